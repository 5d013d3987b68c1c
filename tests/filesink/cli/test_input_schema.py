"""``filesink run``'s schema of a landing directory of Parquet files, without Spark: the files' footers merged in the
order they landed by the sink's own rules, refused changes named with their file, the union compared with the
sink's recorded schema (its columns first, in its order), and the line said when the sink takes a new schema."""

from __future__ import annotations

import io
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyspark.sql import types as T
from rich.console import Console

from filesink import ExactlyOnceParquetSink, SchemaMismatchError
from filesink.cli.inputschema import as_spark_reads, check_against_sink, read_footer
from filesink.cli.preflight import check_input
from filesink.cli.progress import Progress
from filesink.errors import InputError
from filesink.schema.evolution import Change
from filesink.sink.face import SinkStats
from filesink.sink.schema_versions import SchemaTaken


def _land(directory: Path, name: str, columns: dict[str, pa.Array], at: float) -> Path:
    """A Parquet file of ``columns`` that landed at the modification time ``at``."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    pq.write_table(pa.table(columns), path)
    os.utime(path, (at, at))
    return path


def _ints(t: pa.DataType) -> pa.Array:
    return pa.array([1], t)


def test_files_are_merged_in_the_order_they_landed(tmp_path):
    """Names sort one way, modification times another: the union takes each file's new columns in landing order,
    its widened types, and each column's source is the newest file that has it."""
    d = tmp_path / "in"
    _land(d, "c.parquet", {"id": _ints(pa.int64()), "n": _ints(pa.int32()), "f": pa.array([0.5], pa.float32())}, 100)
    _land(d, "b.parquet", {"n": _ints(pa.int32()), "id": _ints(pa.int64()), "x": _ints(pa.int64())}, 200)
    newest = _land(d, "a.parquet", {"n": _ints(pa.int64()), "id": _ints(pa.int64()), "f": _ints(pa.float64())}, 300)
    with pytest.raises(InputError, match=r"the file \S*/b\.parquet changes .* \(c\.parquet\) .*f \(float\) is gone"):
        check_input(d, "parquet")
    found = check_input(d, "parquet", fill_missing=True)
    assert found.files == [d / "a.parquet", d / "b.parquet", d / "c.parquet"]
    merged = found.merged
    assert merged is not None and merged.files == 3
    assert [(f.name, f.type) for f in merged.schema] == [
        ("id", pa.int64()),
        ("n", pa.int64()),
        ("f", pa.float64()),
        ("x", pa.int64()),
    ]
    assert all(f.nullable for f in merged.schema)
    assert dict(merged.sources) == {"id": newest, "n": newest, "f": newest, "x": d / "b.parquet"}


@pytest.mark.parametrize(
    ("later", "words"),
    [
        ({"id": _ints(pa.int64()), "n": _ints(pa.int16())}, "n narrowed from int to smallint"),
        ({"id": _ints(pa.int64()), "n": pa.array(["1"])}, "n changed from int to string, which is not a widening"),
        ({"id": _ints(pa.int64())}, "n (int) is gone: a removed column or field is refused"),
        ({"id": _ints(pa.int64()), "m": _ints(pa.int32())}, "n (int) is gone and m of the same type is new"),
    ],
)
def test_a_file_the_sink_would_refuse_is_named(tmp_path, later, words):
    d = tmp_path / "in"
    _land(d, "first.parquet", {"id": _ints(pa.int64()), "n": _ints(pa.int32())}, 100)
    _land(d, "second.parquet", {"id": _ints(pa.int64()), "n": _ints(pa.int32())}, 200)
    _land(d, "late.parquet", later, 300)
    with pytest.raises(InputError) as refused:
        check_input(d, "parquet")
    message = str(refused.value)
    assert f"the file {d / 'late.parquet'} changes the schema of the files that landed before it" in message
    assert "(first.parquet and 1 more)" in message and words in message
    assert "Nothing has been read or written yet" in message and "move late.parquet out of" in message
    assert check_input(d, "parquet", merge=False).merged is None, "a schema given is what the files are read with"


def test_a_missing_key_or_partition_column_is_never_filled(tmp_path):
    d = tmp_path / "in"
    _land(d, "a.parquet", {"id": _ints(pa.int64()), "day": pa.array(["2024-01-01"])}, 100)
    _land(d, "b.parquet", {"id": _ints(pa.int64())}, 200)
    assert check_input(d, "parquet", fill_missing=True).merged is not None
    with pytest.raises(InputError, match=r"b\.parquet .*day \(string\) is gone"):
        check_input(d, "parquet", fill_missing=True, keep=("day",))


def test_footer_types_are_taken_as_spark_reads_them(tmp_path):
    """INT96 timestamps (Spark 3's default) have a zone, millisecond timestamps are microseconds, unsigned
    integers the next wider signed type, dictionaries their values: a file of them and one of Spark's types merge
    with no change."""
    spark_like = {
        "t": pa.array([1], pa.timestamp("us", "UTC")),
        "u": pa.array([1], pa.int64()),
        "c": pa.array(["a"]),
        "p": pa.array([{"t": 1}], pa.struct([("t", pa.timestamp("us", "UTC"))])),
    }
    other = {
        "t": pa.array([1], pa.timestamp("ns")),
        "u": pa.array([1], pa.uint32()),
        "c": pa.array(["a"]).dictionary_encode(),
        "p": pa.array([{"t": 1}], pa.struct([("t", pa.timestamp("ns"))])),
    }
    d = tmp_path / "in"
    _land(d, "a.parquet", spark_like, 100)
    pq.write_table(pa.table(other), d / "b.parquet", use_deprecated_int96_timestamps=True)
    footer = read_footer(d / "b.parquet")
    assert [(f.name, f.type) for f in footer.schema] == [(n, a.type) for n, a in spark_like.items()]
    merged = check_input(d, "parquet").merged
    assert merged is not None and merged.schema.equals(footer.schema)
    pq.write_table(pa.table({"ms": pa.array([1], pa.timestamp("ms"))}), tmp_path / "ms.parquet")
    assert read_footer(tmp_path / "ms.parquet").schema.field("ms").type == pa.timestamp("us")
    assert as_spark_reads(pa.uint64()) == pa.decimal128(20, 0) and as_spark_reads(pa.uint8()) == pa.int16()


def test_an_unreadable_footer_is_named(tmp_path):
    d = tmp_path / "in"
    _land(d, "a.parquet", {"id": _ints(pa.int64())}, 100)
    (d / "b.parquet").write_bytes(b"PAR1 cut short")
    with pytest.raises(InputError, match=r"the input file .*b\.parquet is not a readable Parquet file"):
        check_input(d, "parquet")


# -- the files' union and the sink's recorded schema ---------------------------------------------------------------

RECORDED = T.StructType(
    [
        T.StructField("id", T.LongType()),
        T.StructField("user_id", T.LongType()),
        T.StructField("event_date", T.StringType()),
        T.StructField("amount", T.DoubleType()),
    ]
)


def _sink(tmp_path: Path, **options) -> ExactlyOnceParquetSink:
    return ExactlyOnceParquetSink(
        str(tmp_path / "out"), tmp_path / "state", key_columns=["user_id"], partition_by=["event_date"], **options
    )


def _recorded(tmp_path: Path) -> None:
    """A sink that recorded ``RECORDED`` and sealed its epoch 0."""
    with _sink(tmp_path) as sink:
        sink.check_schema(RECORDED)
        sink.log_store.seal(0, [])


def _row(**columns: pa.Array) -> dict[str, pa.Array]:
    return columns


def test_the_union_takes_the_sinks_order_and_a_refused_change_names_the_newest_file(tmp_path):
    _recorded(tmp_path)
    d = tmp_path / "in"
    _land(
        d,
        "old.parquet",
        _row(amount=pa.array([1.5]), user_id=_ints(pa.int64()), id=_ints(pa.int64()), event_date=pa.array(["d"])),
        100,
    )
    _land(
        d,
        "new.parquet",
        _row(
            x=_ints(pa.int64()),
            amount=pa.array([1.5]),
            user_id=_ints(pa.int64()),
            id=_ints(pa.int64()),
            event_date=pa.array(["d"]),
        ),
        200,
    )
    merged = check_input(d, "parquet").merged
    assert merged is not None and merged.schema.names == ["amount", "user_id", "id", "event_date", "x"]
    with _sink(tmp_path) as sink:
        ordered = check_against_sink(merged, sink, d)
        assert ordered.schema.names == ["id", "user_id", "event_date", "amount", "x"]
        assert [name for name, _ in ordered.sources] == ordered.schema.names
        assert [v.version for v in sink.ledger.schema_history()] == [1], "a check records nothing"

    _land(
        d,
        "odd.parquet",
        _row(
            x=_ints(pa.int64()),
            amount=pa.array(["1.5"]),
            user_id=_ints(pa.int64()),
            id=_ints(pa.int64()),
            event_date=pa.array(["d"]),
        ),
        300,
    )
    with pytest.raises(InputError, match=r"odd\.parquet .*amount changed from double to string"):
        check_input(d, "parquet")
    for path in (d / "old.parquet", d / "new.parquet"):
        path.unlink()
    merged = check_input(d, "parquet").merged
    assert merged is not None
    with _sink(tmp_path) as sink, pytest.raises(SchemaMismatchError) as refused:
        check_against_sink(merged, sink, d)
    message = str(refused.value)
    assert f"the files in {d} change the sink's schema (version 1) in a way the sink does not take" in message
    assert "amount changed from double to string, which is not a widening the sink takes" in message
    assert f"(in {d / 'odd.parquet'}, the newest file with amount)" in message
    assert "Nothing has been read or written yet" in message


def test_a_recorded_column_no_file_has_is_refused_unless_the_sink_fills_it(tmp_path):
    _recorded(tmp_path)
    d = tmp_path / "in"
    _land(d, "a.parquet", _row(id=_ints(pa.int64()), user_id=_ints(pa.int64()), event_date=pa.array(["d"])), 100)
    merged = check_input(d, "parquet").merged
    assert merged is not None
    with _sink(tmp_path) as sink, pytest.raises(SchemaMismatchError, match=r"amount \(double\) is gone"):
        check_against_sink(merged, sink, d)
    with _sink(tmp_path, fill_missing_columns=True) as sink:
        assert check_against_sink(merged, sink, d).schema.names == ["id", "user_id", "event_date"]


def test_a_partition_column_keeps_its_type_against_the_recorded_one(tmp_path):
    _recorded(tmp_path)
    d = tmp_path / "in"
    columns = _row(
        id=_ints(pa.int64()), user_id=_ints(pa.int64()), event_date=_ints(pa.int32()), amount=pa.array([1.5])
    )
    _land(d, "a.parquet", columns, 100)
    merged = check_input(d, "parquet").merged
    assert merged is not None
    with (
        _sink(tmp_path) as sink,
        pytest.raises(
            SchemaMismatchError, match="event_date changed from string to int, and it is a key or partition column"
        ) as refused,
    ):
        check_against_sink(merged, sink, d)
    assert f"(in {d / 'a.parquet'}, the newest file with event_date)" in str(refused.value)


# -- the line said when the sink takes a new schema -----------------------------------------------------------------


def test_the_schema_line_names_each_change_and_the_batch():
    taken = SchemaTaken(
        3,
        2,
        (
            Change("n", "widened", "int", "bigint"),
            Change("x", "added", None, "bigint"),
            Change("p.y", "added", None, "string"),
        ),
    )
    assert taken.line() == (
        "schema: the sink took `n` widened from int to bigint, new column `x` (bigint), new field `p.y` (string) at "
        "batch 3 (schema version 2)"
    )
    assert SchemaTaken(4, 3, ()).line() == "schema: the sink took a new column order at batch 4 (schema version 3)"


def test_progress_says_each_new_schema_once(tmp_path):
    out = io.StringIO()
    stats = SinkStats()
    progress = Progress(Console(file=out, width=200), stats, tmp_path / "state", "filesink run")
    with progress:
        stats.schema_changes.append(SchemaTaken(1, 2, (Change("x", "added", None, "bigint"),)))
        progress.update()
        progress.update()
    said = [line for line in out.getvalue().splitlines() if line.startswith("schema:")]
    assert said == ["schema: the sink took new column `x` (bigint) at batch 1 (schema version 2)"]
