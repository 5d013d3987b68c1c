"""``filesink run`` as a command for the end-to-end tests: the command in a subprocess with a deadline, the
options of a run over ``tmp_path`` (input ``in``, output ``out``, state ``state``), and the check of a refusal."""

from __future__ import annotations

import subprocess
from pathlib import Path

import run_server

FAST_START = "spark.driver.extraJavaOptions=-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
"""Short test runs start faster without the JVM's optimizing compiler and parallel GC."""


def filesink(*args: str, env: dict[str, str] | None = None, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    """``python -m filesink ARGS`` to its end, with ``env`` added to the environment: through this test process's
    run server (:mod:`run_server`, one ``filesink`` process that keeps its JVM between commands) unless the command
    needs a process of its own."""
    return run_server.filesink(args, timeout, env=env)


def run_args(tmp_path: Path, *extra: str, output: str | None = None) -> list[str]:
    """``run`` over ``tmp_path/in`` into ``tmp_path/out`` (key ``user_id``, partitioned by ``event_date``)."""
    return [
        "run",
        "--input",
        str(tmp_path / "in"),
        "--output",
        output or str(tmp_path / "out"),
        "--state-dir",
        str(tmp_path / "state"),
        "--key",
        "user_id",
        "--partition-by",
        "event_date",
        "--parallelism",
        "2",
        "--conf",
        FAST_START,
        *extra,
    ]


def refused(tmp_path: Path, proc: subprocess.CompletedProcess[str], *words: str, new: bool = True) -> None:
    """``proc`` ended with exit 1 and a message holding each of ``words``, without a traceback; for a ``new``
    sink, nothing was written (no output, no state directory)."""
    assert proc.returncode == 1, proc.stderr[-2000:]
    for word in words:
        assert word in proc.stderr, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    if new:
        assert not (tmp_path / "out").exists() and not (tmp_path / "state").exists(), "nothing may be written"
