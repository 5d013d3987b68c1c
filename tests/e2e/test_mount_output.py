"""An output directory that is a mount point (its own disk: the common case) or a bind mount, with real Spark
queries. A local output's temp files must be renamed into it, which fails across file systems and across mounts
(``EXDEV``), so the sink stages on the output's own file system (``<output>/_filesink_staging``, which readers
skip) and checks at start that a rename works. An output it cannot write is refused before anything is sealed;
once it is writable, the query resumes and the output is exact."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from checker import check
from helpers import run
from mounts import bind, remount, tmpfs
from sink_helpers import input_file, read_duckdb, read_pyarrow, run_query

from filesink import ExactlyOnceParquetSink, Rollover, SinkOptionError
from filesink.output.location import OUTPUT_STAGING
from logstore import LogStore

pytestmark = pytest.mark.timeout(600)

EVERY_TWO = Rollover(target_file_size=None, max_age_seconds=None, max_epochs=2)
"""A file every two epochs: files are published by Spark tasks while the query runs."""
FAST_START = "spark.driver.extraJavaOptions=-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


def _sink(out: Path, state: Path) -> ExactlyOnceParquetSink:
    keys = ["user_id"]
    return ExactlyOnceParquetSink(str(out), state, key_columns=keys, vnodes=16, parallelism=2, rollover=EVERY_TWO)


def _query_twice(spark, out: Path, tmp_path: Path) -> None:
    """Two runs of a query (a restart between them) into ``out``; the output is exact, with nothing but the
    sink's files and claim in it, and no temp file left in its staging directory."""
    source, checkpoint, state = tmp_path / "in", tmp_path / "checkpoint", tmp_path / "state"
    expected = input_file(source, 0) + input_file(source, 1) + input_file(source, 2)
    with _sink(out, state) as sink:
        assert sink.output.local_staging() == out / OUTPUT_STAGING
        assert run_query(spark, sink, source, checkpoint) is None
        assert sink.stats.files_committed >= 1, "files were published while the query ran"
        sink_id = sink.log_store.sink_id
    expected += input_file(source, 3)
    with _sink(out, state) as sink:
        assert run_query(spark, sink, source, checkpoint) is None
        sink.flush()
    report = check(str(out), None, expected, sink_id=sink_id)
    assert report.anomalies == 0, report.line()
    assert [p.relative_to(out).as_posix() for p in (out / OUTPUT_STAGING).rglob("*")] == []
    # Spark reads the output as it is, and skips a whole temp file in the staging directory (one about to be
    # renamed into the output), as pyarrow and DuckDB do (tests/filesink/test_staging.py).
    [first, *_] = sorted(out.glob("part-*.parquet"))
    staged = out / OUTPUT_STAGING / "term-0000000099"
    staged.mkdir()
    shutil.copy(first, staged / f".{first.stem}.00000.attempt.tmp")
    assert spark.read.parquet(str(out)).count() == sum(expected.values())
    shutil.rmtree(staged)
    assert not (state / "staging").exists() or list((state / "staging").iterdir()) == []
    done = run(
        [sys.executable, "-m", "filesink", "recover", "plan", "--state-dir", str(state), "--json"],
        120,
        "filesink recover plan",
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0 and json.loads(done.stdout)["nothing_to_do"] is True, done.stdout + done.stderr


def test_a_query_writes_exactly_into_an_output_that_is_a_mount_point(spark, tmp_path):
    out = tmp_path / "out"
    with tmpfs(out):
        assert os.stat(out).st_dev != os.stat(tmp_path).st_dev, "the output is a file system of its own"
        _query_twice(spark, out, tmp_path)


def test_a_query_writes_exactly_into_a_bind_mounted_output(spark, tmp_path):
    """A bind mount of a directory on the state directory's file system (a container's volume): the same device
    number, yet renames from the state directory's staging fail with EXDEV. The start-up probe notices."""
    out = tmp_path / "out"
    with bind(tmp_path / "volume", out):
        (tmp_path / "state").mkdir()
        assert os.stat(out).st_dev == os.stat(tmp_path / "state").st_dev
        _query_twice(spark, out, tmp_path)
    assert not (tmp_path / "state" / "staging").exists(), "the failed probe leaves no staging directory"


def _filesink_run(tmp_path: Path, out: Path) -> subprocess.CompletedProcess[str]:
    args = ["--input", tmp_path / "in", "--output", out, "--state-dir", tmp_path / "state", "--available-now"]
    args += ["--key", "user_id", "--parallelism", "2", "--conf", FAST_START]
    return run(
        [sys.executable, "-m", "filesink", "run", *map(str, args)],
        300,
        "filesink run",
        capture_output=True,
        text=True,
    )


def test_a_read_only_output_is_refused_before_anything_is_sealed_then_the_run_resumes(tmp_path):
    out = tmp_path / "out"
    expected = input_file(tmp_path / "in", 0) + input_file(tmp_path / "in", 1)
    with tmpfs(out):
        remount(out, "ro")
        done = _filesink_run(tmp_path, out)
        assert done.returncode == 1, done.stdout + done.stderr
        assert "Traceback" not in done.stderr, done.stderr
        [line] = [x for x in done.stderr.splitlines() if x.startswith("error: ")]
        assert str(out) in line and "Read-only file system" in line and "mounted read-write" in line, line
        assert not (tmp_path / "state" / "state.sqlite").exists(), "no state was made, nothing sealed"
        assert not (tmp_path / "state" / "log").exists()
        with pytest.raises(SinkOptionError, match="cannot be renamed into it"):
            ExactlyOnceParquetSink(str(out), tmp_path / "state")

        remount(out, "rw")  # the user's fix
        done = _filesink_run(tmp_path, out)
        assert done.returncode == 0, done.stdout + done.stderr
        assert read_pyarrow(str(out)) == expected
        assert read_duckdb(str(out)) == expected
        store = LogStore.open_existing(tmp_path / "state", readonly=True)
        try:
            assert store.last_sealed_epoch >= 0
        finally:
            store.close()
