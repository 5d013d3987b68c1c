"""Types that Spark's type strings do not tell apart, and key columns Spark cannot hash: nothing wedges a sink.

Before the admission checks, a session time zone that changed between runs, or an ``array<int>`` whose element
nullability changed, sealed the epoch and then failed every file at every roll; a map column in the default keys
failed batch 0 with a raw AnalysisException, and the state directory could not be reopened with other keys.
"""

from __future__ import annotations

import datetime
from collections import Counter

import pyarrow as pa
import pyarrow.dataset as ds
import pytest
from pyspark.sql import functions as F
from pyspark.sql import types as T

from filesink import ExactlyOnceParquetSink, Rollover, SchemaMismatchError, SinkOptionError
from filesink.admission import Admission, Refusal
from filesink.schema import conformable, file_schema
from logstore import NOTHING, VNODE_COLUMN

HOLD = Rollover(target_file_size=None, max_age_seconds=None, max_epochs=1000)
UTC = datetime.UTC


def _sink(tmp_path, **options):
    return ExactlyOnceParquetSink(
        str(tmp_path / "out"), tmp_path / "state", vnodes=8, parallelism=2, rollover=HOLD, **options
    )


def _read(path) -> pa.Table:
    return ds.dataset(str(path), format="parquet").to_table()


def test_session_time_zone_that_changes_between_runs(spark, tmp_path):
    instants = [datetime.datetime(2024, 3, 1, 12, 0, i, 250_000, tzinfo=UTC) for i in range(6)]
    schema = "id long, ts timestamp"
    zone = spark.conf.get("spark.sql.session.timeZone")
    try:
        spark.conf.set("spark.sql.session.timeZone", "UTC")
        with _sink(tmp_path) as sink:
            sink(spark.createDataFrame([(i, t) for i, t in enumerate(instants[:3])], schema), 0)
            assert sink.stats.files_committed == 0  # held in the log store across the restart
        spark.conf.set("spark.sql.session.timeZone", "Asia/Tokyo")
        with _sink(tmp_path) as sink:
            sink(spark.createDataFrame([(i + 3, t) for i, t in enumerate(instants[3:])], schema), 1)
            segments = sink.log_store.segments(1)
            sink.flush()
            assert sink.stats.files_committed >= 1
        assert segments, "epoch 1 was sealed"
    finally:
        spark.conf.set("spark.sql.session.timeZone", zone)
    table = _read(tmp_path / "out")
    assert table.schema.field("ts").type == pa.timestamp("us", tz="UTC")  # the zone recorded with the first batch
    got = Counter(zip(table["id"].to_pylist(), table["ts"].to_pylist(), strict=True))
    assert got == Counter(enumerate(instants))


def test_array_whose_element_nullability_changes(spark, tmp_path):
    ids = spark.range(4)
    without_nulls = ids.select("id", F.array(F.col("id").cast("int")).alias("xs"))
    with_nulls = ids.select("id", F.array(F.col("id").cast("int"), F.lit(None).cast("int")).alias("xs"))
    assert not without_nulls.schema["xs"].dataType.containsNull
    assert with_nulls.schema["xs"].dataType.containsNull
    with _sink(tmp_path) as sink:
        sink(without_nulls, 0)
    with _sink(tmp_path) as sink:  # a restart, as when the query's code changed
        sink(with_nulls, 1)
        sink(without_nulls, 2)
        sink.flush()
    table = _read(tmp_path / "out")
    got = Counter((i, tuple(xs)) for i, xs in zip(table["id"].to_pylist(), table["xs"].to_pylist(), strict=True))
    expected = Counter((i, (i,)) for i in range(4)) + Counter((i, (i, None)) for i in range(4))
    expected += Counter((i, (i,)) for i in range(4))
    assert got == expected


def test_map_column_with_default_keys(spark, tmp_path):
    df = spark.createDataFrame(
        [(i, {"a": i, "b": None}) for i in range(20)], "id long, attrs map<string, int>"
    ).repartition(3)
    with _sink(tmp_path) as sink:
        sink(df, 0)
        sink.flush()
    table = _read(tmp_path / "out")
    got = Counter(
        (i, tuple(sorted(m))) for i, m in zip(table["id"].to_pylist(), table["attrs"].to_pylist(), strict=True)
    )
    assert got == Counter((i, (("a", i), ("b", None))) for i in range(20))


def test_only_map_columns_with_default_keys(spark, tmp_path):
    df = spark.createDataFrame([({"k": i},) for i in range(10)], "m map<string, long>")
    with _sink(tmp_path) as sink:
        sink(df, 0)
        sink.flush()
    table = _read(tmp_path / "out")
    assert Counter(tuple(m) for m in table["m"].to_pylist()) == Counter((("k", i),) for i in range(10))


def test_map_key_column_refused_then_other_keys(spark, tmp_path):
    df = spark.createDataFrame([(i, {"a": i}) for i in range(10)], "id long, attrs map<string, int>")
    sink = _sink(tmp_path, key_columns=["attrs"])
    try:
        with pytest.raises(SinkOptionError, match=r"key_columns names attrs \(map<string,int>\).*cannot hash a map"):
            sink.check_schema(df.schema)
        with pytest.raises(SinkOptionError, match="attrs"):
            sink(df, 0)
        assert sink.log_store.last_sealed_epoch == NOTHING
        assert list(sink.log_store.storage.list_files()) == [] or all(
            not name.startswith("epoch") for name, _ in sink.log_store.storage.list_files()
        )
    finally:
        sink.close()
    with _sink(tmp_path, key_columns=["id"]) as sink:  # the user's fix: other keys, same state directory
        sink(df, 0)
        sink.flush()
    table = _read(tmp_path / "out")
    assert Counter(table["id"].to_pylist()) == Counter(range(10))
    with pytest.raises(SinkOptionError, match="key_columns"):
        _sink(tmp_path, key_columns=["attrs"])  # once something is sealed, the keys are kept for life


def test_schema_may_change_until_something_is_sealed(tmp_path):
    first = T.StructType(
        [T.StructField("id", T.LongType()), T.StructField("m", T.MapType(T.StringType(), T.LongType()))]
    )
    second = T.StructType([T.StructField("id", T.LongType()), T.StructField("name", T.StringType())])
    with _sink(tmp_path, key_columns=["m"]) as sink, pytest.raises(SinkOptionError):
        sink.check_schema(first)
    with _sink(tmp_path) as sink:
        sink.check_schema(first)
        sink.check_schema(second)  # nothing sealed: the query's schema may still change
        assert sink.recorded_spark_schema() == [("id", "bigint"), ("name", "string")]
        sink.log_store.seal(0, [])
        with pytest.raises(SchemaMismatchError, match="name \\(string\\) is missing"):
            sink.check_schema(first)


def test_admission_conforms_or_refuses():
    recorded = file_schema(
        pa.schema([("ts", pa.timestamp("us", tz="UTC")), ("xs", pa.list_(pa.field("element", pa.int32(), False)))])
    )
    assert recorded.field("xs").type.value_field.nullable
    admission = Admission(5, bytes(recorded.serialize().to_pybytes()))
    batch = pa.record_batch(
        [
            pa.array([0], pa.timestamp("us", tz="Asia/Tokyo")),
            pa.array([[1, None]], pa.list_(pa.field("element", pa.int32()))),
            pa.array([3], pa.int32()),
        ],
        names=["ts", "xs", VNODE_COLUMN],
    )
    [admitted] = admission.admit([batch])
    assert admitted.schema.names == ["ts", "xs", VNODE_COLUMN]
    assert admitted.schema.field("ts").type == pa.timestamp("us", tz="UTC")
    assert admitted.column("ts").to_pylist() == batch.column("ts").to_pylist()  # the same instants
    assert admitted.column("xs").to_pylist() == [[1, None]]

    wrong = pa.record_batch(
        [pa.array([0], pa.timestamp("us")), batch.column("xs"), batch.column(VNODE_COLUMN)],
        names=["ts", "xs", VNODE_COLUMN],
    )
    with pytest.raises(Refusal, match=r"batch 5 have column 'ts' of type timestamp\[us\], the sink schema says"):
        admission.admit([wrong])
    assert not conformable(pa.timestamp("ms", tz="UTC"), pa.timestamp("us", tz="UTC"))
    assert not conformable(pa.list_(pa.int64()), pa.list_(pa.int32()))
    assert conformable(pa.struct([pa.field("a", pa.int32(), False)]), pa.struct([("a", pa.int32())]))
