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

import forkserver
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
"""Only reached when the output is a table (a table's commit): run on a Delta and an Iceberg table."""
TABLES = ("delta", "iceberg")
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
"""The steps around a table's commit, also run on each table format (killed there)."""


class Job:
    """One job's directories; runs of it are subprocesses with their own failpoints."""

    def __init__(self, root: Path, where: str, request: pytest.FixtureRequest) -> None:
        self.root = root
        self.state = root / "state"
        self.shared = root / "failpoints"
        self.shared.mkdir(parents=True)
        self.table = where if where in TABLES else None
        if where == "local" or self.table:
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
        proc = forkserver.popen(
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
        if self.table:
            assert table_rows(self.table, self.output) == expected_rows(self.epochs), f"{self.table} after {self.runs}"
            return
        report = check(self.output, self.options, expected_rows(self.epochs), PARTITION_BY)
        assert report.anomalies == 0, report.line(runs=self.runs)

    def pending(self) -> int:
        with sqlite3.connect(self.state / "state.sqlite") as db:
            return int(db.execute("SELECT COUNT(*) FROM sink_files").fetchone()[0])


def table_rows(table_format: str, path: str) -> Counter:
    """The rows of the job's table at ``path``, as a multiset (every input column, partition column included)."""
    if table_format == "delta":
        from deltalake import DeltaTable

        data = DeltaTable(path).to_pyarrow_table(columns=list(COLUMNS))
    else:
        from pyiceberg.catalog.sql import SqlCatalog

        from filesink.destination.iceberg import CATALOG_NAME, EMBEDDED_CATALOG

        catalog = SqlCatalog(CATALOG_NAME, uri=f"sqlite:///{path}/{EMBEDDED_CATALOG}", warehouse=path)
        data = catalog.load_table("matrix.events").scan(selected_fields=tuple(COLUMNS)).to_arrow()
    return Counter(zip(*(data[c].to_pylist() for c in COLUMNS), strict=True))


def _nth(point: str) -> int:
    return 1 if point.startswith("recovery.") else 2


SINGLE = (
    [(p, a, "local") for p in NORMAL for a in ACTIONS]
    + [(p, a, "s3") for p in S3_ONLY for a in ACTIONS]
    + [(p, a, "local") for p in RECOVERY for a in ACTIONS]
    + [(p, a, t) for t in TABLES for p in TABLE_ONLY for a in ACTIONS]
    + [(p, "kill", t) for t in TABLES for p in ON_A_TABLE]
)
