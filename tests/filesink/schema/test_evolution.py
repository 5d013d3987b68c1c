"""Schema evolution without Spark's jobs: which changes are taken, which are refused (each naming the column, both
types and the way out), rows of an older schema written under the newer one, and the history a sink records (in
its state database and its durable home, so a rebuild knows it)."""

from __future__ import annotations

import decimal
import re
import shutil

import pyarrow as pa
import pytest
from pyspark.sql import types as T

from filesink import ExactlyOnceParquetSink, Rollover, SchemaMismatchError
from filesink.schema.conform import file_schema
from filesink.schema.evolution import evolve, spark_name, upgradable, upgrade
from logstore import VNODE_COLUMN

HOLD = Rollover(target_file_size=None, max_age_seconds=None, max_epochs=1000)

POINT = pa.struct([("x", pa.int32())])
OLD = file_schema(
    pa.schema(
        [
            ("id", pa.int64()),
            ("n", pa.int32()),
            ("f", pa.float32()),
            ("d", pa.decimal128(5, 2)),
            ("p", POINT),
            ("ps", pa.list_(POINT)),
            ("m", pa.map_(pa.string(), POINT)),
        ]
    )
)


def _with(schema: pa.Schema, name: str, type_: pa.DataType) -> pa.Schema:
    return file_schema(schema.set(schema.get_field_index(name), pa.field(name, type_)))


# -- evolve ----------------------------------------------------------------------------------------------------


def test_new_columns_and_fields_at_any_depth_and_wider_types_are_taken():
    wider = pa.struct([("x", pa.int64()), ("y", pa.string())])
    new = file_schema(
        pa.schema(
            [
                ("id", pa.int64()),
                ("n", pa.int64()),
                ("f", pa.float64()),
                ("d", pa.decimal128(9, 2)),
                ("p", pa.struct([("x", pa.int32()), ("q", pa.struct([("deep", pa.bool_())]))])),
                ("ps", pa.list_(wider)),
                ("m", pa.map_(pa.string(), wider)),
                ("extra", pa.string()),
            ]
        )
    )
    evolution = evolve(OLD, new)
    assert evolution.problems == ()
    assert [str(c) for c in evolution.changes] == [
        "n widened from int to bigint",
        "f widened from float to double",
        "d widened from decimal(5,2) to decimal(9,2)",
        "p.q (struct<deep:boolean>) added",
        "ps.element.x widened from int to bigint",
        "ps.element.y (string) added",
        "m.value.x widened from int to bigint",
        "m.value.y (string) added",
        "extra (string) added",
    ]
    assert evolution.schema.equals(new)


@pytest.mark.parametrize(
    ("old", "new"),
    [(pa.int8(), pa.int16()), (pa.int8(), pa.int64()), (pa.int16(), pa.int32()), (pa.int32(), pa.int64())],
)
def test_every_integer_widening(old, new):
    evolution = evolve(file_schema(pa.schema([("v", old)])), file_schema(pa.schema([("v", new)])))
    assert evolution.problems == () and evolution.schema.field("v").type == new


def test_the_same_schema_up_to_zone_labels_and_string_widths_changes_nothing():
    old = file_schema(pa.schema([("ts", pa.timestamp("us", tz="UTC")), ("s", pa.string())]))
    new = file_schema(pa.schema([("ts", pa.timestamp("us", tz="Asia/Tokyo")), ("s", pa.large_string())]))
    evolution = evolve(old, new)
    assert evolution.problems == () and evolution.changes == () and evolution.schema.equals(old)


@pytest.mark.parametrize(
    ("schema", "match"),
    [
        (_with(OLD, "n", pa.int16()), r"n narrowed from int to smallint: .* Cast it back to int"),
        (_with(OLD, "n", pa.string()), r"n changed from int to string, which is not a widening"),
        (_with(OLD, "f", pa.int64()), r"f changed from float to bigint, which is not a widening"),
        (_with(OLD, "d", pa.decimal128(9, 3)), r"d changed from decimal\(5,2\) to decimal\(9,3\)"),
        (_with(OLD, "p", pa.struct([("x", pa.int16())])), r"p.x narrowed from int to smallint"),
        (_with(OLD, "p", pa.struct([("z", pa.int64())])), r"p.x \(int\) is gone"),
        (OLD.remove(OLD.get_field_index("n")), r"n \(int\) is gone: .*fill_missing_columns=True"),
        (_with(OLD, "m", pa.map_(pa.int64(), POINT)), r"m.key changed from string to bigint"),
        (_with(OLD, "ps", POINT), r"ps changed from array<struct<x:int>> to struct<x:int>"),
    ],
)
def test_refused_changes_name_the_column_both_types_and_the_way_out(schema, match):
    evolution = evolve(OLD, schema)
    assert len(evolution.problems) == 1, evolution.problems
    assert re.search(match, evolution.problems[0]), evolution.problems[0]


def test_a_date_is_not_widened_to_a_timestamp():
    old = file_schema(pa.schema([("day", pa.date32())]))
    new = file_schema(pa.schema([("day", pa.timestamp("us", tz="UTC"))]))
    (problem,) = evolve(old, new).problems
    assert "day changed from date to timestamp: a date is not widened to a timestamp" in problem


def test_a_rename_is_said_to_look_like_one():
    new = pa.schema([f.with_name("count") if f.name == "n" else f for f in OLD])
    problems = evolve(OLD, new).problems
    assert len(problems) == 1
    assert "n (int) is gone and count of the same type is new: this looks like a rename" in problems[0]
    assert "alias count as n" in problems[0]


def test_key_and_partition_columns_keep_their_types():
    (problem,) = evolve(OLD, _with(OLD, "n", pa.int64()), fixed=("n",)).problems
    assert "n changed from int to bigint, and it is a key or partition column" in problem
    assert evolve(OLD, file_schema(OLD.append(pa.field("new", pa.int8()))), fixed=("n",)).problems == ()


def test_spark_names():
    assert spark_name(pa.map_(pa.string(), pa.list_(pa.timestamp("us")))) == "map<string,array<timestamp_ntz>>"


# -- rows of an older schema -----------------------------------------------------------------------------------


def test_rows_of_an_older_schema_get_nulls_and_wider_values():
    old_rows = pa.record_batch(
        [
            pa.array([1, 2], pa.int64()),
            pa.array([7, None], pa.int32()),
            pa.array([1.5, 2.25], pa.float32()),
            pa.array([decimal.Decimal("1.25"), None], pa.decimal128(5, 2)),
            pa.array([{"x": 3}, None], POINT),
            pa.array([[{"x": 4}], []], pa.list_(POINT)),
            pa.array([[("k", {"x": 5})], None], pa.map_(pa.string(), POINT)),
            pa.array([0, 1], pa.int32()),
        ],
        schema=OLD.append(pa.field(VNODE_COLUMN, pa.int32())),
    )
    wider = pa.struct([("x", pa.int64()), ("y", pa.string())])
    new = file_schema(
        pa.schema(
            [
                ("extra", pa.string()),
                ("id", pa.int64()),
                ("n", pa.int64()),
                ("f", pa.float64()),
                ("d", pa.decimal128(9, 2)),
                ("p", wider),
                ("ps", pa.list_(wider)),
                ("m", pa.map_(pa.string(), wider)),
            ]
        )
    )
    got = upgrade(old_rows, new, keep=(VNODE_COLUMN,))
    assert got is not None
    assert got.schema.names == [*new.names, VNODE_COLUMN]
    assert got.to_pylist() == [
        {
            "extra": None,
            "id": 1,
            "n": 7,
            "f": 1.5,
            "d": decimal.Decimal("1.25"),
            "p": {"x": 3, "y": None},
            "ps": [{"x": 4, "y": None}],
            "m": [("k", {"x": 5, "y": None})],
            VNODE_COLUMN: 0,
        },
        {
            "extra": None,
            "id": 2,
            "n": None,
            "f": 2.25,
            "d": None,
            "p": None,
            "ps": [],
            "m": None,
            VNODE_COLUMN: 1,
        },
    ]


def test_nothing_is_dropped_or_narrowed_on_the_way():
    rows = pa.record_batch([pa.array([{"x": 1, "y": "a"}])], names=["p"])
    assert not upgradable(rows.schema.field("p").type, POINT)  # a cast alone would drop p.y without a word
    assert upgrade(rows, pa.schema([("p", POINT)])) is None
    assert upgrade(pa.record_batch([pa.array([300], pa.int64())], names=["n"]), pa.schema([("n", pa.int8())])) is None
    assert upgrade(pa.record_batch([pa.array([1])], names=["gone"]), pa.schema([("n", pa.int64())])) is None


# -- the sink's history ----------------------------------------------------------------------------------------


def _spark(*fields: tuple[str, T.DataType]) -> T.StructType:
    return T.StructType([T.StructField(n, t) for n, t in fields])


V1 = _spark(("id", T.LongType()), ("n", T.IntegerType()), ("p", T.StructType([T.StructField("x", T.IntegerType())])))
V2 = _spark(
    ("id", T.LongType()),
    ("n", T.LongType()),
    ("p", T.StructType([T.StructField("x", T.IntegerType()), T.StructField("y", T.StringType())])),
    ("extra", T.DateType()),
)


def _sink(tmp_path, **options):
    return ExactlyOnceParquetSink(
        str(tmp_path / "out"),
        tmp_path / "state",
        log_store=str(tmp_path / "log"),
        vnodes=4,
        rollover=HOLD,
        **options,
    )


@pytest.mark.parametrize(
    ("schema", "options", "match"),
    [
        (_spark(("id", T.LongType()), ("n", T.IntegerType())), {}, r"p \(struct<x:int>\) is gone"),
        (_spark(("id", T.IntegerType()), ("n", T.IntegerType()), ("p", V1["p"].dataType)), {}, "id narrowed"),
        (_spark(("id", T.StringType()), ("n", T.IntegerType()), ("p", V1["p"].dataType)), {}, "id changed"),
        (_spark(("id", T.LongType()), ("n", T.LongType()), ("p", V1["p"].dataType)), {"key_columns": ["n"]}, "key"),
        (_spark(("id", T.LongType()), ("k", T.IntegerType()), ("p", V1["p"].dataType)), {}, "looks like a rename"),
    ],
)
def test_a_refused_change_leaves_the_sink_as_it_was(tmp_path, schema, options, match):
    with _sink(tmp_path, **options) as sink:
        sink.check_schema(V1)
        sink.log_store.seal(0, [])
        with pytest.raises(SchemaMismatchError, match=match + ".*Nothing of this batch was written"):
            sink.check_schema(schema)
        assert [v.version for v in sink.ledger.schema_history()] == [1]
        assert sink.recorded_spark_schema() == [("id", "bigint"), ("n", "int"), ("p", "struct<x:int>")]


def test_a_partition_column_keeps_its_type(tmp_path):
    with _sink(tmp_path, partition_by=["n"]) as sink:
        sink.check_schema(V1)
        sink.log_store.seal(0, [])
        with pytest.raises(SchemaMismatchError, match="n changed from int to bigint, and it is a key or partition"):
            sink.check_schema(V2)


def test_the_history_is_in_the_home_and_a_rebuild_takes_it(tmp_path):
    with _sink(tmp_path) as sink:
        sink.check_schema(V1)
        sink.log_store.seal(0, [])
        version = sink._check_schema(V2, 1)
        assert version is not None and version.first_epoch == 1
        assert version.changes == ("n widened from int to bigint", "p.y (string) added", "extra (date) added")
        sink._record_version(version, [])
        sink.log_store.seal(1, [])
        history = sink.ledger.schema_history()
    assert [(v.version, v.first_epoch, v.changes) for v in history] == [
        (1, 0, ()),
        (2, 1, ("n widened from int to bigint", "p.y (string) added", "extra (date) added")),
    ]
    shutil.rmtree(tmp_path / "state")  # the driver's machine is lost; the log store (the durable home) is not
    with _sink(tmp_path) as sink:
        assert sink.ledger.schema_history() == history
        assert pa.ipc.read_schema(pa.py_buffer(sink.ledger.arrow_schema())).names == ["id", "n", "p", "extra"]
        sink.check_schema(V2)  # the newest schema: nothing to record
        with pytest.raises(SchemaMismatchError, match=r"n narrowed from bigint to int"):
            sink.check_schema(V1)


def test_a_version_no_seal_used_is_taken_back(tmp_path):
    """A run that stopped between recording a new schema and sealing its batch left a version no rows use: the
    batch coming again with the older schema takes it back, and another change replaces it."""
    with _sink(tmp_path) as sink:
        sink.check_schema(V1)
        sink.log_store.seal(0, [])
        version = sink._check_schema(V2, 1)
        assert version is not None
        sink._record_version(version, [])  # and no seal: the run stops here
    with _sink(tmp_path) as sink:
        assert [v.version for v in sink.ledger.schema_history()] == [1, 2]
        assert sink._check_schema(V1, 1) is None
        assert [v.version for v in sink.ledger.schema_history()] == [1]
        assert sink.recorded_spark_schema() == [("id", "bigint"), ("n", "int"), ("p", "struct<x:int>")]
        other = sink._check_schema(_spark(*[(f.name, f.dataType) for f in V1.fields], ("more", T.StringType())), 1)
        assert other is not None and other.changes == ("more (string) added",)


def test_a_check_before_the_query_fills_missing_columns_too(tmp_path):
    """``filesink run`` checks the input's schema before it starts the query: a sink that fills missing columns
    takes a schema without them there too, as it does at the batch."""
    without_n = _spark(("id", T.LongType()), ("p", V1["p"].dataType))
    with _sink(tmp_path / "filling", fill_missing_columns=True) as sink:
        sink.check_schema(V1)
        sink.log_store.seal(0, [])
        sink.check_schema(without_n)
        assert [v.version for v in sink.ledger.schema_history()] == [1]
    with _sink(tmp_path / "refusing") as sink, pytest.raises(SchemaMismatchError, match=r"n \(int\) is gone"):
        sink.check_schema(V1)
        sink.log_store.seal(0, [])
        sink.check_schema(without_n)


def test_a_column_becoming_nullable_is_taken_as_it_is(tmp_path):
    """The files' fields are nullable at every depth already: a column (or a nested field) that was not nullable
    becoming nullable changes nothing, and its nulls are written."""
    strict = T.StructType(
        [
            T.StructField("id", T.LongType(), nullable=False),
            T.StructField("n", T.IntegerType(), nullable=False),
            T.StructField("p", T.StructType([T.StructField("x", T.IntegerType(), nullable=False)]), nullable=False),
        ]
    )
    loose = T.StructType([T.StructField(f.name, f.dataType, nullable=True) for f in V1.fields])
    with _sink(tmp_path) as sink:
        sink.check_schema(strict)
        sink.log_store.seal(0, [])
        assert sink._check_schema(loose, 1) is None
        assert [v.version for v in sink.ledger.schema_history()] == [1]
    rows = pa.record_batch([pa.array([1, None], pa.int32())], names=["n"])
    assert upgrade(rows, file_schema(pa.schema([pa.field("n", pa.int32(), nullable=False)]))) is not None
