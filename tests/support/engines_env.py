"""Spark with the Delta and Iceberg connectors users query the sink's tables with: a virtual environment of its own
(a pinned pyspark) and the connectors' jars, fetched with Maven, built once per user and pins, reused by later
sessions. ``python engines_env.py`` builds it (``scripts/engines.sh``) and prints where it is and what it cost.

The test environment's pyspark is newer than the connectors support. The pins are the newest Spark that both
connectors work with: Iceberg's newest Spark runtime is ``iceberg-spark-runtime-4.1`` (1.12.0), and delta-spark 4.2.0
is built against Spark 4.1.0 (its pom's ``spark-sql_2.13``, provided); Spark 4.2 has neither. delta-spark 4.2.0 calls
a constructor of Spark's ``ParquetToSparkSchemaConverter`` (7 booleans) that Spark 4.1.2 replaced (8 booleans): on
pyspark 4.1.2 to 4.1.4 reading a checkpointed Delta table fails with ``NoSuchMethodError``. So pyspark 4.1.1, the
newest Spark on which both connectors run. S3 is Hadoop's S3A (``hadoop-aws`` of the Hadoop that Spark 4.1 ships,
3.4.2, with the modules of the AWS SDK it is built against, 2.29.52, not the 600 MB SDK bundle); Iceberg reads S3
through it too (its ``HadoopFileIO``), so that one AWS SDK is on the class path. Iceberg's JDBC catalog reads the
sink's SQL catalogs with the SQLite and PostgreSQL JDBC drivers. Spark's Kafka source (``spark-sql-kafka-0-10`` of
the same Spark) is there for the Kafka tests, and the sink's own dependencies are installed so that the sink runs in
this Spark too (from the checkout, on ``PYTHONPATH``).

Maven resolves the jars with their dependencies (``copy-dependencies`` of a generated pom); those Spark ships
itself (the same artifact name in pyspark's ``jars``) are left out, but for the connectors' and AWS's own.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
import tomllib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from duckdb_env import locked

T = TypeVar("T")

PYSPARK = "4.1.1"
DELTA = "4.2.0"
ICEBERG = "1.12.0"
HADOOP = "3.4.2"
"""The Hadoop of pyspark 4.1.1's jars (``hadoop-client-api-3.4.2.jar``): ``hadoop-aws`` must match it."""
AWS_SDK = "2.29.52"
"""The AWS SDK v2 that hadoop-aws 3.4.2 is built against (hadoop-project's ``aws-java-sdk-v2.version``)."""
ARTIFACTS = (
    f"io.delta:delta-spark_2.13:{DELTA}",
    f"org.apache.iceberg:iceberg-spark-runtime-4.1_2.13:{ICEBERG}",
    f"org.apache.hadoop:hadoop-aws:{HADOOP}",
    f"software.amazon.awssdk:s3:{AWS_SDK}",
    f"software.amazon.awssdk:s3-transfer-manager:{AWS_SDK}",
    f"software.amazon.awssdk:sts:{AWS_SDK}",
    f"software.amazon.awssdk:apache-client:{AWS_SDK}",
    "org.xerial:sqlite-jdbc:3.49.1.0",
    "org.postgresql:postgresql:42.7.5",
    f"org.apache.spark:spark-sql-kafka-0-10_2.13:{PYSPARK}",
)
EXCLUDED = ("software.amazon.awssdk:bundle",)
"""hadoop-aws's dependency on the whole SDK (about 600 MB): the modules above are what S3A uses."""
OWN_GROUPS = ("io.delta", "org.apache.iceberg", "software.amazon.awssdk")
"""Jars of these groups are kept even where pyspark has a jar of the same artifact name (the SDK's ``annotations``
is not Spark's)."""
PINS = (f"pyspark=={PYSPARK}", *ARTIFACTS)
EXTRAS = ("delta", "iceberg", "metrics")
"""The project's extras installed beside its dependencies: the sink itself runs in this Spark too (its Kafka
source, the JVM peers' benchmarks), from the checkout (``PYTHONPATH``), with pyspark held at :data:`PYSPARK`."""


def project_requirements() -> list[str]:
    """The project's dependencies and :data:`EXTRAS` from ``pyproject.toml``, but pyspark (pinned apart)."""
    project = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())["project"]
    wanted = [*project["dependencies"], *(r for extra in EXTRAS for r in project["optional-dependencies"][extra])]
    return [r for r in wanted if not r.startswith("pyspark")]


ENV_VAR = "FILESINK_ENGINES_CACHE"
"""Where the environment is built instead of the user's cache directory."""
VENV_DEADLINE = 60.0
PIP_DEADLINE = 600.0
"""pyspark is a source distribution of about 450 MB (its wheel is built by pip, then cached by pip)."""
MAVEN_DEADLINE = 600.0
LOCK_DEADLINE = VENV_DEADLINE + PIP_DEADLINE + MAVEN_DEADLINE + 30.0
READY = "ready.json"
"""Written last, atomically: the pins, the jars and what the build cost. Without it, a directory is unfinished."""

POM = """<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>filesink.tests</groupId><artifactId>engines</artifactId><version>1</version>
  <dependencies>
{dependencies}
  </dependencies>
</project>
"""


@dataclass(frozen=True)
class Engines:
    """A built environment: its Python (with pyspark) and the jars to give Spark."""

    python: Path
    jars: tuple[Path, ...]
    cost: dict


def cache_root() -> Path:
    """``$FILESINK_ENGINES_CACHE``, else the user's cache directory (``$XDG_CACHE_HOME``, else ``~/.cache``)."""
    if os.environ.get(ENV_VAR):
        return Path(os.environ[ENV_VAR])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "filesink-tests"


def env_name() -> str:
    """The pins and the interpreter the virtual environment is built on (a venv is tied to it)."""
    base = os.path.realpath(getattr(sys, "_base_executable", sys.executable))
    key = json.dumps([PINS, EXCLUDED, project_requirements(), sys.version, base])
    py = f"py{sys.version_info.major}.{sys.version_info.minor}"
    return (
        f"engines-spark-{PYSPARK}-delta-{DELTA}-iceberg-{ICEBERG}-{py}-{hashlib.sha256(key.encode()).hexdigest()[:10]}"
    )


def pinned_engines(root: Path | None = None) -> tuple[Engines | None, str]:
    """The environment under ``root`` (default :func:`cache_root`), built first if it is not yet: ``(engines, "")``,
    or ``(None, reason)`` naming the step that failed and its answer. Several processes may call this at once: one
    builds under a lock file, the others wait and reuse what it built."""
    home = (root or cache_root()) / env_name()
    return built_once(home, lambda: _ready(home), lambda: _build(home), LOCK_DEADLINE)


def built_once(
    home: Path, ready: Callable[[], T | None], build: Callable[[], str], deadline: float
) -> tuple[T | None, str]:
    """What ``ready()`` finds in ``home``, built first by ``build()`` (which returns "" or why it failed) if it finds
    nothing: ``(found, "")`` or ``(None, reason)``. One process builds under a lock file beside ``home``; others wait
    up to ``deadline`` seconds and reuse what it built."""
    found = ready()
    if found is not None:
        return found, ""
    try:
        home.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        return None, f"cannot create the cache directory {home.parent}: {e}"
    with locked(home.parent / f"{home.name}.lock", deadline, poll=0.5) as held:
        if not held:
            return None, f"another process built {home} for more than {deadline:g} s (its lock is held)"
        found = ready()
        if found is not None:
            return found, ""
        reason = build()
    return (None, reason) if reason else (ready(), "")


def _ready(home: Path) -> Engines | None:
    try:
        recorded = json.loads((home / READY).read_text())
    except (OSError, ValueError):
        return None
    python = home / "venv" / "bin" / "python"
    jars = tuple(home / "jars" / name for name in recorded.get("jars", ()))
    if recorded.get("pins") != list(PINS) or not python.exists() or not all(j.exists() for j in jars):
        return None
    return Engines(python, jars, recorded.get("cost", {}))


def _dependency(artifact: str) -> str:
    group, name, version = artifact.split(":")
    exclusions = "".join(
        f"<exclusion><groupId>{g}</groupId><artifactId>{a}</artifactId></exclusion>"
        for g, a in (e.split(":") for e in EXCLUDED)
    )
    return (
        f"    <dependency><groupId>{group}</groupId><artifactId>{name}</artifactId><version>{version}</version>"
        f"<exclusions>{exclusions}</exclusions></dependency>"
    )


def _artifact_name(jar: str) -> str:
    """``jackson-core-2.13.5.jar`` -> ``jackson-core`` (the name before the version)."""
    parts = jar.removesuffix(".jar").split("-")
    for i, part in enumerate(parts):
        if i and part[:1].isdigit():
            return "-".join(parts[:i])
    return "-".join(parts)


def _spark_jars(python: Path) -> set[str]:
    site = next((python.parent.parent / "lib").glob("python3*/site-packages/pyspark/jars"))
    return {_artifact_name(p.name) for p in site.glob("*.jar")}


def _run(what: str, args: Sequence[str], deadline: float, cwd: Path | None = None) -> str:
    """Run a build step: its output, or raise ``RuntimeError`` with the command and its answer."""
    environ = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    command = " ".join(args)
    try:
        done = subprocess.run(args, capture_output=True, text=True, timeout=deadline, env=environ, cwd=cwd, check=False)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"{what} ({command}) did not finish within {deadline:g} s") from None
    except OSError as e:
        raise RuntimeError(f"{what} ({command}) failed: {e}") from None
    if done.returncode != 0:
        tail = (done.stderr.strip() + "\n" + done.stdout.strip()).strip()[-1500:]
        raise RuntimeError(f"{what} ({command}) failed (exit {done.returncode}): {tail}")
    return done.stdout


def _size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _build(home: Path) -> str:
    """Build the environment in ``home`` (what an unfinished build left is removed first): the reason it could not
    be built, or "" once it is ready."""
    shutil.rmtree(home, ignore_errors=True)
    home.mkdir(parents=True)
    python = home / "venv" / "bin" / "python"
    cost: dict = {}
    try:
        mvn = shutil.which("mvn")
        if mvn is None:
            raise RuntimeError("Maven ('mvn') is not installed: it fetches the connectors' jars")
        started = time.monotonic()
        _run("creating the virtual environment", [sys.executable, "-m", "venv", str(home / "venv")], VENV_DEADLINE)
        pip = [str(python), "-m", "pip", "install", "--disable-pip-version-check", "--no-input"]
        _run(f"pip installing pyspark=={PYSPARK}", [*pip, "--retries", "1", "--timeout", "60", PINS[0]], PIP_DEADLINE)
        _run(
            "pip installing the sink's dependencies",
            [*pip, "--retries", "1", "--timeout", "60", PINS[0], *project_requirements()],
            PIP_DEADLINE,
        )
        cost["venv_seconds"] = round(time.monotonic() - started, 1)
        cost["venv_bytes"] = _size(home / "venv")
        started = time.monotonic()
        (home / "pom.xml").write_text(POM.format(dependencies="\n".join(_dependency(a) for a in ARTIFACTS)))
        fetched = home / "fetched"
        _run(
            "Maven fetching the connectors' jars",
            [
                mvn,
                *("-B", "-q", "dependency:copy-dependencies", "-Dmdep.useRepositoryLayout=true"),
                *(f"-DoutputDirectory={fetched}", "-DincludeScope=runtime"),
            ],
            MAVEN_DEADLINE,
            cwd=home,
        )
        cost["maven_seconds"] = round(time.monotonic() - started, 1)
        cost["maven_bytes"] = _size(fetched)
    except RuntimeError as e:
        return str(e)
    spark = _spark_jars(python)
    jars = home / "jars"
    jars.mkdir()
    kept = []
    for jar in sorted(fetched.rglob("*.jar")):  # <group as path>/<artifact>/<version>/<artifact>-<version>.jar
        group = ".".join(jar.relative_to(fetched).parts[:-3])
        if group in OWN_GROUPS or jar.parent.parent.name not in spark:
            shutil.move(str(jar), jars / jar.name)
            kept.append(jar.name)
    shutil.rmtree(fetched)
    cost["jars_bytes"] = _size(jars)
    ready = home / f"{READY}.tmp"
    ready.write_text(json.dumps({"pins": list(PINS), "jars": kept, "cost": cost}, indent=1))
    ready.replace(home / READY)
    return ""


def main() -> None:
    started = time.monotonic()
    engines, reason = pinned_engines()
    if engines is None:
        sys.exit(f"error: the Spark engines' environment could not be built: {reason}")
    print(
        json.dumps(
            {
                "home": str(engines.python.parent.parent.parent),
                "pins": list(PINS),
                "jars": len(engines.jars),
                "build": engines.cost,
                "this_call_seconds": round(time.monotonic() - started, 1),
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
