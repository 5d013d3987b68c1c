"""Hive partition directories: any value is encoded so it stays one path component under the prefix."""

from __future__ import annotations

import datetime
import posixpath

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from filesink.partitioning import DEFAULT_PARTITION, escape, partition_dir, unescape

PREFIX = "bucket/table"


@given(st.lists(st.one_of(st.none(), st.text(), st.integers(), st.booleans()), min_size=1, max_size=3))
def test_no_value_can_leave_the_prefix_or_add_components(values):
    columns = [f"c{i}" for i in range(len(values))]
    key = f"{PREFIX}/{partition_dir(columns, values)}/part-0.parquet"
    assert posixpath.normpath(key) == key, "no '.', '..' or empty component"
    assert key.startswith(PREFIX + "/")
    components = key[len(PREFIX) + 1 :].split("/")
    assert len(components) == len(values) + 1
    for column, value, component in zip(columns, values, components, strict=False):
        name, _, text = component.partition("=")
        assert name == column
        assert all(ch.isprintable() for ch in text) and not set(text) & set("/=\\")
        if value is None or value == "":
            assert text == DEFAULT_PARTITION
        else:
            assert unescape(text) == (str(value).lower() if isinstance(value, bool) else str(value))


@pytest.mark.parametrize(
    ("value", "text"),
    [
        ("a/b", "a%2Fb"),
        ("..", "%2E%2E"),
        (".", "%2E"),
        ("a..b", "a..b"),
        ("k=v", "k%3Dv"),
        ("100%", "100%25"),
        ("tab\there", "tab%09here"),
        ("nul\x00", "nul%00"),
        ("\u200b", "%E2%80%8B"),  # zero-width space: not printable
        ("café", "café"),
        ("", DEFAULT_PARTITION),
        (None, DEFAULT_PARTITION),
        (datetime.date(2024, 2, 29), "2024-02-29"),
        (datetime.datetime(2024, 2, 29, 13, 5, 1), "2024-02-29 13%3A05%3A01"),
        (True, "true"),
    ],
)
def test_examples(value, text):
    assert partition_dir(["p"], [value]) == f"p={text}"


def test_column_names_are_escaped_too():
    assert partition_dir(["a/b", ".."], [1, 2]) == "a%2Fb=1/%2E%2E=2"
    assert escape("x=y") == "x%3Dy"


@settings(max_examples=30, deadline=None)
@given(st.lists(st.one_of(st.none(), st.text(min_size=1, max_size=8)), min_size=1, max_size=5, unique=True))
def test_pyarrow_reads_back_the_original_values(tmp_path_factory, values):
    root = tmp_path_factory.mktemp("hive")
    for i, value in enumerate(values):
        directory = root / partition_dir(["p"], [value])
        directory.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.table({"i": [i]}), directory / f"part-{i}.parquet")
    hive = ds.partitioning(pa.schema([("p", pa.string())]), flavor="hive")
    table = ds.dataset(root, format="parquet", partitioning=hive).to_table()
    got = dict(zip(table["i"].to_pylist(), table["p"].to_pylist(), strict=True))
    assert got == {i: (v or None) for i, v in enumerate(values)}
