"""Types that Spark's type strings do not tell apart, types a Parquet file cannot hold, key columns Spark cannot
hash and column names Spark would take apart: nothing wedges a sink.

Before the admission checks, a session time zone that changed between runs, or an ``array<int>`` whose element
nullability changed, sealed the epoch and then failed every file at every roll; a map column in the default keys
failed batch 0 with a raw AnalysisException, and the state directory could not be reopened with other keys. So did,
until they were refused before the append, an ``interval`` column or a struct without fields (sealed, then every
file failed), and a year-month interval, a struct with two fields of one name, a variant among the default keys or
a column named ``a.b`` (each failed every run of the batch in Spark with a message that named no fix).
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
from filesink.schema.conform import conformable, file_schema
from filesink.tasks.admission import Admission, Refusal
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
        with pytest.raises(SchemaMismatchError, match="name \\(string\\) is gone"):
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
    assert conformable(pa.large_string(), pa.string()) and conformable(pa.binary(), pa.large_binary())
    assert conformable(pa.large_list(pa.large_string()), pa.list_(pa.string()))
    assert not conformable(pa.string(), pa.binary()) and not conformable(
        pa.large_list(pa.int64()), pa.list_(pa.int32())
    )
    assert conformable(pa.struct([pa.field("a", pa.int32(), False)]), pa.struct([("a", pa.int32())]))


UNWRITABLE = [
    (
        "select id, make_interval(1, 2, 3, 4, 5, 6, 7) as iv from range(4)",
        r"'iv' \(interval\): an interval of months, days and microseconds, which a Parquet file cannot hold",
    ),
    ("select id, named_struct('x', make_interval(0, 1, 0, 0, 0, 0, 0)) as s from range(4)", r"'s\.x' \(interval\)"),
    (
        "select id, interval '1-2' year to month as iv from range(4)",
        r"'iv' \(interval year to month\): a year-month interval, which Spark cannot hand to Python as Arrow",
    ),
    ("select id, struct() as s from range(4)", r"'s' \(struct<>\): a struct without fields"),
    ("select id, map(id, struct()) as m from range(4)", r"'m\.value' \(struct<>\): a struct without fields"),
    (
        "select id, array(named_struct('a', 1, 'a', 2)) as xs from range(4)",
        r"'xs\.element' \(struct<a:int,a:int>\): a struct with more than one field named 'a'",
    ),
]


def test_a_batch_without_columns_is_refused_before_the_append(spark, tmp_path):
    """``select()`` gives rows without columns: they used to be sealed, and then every file failed."""
    with _sink(tmp_path) as sink:
        with pytest.raises(SchemaMismatchError, match=r"the batch has no columns.*Nothing of this batch was written"):
            sink(spark.range(3).select(), 0)
        assert sink.log_store.last_sealed_epoch == NOTHING
        assert sink.log_store.held_totals().rows == 0
        sink(spark.range(3), 0)  # the fixed query
        sink.flush()
    assert Counter(_read(tmp_path / "out")["id"].to_pylist()) == Counter(range(3))


@pytest.mark.parametrize(("query", "match"), UNWRITABLE)
def test_types_a_parquet_file_cannot_hold_are_refused_before_the_append(spark, tmp_path, query, match):
    df = spark.sql(query)
    column = df.columns[1]
    with _sink(tmp_path) as sink:
        with pytest.raises(SchemaMismatchError, match=match):
            sink.check_schema(df.schema)
        with pytest.raises(SchemaMismatchError, match=match + ".*Nothing of this batch was written"):
            sink(df, 0)
        assert sink.log_store.last_sealed_epoch == NOTHING
        assert sink.log_store.held_totals().rows == 0
        fixed = df.select("id", F.col(column).cast("string").alias(column))  # what the message says to do
        sink(fixed, 0)
        sink.flush()
    table = _read(tmp_path / "out")
    assert table.schema.field(column).type == pa.string()
    expected = Counter((r.id, r[column]) for r in fixed.collect())
    assert Counter(zip(table["id"].to_pylist(), table[column].to_pylist(), strict=True)) == expected


def test_admission_refuses_what_a_parquet_file_cannot_hold():
    """The admission's own check, on Arrow types: whatever Spark hands over that a file writer would refuse."""
    admission = Admission(7, partition_by=("day",))
    ids, day, vnode = pa.array([1, 2]), pa.array(["d", "e"]), pa.array([0, 1], pa.int32())
    interval = pa.array([pa.MonthDayNano([1, 2, 3]), None], pa.month_day_nano_interval())
    batch = pa.record_batch([ids, interval, day, vnode], names=["id", "iv", "day", VNODE_COLUMN])
    with pytest.raises(
        Refusal, match=r"rows of batch 7: column 'iv' of type month_day_nano_interval: a Parquet file cannot hold it"
    ):
        admission.admit([batch])
    empty = pa.array([{}, {}], pa.struct([]))
    batch = pa.record_batch([ids, day, empty, vnode], names=["id", "day", "s", VNODE_COLUMN])
    with pytest.raises(Refusal, match=r"column 's' of type struct<>: a Parquet file cannot hold it"):
        admission.admit([batch])
    [admitted] = admission.admit([pa.record_batch([ids, day, vnode], names=["id", "day", VNODE_COLUMN])])
    assert admitted.num_rows == 2


def test_empty_array_literal_is_written(spark, tmp_path):
    """Spark types ``array()`` as an array of a not-null null type, which Arrow and Parquet hold only nullable:
    the files' schema widens it, and the admission's check (made on the files' schema) lets it through."""
    df = spark.sql("select id, array() as xs from range(5)")
    with _sink(tmp_path) as sink:
        sink(df, 0)
        sink.flush()
    table = _read(tmp_path / "out")
    assert Counter(zip(table["id"].to_pylist(), map(tuple, table["xs"].to_pylist()), strict=True)) == Counter(
        (i, ()) for i in range(5)
    )


def test_column_names_spark_would_take_apart(spark, tmp_path):
    """A dot, a space or a backtick in a column name: the sink quotes names where Spark would parse them."""
    df = spark.sql(
        "select id as `a.b`, cast(id % 3 as string) as `c d`, id * 2 as `e``f`, named_struct('x.y', id) as `g.h` "
        "from range(40)"
    ).repartition(3)
    expected = Counter((r[0], r[1], r[2], r[3]["x.y"]) for r in df.collect())
    for name, keys, partition_by in (("default", None, None), ("keyed", ["a.b", "e`f"], ["c d"])):
        out = tmp_path / name
        with ExactlyOnceParquetSink(
            str(out / "out"),
            out / "state",
            vnodes=8,
            parallelism=2,
            rollover=HOLD,
            key_columns=keys,
            partition_by=partition_by,
        ) as sink:
            sink(df, 0)
            assert sink.log_store.held_totals().rows == 40
            sink.flush()
        hive = ds.partitioning(pa.schema([("c d", pa.string())]), flavor="hive") if partition_by else None
        table = ds.dataset(str(out / "out"), format="parquet", partitioning=hive).to_table()
        got = zip(*(table[c].to_pylist() for c in ("a.b", "c d", "e`f")), table["g.h"].to_pylist(), strict=True)
        assert Counter((a, c, e, g["x.y"]) for a, c, e, g in got) == expected, name


def test_variant_column_with_default_keys_and_refused_as_a_key(spark, tmp_path):
    df = spark.sql("select id, parse_json(concat('{\"n\": ', id, '}')) as v from range(12)")
    with _sink(tmp_path, key_columns=["v"]) as sink:
        with pytest.raises(SinkOptionError, match=r"key_columns names v \(variant\): Spark cannot hash a variant"):
            sink(df, 0)
        assert sink.log_store.last_sealed_epoch == NOTHING
    with _sink(tmp_path) as sink:  # the default keys leave the variant out
        sink(df, 0)
        sink.flush()
    table = _read(tmp_path / "out")  # a variant is written as Spark holds it: its value and metadata bytes
    got = Counter(
        (i, v["value"], v["metadata"]) for i, v in zip(table["id"].to_pylist(), table["v"].to_pylist(), strict=True)
    )
    expected = Counter((r.id, bytes(r.v.value), bytes(r.v.metadata)) for r in df.collect())
    assert got == expected
    assert {r.v.toJson() for r in df.collect()} == {f'{{"n":{i}}}' for i in range(12)}


@pytest.mark.parametrize("first_large", [False, True], ids=["turned-on", "turned-off"])
def test_large_var_types_turned_on_or_off_between_runs(spark, tmp_path, first_large):
    """``spark.sql.execution.arrow.useLargeVarTypes`` changes the Arrow type of strings and binary, not the data:
    batches of the other width are conformed to the recorded one, not refused with a cast the user cannot make."""
    conf = "spark.sql.execution.arrow.useLargeVarTypes"
    query = (
        "select id, cast(id as string) as s, array(cast(id as string)) as xs, cast(cast(id as string) as binary) as b "
        "from range({})"
    )
    expected = Counter()
    try:
        for epoch, large in enumerate((first_large, not first_large, first_large)):
            spark.conf.set(conf, str(large).lower())
            with _sink(tmp_path) as sink:  # a restart with the setting changed
                df = spark.sql(query.format(10 + epoch))
                sink(df, epoch)
                expected.update((r.id, r.s, tuple(r.xs), bytes(r.b)) for r in df.collect())
                assert sink.log_store.last_sealed_epoch == epoch
                if epoch == 2:
                    sink.flush()
    finally:
        spark.conf.unset(conf)
    table = _read(tmp_path / "out")
    string, binary = (pa.large_string(), pa.large_binary()) if first_large else (pa.string(), pa.binary())
    assert table.schema.field("s").type == string and table.schema.field("b").type == binary  # the recorded width
    got = zip(*(table[c].to_pylist() for c in ("id", "s", "xs", "b")), strict=True)
    assert Counter((i, s, tuple(xs), b) for i, s, xs, b in got) == expected


def test_column_names_that_differ_only_in_case(spark, tmp_path):
    """Spark's own writer refuses ``a`` and ``A`` unless the session tells names apart by case; so does the sink,
    before anything is written. With ``spark.sql.caseSensitive`` on, both columns are written."""
    df = spark.sql("select id, id * 2 as a, id * 3 as A from range(8)")
    with _sink(tmp_path / "insensitive") as sink:
        with pytest.raises(SchemaMismatchError, match=r"names differ only in case: 'A', 'a'.*Nothing of this batch"):
            sink(df, 0)
        assert sink.log_store.last_sealed_epoch == NOTHING
        assert sink.log_store.held_totals().rows == 0
    spark.conf.set("spark.sql.caseSensitive", "true")
    try:
        df = spark.sql("select id, id * 2 as a, id * 3 as A from range(8)")
        with _sink(tmp_path / "sensitive") as sink:
            sink(df, 0)
            sink.flush()
    finally:
        spark.conf.unset("spark.sql.caseSensitive")
    table = _read(tmp_path / "sensitive" / "out")
    got = zip(table["id"].to_pylist(), table["a"].to_pylist(), table["A"].to_pylist(), strict=True)
    assert Counter(got) == Counter((i, 2 * i, 3 * i) for i in range(8))


def test_files_name_a_time_zone_their_readers_know(spark, tmp_path):
    """Spark labels timestamps with the session time zone as given (``GMT+05:30``, ``PST``), which pyarrow and
    pandas cannot resolve; the files say the same zone the way they can."""
    zone = spark.conf.get("spark.sql.session.timeZone")
    instants = [datetime.datetime(2024, 3, 1, 12, 0, i, tzinfo=UTC) for i in range(4)]
    try:
        for epoch, session in enumerate(("GMT+05:30", "PST")):  # a restart with another session zone
            spark.conf.set("spark.sql.session.timeZone", session)
            with _sink(tmp_path) as sink:
                rows = [(epoch * 10 + i, t) for i, t in enumerate(instants)]
                sink(spark.createDataFrame(rows, "id long, ts timestamp"), epoch)
                if epoch == 1:
                    sink.flush()
    finally:
        spark.conf.set("spark.sql.session.timeZone", zone)
    table = _read(tmp_path / "out")
    assert table.schema.field("ts").type == pa.timestamp(
        "us", tz="+05:30"
    )  # the first batch's zone, as pyarrow says it
    got = Counter(zip(table["id"].to_pylist(), table["ts"].to_pylist(), strict=True))
    assert got == Counter((e * 10 + i, t) for e in (0, 1) for i, t in enumerate(instants))
