"""The run server (``run_server.py``) answers as ``python -m filesink`` would: exit codes, both streams, the
command's environment, a process per launch environment, and a process of its own where a JVM must start anew."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import run_server

pytestmark = pytest.mark.timeout(180)


def _own(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "filesink", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, **(env or {})),
    )


@pytest.mark.parametrize(
    "args",
    [
        ("--help",),
        ("run", "--ouput", "x"),  # a mistyped option: a usage error naming the closest one, exit 2
        ("recover", "status"),  # a missing required option
        ("run", "--input", "/nonexistent/in", "--output", "/nonexistent/out", "--state-dir", "/nonexistent/s"),
    ],
    ids=["help", "mistyped", "missing", "refused"],
)
def test_a_command_answers_as_in_a_process_of_its_own(args):
    served = run_server.filesink(args, 120)
    alone = _own(*args)
    assert (served.returncode, served.stdout, served.stderr) == (alone.returncode, alone.stdout, alone.stderr)
    assert served.stdout or served.stderr


def test_commands_share_a_server_per_launch_environment_with_their_own_working_directory(tmp_path, monkeypatch):
    base = dict(os.environ)
    run_server.filesink(["--help"], 120)
    first = run_server._SERVERS[run_server.launch_key(base)].proc
    assert first is not None and first.poll() is None
    # a variable the JVM does not keep is the command's own: the command runs in the same server
    monkeypatch.chdir(tmp_path)  # and the command's working directory is the caller's: relative paths resolve there
    done = run_server.filesink(["run", "--input", "not-here", "--output", "o", "--state-dir", "s"], 120, env={"X": "1"})
    assert done.returncode == 1 and str(tmp_path / "not-here") in done.stderr, done.stderr
    assert run_server._SERVERS[run_server.launch_key(base)].proc is first
    # a variable the JVM keeps (FILESINK_*, AWS_*, SPARK_*, ...) starts another server
    other = dict(base, FILESINK_TEST_MARKER="x")
    assert run_server.launch_key(other) != run_server.launch_key(base)
    run_server.filesink(["--help"], 120, env={"FILESINK_TEST_MARKER": "x"})
    assert run_server._SERVERS[run_server.launch_key(other)].proc is not first


def test_what_only_a_new_jvm_takes_runs_in_a_process_of_its_own():
    assert run_server.needs_own_process(["run", "--format", "kafka"])
    assert run_server.needs_own_process(["run", "--conf", "spark.jars.packages=x"])
    assert not run_server.needs_own_process(["run", "--format", "parquet", "--conf", "spark.sql.shuffle.partitions=2"])


def test_at_most_two_servers_live_at_once():
    for marker in ("a", "b", "c"):
        run_server.filesink(["--help"], 120, env={"FILESINK_TEST_MARKER": marker})
    assert len(run_server._SERVERS) <= run_server.MAX_SERVERS == 2
    live = [s for s in run_server._SERVERS.values() if s.proc is not None and s.proc.poll() is None]
    assert len(live) <= 2
