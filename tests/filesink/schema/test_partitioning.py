"""Hive partition directories: Spark's text for each type, Spark's escaping, and no value can leave the prefix.

What Spark's own writer produces is checked against Spark itself in tests/e2e/test_spark_partition_text.py; these
tests pin the text without Spark, and the admission check's limits (:func:`check_paths`)."""

from __future__ import annotations

import datetime
import decimal
import math
import posixpath
import struct

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from filesink.output.limits import KeyLimits
from filesink.schema.partitioning import (
    DEFAULT_PARTITION,
    PartitionTypeError,
    _text_bound,
    _text_bytes,
    arrow_zone,
    check_paths,
    component_texts,
    escape,
    java_float_text,
    legacy_partition_dir,
    partition_dir,
    partition_dirs,
    unescape,
    value_texts,
)

PREFIX = "bucket/table"
INT64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)


@settings(deadline=None)
@given(st.lists(st.one_of(st.none(), st.text(), INT64, st.booleans()), min_size=1, max_size=3))
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
        assert "/" not in text and "\x00" not in text and "=" not in text
        if value is None or value == "":
            assert text == DEFAULT_PARTITION
        else:
            assert unescape(text) == (str(value).lower() if isinstance(value, bool) else str(value))


@pytest.mark.parametrize(
    ("value", "text"),
    [
        ("a/b", "a%2Fb"),
        ("..", ".."),  # the component is "p=..": never a relative path component
        (".", "."),
        ("k=v", "k%3Dv"),
        ("100%", "100%25"),
        ("tab\there", "tab%09here"),
        ("nul\x00", "nul%00"),  # beyond Spark, which fails on it
        ("\x01\x1f\x7f", "%01%1F%7F"),
        ("{[]}^", "%7B%5B%5D}%5E"),  # Spark escapes '{' and not '}'
        ("#?*\"'\\:", "%23%3F%2A%22%27%5C%3A"),
        ("~!@$&()+,; <>|", "~!@$&()+,; <>|"),
        ("\u200b", "\u200b"),  # not ASCII: as it is (Spark would read %E2%80%8B back as three characters)
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
    assert partition_dir(["a/b", ".."], [1, 2]) == "a%2Fb=1/..=2"
    assert escape("x=y") == "x%3Dy"


# -- the text of each type, as Spark's cast to string gives it (the values Spark was run on, see the e2e test) --

UTC = datetime.UTC


def _f32(x: float) -> float:
    return float(struct.unpack("f", struct.pack("f", x))[0])


@pytest.mark.parametrize(
    ("array", "texts"),
    [
        (pa.array([True, False, None]), ["true", "false", None]),
        (pa.array([-128, 127], pa.int8()), ["-128", "127"]),
        (pa.array([2**63 - 1, -(2**63)], pa.int64()), ["9223372036854775807", "-9223372036854775808"]),
        (
            pa.array(
                [1.1, math.nan, math.inf, -math.inf, -0.0, 0.0, 1e10, 1e-4, 3.4028235e38, 1e-45, 1e7], pa.float32()
            ),
            [
                "1.1",
                "NaN",
                "Infinity",
                "-Infinity",
                "-0.0",
                "0.0",
                "1.0E10",
                "1.0E-4",
                "3.4028235E38",
                "1.4E-45",
                "1.0E7",
            ],
        ),
        (
            pa.array([1.1, 0.001, 9999999.0, 0.1 + 0.2, 5e-324, 1.7976931348623157e308, 123456789.123, 1e23, 2e-3]),
            [
                "1.1",
                "0.001",
                "9999999.0",
                "0.30000000000000004",
                "4.9E-324",
                "1.7976931348623157E308",
                "1.23456789123E8",
                "1.0E23",
                "0.002",
            ],
        ),
        (
            pa.array(
                [decimal.Decimal("1.5"), decimal.Decimal(0), decimal.Decimal("1E-7"), decimal.Decimal("-12345.6789")],
                pa.decimal128(20, 10),
            ),
            ["1.5000000000", "0.0000000000", "0.0000001000", "-12345.6789000000"],
        ),
        (
            pa.array([decimal.Decimal(12345678901234567890123456789)], pa.decimal128(38, 0)),
            ["12345678901234567890123456789"],
        ),
        (
            pa.array([datetime.date(2024, 2, 29), datetime.date(1, 1, 1), datetime.date(999, 12, 31)]),
            ["2024-02-29", "0001-01-01", "0999-12-31"],
        ),
        (
            pa.array(
                [
                    datetime.datetime(2024, 2, 29, 13, 5, 1, 100000, tzinfo=UTC),
                    datetime.datetime(2024, 2, 29, 13, 5, 1, tzinfo=UTC),
                    datetime.datetime(2024, 2, 29, 13, 5, 1, 123456, tzinfo=UTC),
                    datetime.datetime(1900, 1, 1, tzinfo=UTC),
                    datetime.datetime(1, 1, 1, 3, tzinfo=UTC),
                ],
                pa.timestamp("us", tz="UTC"),
            ).cast(pa.timestamp("us", tz="America/Sao_Paulo")),
            # in the zone of the type, without an offset; before 1914 Sao Paulo's local mean time (-03:06:28)
            [
                "2024-02-29 10:05:01.1",
                "2024-02-29 10:05:01",
                "2024-02-29 10:05:01.123456",
                "1899-12-31 20:53:32",
                "0000-12-31 23:53:32",
            ],
        ),
        (
            pa.array(
                [datetime.datetime(2024, 2, 29, 13, 5, 1, 100000), datetime.datetime(2024, 2, 29)], pa.timestamp("us")
            ),
            ["2024-02-29 13:05:01.1", "2024-02-29 00:00:00"],
        ),
        (
            pa.array([datetime.time(12, 34, 56, 500000), datetime.time(0, 0)], pa.time64("ns")),
            ["12:34:56.5", "00:00:00"],
        ),
        (pa.array([b"abc", b"\xff\x00", None]), ["abc", "\ufffd\x00", None]),
    ],
    ids=lambda v: str(v.type) if isinstance(v, pa.Array) else None,
)
def test_value_texts(array, texts):
    assert value_texts(array) == texts


@pytest.mark.parametrize("kind", [pa.string(), pa.large_string(), pa.string_view()], ids=str)
def test_strings_with_bytes_that_are_not_utf8_are_named_as_spark_names_them(kind):
    """A Spark string may hold any bytes (``cast(unhex('C328') as string)``); Spark's writer names the directory
    with each invalid sequence as U+FFFD, and so does the sink, instead of failing the file after the seal."""
    as_bytes = {pa.string(): pa.binary(), pa.large_string(): pa.large_binary(), pa.string_view(): pa.binary_view()}
    array = pa.array([b"\xc3(", b"ok", None, b"a\xff/b", b""], as_bytes[kind]).view(kind)
    assert value_texts(array) == ["\ufffd(", "ok", None, "a\ufffd/b", ""]
    assert component_texts("p", array) == [
        "p=\ufffd(",
        "p=ok",
        f"p={DEFAULT_PARTITION}",
        "p=a\ufffd%2Fb",
        f"p={DEFAULT_PARTITION}",
    ]
    if kind != pa.string_view():
        expected = [len(text.encode()) - len("p=") for text in component_texts("p", array)]
        assert _text_bytes(array, "p").to_pylist() == expected  # 3 bytes for each byte that was not UTF-8
        assert max(expected) <= (_text_bound(array) or 0)


@pytest.mark.parametrize(
    ("zone", "known"),
    [
        ("GMT+05:30", "+05:30"),
        ("UTC+1", "+01:00"),
        ("UT-3", "-03:00"),
        ("+5", "+05:00"),
        ("Z", "+00:00"),
        ("PST", "America/Los_Angeles"),
        ("EST", "-05:00"),
        ("America/Sao_Paulo", "America/Sao_Paulo"),
        ("UTC", "UTC"),
    ],
)
def test_java_zone_ids_are_read_as_the_jdk_reads_them(zone, known):
    assert arrow_zone(zone) == known
    instants = [datetime.datetime(2024, 2, 29, 10, 5, 1, 100000, tzinfo=datetime.UTC), None]
    assert value_texts(pa.array(instants, pa.timestamp("us", zone))) == value_texts(
        pa.array(instants, pa.timestamp("us", known))
    )


def test_a_zone_no_directory_can_be_named_in_is_refused_by_the_admission_check():
    """An offset with seconds (Java takes ``+05:30:15``, pyarrow does not): refused before the seal, not failed
    at every roll after it."""
    batch = pa.record_batch([pa.array([0, 1], pa.timestamp("s", "+05:30:15"))], names=["ts"])
    problem = check_paths(batch, ["ts"], LIMITS)
    assert problem is not None
    assert "partition column 'ts' of type timestamp[s, tz=+05:30:15]: no directory can be named" in problem
    assert "set spark.sql.session.timeZone to a region id" in problem
    assert check_paths(pa.record_batch([pa.array([0], pa.timestamp("s", "PST"))], names=["ts"]), ["ts"], LIMITS) is None


@settings(max_examples=300, deadline=None)
@given(st.floats(allow_nan=False, allow_infinity=False), st.booleans())
def test_float_text_reads_back_as_the_same_value_in_java_form(x, single):
    if single:
        x = _f32(x) if abs(x) < 3.4e38 else 1.0
    text = java_float_text(x, single)
    back = float(text)
    assert (_f32(back) if single else back) == x and math.copysign(1, back) == math.copysign(1, x)
    if x == 0 or 1e-3 <= abs(x) < 1e7:
        assert "E" not in text and "." in text
    else:
        mantissa, _, exponent = text.partition("E")
        assert "." in mantissa and 1 <= abs(float(mantissa)) < 10
        assert exponent == str(int(exponent))


def test_types_without_spark_text_are_refused_naming_the_column():
    with pytest.raises(PartitionTypeError, match=r"partition column tags has the Arrow type list<item: int64>"):
        value_texts(pa.array([[1]]), "tags")


def test_the_same_directory_for_values_spark_writes_alike():
    keys = pa.table({"p": pa.array([None, ""]), "q": pa.array([b"\xff", b"\xfe"])})
    assert partition_dirs(keys, ["p", "q"]) == [f"p={DEFAULT_PARTITION}/q=\ufffd"] * 2


def test_legacy_directories_are_as_before():
    assert legacy_partition_dir(["p"], [math.nan]) == "p=nan"
    assert (
        legacy_partition_dir(["p"], [datetime.datetime(2024, 1, 1, tzinfo=UTC)]) == "p=2024-01-01 00%3A00%3A00+00%3A00"
    )
    assert legacy_partition_dir(["p", ".."], ["\u200b", ".."]) == "p=%E2%80%8B/%2E%2E=%2E%2E"
    assert legacy_partition_dir(["p"], [b"\x01"]) == "p=01"


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


# -- check_paths: the admission check against an output's limits ----------------------------------------------

LIMITS = KeyLimits(
    prefix_bytes=10,
    component_bytes=255,
    key_bytes=400,
    component_rule="a path component may have on the test's store",
    key_rule="a key may have on the test's store",
    name_bytes=100,
)


def test_check_paths_passes_values_that_fit():
    batch = pa.record_batch({"p": ["x" * 253, "é" * 126, None], "q": [1, 2, 3]})  # "p=" + 253 bytes = 255
    assert check_paths(batch, ["p"], LIMITS) is None


def test_check_paths_names_the_column_the_value_and_the_limit():
    batch = pa.record_batch({"p": ["short", "é" * 127, "a" * 300, "also short"]})  # 2 + 254 bytes: over by one
    problem = check_paths(batch, ["p"], LIMITS)
    assert problem is not None
    assert "partition column 'p' has a value of 300 characters, 'aaaaaaaa" in problem
    assert "302 bytes long, over the 255 bytes a path component may have on the test's store" in problem
    assert "substring(p, 1, 100)" in problem
    escaped = pa.record_batch({"p": [":" * 100]})  # 3 bytes escaped each: 302 bytes
    assert "has a value of 100 characters" in (check_paths(escaped, ["p"], LIMITS) or "")


def test_check_paths_blames_a_partition_column_name_too_long_for_any_directory():
    name = "n" * 300
    batch = pa.record_batch([pa.array(["0", "1"])], names=[name])
    problem = check_paths(batch, [name], LIMITS)
    assert problem is not None
    assert problem.startswith(f"partition column {name[:40] + '...'!r} has a name of 300 bytes (escaped)"), problem
    assert "Rename the column in the query (alias)" in problem
    short = "n" * (LIMITS.component_bytes - 2)  # "<name>=" and one character: exactly the limit
    assert check_paths(pa.record_batch([pa.array(["0"])], names=[short]), [short], LIMITS) is None


def test_check_paths_sums_the_whole_key():
    # each directory fits, and the longest of each column together would not, but no row has both
    batch = pa.record_batch({"a": ["x" * 150, "y"], "b": ["y", "z" * 150]})
    assert check_paths(batch, ["a", "b"], LIMITS) is None
    # 10 + 2 + 100 + (2 + 150) + (2 + 150) = 416 > 400
    batch = pa.record_batch({"a": ["x" * 150, "y"], "b": ["z" * 150, "z"]})
    problem = check_paths(batch, ["a", "b"], LIMITS)
    assert problem is not None
    assert "make its object's key 416 bytes long" in problem
    assert "a='xxxxxxxxxxxxxxxxxxxx...' (152 bytes), b='zzzzzzzzzzzzzzzzzzzz...' (152 bytes)" in problem
    assert "over the 400 bytes a key may have on the test's store" in problem


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.none(), st.text(max_size=12)), min_size=1, max_size=20))
def test_the_vectorized_lengths_are_the_escaped_texts_lengths(values):
    array = pa.array(values, pa.string())
    expected = [len(text.encode()) - len("p=") for text in component_texts("p", array)]
    assert _text_bytes(array, "p").to_pylist() == expected
    assert max(expected) <= (_text_bound(array) or 0)


@pytest.mark.parametrize(
    "array",
    [
        pa.array([b"\xff" * 5, b"a:b", None]),
        pa.array([1.5, math.nan, None]),
        pa.array([decimal.Decimal("-0.00001")], pa.decimal128(5, 5)),
        pa.array([datetime.datetime(2024, 1, 1, 1, 1, 1, 123456)], pa.timestamp("ns", "UTC")),
    ],
    ids=lambda a: str(a.type),
)
def test_the_lengths_of_other_types_are_measured_per_value_and_bounded(array):
    expected = [len(text.encode()) - len("p=") for text in component_texts("p", array)]
    assert _text_bytes(array, "p").to_pylist() == expected
    assert max(expected) <= (_text_bound(array) or 0)
