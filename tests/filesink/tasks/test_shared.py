"""The check that the executors see the driver's local log store and output (filesink.tasks.shared): what a task finds,
and what the sink does when a task of its append or of its file writes does not see them.

In local mode the executors are the driver's machine, so a task that "does not see" the driver's directories is made
by changing what is at the path (the term record's nonce, the marker). A real cluster whose workers do not share the
driver's disk: tests/e2e/test_cluster_shared.py."""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from pathlib import Path

import pytest
from sink_helpers import batch_df, batch_rows, parquet_files, read_duckdb, read_pyarrow

from filesink import ExactlyOnceParquetSink, Rollover
from filesink.errors import NotSharedError, SinkFailedError
from filesink.output import (
    OutputLocation,
    find_output_garbage,
    prepare_staging,
    release_staging,
    remove_output_garbage,
)
from filesink.output.fencing import term_staging
from filesink.output.location import SHARED_PREFIX
from filesink.tasks.shared import on_cluster, shared_dirs
from logstore import LogLocation, LogStore
from logstore.home import term_path
from logstore.store import NOTHING

NO_AGE = Rollover(target_file_size=None, max_age_seconds=None, max_epochs=1000)


def _started(tmp_path: Path, term_at_least: int = 0) -> tuple[LogStore, OutputLocation, int]:
    """A log store under ``tmp_path / "state"`` with a run's term taken, and a local output with its staging."""
    store = LogStore.open(tmp_path / "state", vnodes=4)
    output = OutputLocation(str(tmp_path / "out"))
    term = store.home.take_term(term_at_least)
    prepare_staging(output, term)
    return store, output, term


def test_the_tasks_check_passes_once_per_process(tmp_path):
    store, output, term = _started(tmp_path)
    try:
        check = shared_dirs(store, output, term)
        assert check is not None
        record = store.home.read(term_path(term))
        assert check.log_nonce == record["nonce"] and check.log == store.target.location
        marker = Path(check.marker or "")
        assert marker.parent == term_staging(output, term) and marker.name.startswith(SHARED_PREFIX)
        assert marker.is_file() and check.output == str(tmp_path / "out")
        assert check.problem() is None
        marker.unlink()
        assert check.problem() is None, "a passed check is remembered in the process (one read per worker)"
        assert dataclasses.replace(check, marker=str(marker.with_name("other"))).problem() is not None
    finally:
        store.close()


def test_a_log_store_that_is_not_the_drivers(tmp_path):
    store, output, term = _started(tmp_path)
    try:
        check = shared_dirs(store, output, term)
        assert check is not None
        elsewhere = tmp_path / "executor-disk"  # what an executor's own disk holds at the path: nothing
        elsewhere.mkdir()
        empty = dataclasses.replace(check, log=LogLocation(str(elsewhere)))
        message = empty.problem()
        assert message is not None
        assert f"the log store {elsewhere} is a local directory" in message
        record = f"{elsewhere}/{term_path(term)}"
        assert f"this run's writer term record {record}, which the driver created, is not there" in message
        assert "must be shared storage, such as s3://bucket/prefix (log_store=, filesink run --log-store)" in message
        assert "filesink recover move-log-store" in message
        # another run's record at the same path: the nonce tells it apart
        (elsewhere / term_path(term)).parent.mkdir(parents=True)
        (elsewhere / term_path(term)).write_text(json.dumps({"term": term, "nonce": "another run"}))
        message = empty.problem()
        assert message is not None and "holds another run's nonce. On a cluster" in message
    finally:
        store.close()


def test_an_output_that_is_not_the_drivers(tmp_path):
    store, output, term = _started(tmp_path)
    try:
        check = shared_dirs(store, output, term)
        assert check is not None and check.marker is not None
        unseen = dataclasses.replace(check, marker=check.marker.replace(SHARED_PREFIX, SHARED_PREFIX + "x"))
        message = unseen.problem()
        assert message is not None
        staging = term_staging(output, term)
        assert f"the output {tmp_path / 'out'} is a local directory" in message
        assert f"which the driver created in this run's staging directory {staging}" in message
        assert "is not there" in message and "or write the output to s3://bucket/table" in message
    finally:
        store.close()


def test_a_fenced_run_is_left_to_its_fencing(tmp_path):
    """A newer run pruned this run's term record and renamed its staging directory away: the markers are gone, but
    the store is shared, so the check passes and the run's fence checks say what happened (FencedError)."""
    store, output, term = _started(tmp_path)
    try:
        check = shared_dirs(store, output, term)
        assert check is not None and check.marker is not None
        gone = dataclasses.replace(check, marker=check.marker + ".gone", log_nonce="pruned")
        assert gone.problem() is not None
        store.home.take_term(term)  # a newer run
        assert gone.problem() is None
    finally:
        store.close()


def test_the_marker_goes_with_the_staging_directory(tmp_path):
    store, output, term = _started(tmp_path)
    try:
        check = shared_dirs(store, output, term)
        assert check is not None and check.marker is not None
        release_staging(output, term)  # a run that closes
        assert not term_staging(output, term).exists()
        crashed = store.home.take_term(term)  # a run that crashed leaves its marker
        prepare_staging(output, crashed)
        left = shared_dirs(store, output, crashed)
        assert left is not None and left.marker is not None
        newer = store.home.take_term(crashed)  # the next run's recovery finds it
        garbage = find_output_garbage(output, store.storage, store.sink_id, newer)
        assert garbage.staging_dirs == [term_staging(output, crashed)]
        assert garbage.staging_temp_files == [Path(left.marker)]
        remove_output_garbage(output, store.storage, garbage)
        assert not term_staging(output, crashed).exists(), "removed whole: the marker is no unexpected file"
    finally:
        store.close()


def test_local_masters_are_not_probed(spark):
    assert not on_cluster(spark), spark.sparkContext.master


def _rows(batch: int) -> list[tuple]:
    return batch_rows(batch, 300, seed=3)


def test_an_append_task_that_does_not_see_the_log_store_refuses_the_batch(spark, tmp_path):
    """Nothing of the batch is sealed or left in the log store; the same sink takes it once the path holds the
    driver's log store again (the check is not remembered where it failed)."""
    path = str(tmp_path / "out")
    sink = ExactlyOnceParquetSink(path, tmp_path / "state", vnodes=8, parallelism=2, rollover=NO_AGE)
    try:
        record = tmp_path / "state" / "log" / term_path(sink.term)
        driver = record.read_text()
        record.write_text(json.dumps({**json.loads(driver), "nonce": "what another disk holds"}))
        with pytest.raises(NotSharedError) as refused:
            sink(batch_df(spark, _rows(0)), 0)
        message = str(refused.value)
        assert message.startswith(f"the log store {tmp_path / 'state' / 'log'} is a local directory, and what ")
        assert "holds another run's nonce. On a cluster" in message
        assert message.endswith(
            "Nothing of batch 0 was sealed: the append tasks on that executor wrote nothing, and the segments the "
            "others wrote were deleted. Spark keeps the batch in the query's checkpoint: fix the cause and start the "
            "query again"
        )
        assert sink.log_store.last_sealed_epoch == NOTHING
        segments = [p for p in (tmp_path / "state" / "log").rglob("*.seg")]
        assert segments == [], "no segment left in the log store"
        record.write_text(driver)
        sink(batch_df(spark, _rows(0)), 0)
        sink(batch_df(spark, _rows(1)), 1)
        sink.flush()
    finally:
        sink.close()
    expected = Counter(_rows(0)) + Counter(_rows(1))
    assert read_pyarrow(path) == expected
    assert read_duckdb(path) == expected


def test_a_file_writer_that_does_not_see_the_output_writes_nothing(spark, tmp_path):
    """The roll's files stay pending, none is written; the next start resolves them and every row lands once."""
    path = str(tmp_path / "out")

    def sink() -> ExactlyOnceParquetSink:
        return ExactlyOnceParquetSink(path, tmp_path / "state", vnodes=8, parallelism=2, rollover=NO_AGE)

    first = sink()
    try:
        first(batch_df(spark, _rows(0)), 0)
        first(batch_df(spark, _rows(1)), 1)
    finally:
        first.close()
    second = sink()
    try:
        second.use_spark(spark)
        [marker] = term_staging(second.output, second.term).iterdir()
        marker.unlink()  # what an executor that does not share the output sees
        with pytest.raises(NotSharedError) as refused:
            second.flush()
        message = str(refused.value)
        assert message.startswith(f"the output {path} is a local directory, and what executor host ")
        assert f"the marker {marker.name}, which the driver created in this run's staging directory " in message
        assert "(1 more tasks found the same)" in message, "two writers, both refused"
        assert "The files of this roll stay pending (pre-committed): the next start resolves each of them" in message
        assert parquet_files(path) == [], "no file was written"
        assert len(second.ledger.pending()) == 2
        with pytest.raises(SinkFailedError):
            second(batch_df(spark, _rows(2)), 2)
    finally:
        second.close()
    third = sink()
    try:
        third(batch_df(spark, _rows(2)), 2)
        third.flush()
    finally:
        third.close()
    expected = Counter(_rows(0)) + Counter(_rows(1)) + Counter(_rows(2))
    assert read_pyarrow(path) == expected
    assert read_duckdb(path) == expected
