"""Spark as another writer of the sink's tables while the sink streams into them and is killed (chaos tier).

A streaming job writes through the sink into a partitioned table (``sink_job.py``: Spark's file source, a roll
every two micro-batches) and is SIGKILLed (driver, JVM and workers) at random moments, restarted each time at
another parallelism. Meanwhile, while the job runs, Spark with the format's own connector (``engines_env.py``)
maintains the table:

- Delta: ``OPTIMIZE`` (compaction: the sink's files removed, bigger ones added) and ``VACUUM ... RETAIN 0 HOURS``
  (the retention check off: files the table no longer holds are deleted at once);
- Iceberg (the sink's embedded SQLite catalog, shared by pyiceberg and Iceberg's JdbcCatalog):
  ``rewrite_data_files`` (every file rewritten) and ``expire_snapshots`` (all but the newest, their files deleted).

After every kill the table, read by deltalake or pyiceberg and by Spark, holds input rows only, none twice, and both
read the same rows. At the end (the job run to its end, the table maintained once more, then more input and a last
run: the sink still commits after the other writer's commits), every input row is in the table exactly once, as
each reader reads it, and the table's history holds the other writer's commits among the sink's.

The kill campaigns' ``TableWatch`` assumes the sink is the table's only writer (its files never rewritten); here the
check is the rows, as every reader reads them. A maintenance that loses a race with the sink's commit (the
connector's conflict check) is allowed and counted; any other refusal fails the test.

Delta's ``VACUUM`` with a retention of 0 hours deletes every file the table does not hold, a roll's files between
their write and the table's commit included; see ``test_vacuum_with_no_retention_during_a_roll`` below.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from checker import compare
from engine_tables import TABLE
from helpers import (
    SUPPORT,
    communicate,
    process_state,
    readline_with_deadline,
    run,
    support_env,
    wait_for_line,
    wait_until,
)
from helpers import kill as kill_process
from sink_helpers import COLUMNS, batch_rows
from spark_engines import SparkSQL, embedded_catalog, engines_or_skip
from table_checker import TableTarget, read_table

from logstore.failpoints import DIR_VAR, ENV_VAR, fired

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(2400)]

JOB = SUPPORT / "sink_job.py"
LINE_TIMEOUT = 300.0
PER_RUN = 8
"""Input files (micro-batches) added before each run: a run killed early leaves the rest to the next."""
MORE = 4
"""Input files added after the last maintenance, for a last run."""
ROWS = 150
KILLS = 5
KINDS = ("OPTIMIZE", "VACUUM", "rewrite_data_files", "expire_snapshots")
CONFLICTS = ("Concurrent", "CommitFailedException", "ValidationException", "conflict")
"""What a maintenance that lost a race with the sink's commit says (Delta's ``Concurrent...Exception``, Iceberg's
``CommitFailedException`` / ``ValidationException``)."""


def _input(tmp_path: Path, batches: range, seed: int) -> Counter[Any]:
    source = tmp_path / "input"
    source.mkdir(exist_ok=True)
    expected: Counter[Any] = Counter()
    for b in batches:
        rows = batch_rows(b, ROWS, seed)
        expected.update(rows)
        table = pa.table(dict(zip(COLUMNS, zip(*rows, strict=True), strict=True)))
        pq.write_table(table, source / f"in-{b:03d}.parquet")
    return expected


def _start(tmp_path: Path, table_format: str, parallelism: int) -> subprocess.Popen[str]:
    """Start the job; its standard error goes to a file of its own (``run-<n>.log``): Spark's log could fill a pipe."""
    env = support_env(SINK_JOB_S3="{}", SINK_JOB_PARTITION_BY="event_date", SINK_JOB_ICEBERG_TABLE=TABLE)
    env.update(TableTarget(table_format, table=TABLE).env())
    args = [str(tmp_path / d) for d in ("input", "table", "state", "checkpoint")]
    log = tmp_path / f"run-{len(list(tmp_path.glob('run-*.log')))}.log"
    with log.open("w") as err:
        return subprocess.Popen(
            [sys.executable, str(JOB), *args, str(parallelism)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            start_new_session=True,
        )


def _to_the_end(proc: subprocess.Popen[str], tmp_path: Path, what: str) -> None:
    """Wait for the newest run to end, which must be a success."""
    out, _ = communicate(proc, 900, what)
    if proc.returncode != 0 or not out.endswith("done\n"):
        log = max(tmp_path.glob("run-*.log"), key=lambda p: p.stat().st_mtime).read_text()
        pytest.fail(f"{what} ended with exit {proc.returncode}:\n{log[-3000:]}")


def _maintenance(table_format: str, table: Path) -> list[str]:
    if table_format == "delta":
        return [f"OPTIMIZE delta.`{table}`", f"VACUUM delta.`{table}` RETAIN 0 HOURS"]
    now = (dt.datetime.now(dt.UTC) + dt.timedelta(seconds=1)).strftime("%Y-%m-%d %H:%M:%S.%f")
    return [
        f"CALL filesink.system.rewrite_data_files(table => '{TABLE}', options => map('rewrite-all', 'true'))",
        f"CALL filesink.system.expire_snapshots(table => '{TABLE}', older_than => TIMESTAMP '{now}', retain_last => 1)",
    ]


class Campaign:
    def __init__(self, tmp_path: Path, table_format: str, spark: SparkSQL, seed: int):
        self.tmp_path, self.format, self.spark, self.seed = tmp_path, table_format, spark, seed
        self.table = tmp_path / "table"
        self.catalog = embedded_catalog(self.table) if table_format == "iceberg" else None
        self.source = f"delta.`{self.table}`" if table_format == "delta" else f"filesink.{TABLE}"
        self.sent: list[str] = []
        self.done: Counter[str] = Counter()
        """Maintenance statements that committed, and those that lost a race ("conflict")."""

    def maintain(self) -> None:
        """One round of the other writer's maintenance (the table must exist)."""
        self.start_maintenance()
        self.end_maintenance()

    def start_maintenance(self) -> None:
        """Send a round of maintenance to Spark, which runs it while the test goes on."""
        self.sent = _maintenance(self.format, self.table)
        self.spark.send(self.sent, self.catalog)

    def end_maintenance(self) -> None:
        """Wait for the round sent and check its answers."""
        for statement, answer in zip(self.sent, self.spark.receive(), strict=True):
            kind = next(k for k in KINDS if k in statement)
            if "error" not in answer:
                self.done[kind] += 1
                continue
            assert any(c in answer["error"] for c in CONFLICTS), f"seed {self.seed}: {statement}: {answer['error']}"
            self.done["conflict"] += 1

    def rows(self) -> Counter[Any]:
        """The table's rows as deltalake / pyiceberg read them, which must be what Spark reads."""
        view = read_table(TableTarget(self.format, table=TABLE), str(self.table), None)
        ours = view.rows
        if not view.commits:  # no table yet (killed before its first commit)
            return ours
        spark = Counter(
            tuple(r) for r in self.spark.rows(f"SELECT {', '.join(COLUMNS)} FROM {self.source}", self.catalog)
        )
        assert spark == ours, (
            f"seed {self.seed}: Spark reads {sum(spark.values())} rows, the sink's reader {sum(ours.values())}"
        )
        return ours

    def exists(self) -> bool:
        return bool(read_table(TableTarget(self.format, table=TABLE), str(self.table), None).commits)


@pytest.mark.parametrize("table_format", ["delta", "iceberg"])
def test_spark_maintains_a_table_while_the_sink_streams_and_is_killed(tmp_path: Path, table_format: str) -> None:
    pytest.importorskip("deltalake" if table_format == "delta" else "pyiceberg")
    engines = engines_or_skip()
    seed = 7 if table_format == "delta" else 11
    rng = random.Random(seed)
    expected: Counter[Any] = Counter()
    parallelism = 1
    landed = 0
    with SparkSQL(engines, tmp_path / "spark.log") as spark:
        campaign = Campaign(tmp_path, table_format, spark, seed)
        for k in range(KILLS):
            expected += _input(tmp_path, range(k * PER_RUN, (k + 1) * PER_RUN), seed)  # and what a kill left
            parallelism = rng.choice([p for p in (1, 2, 3) if p != parallelism])
            proc = _start(tmp_path, table_format, parallelism)
            try:
                wait_for_line(proc, "started\n", LINE_TIMEOUT, "the line 'started'")
                for _ in range(rng.randrange(1, 3)):
                    if not readline_with_deadline(proc, LINE_TIMEOUT, "the job's next batch"):
                        break
                maintaining = campaign.exists()
                if maintaining:  # while the job runs: its rolls, the maintenance and the kill interleave
                    campaign.start_maintenance()
                for _ in range(rng.randrange(0, 3)):
                    if not readline_with_deadline(proc, LINE_TIMEOUT, "the job's next batch"):
                        break
                time.sleep(rng.uniform(0.0, 1.5))
                landed += proc.poll() is None  # else it ran to the end of its input first
            finally:
                kill_process(proc, group=True, timeout=60)
            if maintaining:
                campaign.end_maintenance()
            got = campaign.rows()
            _lost, duplicated, unexpected = compare(expected, got)
            assert (duplicated, unexpected) == (0, 0), (
                f"seed {seed}: after kill {k + 1} the table has {duplicated} rows twice, {unexpected} unexpected"
            )
        proc = _start(tmp_path, table_format, rng.choice([1, 2, 3]))
        _to_the_end(proc, tmp_path, f"seed {seed}: the run to the end of the input")
        campaign.maintain()
        assert campaign.rows() == expected, f"seed {seed}: after the run to the end and a maintenance"
        before = read_table(TableTarget(table_format, table=TABLE), str(tmp_path / "table"), None)
        expected += _input(tmp_path, range(KILLS * PER_RUN, KILLS * PER_RUN + MORE), seed)
        proc = _start(tmp_path, table_format, 2)
        _to_the_end(proc, tmp_path, f"seed {seed}: the run over more input, after the other writer's commits")
        after = read_table(TableTarget(table_format, table=TABLE), str(tmp_path / "table"), None)
        assert len(after.commits) > len(before.commits), f"seed {seed}: the sink committed nothing after maintenance"
        got = campaign.rows()
        if table_format == "delta":
            [history] = spark.ask([f"DESCRIBE HISTORY delta.`{tmp_path / 'table'}`"])
            operations = Counter(row[history["columns"].index("operation")] for row in history["rows"])
        else:
            snapshots = spark.rows(f"SELECT operation FROM filesink.{TABLE}.snapshots", campaign.catalog)
            operations = Counter(row[0] for row in snapshots)
    assert got == expected, f"seed {seed}: {compare(expected, got)} (lost, duplicated, unexpected) at the end"
    figures = {"seed": seed, "kills": landed, **campaign.done, "operations": dict(operations)}
    print(json.dumps(figures))
    assert landed >= KILLS // 2, f"seed {seed}: only {landed} of {KILLS} kills landed while the job ran"
    assert campaign.done["OPTIMIZE" if table_format == "delta" else "rewrite_data_files"] >= 1
    assert operations["OPTIMIZE" if table_format == "delta" else "replace"] >= 1, operations


ROLL_JOB = SUPPORT / "engine_roll_job.py"


def test_vacuum_with_no_retention_during_a_roll(tmp_path: Path) -> None:
    """The sink stopped between a roll's write and the table's commit (the failpoint ``filesink.table.before``), and
    Spark's ``VACUUM ... RETAIN 0 HOURS`` deletes the roll's files, which the table does not hold yet. Resumed, the
    sink refuses the commit (``TableCommitFailedError`` naming the objects) rather than commit files that are gone;
    killed instead, it commits nothing. Either way the next start writes the roll again from the log store: every
    row once, as deltalake and Spark read the table. (Before the sink checked its objects, the resumed sink
    committed the deleted files: every reader failed on a missing file, and the log store was truncated past
    their rows.)"""
    pytest.importorskip("deltalake")
    engines = engines_or_skip()
    with SparkSQL(engines, tmp_path / "spark.log") as spark:
        for resumed in (True, False):
            _vacuum_during_a_roll(spark, tmp_path / ("resumed" if resumed else "killed"), resumed=resumed)


def _vacuum_during_a_roll(spark: SparkSQL, root: Path, *, resumed: bool) -> None:
    table = root / "table"
    job = [sys.executable, str(ROLL_JOB), str(table), str(root / "state"), "delta"]
    first = run([*job, "0", "2"], LINE_TIMEOUT, "the first roll", env=support_env(), capture_output=True, text=True)
    assert first.returncode == 0, first.stderr[-3000:]
    shared = root / "failpoints"
    shared.mkdir()
    env = support_env(**{ENV_VAR: "filesink.table.before=stop@once", DIR_VAR: str(shared)})
    proc = subprocess.Popen([*job, "2", "2"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: bool(fired(str(shared))), LINE_TIMEOUT, "the roll to stop before its commit", proc=proc)
        pid = fired(str(shared))[0][1]
        wait_until(lambda: process_state(pid) == "T", 60, "the job to stop", proc=proc)
        before = {p.relative_to(table) for p in table.rglob("*.parquet")}
        [vacuum] = spark.ask([f"VACUUM delta.`{table}` RETAIN 0 HOURS"])
        assert "error" not in vacuum, vacuum["error"]
        held = set(read_table(TableTarget("delta"), str(table), None).files)
        deleted = {str(p) for p in before - {p.relative_to(table) for p in table.rglob("*.parquet")}}
        assert deleted and not deleted & held, f"VACUUM deleted {deleted}; the table holds {held}"
        if resumed:
            os.kill(pid, signal.SIGCONT)
            _out, err = communicate(proc, LINE_TIMEOUT, "the resumed roll")
            assert proc.returncode != 0 and "TableCommitFailedError" in err, err[-3000:]
            assert "no longer in" in err and sorted(deleted)[0] in err, err[-3000:]
        else:
            kill_process(proc)
    finally:
        kill_process(proc)
    again = run([*job, "4", "1"], LINE_TIMEOUT, "the next start", env=support_env(), capture_output=True, text=True)
    assert again.returncode == 0 and again.stdout.endswith("done\n"), again.stderr[-3000:]
    expected = Counter(r for e in range(5) for r in batch_rows(e, 40))
    got = read_table(TableTarget("delta"), str(table), None).rows
    assert got == expected, f"{'resumed' if resumed else 'killed'}: {compare(expected, got)}"
    spark_rows = spark.rows(f"SELECT {', '.join(COLUMNS)} FROM delta.`{table}`")
    assert Counter(tuple(r) for r in spark_rows) == expected
