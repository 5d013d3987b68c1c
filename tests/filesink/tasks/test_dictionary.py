"""Which columns get a Parquet dictionary (:mod:`filesink.tasks.dictionary`), checked in the written files' metadata."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq

from filesink.tasks.dictionary import dictionary_columns, leaf_paths


def _write(table: pa.Table, row_group_rows: int = 1_000_000) -> pq.FileMetaData:
    sink = pa.BufferOutputStream()
    use = dictionary_columns(table, row_group_rows)
    with pq.ParquetWriter(sink, table.schema, compression="zstd", use_dictionary=use) as writer:
        writer.write_table(table, row_group_size=row_group_rows)
    written = pq.ParquetFile(pa.BufferReader(sink.getvalue()))
    assert written.read().equals(table), "the rows read back are the rows written"
    return written.metadata


def _has_dictionary(metadata: pq.FileMetaData) -> dict[str, bool]:
    group = metadata.row_group(0)
    return {group.column(i).path_in_schema: group.column(i).has_dictionary_page for i in range(group.num_columns)}


def _rows(n: int) -> pa.Table:
    return pa.table(
        {
            "id": pa.array(range(n), pa.int64()),
            "key": pa.array([f"session-{i * 7919 % n:08d}-abcdefghijklmnop" for i in range(n)]),
            "country": pa.array(["DE", "FR", "US", None][i % 4] for i in range(n)),
            "amount": pa.array([float(i % 500) for i in range(n)]),
        }
    )


def test_mostly_distinct_columns_are_written_plain_and_the_others_keep_their_dictionary():
    metadata = _write(_rows(200_000))
    assert _has_dictionary(metadata) == {"id": False, "key": False, "country": True, "amount": True}


def test_a_small_file_keeps_every_dictionary_that_fits_its_page():
    """Distinct values that fit the dictionary page are worth a dictionary: 2,000 rows of them."""
    assert dictionary_columns(_rows(2_000), 1_000_000) is True
    assert set(_has_dictionary(_write(_rows(2_000))).values()) == {True}


def test_the_row_group_bounds_the_dictionary():
    """Row groups of 5,000 rows: each chunk's dictionary of unique ids fits its page."""
    assert dictionary_columns(_rows(50_000), 5_000) is True


def test_nested_columns_keep_their_dictionary_next_to_a_plain_one():
    n = 200_000
    table = pa.table(
        {
            "id": pa.array(range(n), pa.int64()),
            "tags": pa.array([["a", "b"][: i % 3] for i in range(n)], pa.list_(pa.string())),
            "point": pa.array([{"x": i % 10, "label": "p"} for i in range(n)]),
        }
    )
    assert leaf_paths(table.schema) == ["id", "tags.list.element", "point.x", "point.label"]
    assert _has_dictionary(_write(table)) == {
        "id": False,
        "tags.list.element": True,
        "point.x": True,
        "point.label": True,
    }


def test_empty_and_all_null_columns_keep_the_default():
    assert dictionary_columns(_rows(0), 1_000_000) is True
    nulls = pa.table({"a": pa.nulls(200_000, pa.string()), "b": pa.array(range(200_000))})
    assert dictionary_columns(nulls, 1_000_000) == ["a"], "b: 200,000 distinct int64 outgrow the page"


def test_the_choice_depends_only_on_the_rows():
    table = _rows(100_000)
    assert dictionary_columns(table, 1_000_000) == dictionary_columns(table.slice(0), 1_000_000)
    one, two = pa.BufferOutputStream(), pa.BufferOutputStream()
    for sink in (one, two):
        with pq.ParquetWriter(sink, table.schema, use_dictionary=dictionary_columns(table, 1_000_000)) as writer:
            writer.write_table(table)
    assert one.getvalue() == two.getvalue()


def test_a_key_column_in_log_store_order_is_judged_over_the_whole_row_group():
    """A file's rows come in vnode order, and the vnode is a hash of the key: the first 20,000 rows hold a few
    vnodes' keys, most of them twice here, though the row group holds 200,000 distinct keys (1.6 MB of int64,
    more than the dictionary page). The probe is spread over the rows, so the key is written plain."""
    n = 400_000
    keys = pa.array([(i * 7919) % (n // 2) for i in range(n)], pa.int64())
    vnodes = pa.compute.bit_wise_and(keys, 255)
    order = pa.compute.sort_indices(
        pa.table({"v": vnodes, "i": pa.array(range(n))}), [("v", "ascending"), ("i", "ascending")]
    )
    table = pa.table({"key": keys, "country": pa.array(["DE", "FR", "US", "NL"] * (n // 4))}).take(order)
    head = table.slice(0, 20_000).column("key")
    assert len(head.unique()) < 11_000, "the first rows hold most of their keys twice"
    assert _has_dictionary(_write(table)) == {"key": False, "country": True}
