"""A roll's files deleted between their write and the table's commit, as another writer's clean-up of the files a
table does not hold deletes them (Delta's ``VACUUM`` with a short retention, Iceberg's ``remove_orphan_files`` with a
recent ``older_than``): the sink refuses the commit (``TableCommitFailedError`` naming the objects) instead of
committing files that are gone, and the next start writes them again from the log store: every row once.

The sink runs as a subprocess (``engine_roll_job.py``, without Spark) stopped by the failpoint
``filesink.table.before`` (after the write, before the commit); the test deletes what the table does not hold, then
lets it go on. ``tests/e2e/test_tables_spark_writers.py`` does the same with Spark's own ``VACUUM`` (chaos tier)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from helpers import SUPPORT, communicate, kill, process_state, run, support_env, wait_until
from sink_helpers import batch_rows
from table_checker import TableTarget, data_objects, read_table

from logstore.failpoints import DIR_VAR, ENV_VAR, fired

JOB = SUPPORT / "engine_roll_job.py"
DEADLINE = 120.0


@pytest.mark.parametrize("table_format", ["delta", "iceberg"])
def test_a_rolls_files_deleted_before_the_commit_are_written_again(tmp_path: Path, table_format: str) -> None:
    pytest.importorskip("deltalake" if table_format == "delta" else "pyiceberg")
    from engine_tables import TABLE

    table = tmp_path / "table"
    target = TableTarget(table_format, table=TABLE)
    job = [sys.executable, str(JOB), str(table), str(tmp_path / "state"), table_format]
    first = run([*job, "0", "2"], DEADLINE, "the first roll", env=support_env(), capture_output=True, text=True)
    assert first.returncode == 0, first.stderr[-3000:]
    shared = tmp_path / "failpoints"
    shared.mkdir()
    env = support_env(**{ENV_VAR: "filesink.table.before=stop@once", DIR_VAR: str(shared)})
    proc = subprocess.Popen([*job, "2", "2"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: bool(fired(str(shared))), DEADLINE, "the roll to stop before its commit", proc=proc)
        pid = fired(str(shared))[0][1]
        wait_until(lambda: process_state(pid) == "T", 60, "the job to stop", proc=proc)
        held = set(read_table(target, str(table), None).files)
        outside = sorted(set(data_objects(target, str(table), None)) - held)
        assert outside, "the stopped roll's files are in the directory, not yet in the table"
        for key in outside:  # what a clean-up of the files the table does not hold deletes
            (table / key).unlink()
        os.kill(pid, signal.SIGCONT)
        _out, err = communicate(proc, DEADLINE, "the resumed roll")
    finally:
        kill(proc)
    assert proc.returncode != 0 and "TableCommitFailedError" in err, err[-3000:]
    assert "no longer in" in err and outside[0] in err, err[-3000:]
    assert set(read_table(target, str(table), None).files) == held, "nothing was committed"
    again = run([*job, "4", "1"], DEADLINE, "the next start", env=support_env(), capture_output=True, text=True)
    assert again.returncode == 0 and again.stdout.endswith("done\n"), again.stderr[-3000:]
    expected = Counter(r for epoch in range(5) for r in batch_rows(epoch, 40))
    assert read_table(target, str(table), None).rows == expected
