"""The sink names partition directories as Spark's own writer does, for every type Spark partitions by.

The same rows are written by ``df.write.partitionBy(...)`` and by the sink (session time zone not UTC). Checked:
(a) each row's directories are the same text; (b) ``spark.read.parquet`` infers the same partition column types
and reads the same rows from both, and pyarrow's hive partitioning reads the sink's output with the original
string values; (c) the types Spark refuses as partition columns (and intervals) are refused by the sink's schema
check before anything is written.
"""

from __future__ import annotations

import datetime
import decimal
import math
import os
from pathlib import Path

import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from filesink import ExactlyOnceParquetSink, Rollover, SinkOptionError
from filesink.schema.partitioning import SPARK_TYPES, unescape

ZONE = "America/Sao_Paulo"
UTC = datetime.UTC


def _f32(x: float) -> float:
    import struct

    return float(struct.unpack("f", struct.pack("f", x))[0])


def _columns():
    """(column, Spark type, values): every type Spark partitions by, with its awkward values."""
    from pyspark.sql import types as T

    floats = [1.1, math.nan, math.inf, -math.inf, -0.0, 0.0, 1e10, 1e-4, 3.4028235e38, 1e-45, 0.001, 1e7, 123456.79]
    doubles = [1.1, math.nan, math.inf, -math.inf, -0.0, 0.0, 1e10, 1e-4, 1.7976931348623157e308, 5e-324, 0.001]
    doubles += [1e7, 9999999.0, 0.1 + 0.2, 2.82879384806159e17, 1e23, 123456789.123, None]
    columns = [
        (
            "s",
            T.StringType(),
            [
                "a/b",
                "..",
                ".",
                "k=v",
                "100%",
                "tab\there",
                "\u200b",
                "café",
                "",
                None,
                "A",
                "a",
                "x y",
                "<>|",
                "{[]}^",
                "#?*\"'\\:",
                "\x7f\x01",
                "e\u0301",
                "\U0001f600",
                "~!@$&()+,;",
                " lead",
                "trail ",
            ],
        ),
        ("bo", T.BooleanType(), [True, False, None]),
        ("by", T.ByteType(), [1, -128, 127, None]),
        ("sh", T.ShortType(), [-32768, 32767]),
        ("i4", T.IntegerType(), [0, -1, 2**31 - 1]),
        ("i8", T.LongType(), [2**63 - 1, -(2**63)]),
        ("f4", T.FloatType(), [_f32(x) for x in floats]),
        ("f8", T.DoubleType(), doubles),
        (
            "de",
            T.DecimalType(20, 10),
            [decimal.Decimal("1.5"), decimal.Decimal(0), decimal.Decimal("1E-7"), decimal.Decimal("-12345.6789"), None],
        ),
        ("d0", T.DecimalType(38, 0), [decimal.Decimal(12345678901234567890123456789), decimal.Decimal(0)]),
        ("da", T.DateType(), [datetime.date(2024, 2, 29), datetime.date(1, 1, 1), datetime.date(999, 12, 31), None]),
        (
            "ts",
            T.TimestampType(),
            [
                datetime.datetime(2024, 2, 29, 13, 5, 1, 100000, tzinfo=UTC),
                datetime.datetime(2024, 2, 29, 13, 5, 1, tzinfo=UTC),
                datetime.datetime(2024, 2, 29, 13, 5, 1, 123456, tzinfo=UTC),
                datetime.datetime(1900, 1, 1, tzinfo=UTC),
                datetime.datetime(2024, 10, 6, 2, 30, tzinfo=UTC),
                None,
            ],
        ),
        (
            "tn",
            T.TimestampNTZType(),
            [datetime.datetime(2024, 2, 29, 13, 5, 1, 100000), datetime.datetime(2024, 2, 29), None],
        ),
        ("bi", T.BinaryType(), [b"abc", b"\xff", b"x:y", None]),
        # columns Spark infers as double and timestamp (with NaN and Infinity; with a fraction)
        ("fn", T.DoubleType(), [1.5, math.nan, math.inf, -math.inf]),
        (
            "tc",
            T.TimestampType(),
            [datetime.datetime(2024, 2, 29, 13, 5, 1, 100000, tzinfo=UTC), datetime.datetime(2024, 1, 1, tzinfo=UTC)],
        ),
    ]
    if hasattr(T, "TimeType"):
        columns.append(("ti", T.TimeType(), [datetime.time(12, 34, 56, 500000), datetime.time(0, 0), None]))
    return columns


def _dirs_by_row(root: Path) -> dict[int, list[str]]:
    """Per row id, the directory names of the object that holds it."""
    found: dict[int, list[str]] = {}
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            if not name.endswith(".parquet") or name.startswith((".", "_")):
                continue
            path = Path(dirpath) / name
            parts = list(path.relative_to(root).parts[:-1])
            for i in pq.read_table(path, columns=["i"])["i"].to_pylist():
                assert i not in found, f"row {i} twice"
                found[i] = parts
    return found


def _java_major(spark) -> int:
    version = str(spark.sparkContext._jvm.java.lang.System.getProperty("java.version"))
    return int(version.split(".")[0] if not version.startswith("1.") else version.split(".")[1])


@pytest.mark.timeout(400)
def test_directories_and_types_read_back_are_sparks(spark, tmp_path):
    from pyspark.sql import types as T

    columns = _columns()
    names = [c for c, _, _ in columns]
    without_time = set() if "ti" in names else {"time"}  # a Spark without a time type
    assert {t.simpleString().split("(")[0] for _, t, _ in columns} == set(SPARK_TYPES) - without_time
    count = max(len(v) for _, _, v in columns)
    rows = [(i, *(values[i % len(values)] for _, _, values in columns)) for i in range(count)]
    schema = T.StructType([T.StructField("i", T.LongType())] + [T.StructField(c, t) for c, t, _ in columns])

    before = spark.conf.get("spark.sql.session.timeZone")
    spark.conf.set("spark.sql.session.timeZone", ZONE)
    try:
        df = spark.createDataFrame(rows, schema)
        theirs, ours = tmp_path / "spark", tmp_path / "sink"
        df.write.partitionBy(*names).parquet(str(theirs))
        sink = ExactlyOnceParquetSink(
            str(ours),
            tmp_path / "state",
            vnodes=4,
            parallelism=2,
            partition_by=names,
            rollover=Rollover(target_file_size=None, max_age_seconds=None, max_epochs=1000),
        )
        sink(df, 0)
        sink.flush()
        sink.close()

        # (a) the same directory text for every row
        spark_dirs, sink_dirs = _dirs_by_row(theirs), _dirs_by_row(ours)
        assert sorted(spark_dirs) == sorted(sink_dirs) == list(range(count))
        old_java = _java_major(spark) < 19
        for i in range(count):
            for column, a, b in zip(names, spark_dirs[i], sink_dirs[i], strict=True):
                if a == b:
                    continue
                # Java before 19 prints a few doubles with more digits than needed; both read back the same
                assert old_java and column in ("f4", "f8"), (i, a, b)
                assert float(unescape(a.partition("=")[2])) == float(unescape(b.partition("=")[2])), (i, a, b)
        assert any(d == "s=a%2Fb" for parts in sink_dirs.values() for d in parts)
        assert any(d == "f8=NaN" for parts in sink_dirs.values() for d in parts)
        assert any(d == "ts=2024-02-29 10%3A05%3A01.1" for parts in sink_dirs.values() for d in parts), "local time"

        # (b) Spark infers the same types, and reads the same rows, from both
        read_theirs, read_ours = spark.read.parquet(str(theirs)), spark.read.parquet(str(ours))
        assert read_ours.schema.simpleString() == read_theirs.schema.simpleString()
        inferred = {f.name: f.dataType.simpleString() for f in read_ours.schema.fields}
        assert inferred["fn"] == "double" and inferred["tc"] == "timestamp", inferred  # not strings
        assert inferred["i4"] == "int" and inferred["da"] == "date" and inferred["d0"] == "decimal(29,0)", inferred

        def normalized(row) -> str:  # doubles read as strings: as the double they stand for (Java 17's digits)
            fields = row.asDict()
            for c in ("f4", "f8"):
                if isinstance(fields[c], str):
                    fields[c] = repr(float(fields[c]))
            return repr(sorted(fields.items()))

        assert sorted(map(normalized, read_ours.collect())) == sorted(map(normalized, read_theirs.collect()))
    finally:
        spark.conf.set("spark.sql.session.timeZone", before)

    # pyarrow's hive partitioning reads the sink's output, string values as they were
    table = ds.dataset(ours, format="parquet", partitioning=ds.HivePartitioning.discover(infer_dictionary=False))
    got = table.to_table(columns=["i", "s"]).to_pylist()
    assert {r["i"]: r["s"] for r in got} == {row[0]: (row[1] or None) for row in rows}


def _written_by_both(df, column: str, tmp_path: Path) -> tuple[Path, Path]:
    """``df`` written partitioned by ``column`` by Spark's writer and by the sink (every row written, none held)."""
    theirs, ours = tmp_path / "spark", tmp_path / "sink"
    df.write.partitionBy(column).parquet(str(theirs))
    with ExactlyOnceParquetSink(
        str(ours),
        tmp_path / "state",
        vnodes=4,
        parallelism=2,
        partition_by=[column],
        rollover=Rollover(target_file_size=None, max_age_seconds=None, max_epochs=1000),
    ) as sink:
        sink(df, 0)
        sink.flush()
        assert sink.log_store.held_totals().rows == 0
    return theirs, ours


def test_string_values_that_are_not_utf8_get_sparks_directories(spark, tmp_path):
    """A string holding bytes that are not UTF-8 (Spark does not check: ``cast(binary as string)``) used to be
    sealed and then fail every file at every roll; the sink names its directory as Spark does (U+FFFD)."""
    df = spark.sql(
        "SELECT id AS i, CAST(unhex(element_at(array('C328', '41', 'FF2F41', '', 'E282'), CAST(id % 5 + 1 AS INT))) "
        "AS STRING) AS s, id * 2 AS v FROM range(20)"
    )
    theirs, ours = _written_by_both(df, "s", tmp_path)
    spark_dirs, sink_dirs = _dirs_by_row(theirs), _dirs_by_row(ours)
    assert sorted(spark_dirs) == list(range(20))
    assert sink_dirs == spark_dirs
    assert any(parts == ["s=\ufffd("] for parts in sink_dirs.values())
    read_theirs = sorted(map(tuple, spark.read.parquet(str(theirs)).select("i", "s", "v").collect()))
    read_ours = sorted(map(tuple, spark.read.parquet(str(ours)).select("i", "s", "v").collect()))
    assert read_ours == read_theirs


def test_the_jdks_short_zone_ids_are_the_sinks(spark):
    from filesink.schema.conform import _JAVA_SHORT_IDS

    ids = spark.sparkContext._jvm.java.time.ZoneId.SHORT_IDS
    assert {k: ids.get(k) for k in ids.keySet().toArray()} == _JAVA_SHORT_IDS


@pytest.mark.timeout(300)
@pytest.mark.parametrize("zone", ["PST", "GMT+05:30", "UTC-3", "Z"])
def test_session_time_zones_pyarrow_does_not_know_get_sparks_directories(spark, tmp_path, zone):
    """Java zone ids Spark takes and pyarrow does not (a short id, offsets in Java's forms) used to be sealed and
    then fail every file of a sink partitioned by a timestamp."""
    before = spark.conf.get("spark.sql.session.timeZone")
    spark.conf.set("spark.sql.session.timeZone", zone)
    try:
        df = spark.sql(
            "SELECT id AS i, timestamp'2024-03-10 01:30:00' + make_interval(0, 0, 0, 0, CAST(id AS INT), 0, 0) AS ts "
            "FROM range(6)"
        )
        theirs, ours = _written_by_both(df, "ts", tmp_path)
        assert _dirs_by_row(ours) == _dirs_by_row(theirs)
        assert sorted(map(tuple, spark.read.parquet(str(ours)).collect())) == sorted(
            map(tuple, spark.read.parquet(str(theirs)).collect())
        )
    finally:
        spark.conf.set("spark.sql.session.timeZone", before)


def test_a_session_time_zone_no_directory_can_be_named_in_is_refused_before_the_seal(spark, tmp_path):
    from filesink.errors import BatchRefusedError

    before = spark.conf.get("spark.sql.session.timeZone")
    spark.conf.set("spark.sql.session.timeZone", "+05:30:15")  # Java takes seconds in an offset, pyarrow does not
    try:
        df = spark.sql("SELECT id AS i, timestamp'2024-03-10 01:30:00' AS ts FROM range(3)")
        with ExactlyOnceParquetSink(str(tmp_path / "out"), tmp_path / "state", vnodes=4, partition_by=["ts"]) as sink:
            with pytest.raises(BatchRefusedError, match=r"partition column 'ts'.*set spark.sql.session.timeZone to"):
                sink(df, 0)
            assert sink.log_store.last_sealed_epoch == -1 and sink.log_store.held_totals().rows == 0
    finally:
        spark.conf.set("spark.sql.session.timeZone", before)


@pytest.mark.parametrize(
    ("sql", "kind"),
    [
        ("array(1, 2)", "array<int>"),
        ("map('a', 1)", "map<string,int>"),
        ("named_struct('x', 1)", "struct<x:int>"),
        ("parse_json('1')", "variant"),
        ("null", "void"),
        ("interval '1-2' year to month", "interval year to month"),
        ("interval '1 02:03:04.5' day to second", "interval day to second"),
    ],
)
def test_types_spark_does_not_partition_by_are_refused_before_anything_is_written(spark, tmp_path, sql, kind):
    df = spark.sql(f"SELECT 1 AS i, {sql} AS p")
    sink = ExactlyOnceParquetSink(str(tmp_path / "out"), tmp_path / "state", vnodes=4, partition_by=["p"])
    with pytest.raises(SinkOptionError, match=rf"partition_by names p \({kind}\): a partition column must have"):
        sink(df, 0)
    assert sink.log_store.last_sealed_epoch == -1 and sink.log_store.segments() == []
    assert sink.recorded_spark_schema() is None
    sink.close()
    assert [p.name for p in (tmp_path / "out").iterdir() if not p.name.startswith("_")] == []
