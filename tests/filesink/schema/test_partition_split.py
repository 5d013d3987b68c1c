"""A file writer's split of its rows by partition directory (:func:`filesink.tasks.writer.split_partitions`), checked
against each row's own directory: every row lands in the object of its directory, in input order, and the
objects come in the order their directories first occur (which numbers a file's objects the same on a re-run)."""

from __future__ import annotations

import struct

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from filesink.schema.partitioning import partition_dirs
from filesink.tasks.writer import key_groups, split_partitions


def _float(bits: int) -> float:
    return struct.unpack("<d", struct.pack("<Q", bits))[0]


NAN_BITS = [0x7FF8000000000000, 0xFFF8000000000000, 0x7FF0000000000001, 0x7FF8000000000123]
FLOATS = st.one_of(
    st.none(),
    st.sampled_from([0.0, -0.0, 1.5, float("inf")]),
    st.sampled_from([_float(b) for b in NAN_BITS]),
)
TEXTS = st.one_of(st.none(), st.sampled_from(["", "a", "a/b", "k=v", "café", "A"]))
BYTES = st.one_of(st.none(), st.sampled_from([b"", b"a", b"\xff", b"\xfe", b"caf\xc3\xa9"]))
INTS = st.one_of(st.none(), st.integers(min_value=-3, max_value=3))
BOOLS = st.one_of(st.none(), st.booleans())
COLUMNS = {"f": (FLOATS, pa.float64()), "s": (TEXTS, pa.string()), "b": (BYTES, pa.binary()),
           "i": (INTS, pa.int64()), "t": (BOOLS, pa.bool_())}  # fmt: skip


def _batch(keys: dict[str, list[object]]) -> pa.RecordBatch:
    rows = len(next(iter(keys.values())))
    columns = {name: pa.array(values, COLUMNS[name][1]) for name, values in keys.items()}
    return pa.record_batch({**columns, "id": pa.array(range(rows), pa.int64())})


@st.composite
def batches(draw: st.DrawFn) -> tuple[pa.RecordBatch, tuple[str, ...]]:
    names = draw(st.lists(st.sampled_from(sorted(COLUMNS)), min_size=1, max_size=3, unique=True))
    rows = draw(st.integers(min_value=0, max_value=40))
    return _batch({n: draw(st.lists(COLUMNS[n][0], min_size=rows, max_size=rows)) for n in names}), tuple(names)


@settings(deadline=None, max_examples=200)
@given(batches())
def test_every_row_lands_in_its_own_directory_in_input_order(drawn):
    batch, partition_by = drawn
    expected: dict[str, list[int]] = {}
    for row in range(batch.num_rows):  # the directory of each row alone
        one = pa.Table.from_batches([batch.slice(row, 1).select(list(partition_by))])
        expected.setdefault(partition_dirs(one, partition_by)[0], []).append(row)

    split = split_partitions(batch, partition_by, ["id"])
    assert [directory for directory, _ in split] == list(expected), "directories in the order they first occur"
    assert {d: rows.column("id").to_pylist() for d, rows in split} == expected
    assert all(rows.schema.names == ["id"] for _, rows in split), "the partition columns are not in the objects"


def test_floats_and_bytes_are_grouped_by_their_bits_and_merged_by_their_directory():
    nans = [_float(b) for b in NAN_BITS]
    batch = _batch({"f": [nans[0], -0.0, nans[1], 0.0, None, nans[2], -0.0], "b": [b"\xff", b"\xfe"] * 3 + [None]})
    firsts, lists = key_groups(batch.select(["f", "b"]))
    assert [rows.to_pylist() for rows in lists] == [[0], [1], [2], [3], [4], [5], [6]]
    assert firsts.to_pylist() == [0, 1, 2, 3, 4, 5, 6]

    split = dict(split_partitions(batch.select(["f", "id"]), ("f",), ["id"]))
    assert {d: rows.column("id").to_pylist() for d, rows in split.items()} == {
        "f=NaN": [0, 2, 5],  # three NaNs of other bits: one directory, as Spark names them
        "f=-0.0": [1, 6],
        "f=0.0": [3],
        "f=__HIVE_DEFAULT_PARTITION__": [4],
    }
    by_bytes = dict(split_partitions(batch.select(["b", "id"]), ("b",), ["id"]))
    assert {d: rows.column("id").to_pylist() for d, rows in by_bytes.items()} == {
        "b=\ufffd": [0, 1, 2, 3, 4, 5],  # bytes that are not UTF-8 read as U+FFFD, as Spark reads them
        "b=__HIVE_DEFAULT_PARTITION__": [6],
    }


def test_many_key_combinations_keep_their_codes_below_the_row_count():
    """Three columns of 3,000 distinct values each: the product of their counts is far above the rows, and the
    combination code is encoded again after each column, so it never grows past them."""
    rows = 3_000
    batch = _batch({"i": list(range(rows)), "s": [f"v{r}" for r in range(rows)], "f": [r + 0.5 for r in range(rows)]})
    firsts, lists = key_groups(batch.select(["i", "s", "f"]))
    assert firsts.to_pylist() == list(range(rows))
    assert [rows.to_pylist() for rows in lists] == [[r] for r in range(rows)]
