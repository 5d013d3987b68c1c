"""The two-pass reorder gives exactly the rows and order of one ``take``, for every column type."""

from __future__ import annotations

import itertools
import random

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from helpers import COLUMN_KINDS, random_column

from logstore import reorder
from logstore.reorder import Reorder


def _table(rng: random.Random, n: int) -> pa.Table:
    return pa.table({kind: random_column(rng, kind, n, rng.choice([0.0, 0.3, 1.0])) for kind in COLUMN_KINDS})


def _order(rng: random.Random, n: int, vnodes: int) -> pa.Array:
    return pc.sort_indices(pa.array([rng.randrange(vnodes) for _ in range(n)], pa.int32()))


def _cuts(rng: random.Random, n: int) -> list[tuple[int, int]]:
    cuts = sorted({0, n, *(rng.randrange(n + 1) for _ in range(rng.randrange(6)))})
    return list(itertools.pairwise(cuts))


@pytest.mark.parametrize("seed", range(12))
def test_parts_equal_one_take_of_the_whole_order(monkeypatch, seed):
    rng = random.Random(seed)
    n = rng.choice([1, 50, 3_000])
    monkeypatch.setattr(reorder, "TWO_PASS_BYTES", 0)  # every variable-width column in two passes
    monkeypatch.setattr(reorder, "WINDOW_BYTES", rng.choice([1, 500, 40_000]))
    table = _table(rng, n)
    if rng.random() < 0.5:  # columns that start at an offset inside their buffers
        table = pa.concat_tables([table, table]).slice(rng.randrange(1, n + 1), n).combine_chunks()
    order = _order(rng, n, rng.choice([1, 7, 256]))

    rows = Reorder(table, order)

    assert set(rows.two_pass_columns) == {
        "string", "sparse_string", "large_string", "binary", "list", "struct"
    }  # fmt: skip
    for start, end in _cuts(rng, n):
        part = rows.take(start, end)
        assert part.schema == table.schema
        assert part.equals(table.take(order.slice(start, end - start)))


def test_fixed_width_columns_and_small_tables_take_one_pass(monkeypatch):
    rng = random.Random(3)
    table = pa.table(
        {
            "id": pa.array(range(500), pa.int64()),
            "string": pa.array(["long value " * 10] * 500),
            "binary": pa.array([b"b"] * 500),
        }
    )
    order = _order(rng, 500, 16)
    assert Reorder(table, order).two_pass_columns == []  # far under TWO_PASS_BYTES
    variable = table["string"].nbytes + table["binary"].nbytes
    monkeypatch.setattr(reorder, "TWO_PASS_BYTES", variable)
    assert Reorder(table, order).two_pass_columns == ["string", "binary"]  # never the fixed-width "id"
    monkeypatch.setattr(reorder, "TWO_PASS_BYTES", variable + 1)
    assert Reorder(table, order).two_pass_columns == []


def test_a_large_string_column_with_the_default_limits():
    """Over TWO_PASS_BYTES with the defaults: many windows, groups cut anywhere."""
    rng = random.Random(11)
    n = 300_000
    words = pa.array([f"value-{i:07d}-" + "x" * (i % 23) for i in range(n)])
    table = pa.table({"id": pa.array(range(n), pa.int64()), "s": words, "l": pa.array([[i, -i] for i in range(n)])})
    assert table["s"].nbytes > reorder.TWO_PASS_BYTES
    order = _order(rng, n, 256)
    rows = Reorder(table, order)
    assert rows.two_pass_columns == ["s", "l"]
    got = pa.concat_tables(rows.take(s, e) for s, e in [(0, 1), (1, 99_999), (99_999, 250_000), (250_000, n)])
    assert got.equals(table.take(order))
    assert got["id"].to_pylist() == order.to_pylist()  # each row where the order puts it


def test_no_rows(monkeypatch):
    monkeypatch.setattr(reorder, "TWO_PASS_BYTES", 0)
    table = pa.table({"s": pa.array([], pa.string()), "i": pa.array([], pa.int64())})
    rows = Reorder(table, pa.array([], pa.uint64()))
    assert rows.two_pass_columns == []
    assert rows.take(0, 0).equals(table)
