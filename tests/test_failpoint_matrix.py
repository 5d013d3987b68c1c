"""Every failpoint, every action: the job fails there, is started again, and finishes; the output equals the
input exactly and nothing but the sink's committed files is visible. Then double faults: the job dies at a
failpoint of normal operation, and its recovery dies again at a failpoint of recovery.

The job is ``matrix_job.py`` (the sink's protocol without Spark, so that each run takes about a second);
the failpoints are found by reading the packages' source, so a new failpoint joins the matrix by itself.
The full cross product of double faults runs in the ``chaos`` tier; the default tier pairs every failpoint
of normal operation with one recovery failpoint, round robin, so that each of both appears.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import matrix_job
import pytest
from checker import check
from helpers import communicate, wait_until
from matrix_job import PARTITION_BY, expected_rows

from logstore.failpoints import DIR_VAR, ENV_VAR, fired

JOB = Path(__file__).with_name("matrix_job.py")
ROOT = Path(__file__).parents[1]
EPOCHS = 6
ACTIONS = ("raise", "kill", "hang")


def registered_failpoints() -> list[str]:
    """Every failpoint name in the packages' source."""
    names: set[str] = set()
    for package in ("logstore", "filesink", "recovery"):
        for source in sorted((ROOT / package).glob("*.py")):
            names |= set(re.findall(r'failpoint\(\s*"([a-z0-9_.]+)"', source.read_text()))
    return sorted(names)


REGISTERED = registered_failpoints()
S3_ONLY = [n for n in REGISTERED if n.startswith("filesink.upload.")]
RECOVERY = [n for n in REGISTERED if n.startswith("recovery.")]
NORMAL = [n for n in REGISTERED if n not in S3_ONLY and n not in RECOVERY]


class Job:
    """One job's directories; runs of it are subprocesses with their own failpoints."""

    def __init__(self, root: Path, where: str, request: pytest.FixtureRequest) -> None:
        self.root = root
        self.state = root / "state"
        self.shared = root / "failpoints"
        self.shared.mkdir(parents=True)
        if where == "local":
            self.output, self.options = str(root / "out"), None
        else:
            self.output = request.getfixturevalue("s3_prefix") + "/table"
            self.options = request.getfixturevalue("s3_options")
        self.runs = 0
        self.epochs = EPOCHS

    def run(self, failpoints: str = "", action: str | None = None, parallelism: int = 2) -> subprocess.CompletedProcess:
        """Run once; with ``action``, expect it to fail at the failpoint (a hang is killed once it fired)."""
        self.runs += 1
        env = dict(os.environ, **{ENV_VAR: failpoints, DIR_VAR: str(self.shared)})
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(JOB.parent), env.get("PYTHONPATH")]))
        env["MATRIX_JOB_S3"] = json.dumps(self.options)
        args = [sys.executable, str(JOB), str(self.state), self.output, str(self.epochs), str(parallelism)]
        before = len(fired(str(self.shared)))
        proc = subprocess.Popen(
            args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
        )
        if action == "hang":
            wait_until(lambda: len(fired(str(self.shared))) > before, 120, f"{failpoints} to fire", proc=proc)
            time.sleep(0.2)
            assert proc.poll() is None, "a hanging job must still be running"
            os.killpg(proc.pid, signal.SIGKILL)
        out, err = communicate(proc, 240, f"the job with failpoints {failpoints!r} to end")
        return subprocess.CompletedProcess(args, proc.returncode, out, err)

    def fail(self, point: str, action: str, nth: int | str, parallelism: int = 2) -> None:
        before = len(fired(str(self.shared)))
        run = self.run(f"{point}={action}@{nth}", action, parallelism)
        now = [name for name, _pid, _detail in fired(str(self.shared))[before:]]
        assert now == [point], f"{point}={action}@{nth} did not fire (fired: {now}); stderr: {run.stderr[-2000:]}"
        if action == "raise":
            assert run.returncode == 1 and f"FailpointError: failpoint {point} fired" in run.stderr, run.stderr[-3000:]
        else:
            assert run.returncode == -9, run.stderr[-3000:]

    def finish(self, parallelism: int = 3) -> None:
        """The last restart runs to the end (in this process: no failpoint is configured here)."""
        assert not os.environ.get(ENV_VAR)
        self.runs += 1
        matrix_job.run(self.state, self.output, self.epochs, parallelism, self.options)
        report = check(self.output, self.options, expected_rows(self.epochs), PARTITION_BY)
        assert report.anomalies == 0, report.line(runs=self.runs)

    def pending(self) -> int:
        with sqlite3.connect(self.state / "state.sqlite") as db:
            return int(db.execute("SELECT COUNT(*) FROM sink_files").fetchone()[0])


def _nth(point: str) -> int:
    return 1 if point.startswith("recovery.") else 2


SINGLE = (
    [(p, a, "local") for p in NORMAL for a in ACTIONS]
    + [(p, a, "s3") for p in S3_ONLY for a in ACTIONS]
    + [(p, a, "local") for p in RECOVERY for a in ACTIONS]
)


@pytest.mark.parametrize(("point", "action", "where"), SINGLE, ids=[f"{p}={a}-{w}" for p, a, w in SINGLE])
def test_fail_at_a_failpoint_then_restart_and_finish(tmp_path, request, point, action, where):
    job = Job(tmp_path, where, request)
    if point.startswith("recovery."):  # recovery only has work after a crash: leave visible pending files
        job.fail("filesink.write.after", "kill", 1)
        assert job.pending()
    job.fail(point, action, _nth(point))
    job.finish()


def test_the_matrix_covers_every_step():
    assert len(REGISTERED) >= 25 and {"recovery.fence.after", "filesink.upload.complete.before"} <= set(REGISTERED)
    steps = [
        "logstore.append.before_write",
        "logstore.append.after_write",
        "logstore.seal.before_commit",
        "logstore.seal.after_commit",
        "filesink.plan.before",
        "filesink.precommit.before",
        "filesink.precommit.after",
        "filesink.upload.create.after",
        "filesink.upload.part.before",
        "filesink.upload.complete.before",
        "filesink.upload.complete.after",
        "filesink.commit.before",
        "filesink.commit.after",
        "logstore.truncate.before_commit",
        "logstore.gc.after_metadata",
        "recovery.term.after",
        "recovery.fence.after",
        "recovery.resolve.after",
        "recovery.output_garbage.after",
    ]
    assert [s for s in steps if s not in REGISTERED] == []


def _double(tmp_path: Path, request: pytest.FixtureRequest, first: str, second: str) -> None:
    job = Job(tmp_path, "local", request)
    job.fail(first, "kill", 2)
    if second == "recovery.resolve.after" and not job.pending():
        # nothing pending (the first kill was outside pre-commit..commit): recovery resolves nothing, so the
        # failpoint cannot fire; the restart must simply work
        run = job.run(f"{second}=kill@1")
        assert run.returncode == 0 and second not in {n for n, _p, _d in fired(str(job.shared))}, run.stderr[-2000:]
    else:
        job.fail(second, "kill", 1, parallelism=1)
    job.finish(parallelism=4)


SAMPLED = [(n, RECOVERY[i % len(RECOVERY)]) for i, n in enumerate(NORMAL)]
ALL_PAIRS = [(n, r) for n in NORMAL for r in RECOVERY if (n, r) not in SAMPLED]


@pytest.mark.parametrize(("first", "second"), SAMPLED, ids=[f"{a}+{b}" for a, b in SAMPLED])
def test_double_fault(tmp_path, request, first, second):
    _double(tmp_path, request, first, second)


@pytest.mark.chaos
@pytest.mark.parametrize(("first", "second"), ALL_PAIRS, ids=[f"{a}+{b}" for a, b in ALL_PAIRS])
def test_double_fault_every_pair(tmp_path, request, first, second):
    _double(tmp_path, request, first, second)
