"""The failpoint matrix's job and the failpoints it covers (shared by the matrix, the coverage test and the
disk fault tests).

:class:`Job` runs ``matrix_job.py`` (the sink's protocol without Spark, so that each run takes about a second)
in subprocesses with failpoints configured; the failpoints are found by reading the packages' source
(subpackages too), so a new failpoint joins the matrix by itself.
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
from collections import Counter
from pathlib import Path

import matrix_job
import pytest
from checker import check
from helpers import communicate, support_env, wait_until
from matrix_job import PARTITION_BY, expected_rows
from sink_helpers import COLUMNS

from logstore.failpoints import DIR_VAR, ENV_VAR, fired

JOB = Path(__file__).with_name("matrix_job.py")
ROOT = Path(__file__).parents[2]
EPOCHS = 6
ACTIONS = ("raise", "kill", "hang")


def registered_failpoints() -> list[str]:
    """Every failpoint name in the packages' source."""
    names: set[str] = set()
    for package in ("logstore", "filesink", "recovery"):
        for source in sorted((ROOT / package).rglob("*.py")):
            names |= set(re.findall(r'failpoint\(\s*"([a-z0-9_.]+)"', source.read_text()))
    return sorted(names)


REGISTERED = registered_failpoints()
S3_ONLY = [n for n in REGISTERED if n.startswith("filesink.upload.")]
TABLE_ONLY = [n for n in REGISTERED if ".table." in n]
"""Only reached when the output is a table (a table's commit): run on a Delta table."""
RECOVERY = [n for n in REGISTERED if n.startswith("recovery.") and n not in TABLE_ONLY]
GIVE_UP = [n for n in REGISTERED if n.startswith("logstore.give_up.")]
"""Only reached when the operator gives up a damaged segment: tests/recovery/test_drop_damaged.py fires them."""
NORMAL = [n for n in REGISTERED if n not in S3_ONLY and n not in RECOVERY and n not in GIVE_UP and n not in TABLE_ONLY]
ON_A_TABLE = [
    "filesink.precommit.after",
    "filesink.write.after",
    "filesink.commit.before",
    "filesink.commit.after",
    "recovery.term.after",
    "recovery.fence.after",
    "recovery.resolve.after",
]
"""The steps around a table's commit, also run on a Delta table (killed there)."""


class Job:
    """One job's directories; runs of it are subprocesses with their own failpoints."""

    def __init__(self, root: Path, where: str, request: pytest.FixtureRequest) -> None:
        self.root = root
        self.state = root / "state"
        self.shared = root / "failpoints"
        self.shared.mkdir(parents=True)
        self.table = "delta" if where == "delta" else None
        if where in ("local", "delta"):
            self.output, self.options = str(root / "out"), None
        else:
            self.output = request.getfixturevalue("s3_prefix") + "/table"
            self.options = request.getfixturevalue("s3_options")
        self.runs = 0
        self.epochs = EPOCHS

    def run(self, failpoints: str = "", action: str | None = None, parallelism: int = 2) -> subprocess.CompletedProcess:
        """Run once; with ``action``, expect it to fail at the failpoint (a hang is killed once it fired)."""
        self.runs += 1
        env = support_env(**{ENV_VAR: failpoints, DIR_VAR: str(self.shared)})
        env["MATRIX_JOB_S3"] = json.dumps(self.options)
        env["MATRIX_JOB_TABLE"] = self.table or ""
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
        os.environ["MATRIX_JOB_TABLE"] = self.table or ""
        try:
            matrix_job.run(self.state, self.output, self.epochs, parallelism, self.options)
        finally:
            del os.environ["MATRIX_JOB_TABLE"]
        if self.table == "delta":
            assert delta_rows(self.output) == expected_rows(self.epochs), f"the Delta table after {self.runs} runs"
            return
        report = check(self.output, self.options, expected_rows(self.epochs), PARTITION_BY)
        assert report.anomalies == 0, report.line(runs=self.runs)

    def pending(self) -> int:
        with sqlite3.connect(self.state / "state.sqlite") as db:
            return int(db.execute("SELECT COUNT(*) FROM sink_files").fetchone()[0])


def delta_rows(path: str) -> Counter:
    """The rows of the Delta table at ``path``, as a multiset (every input column, partition column included)."""
    from deltalake import DeltaTable

    table = DeltaTable(path).to_pyarrow_table(columns=list(COLUMNS))
    return Counter(zip(*(table[c].to_pylist() for c in COLUMNS), strict=True))


def _nth(point: str) -> int:
    return 1 if point.startswith("recovery.") else 2


SINGLE = (
    [(p, a, "local") for p in NORMAL for a in ACTIONS]
    + [(p, a, "s3") for p in S3_ONLY for a in ACTIONS]
    + [(p, a, "local") for p in RECOVERY for a in ACTIONS]
    + [(p, a, "delta") for p in TABLE_ONLY for a in ACTIONS]
    + [(p, "kill", "delta") for p in ON_A_TABLE]
)
