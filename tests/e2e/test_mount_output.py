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
from collections import Counter
from pathlib import Path

import pytest
import run_server
from checker import check
from helpers import run
from mounts import bind, remount, tmpfs
from sink_helpers import append_epoch, batch_rows, input_file, read_duckdb, read_pyarrow, run_query

from filesink import ExactlyOnceParquetSink, FileWriteError, Rollover, SinkOptionError
from filesink.output import OutputLocation
from filesink.output.location import OUTPUT_STAGING, STAGING_SUFFIX
from logstore import LogStore

pytestmark = pytest.mark.timeout(600)

EVERY_TWO = Rollover(target_file_size=None, max_age_seconds=None, max_epochs=2)
"""A file every two epochs: files are published by Spark tasks while the query runs."""
HOLD = Rollover(target_file_size=None, max_age_seconds=None, max_epochs=1000)
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
    # renamed into the output), as pyarrow and DuckDB do (tests/filesink/output/test_staging.py).
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
    return run_server.filesink(["run", *map(str, args)], 300)


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


def test_a_sink_wedged_by_staging_on_another_file_system_recovers(tmp_path, monkeypatch):
    """What earlier versions did with an output that is a mount point: temp files next to it, on the parent's file
    system, so the first publish failed with EXDEV after its epochs were sealed, the file left pending. A start
    of this version (``filesink recover apply``, then the sink) fences that staging place, drops the pending
    file, writes it again from the log store, and the output is exact."""
    out, state = tmp_path / "out", tmp_path / "state"
    expected: Counter = Counter()
    with tmpfs(out):
        with monkeypatch.context() as old_version:
            legacy = OutputLocation(str(out), {}, staging_dir=str(tmp_path / f".out{STAGING_SUFFIX}"))
            old_version.setattr(OutputLocation, "of_sink", classmethod(lambda cls, *args: legacy))
            old_version.setattr(OutputLocation, "checked", lambda self: self)
            sink = ExactlyOnceParquetSink(str(out), state, vnodes=8, rollover=HOLD)
            for epoch in range(2):
                rows = batch_rows(epoch, 40, seed=6)
                expected.update(rows)
                append_epoch(sink, epoch, rows)
            with pytest.raises(FileWriteError, match="Invalid cross-device link"):
                sink.flush()
            assert sink.ledger.pending_names(), "the file is pending, its epochs sealed"
            sink._state_lock.release()  # the driver stops here, as if killed: its term's staging stays
            sink.log_store.close()
        assert (tmp_path / f".out{STAGING_SUFFIX}" / f"term-{sink.term:010d}").is_dir()
        assert list(out.glob("*.parquet")) == [], "nothing was published"

        done = run(
            [sys.executable, "-m", "filesink", "recover", "apply", "--state-dir", str(state), "--json"],
            120,
            "filesink recover apply",
            capture_output=True,
            text=True,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        applied = json.loads(done.stdout)
        assert [f["action"] for f in applied["files"]] == ["drop"] and applied["fenced"] == 1, applied
        assert not (tmp_path / f".out{STAGING_SUFFIX}").exists(), "the old staging place is gone"
        with ExactlyOnceParquetSink(str(out), state, vnodes=8, rollover=HOLD) as sink:
            rows = batch_rows(2, 40, seed=6)
            expected.update(rows)
            append_epoch(sink, 2, rows)
            sink.flush()
        report = check(str(out), None, expected)
        assert report.anomalies == 0, report.line()


def test_a_staging_directory_that_is_a_mount_of_its_own_is_refused(tmp_path):
    """No staging place works (``_filesink_staging`` is mounted over): the sink refuses before opening any state."""
    out, state = tmp_path / "out", tmp_path / "state"
    with tmpfs(out / OUTPUT_STAGING):
        with pytest.raises(SinkOptionError) as refused:
            ExactlyOnceParquetSink(str(out), state, vnodes=8, rollover=HOLD)
        message = str(refused.value)
        assert str(out / OUTPUT_STAGING) in message and "Invalid cross-device link" in message, message
        assert not (state / "state.sqlite").exists()
    rows = batch_rows(0, 30, seed=8)  # unmounted: the user's fix
    with ExactlyOnceParquetSink(str(out), state, vnodes=8, rollover=HOLD) as sink:
        append_epoch(sink, 0, rows)
        sink.flush()
    assert read_pyarrow(str(out)) == Counter(rows)
