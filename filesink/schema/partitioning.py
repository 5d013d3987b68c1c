"""Hive-style partition directories, ``<column>=<value>/``, named exactly as Spark's own writer names them.

Spark's writer (``df.write.partitionBy(...)``) turns a value into text with ``cast(value as string)`` in the
session time zone, and escapes it (and the column name) with its path escaping. This module does the same, from
the Arrow type of the column, so that Spark, pyarrow, DuckDB and Trino read the sink's output with the same
partition values, and Spark infers the same partition column types, as for Spark's own output.

- string (Spark string, char, varchar): the value (``a b``, ``café``); bytes that are not UTF-8 (a Spark string
  may hold them, for example after ``cast(binary as string)``) as U+FFFD, as Spark's writer names them;
- binary: the bytes decoded as UTF-8, invalid bytes as U+FFFD (Spark's cast);
- bool: ``true``, ``false``; int8 to int64 (tinyint to bigint): decimal digits (``-128``);
- float, double: Java's ``Float.toString`` / ``Double.toString``: the shortest digits that read back as the same
  value, plain from 10^-3 up to 10^7, else scientific (``1.1``, ``1.0E10``, ``1.0E-4``, ``-0.0``, ``NaN``,
  ``Infinity``, ``-Infinity``);
- decimal(p, s): plain, with ``s`` digits after the point (``1.5000000000`` for decimal(20,10));
- date32 (date): ``yyyy-MM-dd`` (``0999-12-31``);
- timestamp with a zone (timestamp): ``yyyy-MM-dd HH:mm:ss[.f]`` in that zone, the fraction without trailing
  zeros (``2024-02-29 10:05:01.1``); timestamp without a zone (timestamp_ntz): the same, as it is;
- time32, time64 (time): ``HH:mm:ss[.f]`` (``12:34:56.5``).

A timestamp's zone is the one the sink's schema records: Spark labels timestamps with the session time zone, and
the sink keeps the zone of its first batch (:mod:`filesink.schema.conform`), so a value's directory does not move when
the session time zone changes later. Spark takes Java's zone ids, which pyarrow does not all know: a short id
(``PST``) is read as the JDK maps it, an offset in Java's forms (``Z``, ``GMT+05:30``, ``UTC+1``, ``+5``,
``-0530``) as ``+HH:MM`` (:func:`filesink.schema.conform.arrow_zone`).

Spark partitions by no other type (arrays, maps, structs, variant, void: ``INVALID_PARTITION_COLUMN_DATA_TYPE``;
the sink refuses intervals too): :func:`unsupported_columns` names them for the sink's schema check.

Escaping is Spark's (``ExternalCatalogUtils.escapePathName``): ``%XX`` for the control characters 0x01-0x1F and
0x7F and for ``" # % ' * / : = ? \\ { [ ] ^``, and, beyond Spark (which fails on it), for NUL. Everything else,
non-ASCII characters included, is written as it is: Spark reads ``%XX`` back as one character, so percent-encoded
UTF-8 bytes would come back wrong. Null and the empty string become ``__HIVE_DEFAULT_PARTITION__``, which readers
turn back into null. No value can add a path separator or leave the output prefix: ``/`` and NUL are always
escaped, and a component always holds ``=``, so it is never ``.`` or ``..``.

Double and float text: Spark on Java 19 and later prints the shortest digits, as here; on Java 17 a few values get
extra digits (``2.82879384806159008E17`` for ``2.82879384806159E17``). Both texts read back as the same double.

:func:`check_paths` is the admission check (:mod:`filesink.tasks.admission`): the directories of a batch's rows must fit
the output's limits (:mod:`filesink.output.limits`), or the batch is refused before it is sealed.

:func:`legacy_partition_dir` is how versions before this text named directories (``nan``, ``+00:00``, hex
binary, UTF-8 escapes): only recovery uses it, to rewrite a file such a version left pending with the same keys.
"""

from __future__ import annotations

import datetime
import decimal
import math
import struct
from collections.abc import Sequence
from typing import Any
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.compute as pc

from ..output.limits import KeyLimits
from .conform import arrow_zone

DEFAULT_PARTITION = "__HIVE_DEFAULT_PARTITION__"

# Spark's ExternalCatalogUtils.charToEscape (not on Windows), plus NUL.
_ESCAPED = frozenset([chr(c) for c in range(0x00, 0x20)] + list("\"#%'*/:=?\\\x7f{[]^"))

SPARK_TYPES = (
    "string",
    "binary",
    "boolean",
    "tinyint",
    "smallint",
    "int",
    "bigint",
    "float",
    "double",
    "decimal",
    "date",
    "timestamp",
    "timestamp_ntz",
    "time",
)
"""The Spark types a partition column may have (char and varchar are strings)."""


class PartitionTypeError(TypeError):
    """A partition column of a type the sink cannot turn into Spark's directory text (the message names it)."""


def escape(text: str) -> str:
    """Escape one path component (a partition column name, or a value's text) as Spark does."""
    return "".join(f"%{ord(ch):02X}" if ch in _ESCAPED else ch for ch in text)


def unescape(text: str) -> str:
    return unquote(text, encoding="utf-8", errors="surrogatepass")


# -- a value's text ------------------------------------------------------------------------------------------


def _shortest(x: float, single: bool) -> tuple[str, int]:
    """(digits, exponent) of the decimal Java's ``toString`` prints for finite, non-zero ``abs(x)``:
    ``x = d.ddd * 10**exponent``, the fewest digits that read back as ``x`` (as a float32 if ``single``), the
    closest such; when one digit is enough, the closest of one or two digits (Java 19's rule)."""

    def back(text: str) -> float:
        value = float(text)
        return struct.unpack("f", struct.pack("f", value))[0] if single else value

    def parts(text: str) -> tuple[str, int]:
        _sign, digits, exponent = decimal.Decimal(text).as_tuple()
        ds = "".join(map(str, digits)).rstrip("0") or "0"
        assert isinstance(exponent, int)
        return ds, exponent + len(digits) - 1

    text = next(t for p in range(9) if back(t := f"{x:.{p}e}") == x) if single else repr(x)
    digits, exponent = parts(text)
    if len(digits) == 1:
        two = f"{x:.1e}"
        exact = decimal.Decimal(x)
        if back(two) == x and abs(decimal.Decimal(two) - exact) < abs(decimal.Decimal(text) - exact):
            digits, exponent = parts(two)
    return digits, exponent


def java_float_text(x: float, single: bool = False) -> str:
    """Java's ``Double.toString`` (``Float.toString`` if ``single``), which is what Spark's cast to string gives."""
    if math.isnan(x):
        return "NaN"
    if math.isinf(x):
        return "Infinity" if x > 0 else "-Infinity"
    sign = "-" if math.copysign(1.0, x) < 0 else ""
    if x == 0:
        return f"{sign}0.0"
    digits, exponent = _shortest(abs(x), single)
    if 1e-3 <= abs(x) < 1e7:
        if exponent >= 0:
            whole = digits[: exponent + 1].ljust(exponent + 1, "0")
            return f"{sign}{whole}.{digits[exponent + 1 :] or '0'}"
        return f"{sign}0.{'0' * (-exponent - 1)}{digits}"
    return f"{sign}{digits[0]}.{digits[1:] or '0'}E{exponent}"


def _trim_fraction(texts: pa.Array) -> pa.Array:
    """``12:00:01.100000`` -> ``12:00:01.1``, ``12:00:01.000000`` -> ``12:00:01``."""
    trimmed = pc.replace_substring_regex(texts, pattern=r"(\.\d*?)0+$", replacement=r"\1")
    return pc.replace_substring_regex(trimmed, pattern=r"\.$", replacement="")


def _time_text(count: int, per_second: int) -> str:
    seconds, fraction = divmod(count, per_second)
    text = f"{seconds // 3600:02d}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"
    if fraction:
        text += "." + f"{fraction:0{len(str(per_second)) - 1}d}".rstrip("0")
    return text


_PER_SECOND = {"s": 1, "ms": 1_000, "us": 1_000_000, "ns": 1_000_000_000}


def value_texts(values: pa.Array | pa.ChunkedArray, column: str = "") -> list[str | None]:
    """The text of each value (None for null) as Spark's writer gives it; see the module docstring."""
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    if pa.types.is_dictionary(values.type):
        values = values.dictionary_decode()
    t = values.type
    if pa.types.is_null(t):
        return [None] * len(values)
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t):
        if _valid_utf8(values):
            return values.to_pylist()  # type: ignore[no-any-return]
        values = values.view(_AS_BYTES[t.id])  # Spark's strings are bytes, not checked: decoded as Spark does
        t = values.type
    if (
        pa.types.is_binary(t)
        or pa.types.is_large_binary(t)
        or pa.types.is_fixed_size_binary(t)
        or t == pa.binary_view()
    ):
        return [None if v is None else v.decode("utf-8", "replace") for v in values.to_pylist()]
    if pa.types.is_boolean(t):
        return [None if v is None else ("true" if v else "false") for v in values.to_pylist()]
    if pa.types.is_integer(t):
        return [None if v is None else str(v) for v in values.to_pylist()]
    if pa.types.is_float32(t) or pa.types.is_float64(t):
        single = pa.types.is_float32(t)
        return [None if v is None else java_float_text(v, single) for v in values.to_pylist()]
    if pa.types.is_decimal(t):
        return [None if v is None else format(v, "f") for v in values.to_pylist()]
    if pa.types.is_date(t):
        return pc.strftime(values.cast(pa.timestamp("s")), format="%Y-%m-%d").to_pylist()  # type: ignore[no-any-return]
    if pa.types.is_timestamp(t):
        if t.tz is not None and arrow_zone(t.tz) != t.tz:
            values = values.cast(pa.timestamp(t.unit, arrow_zone(t.tz)))  # the same instants, a zone pyarrow knows
        return _trim_fraction(pc.strftime(values, format="%Y-%m-%d %H:%M:%S")).to_pylist()  # type: ignore[no-any-return]
    if pa.types.is_time(t):
        per_second = _PER_SECOND[t.unit]
        counts = values.cast(pa.int64()).to_pylist()
        return [None if v is None else _time_text(v, per_second) for v in counts]
    where = f"partition column {column}" if column else "a partition column"
    raise PartitionTypeError(
        f"{where} has the Arrow type {t}, which the sink cannot write as a partition directory; partition by a "
        f"column of one of the Spark types {', '.join(SPARK_TYPES)}"
    )


_AS_BYTES = {
    pa.string().id: pa.binary(),
    pa.large_string().id: pa.large_binary(),
    pa.string_view().id: pa.binary_view(),
}


def _valid_utf8(values: pa.Array) -> bool:
    """Whether every value of a string array is UTF-8, as Arrow requires and Spark does not check."""
    try:
        values.validate(full=True)
    except pa.ArrowInvalid:
        return False
    return True


def component_texts(column: str, values: pa.Array | pa.ChunkedArray) -> list[str]:
    """``<column>=<value>`` of each value, escaped: one directory name per value."""
    name = escape(column)
    return [f"{name}={escape(text) if text else DEFAULT_PARTITION}" for text in value_texts(values, column)]


def partition_dirs(keys: pa.Table | pa.RecordBatch, columns: Sequence[str]) -> list[str]:
    """``col1=v1/col2=v2`` (no leading or trailing slash) for each row of ``keys`` (which holds ``columns``).
    Work in Python per row: give it distinct rows (the writer gives one row per distinct combination)."""
    per_column = [component_texts(c, keys.column(c)) for c in columns]
    return ["/".join(parts) for parts in zip(*per_column, strict=True)] if per_column else []


def partition_dir(columns: Sequence[str], values: Sequence[object], types: Sequence[pa.DataType] | None = None) -> str:
    """The directory of one combination of Python values (Arrow types inferred from the values unless given)."""
    if len(columns) != len(values):
        raise ValueError(f"{len(columns)} partition columns but {len(values)} values")
    if not columns:
        return ""
    arrays = [pa.array([v], type=types[i] if types is not None else None) for i, v in enumerate(values)]
    return partition_dirs(pa.Table.from_arrays(arrays, names=list(columns)), columns)[0]


# -- the admission check: directories that fit the output ---------------------------------------------------


def _start(text: str, limit: int = 40) -> str:
    return repr(text if len(text) <= limit else text[:limit] + "...")


_ESCAPED_CLASS = "[" + "".join(f"\\x{ord(ch):02x}" for ch in sorted(_ESCAPED)) + "]"
"""A regular expression (RE2) matching one character :func:`escape` turns into ``%XX``."""
_DEFAULT_BYTES = len(DEFAULT_PARTITION)
_TEXT_BOUND = 40
"""No value of a type but string, binary and decimal has a longer escaped text (a timestamp with a 7-character year
and nanoseconds, its colons escaped, has 38 bytes); nor has ``__HIVE_DEFAULT_PARTITION__``."""


def _text_bound(values: pa.Array) -> int | None:
    """The most bytes the escaped text of any of ``values`` can have, or None to measure each value. Escaping
    makes a character 3 bytes at most, and so does decoding binary (an invalid byte becomes U+FFFD)."""
    t = values.type
    if pa.types.is_decimal(t):
        return max(int(t.precision) + 3, _DEFAULT_BYTES)  # sign, point, and a leading zero when scale == precision
    if pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t) or pa.types.is_null(t):
        return _TEXT_BOUND
    if pa.types.is_date(t) or pa.types.is_timestamp(t) or pa.types.is_time(t):
        return _TEXT_BOUND
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t) or pa.types.is_large_binary(t):
        longest = pc.max(pc.binary_length(values)).as_py()
        return max(3 * (longest or 0), _DEFAULT_BYTES)
    return None


def _text_bytes(values: pa.Array, column: str) -> pa.Array:
    """The bytes of each value's escaped text (int64): vectorized for strings, per distinct value otherwise."""
    t = values.type
    if (pa.types.is_string(t) or pa.types.is_large_string(t)) and _valid_utf8(values):
        length = pc.binary_length(values).cast(pa.int64())
        escapes = pc.count_substring_regex(values, pattern=_ESCAPED_CLASS).cast(pa.int64())
        escaped = pc.add(length, pc.multiply(escapes, 2))
        return pc.if_else(pc.fill_null(pc.equal(length, 0), True), _DEFAULT_BYTES, escaped)
    distinct = pc.unique(values)
    texts = value_texts(distinct, column)
    sizes = pa.array([len(escape(x).encode("utf-8", "surrogatepass")) if x else _DEFAULT_BYTES for x in texts])
    return pc.take(sizes, pc.index_in(values, value_set=distinct, skip_nulls=False)).cast(pa.int64())


def check_paths(batch: pa.RecordBatch, columns: Sequence[str], limits: KeyLimits) -> str | None:
    """What is wrong with the partition directories of ``batch``'s rows under the output, or None if every row's
    object key fits ``limits``: each ``col=value`` directory name, and the whole key (output prefix, directories
    and the object's name).

    Cheap on every batch: a column is first bounded, by its type or, for strings and binary, by three times its
    longest value's bytes (vectorized). Only a column whose bound does not fit has its values measured, per
    distinct value (strings vectorized, per row); the per-row sum of a key's parts is vectorized; only a refused
    value's text is made in Python."""
    if not columns or batch.num_rows == 0:
        return None
    for column in columns:  # a directory can be named at all (a time zone pyarrow does not know cannot)
        try:
            value_texts(batch.column(column).slice(0, 1), column)
        except (pa.ArrowException, ValueError) as e:
            zone = getattr(batch.schema.field(column).type, "tz", None)
            fix = (
                f"set spark.sql.session.timeZone to a region id (such as Asia/Kolkata) or an offset (+05:30) "
                f"instead of {zone!r}, in a new sink if this one recorded that zone"
                if zone
                else "partition by another column"
            )
            return (
                f"partition column {column!r} of type {batch.schema.field(column).type}: no directory can be named "
                f"after its values ({e}); {fix}"
            )
    names = {c: len(escape(c).encode("utf-8", "surrogatepass")) + 1 for c in columns}  # "<column>="
    for column, size in names.items():
        if size + 1 > limits.component_bytes:  # no value, however short, leaves room
            return (
                f"partition column {_start(column)} has a name of {size - 1} bytes (escaped), so every directory "
                f"'<name>=<value>' of it is over the {limits.component_bytes} bytes {limits.component_rule}; no file "
                "could hold its rows. Rename the column in the query (alias) to a shorter name, and partition by that"
            )
    sizes: dict[str, pa.Array | int] = {}
    for column in columns:
        values = batch.column(column)
        bound = _text_bound(values)
        if bound is not None and names[column] + bound <= limits.component_bytes:
            sizes[column] = names[column] + bound
            continue
        size = pc.add(_text_bytes(values, column), names[column])
        worst = pc.max(size).as_py()
        if worst > limits.component_bytes:
            row = pc.index(size, worst).as_py()
            text = value_texts(values.slice(row, 1), column)[0] or ""
            directory = component_texts(column, values.slice(row, 1))[0]
            return (
                f"partition column {column!r} has a value of {len(text)} characters, {_start(text)}, whose directory "
                f"name {_start(directory)} is {worst} bytes long, over the {limits.component_bytes} bytes "
                f"{limits.component_rule}; no file could hold the row. Shorten or filter such values in the query "
                f"(for example substring({column}, 1, 100), or a hash of the value), or partition by another column"
            )
        sizes[column] = size
    fixed = limits.prefix_bytes + len(columns) + limits.name_bytes  # a '/' after each directory
    most = sum(s if isinstance(s, int) else pc.max(s).as_py() for s in sizes.values())
    if fixed + most <= limits.key_bytes:
        return None
    exact = {
        c: pc.add(_text_bytes(batch.column(c), c), names[c]) if isinstance(s, int) else s for c, s in sizes.items()
    }
    total: pa.Array = pa.array([fixed] * batch.num_rows, pa.int64())
    for size in exact.values():
        total = pc.add(total, size)
    longest = pc.max(total).as_py()
    if longest <= limits.key_bytes:
        return None
    row = pc.index(total, longest).as_py()
    parts = []
    for column in columns:
        directory = component_texts(column, batch.column(column).slice(row, 1))[0]
        parts.append(f"{column}={_start(directory.partition('=')[2], 20)} ({exact[column][row].as_py()} bytes)")
    return (
        f"the partition directories of a row, {', '.join(parts)}, make its object's key {longest} bytes long "
        f"({limits.prefix_bytes} bytes of output prefix and {limits.name_bytes} of object name included), over the "
        f"{limits.key_bytes} bytes {limits.key_rule}; no file could hold the row. Shorten or filter such values in "
        "the query, partition by fewer columns, or write to an output with a shorter path"
    )


# -- the Spark side: which types a partition column may have -------------------------------------------------


def unsupported_columns(schema: Any, columns: Sequence[str]) -> list[str]:
    """The partition ``columns`` of a Spark schema whose type is not one of :data:`SPARK_TYPES`, as
    ``"name (type)"``."""
    from pyspark.sql import types as T

    allowed: tuple[type, ...] = (
        T.StringType,
        T.BinaryType,
        T.BooleanType,
        T.ByteType,
        T.ShortType,
        T.IntegerType,
        T.LongType,
        T.FloatType,
        T.DoubleType,
        T.DecimalType,
        T.DateType,
        T.TimestampType,
        T.TimestampNTZType,
    )
    time_type = getattr(T, "TimeType", None)
    if time_type is not None:
        allowed += (time_type,)
    types = {f.name: f.dataType for f in schema.fields}
    return [f"{c} ({types[c].simpleString()})" for c in columns if c in types and not isinstance(types[c], allowed)]


# -- before directories followed Spark's text ----------------------------------------------------------------

_LEGACY_SPECIAL = frozenset("\"#%'*/:=?\\{[]^")


def _legacy_escape(text: str) -> str:
    def percent(ch: str) -> str:
        return "".join(f"%{b:02X}" for b in ch.encode("utf-8", "surrogatepass"))

    if text.strip(".") == "":
        return "".join(percent(ch) for ch in text)
    return "".join(
        percent(ch) if ch in _LEGACY_SPECIAL or not ch.isprintable() or ord(ch) < 0x20 or ord(ch) == 0x7F else ch
        for ch in text
    )


def _legacy_value_text(value: object) -> str | None:
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, datetime.datetime):
        return value.isoformat(sep=" ")
    if isinstance(value, datetime.date | datetime.time | decimal.Decimal):
        return str(value)
    if isinstance(value, bytes):
        return value.hex()
    return str(value)


def legacy_partition_dir(columns: Sequence[str], values: Sequence[object]) -> str:
    """The directory versions before Spark's text gave a combination of Python values (``nan``, ``+00:00``)."""
    parts = []
    for column, value in zip(columns, values, strict=True):
        text = _legacy_value_text(value)
        parts.append(f"{_legacy_escape(column)}={DEFAULT_PARTITION if not text else _legacy_escape(text)}")
    return "/".join(parts)
