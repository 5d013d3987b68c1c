"""A pinned DuckDB for reading the sink's tables: a virtual environment of its own with ``duckdb`` and the PyPI
wheels of its Iceberg, Delta and Avro extensions, built once per user and versions, reused by later sessions.

The DuckDB of the test environment does not bundle those extensions, and DuckDB's own extension repository is
not reachable from every machine; the extension wheels install them into the package ``duckdb_ext``, whose
``extensions`` directory DuckDB is pointed at (``duckdb_reader.py``), so nothing is downloaded at read time.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

DUCKDB_VERSION = "1.4.4"
EXTENSIONS_VERSION = "1.4.4.20260205"
"""The extension wheels' version (what pip resolves for duckdb 1.4.4; each wheel requires exactly that duckdb)."""
PINS = (
    f"duckdb=={DUCKDB_VERSION}",
    f"duckdb-ext-iceberg=={EXTENSIONS_VERSION}",
    f"duckdb-ext-delta=={EXTENSIONS_VERSION}",
    f"duckdb-ext-avro=={EXTENSIONS_VERSION}",
)

VENV_DEADLINE = 60.0
"""Seconds for ``python -m venv`` (with pip, from the interpreter's own wheels)."""
PIP_DEADLINE = 240.0
"""Seconds for pip to download and install the pins (about 100 MB of wheels)."""
CHECK_DEADLINE = 60.0
"""Seconds for the built environment to import DuckDB and load the three extensions."""
LOCK_DEADLINE = VENV_DEADLINE + PIP_DEADLINE + CHECK_DEADLINE + 30.0
"""Seconds to wait for another process (another pytest-xdist worker, another session) building the same one."""
READY = "ready.json"
"""Written last, atomically, in a built environment: what it holds. Without it, a directory is an unfinished build."""

CHECK = f"""
import json, duckdb, duckdb_reader
con = duckdb_reader.connect()
print(json.dumps([duckdb.__version__, duckdb_reader.extensions_directory()]))
assert duckdb.__version__ == {DUCKDB_VERSION!r}, duckdb.__version__
"""


def cache_root() -> Path:
    """Where built environments are kept: the user's cache directory (``$XDG_CACHE_HOME``, else ``~/.cache``)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "filesink-tests"


def env_name() -> str:
    """The environment's directory name: the pins, and the interpreter it is built on (a venv is tied to it)."""
    base = os.path.realpath(getattr(sys, "_base_executable", sys.executable))
    key = json.dumps([PINS, sys.version, base])
    py = f"py{sys.version_info.major}.{sys.version_info.minor}"
    return f"duckdb-{DUCKDB_VERSION}-ext-{EXTENSIONS_VERSION}-{py}-{hashlib.sha256(key.encode()).hexdigest()[:10]}"


def pinned_duckdb(root: Path | None = None) -> tuple[Path | None, str]:
    """The Python interpreter of the pinned DuckDB environment under ``root`` (default :func:`cache_root`), built
    there first if it is not yet: ``(python, "")``; or ``(None, reason)`` when it cannot be built (no network,
    pip fails or passes its deadline, another builder holds the lock too long). Several processes may call this at
    once: one builds, under a lock file, the others wait for it and reuse what it built."""
    root = root or cache_root()
    home = root / env_name()
    python = home / "bin" / "python"
    if _ready(home, python):
        return python, ""
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        return None, f"cannot create the cache directory {root}: {e}"
    with locked(root / f"{home.name}.lock") as held:
        if not held:
            return None, f"another process built {home} for more than {LOCK_DEADLINE:g} s (its lock is held)"
        if _ready(home, python):  # built by whoever held the lock before
            return python, ""
        reason = _build(home, python)
    return (None, reason) if reason else (python, "")


def _ready(home: Path, python: Path) -> bool:
    try:
        recorded = json.loads((home / READY).read_text())
    except (OSError, ValueError):
        return False
    return recorded.get("pins") == list(PINS) and python.exists()


@contextlib.contextmanager
def locked(path: Path, wait: float = LOCK_DEADLINE, poll: float = 0.2) -> Iterator[bool]:
    """Hold an exclusive lock on ``path`` (``flock``; released when the process dies), waiting at most ``wait``
    seconds (default :data:`LOCK_DEADLINE`), trying again every ``poll`` seconds: yields whether it is held. The
    engines' environment (``engines_env.py``) is built under it too."""
    with open(path, "a") as f:
        deadline = time.monotonic() + wait
        while True:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    yield False
                    return
                time.sleep(poll)
        try:
            yield True
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _build(home: Path, python: Path) -> str:
    """Build the environment in ``home`` (what an unfinished build left is removed first): the reason it could not
    be built, or "" once it is ready."""
    shutil.rmtree(home, ignore_errors=True)
    steps: list[tuple[str, Sequence[str], float, dict[str, str] | None]] = [
        ("creating the virtual environment", [sys.executable, "-m", "venv", str(home)], VENV_DEADLINE, None),
        (
            f"pip installing {' '.join(PINS)}",
            [
                str(python),
                *("-m", "pip", "install", "--disable-pip-version-check", "--no-input", "--only-binary", ":all:"),
                *("--retries", "1", "--timeout", "30"),
                *PINS,
            ],
            PIP_DEADLINE,
            None,
        ),
        (
            "loading the extensions in the built environment",
            [str(python), "-c", CHECK],
            CHECK_DEADLINE,
            {"PYTHONPATH": str(Path(__file__).parent)},
        ),
    ]
    out = ""
    for what, args, deadline, env in steps:
        environ = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
        try:
            done = subprocess.run(
                args, capture_output=True, text=True, timeout=deadline, env={**environ, **(env or {})}, check=False
            )
        except subprocess.TimeoutExpired:
            return f"{what} did not finish within {deadline:g} s"
        except OSError as e:
            return f"{what} failed: {e}"
        if done.returncode != 0:
            tail = (done.stderr.strip() or done.stdout.strip())[-1500:]
            return f"{what} failed (exit {done.returncode}): {tail}"
        out = done.stdout
    version, extensions = json.loads(out.strip().splitlines()[-1])
    ready = home / f"{READY}.tmp"
    ready.write_text(json.dumps({"pins": list(PINS), "duckdb": version, "extensions": extensions}))
    ready.replace(home / READY)
    return ""
