"""Maven artifacts with their dependencies, fetched once into the user's cache: Spark's Kafka source for
``filesink run --format kafka``, Apache Kafka's broker for ``filesink kafka-broker``.

They are resolved with Apache Ivy, the resolver Spark itself uses for ``spark.jars.packages`` (pyspark ships its jar),
run as a Java subprocess whose answer is kept, so that a failure is quoted as what it is: the artifact that is not
published, the dependency whose download failed, the repository that could not be reached. Ivy reads only the
repositories named here (Maven Central, after any ``spark.jars.repositories``), or the user's own Ivy settings
(``spark.jars.ivySettings``), into a cache of its own: not the local Maven repository (``~/.m2``), where a pom
without its jar makes Spark's default resolver fail.

Jars that pyspark ships itself are left out of the resolution (with what they bring): the Kafka source's jars are
added to a Spark that has them already. The jars land in ``<cache>/jars/<key>/`` (``ready.json`` lists them); a
second fetch of the same artifacts reads that list and starts no JVM. ``FILESINK_CACHE`` puts the cache elsewhere
than ``$XDG_CACHE_HOME/filesink`` (``~/.cache/filesink``).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from xml.sax.saxutils import quoteattr

from .errors import JarFetchError

CENTRAL = "https://repo1.maven.org/maven2/"
CACHE_ENV = "FILESINK_CACHE"
FETCH_DEADLINE = 900.0
"""Seconds for one resolution (Kafka's broker is about 40 MB of jars; a slow network)."""
READY = "ready.json"


@dataclass(frozen=True)
class Repositories:
    """Where artifacts come from: ``extra`` Maven repositories searched before Maven Central (Spark's
    ``spark.jars.repositories``), or the user's own Ivy settings file (``spark.jars.ivySettings``), which replaces
    both."""

    extra: tuple[str, ...] = ()
    ivy_settings: Path | None = None

    @classmethod
    def of_spark_conf(cls, conf: dict[str, str]) -> Repositories:
        extra = tuple(r.strip() for r in conf.get("spark.jars.repositories", "").split(",") if r.strip())
        settings = conf.get("spark.jars.ivySettings")
        return cls(extra, Path(settings) if settings else None)

    def describe(self) -> str:
        if self.ivy_settings is not None:
            return f"the repositories of {self.ivy_settings} (spark.jars.ivySettings)"
        return ", ".join((*self.extra, f"Maven Central ({CENTRAL})"))


def cache_root() -> Path:
    given = os.environ.get(CACHE_ENV)
    if given:
        return Path(given)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "filesink"


def shipped_names(jars_dir: Path) -> tuple[str, ...]:
    """The artifact names of the jars in ``jars_dir`` (``slf4j-api`` of ``slf4j-api-2.0.17.jar``)."""
    names = set()
    for jar in jars_dir.glob("*.jar"):
        match = re.match(r"^(.+?)-\d[^-]*(?:-.+)?\.jar$", jar.name)
        names.add(match.group(1) if match else jar.stem)
    return tuple(sorted(names))


def pyspark_jars() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent / "jars"


def ivy_jar() -> Path:
    found = sorted(pyspark_jars().glob("ivy-*.jar"))
    if not found:
        raise JarFetchError(
            f"pyspark's jars ({pyspark_jars()}) hold no Apache Ivy jar (ivy-*.jar) to resolve Maven artifacts with: "
            "reinstall pyspark, or give the jars yourself with --conf spark.jars=a.jar,b.jar"
        )
    return found[-1]


def fetch(
    artifacts: Sequence[str],
    *,
    exclude: Sequence[str] = (),
    repositories: Repositories = Repositories(),
    what: str,
    say: Callable[[str], None] = lambda line: None,
    root: Path | None = None,
) -> list[Path]:
    """The jars of ``artifacts`` (``group:name:version``) with their runtime dependencies, but the artifact names
    in ``exclude`` (and what they bring); fetched the first time, under a lock, with a line said before. ``what``
    names them in that line and in errors. Raises :class:`JarFetchError` quoting Ivy's problems."""
    root = root or cache_root()
    settings = _settings(repositories, root / "ivy")
    module = _module(artifacts, exclude)
    key = hashlib.sha256((settings + module).encode()).hexdigest()[:12]
    first = artifacts[0].split(":")
    home = root / "jars" / f"{first[1]}-{first[2]}-{key}"
    jars = _ready(home)
    if jars is not None:
        return jars
    home.parent.mkdir(parents=True, exist_ok=True)
    with _locked(home.with_name(home.name + ".lock"), what):
        jars = _ready(home)
        if jars is not None:
            return jars
        say(f"fetching {what} ({', '.join(artifacts)}) from {repositories.describe()} into {home} (once)")
        _resolve(home, settings, module, artifacts, repositories, what)
        jars = _ready(home)
        assert jars is not None
        return jars


def _ready(home: Path) -> list[Path] | None:
    try:
        names = json.loads((home / READY).read_text())["jars"]
    except (OSError, ValueError, KeyError):
        return None
    jars = [home / "jars" / name for name in names]
    return jars if all(j.is_file() for j in jars) else None


def _settings(repositories: Repositories, cache: Path) -> str:
    if repositories.ivy_settings is not None:
        try:
            return repositories.ivy_settings.read_text()
        except OSError as e:
            raise JarFetchError(
                f"cannot read the Ivy settings {repositories.ivy_settings} (spark.jars.ivySettings): "
                f"{e.strerror or e}; give a readable file, or leave the setting out to use Maven Central"
            ) from None
    roots = (*repositories.extra, CENTRAL)
    resolvers = "\n".join(
        f'      <ibiblio name="repo{i}" m2compatible="true" root={quoteattr(r if r.endswith("/") else r + "/")}/>'
        for i, r in enumerate(roots)
    )
    return f"""<ivysettings>
  <settings defaultResolver="chain"/>
  <caches defaultCacheDir={quoteattr(str(cache))} useOrigin="false"/>
  <resolvers>
    <chain name="chain" returnFirst="true">
{resolvers}
    </chain>
  </resolvers>
</ivysettings>
"""


def _module(artifacts: Sequence[str], exclude: Sequence[str]) -> str:
    wanted = {a.split(":")[1] for a in artifacts}
    lines = []
    for artifact in artifacts:
        group, name, version = _coordinate(artifact)
        lines.append(
            f"    <dependency org={quoteattr(group)} name={quoteattr(name)} rev={quoteattr(version)} "
            'conf="default->default"/>'
        )
    lines += [f'    <exclude org="*" module={quoteattr(n)}/>' for n in exclude if n not in wanted]
    body = "\n".join(lines)
    return f"""<ivy-module version="2.0">
  <info organisation="filesink" module="fetch"/>
  <configurations><conf name="default"/></configurations>
  <dependencies>
{body}
  </dependencies>
</ivy-module>
"""


def _coordinate(artifact: str) -> tuple[str, str, str]:
    parts = artifact.split(":")
    if len(parts) != 3 or not all(parts):
        raise JarFetchError(f"{artifact!r} is not a Maven coordinate group:name:version")
    return parts[0], parts[1], parts[2]


class _locked:
    """An exclusive lock on ``path`` (another process fetching the same jars), waited for up to the fetch's
    deadline."""

    def __init__(self, path: Path, what: str) -> None:
        self.path, self.what = path, what

    def __enter__(self) -> None:
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        deadline = time.monotonic() + FETCH_DEADLINE
        while True:
            try:
                fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                if time.monotonic() > deadline:
                    os.close(self.fd)
                    raise JarFetchError(
                        f"another process has been fetching {self.what} for {FETCH_DEADLINE:.0f} s (it holds "
                        f"{self.path}): wait for it, or end it and run again"
                    ) from None
                time.sleep(0.5)

    def __exit__(self, *exc: object) -> None:
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        os.close(self.fd)


def _resolve(
    home: Path, settings: str, module: str, artifacts: Sequence[str], repositories: Repositories, what: str
) -> None:
    work = home.with_name(home.name + ".part")
    shutil.rmtree(work, ignore_errors=True)
    (work / "jars").mkdir(parents=True)
    (work / "ivysettings.xml").write_text(settings)
    (work / "ivy.xml").write_text(module)
    java = str(Path(os.environ["JAVA_HOME"]) / "bin" / "java") if os.environ.get("JAVA_HOME") else "java"
    command = [
        java,
        "-jar",
        str(ivy_jar()),
        *("-settings", str(work / "ivysettings.xml")),
        *("-ivy", str(work / "ivy.xml")),
        *("-confs", "default"),
        *("-retrieve", str(work / "jars" / "[artifact]-[revision](-[classifier]).[ext]")),
    ]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=FETCH_DEADLINE, check=False)
    except FileNotFoundError:
        raise JarFetchError(
            f"cannot fetch {what}: Java ('{java}') was not found. Spark needs Java 17 or newer: install a JDK 17 "
            "or set JAVA_HOME"
        ) from None
    except subprocess.TimeoutExpired:
        raise JarFetchError(
            f"fetching {what} from {repositories.describe()} did not finish within {FETCH_DEADLINE:.0f} s: check "
            "the network (a proxy?), or name a nearer mirror with --conf spark.jars.repositories=URL"
        ) from None
    if done.returncode != 0:
        raise failure(what, artifacts, repositories, done.stdout + done.stderr)
    jars = sorted(p.name for p in (work / "jars").iterdir() if p.suffix == ".jar")
    (work / READY).write_text(json.dumps({"artifacts": list(artifacts), "jars": jars}))
    shutil.rmtree(home, ignore_errors=True)
    work.replace(home)


UNREACHABLE = ("Server access error", "UnknownHost", "Connection refused", "connect timed out")


def problems(output: str) -> list[str]:
    """The lines of Ivy's answer that say what failed, each once, in order: the unresolved dependencies (``...: not
    found``), the failed downloads (``download failed: group#name;version!file.jar``), the servers out of reach."""
    lines: list[str] = []
    section = ""
    for raw in output.splitlines():
        line = raw.strip().lstrip(":").strip().rstrip(":").strip()
        if "FAILED DOWNLOADS" in line or "UNRESOLVED DEPENDENCIES" in line:
            section = line
            continue
        found = None
        if line.startswith("download failed:") or any(w in line for w in UNREACHABLE):
            found = line
        elif "FAILED DOWNLOADS" in section and "!" in line and "#" in line:
            found = f"download failed: {line}"
        elif ("UNRESOLVED" in section and line.endswith("not found")) or "unresolved dependency:" in line:
            found = line
        if found and found not in lines:
            lines.append(found)
    return lines


def failure(what: str, artifacts: Sequence[str], repositories: Repositories, output: str) -> JarFetchError:
    """The error of a failed resolution of ``artifacts``: what Ivy said failed, and what to do for its kind."""
    found = problems(output)
    quoted = "; ".join(found[:4]) or (output.strip().splitlines() or ["Ivy failed without a word"])[-1]
    unpublished = tuple(a for a in artifacts if any(f"{_ivy_name(a)}: not found" in line for line in found))
    unreachable = any(w in output for w in UNREACHABLE)
    if unpublished and not unreachable:
        return JarFetchError(
            f"{repositories.describe()} {'has' if len(unpublished) == 1 else 'have'} no {', '.join(unpublished)}: "
            f"{what} is not published for that version ({quoted})",
            unpublished,
        )
    if unreachable:
        return JarFetchError(
            f"cannot fetch {what}: a repository could not be reached ({quoted}). Check the network (a proxy, DNS), "
            "or name a mirror you can reach with --conf spark.jars.repositories=URL"
        )
    return JarFetchError(
        f"cannot fetch {what}: {artifacts[0]} was found, but not all of its dependencies could be had from "
        f"{repositories.describe()} ({quoted}). Run the same command again if the network failed; if a repository "
        "serves a broken copy, name another with --conf spark.jars.repositories=URL (or your own Ivy settings with "
        "--conf spark.jars.ivySettings=FILE)"
    )


def _ivy_name(artifact: str) -> str:
    """``group#name;version``: how Ivy names ``group:name:version``."""
    group, name, version = _coordinate(artifact)
    return f"{group}#{name};{version}"
