"""The sink through Spark, in local mode: exact multisets of rows read back by DuckDB and pyarrow."""

from __future__ import annotations

from collections import Counter

import pytest
from helpers import wait_until
from sink_helpers import batch_df, batch_rows, parquet_files, read_duckdb, read_pyarrow

from filesink import (
    CheckpointMismatchError,
    ExactlyOnceParquetSink,
    Rollover,
    SchemaMismatchError,
    SinkFailedError,
    SinkLockedError,
    SinkOptionError,
)
from filesink.output.location import SHARED_PREFIX
from logstore.failpoints import ENV_VAR, FailpointError
from logstore.store import NOTHING

NO_AGE = Rollover(target_file_size=None, max_age_seconds=None, max_epochs=1000)


def _sink(path, tmp_path, partition_by=None):
    """A sink on ``path`` with its state in ``tmp_path / "state"``: 8 vnodes, 2 writers, no age rule."""
    return ExactlyOnceParquetSink(
        path, tmp_path / "state", vnodes=8, parallelism=2, rollover=NO_AGE, partition_by=partition_by
    )


@pytest.fixture(params=["local", "s3"])
def output(request, tmp_path):
    """(output path, storage options) on local disk and on the S3 test server."""
    if request.param == "local":
        return str(tmp_path / "out"), None
    return request.getfixturevalue("s3_prefix") + "/table", request.getfixturevalue("s3_options")


def _run(sink, spark, batches, first=0, seed=0):
    expected = Counter()
    for b in range(first, first + batches):
        rows = batch_rows(b, 200, seed)
        sink(batch_df(spark, rows), b)
        expected.update(rows)
    return expected


def test_every_row_exactly_once_for_duckdb_and_pyarrow(spark, tmp_path, output):
    path, options = output
    sink = ExactlyOnceParquetSink(
        path,
        tmp_path / "state",
        key_columns=["user_id"],
        vnodes=16,
        parallelism=2,
        rollover=Rollover(target_file_size=None, max_epochs=3, max_age_seconds=None),
        storage_options=options,
    )
    expected = _run(sink, spark, 7)
    sink.flush()
    sink.close()
    assert read_pyarrow(path, options) == expected
    assert read_duckdb(path, options) == expected
    files = parquet_files(path, options)
    assert files and all(f.endswith(".parquet") and "/" not in f for f in files), files
    # 7 epochs at max_epochs=3 and 2 writers: epochs 0-2, 3-5, then the flush of 6, per writer
    assert len(files) == 6


def test_partitioned_output(spark, tmp_path, output):
    path, options = output
    sink = ExactlyOnceParquetSink(
        path,
        tmp_path / "state",
        key_columns=["user_id"],
        vnodes=8,
        parallelism=2,
        partition_by=["event_date"],
        rollover=NO_AGE,
        storage_options=options,
    )
    expected = _run(sink, spark, 3)
    sink.flush()
    sink.close()
    assert read_pyarrow(path, options, ("event_date",)) == expected
    assert read_duckdb(path, options, ("event_date",)) == expected
    dirs = {f.split("/")[0] for f in parquet_files(path, options)}
    assert dirs == {"event_date=2024-01-01", "event_date=2024-01-02", "event_date=2024-01-03"}


def test_replayed_batch_adds_no_duplicates(spark, tmp_path, monkeypatch):
    path = str(tmp_path / "out")
    sink = ExactlyOnceParquetSink(path, tmp_path / "state", vnodes=8, parallelism=2, rollover=NO_AGE)
    expected = _run(sink, spark, 2)
    # Crash after seal, before Spark records the batch: Spark runs batch 2 again after the restart.
    rows = batch_rows(2, 200)
    monkeypatch.setenv(ENV_VAR, "logstore.seal.after_commit=raise")
    with pytest.raises(FailpointError):
        sink(batch_df(spark, rows), 2)
    monkeypatch.delenv(ENV_VAR)
    sink.close()
    sink = ExactlyOnceParquetSink(path, tmp_path / "state", vnodes=8, parallelism=2, rollover=NO_AGE)
    sink(batch_df(spark, rows), 2)
    sink(batch_df(spark, rows), 2)  # and once more, as Spark would after a second crash
    expected.update(rows)
    sink.flush()
    sink.close()
    assert read_pyarrow(path) == expected


def test_checkpoint_reset_and_second_query_are_refused(spark, tmp_path):
    path = str(tmp_path / "out")
    sink = ExactlyOnceParquetSink(path, tmp_path / "state", vnodes=8, parallelism=1, rollover=NO_AGE)
    _run(sink, spark, 3)
    with pytest.raises(SinkLockedError, match=r"in use by another live sink .*pid"):
        ExactlyOnceParquetSink(path, tmp_path / "state", vnodes=8)
    with pytest.raises(CheckpointMismatchError, match="batch 0 arrived, but epoch 2 is already sealed"):
        sink(batch_df(spark, batch_rows(0, 5)), 0)
    sink.close()
    again = ExactlyOnceParquetSink(path, tmp_path / "state", vnodes=8)  # the lock went with close()
    again.close()


def test_schema_change_fails_before_anything_is_written(spark, tmp_path):
    sink = ExactlyOnceParquetSink(str(tmp_path / "out"), tmp_path / "state", vnodes=8, rollover=NO_AGE)
    _run(sink, spark, 1)
    changed = spark.createDataFrame([(1, "x", 2.0)], "id long, user_id string, extra double")
    with pytest.raises(
        SchemaMismatchError,
        match=r"event_date \(string\) is gone.*user_id changed from bigint to string.*Nothing of this batch",
    ):
        sink(changed, 1)
    assert sink.log_store.last_sealed_epoch == 0
    sink.close()


def test_repeated_column_names_are_refused_before_anything_is_written(spark, tmp_path):
    """Spark lets a query select a column twice; the sink says which names repeat, before the append."""
    sink = ExactlyOnceParquetSink(str(tmp_path / "out"), tmp_path / "state", vnodes=8, rollover=NO_AGE)
    twice = batch_df(spark, batch_rows(0, 5)).selectExpr("id", "user_id", "id", "event_date", "amount", "user_id")
    with pytest.raises(SchemaMismatchError, match=r"more than one column named 'id', 'user_id'.*Nothing of this batch"):
        sink(twice, 0)
    assert sink.log_store.last_sealed_epoch == NOTHING
    assert sink.log_store.held_totals().rows == 0
    expected = _run(sink, spark, 1)  # the query fixed: the same sink takes the batch
    sink.flush()
    assert read_pyarrow(str(tmp_path / "out")) == expected
    sink.close()


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"vnodes": 0}, "vnodes must be an integer from 1 to 32768"),
        ({"parallelism": 0}, "parallelism must be a positive integer"),
        ({"key_columns": "user_id"}, "key_columns must be a list of column names"),
        ({"partition_by": ["a", "a"]}, "partition_by lists a column twice"),
        ({"key_columns": ["__vnode"]}, "reserved"),
        ({"rollover": {"max_rows": 5}}, "rollover must be a filesink.Rollover"),
        ({"path": ""}, "path must be a local directory or an fsspec URL"),
    ],
)
def test_bad_options_are_refused(tmp_path, kwargs, match):
    args = {"path": str(tmp_path / "out"), "state_dir": tmp_path / "state", **kwargs}
    with pytest.raises(SinkOptionError, match=match):
        ExactlyOnceParquetSink(**args)


def test_key_columns_must_exist_and_config_is_kept(spark, tmp_path):
    sink = ExactlyOnceParquetSink(str(tmp_path / "out"), tmp_path / "state", key_columns=["nope"], vnodes=8)
    with pytest.raises(SinkOptionError, match=r"key_columns names columns the batch does not have: \['nope'\]"):
        sink(batch_df(spark, batch_rows(0, 3)), 0)
    sink.close()
    # Nothing was sealed: the user's fix, other key columns, is taken by the same state directory.
    sink = ExactlyOnceParquetSink(str(tmp_path / "out"), tmp_path / "state", key_columns=["id"], vnodes=8)
    sink(batch_df(spark, batch_rows(0, 3)), 0)
    sink.close()
    with pytest.raises(SinkOptionError, match="created with key_columns"):
        ExactlyOnceParquetSink(str(tmp_path / "out"), tmp_path / "state", key_columns=["user_id"], vnodes=8)


def test_rows_rule_bounds_file_sizes(spark, tmp_path):
    path = str(tmp_path / "out")
    rules = Rollover(target_file_size=None, max_rows=500, max_age_seconds=None)
    sink = ExactlyOnceParquetSink(path, tmp_path / "state", vnodes=8, parallelism=1, rollover=rules)
    expected = _run(sink, spark, 6)  # 200 rows per epoch: a file closes when the next epoch would pass 500
    assert len(parquet_files(path)) == 2  # epochs 0-1 and 2-3; 4-5 wait for epoch 6 or a flush
    sink.flush()
    sink.close()
    import pyarrow.parquet as pq

    counts = [pq.ParquetFile(tmp_path / "out" / f).metadata.num_rows for f in parquet_files(path)]
    assert counts == [400, 400, 400]
    assert read_pyarrow(path) == expected


def test_size_rule_lands_files_near_the_target(spark, tmp_path):
    path = str(tmp_path / "out")
    target = 32 * 1024
    rules = Rollover(target_file_size=target, max_age_seconds=None)
    sink = ExactlyOnceParquetSink(path, tmp_path / "state", vnodes=8, parallelism=1, rollover=rules, compression="none")
    expected = Counter()
    for b in range(60):
        rows = batch_rows(b, 100)
        sink(batch_df(spark, rows), b)
        expected.update(rows)
    sink.flush()
    sink.close()
    sizes = [(tmp_path / "out" / f).stat().st_size for f in parquet_files(path)]
    assert len(sizes) >= 5, sizes
    # Every file but the last (the flush of what was left) is size-rolled, the first by a sampled ratio.
    for size in sizes[:-1]:
        assert 0.8 * target <= size <= target, sizes
    assert read_pyarrow(path) == expected


def test_age_rule_fires_while_the_stream_is_idle(spark, tmp_path):
    path = str(tmp_path / "out")
    rules = Rollover(target_file_size=None, max_age_seconds=1.0)
    sink = ExactlyOnceParquetSink(path, tmp_path / "state", vnodes=8, parallelism=1, rollover=rules)
    expected = _run(sink, spark, 1)
    assert parquet_files(path) == []
    try:
        wait_until(lambda: parquet_files(path), 30, "the age rule to publish a file while the stream is idle")
    finally:
        sink.close()
    assert read_pyarrow(path) == expected


def test_a_real_streaming_query(spark, tmp_path):
    """foreachBatch from a file source, available-now: every input row once, then flush."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    source = tmp_path / "input"
    source.mkdir()
    expected = Counter()
    for b in range(4):
        rows = batch_rows(b, 300, seed=5)
        expected.update(rows)
        table = pa.table(dict(zip(["id", "user_id", "event_date", "amount"], zip(*rows, strict=True), strict=True)))
        pq.write_table(table, source / f"in-{b}.parquet")
    path = str(tmp_path / "out")
    sink = ExactlyOnceParquetSink(path, tmp_path / "state", key_columns=["user_id"], vnodes=16, parallelism=2)
    stream = (
        spark.readStream.schema("id long, user_id long, event_date string, amount double")
        .option("maxFilesPerTrigger", 1)
        .parquet(str(source))
    )
    query = (
        stream.writeStream.foreachBatch(sink)
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(300)
    assert query.exception() is None
    sink.flush()
    sink.close()
    assert read_duckdb(path) == expected
    assert read_pyarrow(path) == expected


@pytest.mark.parametrize("partitioned", [False, True])
@pytest.mark.parametrize(
    ("point", "visible"),
    [("filesink.precommit.after", False), ("filesink.write.after", True), ("filesink.commit.after", True)],
)
def test_restart_resolves_pending_files_by_visibility(spark, tmp_path, monkeypatch, point, visible, partitioned):
    """Fail between pre-commit and commit; the next sink commits visible files and rewinds the others."""
    path = str(tmp_path / "out")
    partition_by = ["event_date"] if partitioned else None
    parts = ("event_date",) if partitioned else ()

    sink = _sink(path, tmp_path, partition_by)
    expected = _run(sink, spark, 2)
    monkeypatch.setenv(ENV_VAR, f"{point}=raise")
    with pytest.raises(FailpointError):
        sink.flush()
    monkeypatch.delenv(ENV_VAR)
    pending = sink.ledger.pending()
    assert bool(pending) == (point != "filesink.commit.after")
    assert bool(parquet_files(path)) == visible
    sink.close()
    term = sink.term
    staging = tmp_path / "state" / "staging"
    assert list(staging.iterdir()) == [], "a closed sink leaves no staging directory"
    (staging / f"term-{term:010d}").mkdir()
    (staging / f"term-{term:010d}" / ".part-left-by-a-killed-writer.00000.x.tmp").write_bytes(b"partial")
    sink = _sink(path, tmp_path, partition_by)  # start-up recovery
    assert sink.ledger.pending() == [] and sink.term == term + 1
    assert [p.name for p in staging.iterdir()] == [f"term-{term + 1:010d}"], "killed writers' temp files go"
    [marker] = (staging / f"term-{term + 1:010d}").iterdir()
    assert marker.name.startswith(SHARED_PREFIX), "nothing but the run's marker (filesink.tasks.shared)"
    points = set(sink.log_store.truncate_points().values())
    assert points == ({1} if visible else {-1}), "visible files are committed, invisible ones rewound"
    expected.update(_run(sink, spark, 1, first=2))
    sink.flush()
    sink.close()
    assert read_pyarrow(path, None, parts) == expected
    assert read_duckdb(path, None, parts) == expected


@pytest.mark.parametrize("partitioned", [False, True])
def test_a_sink_whose_write_failed_refuses_to_go_on(spark, tmp_path, monkeypatch, partitioned):
    """A write fails after some of its objects were published: its files stay pending. The same sink object
    must not plan over their vnodes again (that wrote rows twice); a new sink's recovery resolves them."""
    path = str(tmp_path / "out")
    partition_by = ["event_date"] if partitioned else None
    parts = ("event_date",) if partitioned else ()

    sink = _sink(path, tmp_path, partition_by)
    expected = _run(sink, spark, 2)
    sink.close()
    # No Spark session yet: files are written in this process, where the failpoint applies.
    sink = _sink(path, tmp_path, partition_by)
    monkeypatch.setattr("logstore.failpoints._hits", {})  # count from here: "@2" is this process's 2nd hit
    monkeypatch.setenv(ENV_VAR, "filesink.write.publish.before=raise@2")
    with pytest.raises(FailpointError):
        sink.flush()
    monkeypatch.delenv(ENV_VAR)
    pending = [f.name for f in sink.ledger.pending()]
    assert pending and parquet_files(path), "one object was published, the write failed at the second"
    for attempt in (sink.flush, lambda: sink(batch_df(spark, batch_rows(2, 200)), 2)):
        with pytest.raises(SinkFailedError, match=pending[0]):
            attempt()
    assert sink.log_store.last_sealed_epoch == 1, "the refused batch was not appended"
    sink.close()
    sink = _sink(path, tmp_path, partition_by)
    expected.update(_run(sink, spark, 1, first=2))
    sink.flush()
    sink.close()
    assert read_pyarrow(path, None, parts) == expected


def test_a_crash_between_the_first_seal_and_recording_the_schema(spark, tmp_path, monkeypatch):
    """The first seal with rows and the recording of the files' schema are two transactions; a crash between
    them, then a replay of the batch (which skips its append), must still leave the sink able to write."""
    path = str(tmp_path / "out")
    sink = ExactlyOnceParquetSink(path, tmp_path / "state", vnodes=8, parallelism=2, rollover=NO_AGE)
    rows = batch_rows(0, 200)
    monkeypatch.setenv(ENV_VAR, "logstore.seal.after_commit=raise")
    with pytest.raises(FailpointError):
        sink(batch_df(spark, rows), 0)
    monkeypatch.delenv(ENV_VAR)
    sink.close()
    sink = ExactlyOnceParquetSink(path, tmp_path / "state", vnodes=8, parallelism=2, rollover=NO_AGE)
    sink(batch_df(spark, rows), 0)  # the replay: sealed already, so not appended again
    sink.flush()
    sink.close()
    assert read_pyarrow(path) == Counter(rows)
