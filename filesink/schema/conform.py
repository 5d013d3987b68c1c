"""The sink's one schema: what a Spark batch must match, and the Arrow schema its files are written with.

A sink records two schemas with its first batch:

- **the Spark schema**, column names and type strings (``simpleString``), which every later batch must match
  (:func:`schema_problems`);
- **the files' Arrow schema**: the first segment's, with every field nullable at every depth (map keys excepted:
  Arrow and Parquet require them non-null), :func:`file_schema`.

Spark's type strings say nothing of a timestamp's time zone (Spark's Arrow conversion labels timestamps with the
session time zone) or of the nullability of nested fields (``containsNull`` and friends follow the query's plan),
while Arrow types do. So every batch is conformed to the files' Arrow schema before it enters the log store
(:func:`conform`): a timestamp labelled with another time zone is relabelled (the instants are the same), nested
nullability is widened, strings and binary with 64-bit offsets (``large_string``, which Spark sends when
``spark.sql.execution.arrow.useLargeVarTypes`` is on) take the recorded width. The files' schema names each
timestamp's zone the way pyarrow does (:func:`arrow_zone`): Spark labels timestamps with the session time zone as
given, in Java's forms (``PST``, ``GMT+05:30``), which pyarrow and pandas cannot resolve. Any other difference is
refused before the epoch is sealed, naming the column and both types. The file writer conforms the same way, so
segments sealed before this rule existed are written too.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from ..arrowvalues import one_zero


class SchemaConformError(ValueError):
    """A batch's Arrow type cannot be conformed to the files' schema (the message names the column)."""


# -- Spark side ----------------------------------------------------------------------------------------------


def spark_schema_json(schema: Any) -> str:
    """A Spark ``StructType`` as the JSON list of ``[name, simpleString]`` pairs the sink records."""
    return json.dumps([[f.name, f.dataType.simpleString()] for f in schema.fields])


def schema_problems(recorded: str, current: str) -> list[str]:
    """What differs between two recorded Spark schemas (:func:`spark_schema_json`), for an error message."""
    if recorded == current:
        return []
    before, now = dict(json.loads(recorded)), dict(json.loads(current))
    problems = [f"{c} ({t}) is missing" for c, t in before.items() if c not in now]
    problems += [f"{c} ({t}) is new" for c, t in now.items() if c not in before]
    problems += [f"{c} changed from {before[c]} to {now[c]}" for c in before if c in now and before[c] != now[c]]
    return problems or [f"the column order changed from {list(before)} to {list(now)}"]


def repeated(names: list[str], *, fold: Callable[[str], str] = str) -> list[str]:
    """The names that occur more than once in ``names`` once ``fold`` is applied (``str.lower``: names that differ
    only in case), each as written, sorted."""
    folded = [fold(n) for n in names]
    return sorted({n for n, f in zip(names, folded, strict=True) if folded.count(f) > 1})


_HASH_ERRORS = {"a map": "HASH_MAP_TYPE", "a variant": "HASH_VARIANT_TYPE"}
"""What Spark's ``hash`` refuses, and the error class it refuses it with."""


def _unhashable(data_type: Any) -> str | None:
    """What in a Spark data type Spark's ``hash`` refuses: a map (``HASH_MAP_TYPE``) or a variant
    (``HASH_VARIANT_TYPE``), or None."""
    from pyspark.sql import types as T

    if isinstance(data_type, T.MapType):
        return "a map"
    if isinstance(data_type, T.VariantType):
        return "a variant"
    if isinstance(data_type, T.ArrayType):
        return _unhashable(data_type.elementType)
    if isinstance(data_type, T.StructType):
        return next((u for u in (_unhashable(f.dataType) for f in data_type.fields) if u), None)
    return None


def hashable_columns(schema: Any) -> list[str]:
    """The columns of a Spark schema that Spark can hash: every column without a map or a variant in its type."""
    return [f.name for f in schema.fields if _unhashable(f.dataType) is None]


def unhashable_reason(data_type: Any) -> str | None:
    """Why Spark cannot hash values of ``data_type`` (for an error message), or None when it can."""
    found = _unhashable(data_type)
    if found is None:
        return None
    return f"Spark cannot hash {found} ({_HASH_ERRORS[found]})"


def unwritable_columns(schema: Any) -> list[str]:
    """What in a Spark schema the sink cannot carry into a Parquet file, one line each naming the column (a dotted
    path inside structs, ``.element`` of an array, ``.key`` and ``.value`` of a map), its type and what to do.

    These are refused before a batch is appended: some fail in Spark's conversion of rows to Arrow with a message
    that names no column, others would reach the log store and fail only when a file is written, after the epoch
    is sealed, holding the vnodes' rows back for good."""
    problems: list[str] = []
    for field in schema.fields:
        _unwritable(field.name, field.dataType, problems)
    return problems


def _unwritable(path: str, data_type: Any, problems: list[str]) -> None:
    from pyspark.sql import types as T

    shown = f"{path!r} ({data_type.simpleString()})"
    if isinstance(data_type, T.CalendarIntervalType):
        problems.append(
            f"{shown}: an interval of months, days and microseconds, which a Parquet file cannot hold (Spark's own "
            "Parquet sink refuses it too); cast it to a string, or keep its parts as numbers (extract(MONTH FROM "
            "...), extract(DAY FROM ...)), or use a day-time interval (make_dt_interval)"
        )
    elif isinstance(data_type, T.YearMonthIntervalType):
        problems.append(
            f"{shown}: a year-month interval, which Spark cannot hand to Python as Arrow; cast it to a string, or "
            "keep it as a number of months (extract(YEAR FROM ...) * 12 + extract(MONTH FROM ...))"
        )
    elif isinstance(data_type, T.StructType):
        if not data_type.fields:
            problems.append(f"{shown}: a struct without fields, which a Parquet file cannot hold; drop it")
            return
        twice = repeated([f.name for f in data_type.fields])
        if twice:
            problems.append(
                f"{shown}: a struct with more than one field named {', '.join(map(repr, twice))}, which Arrow and "
                "Parquet refuse; give its fields distinct names (named_struct, or alias before struct)"
            )
        for f in data_type.fields:
            _unwritable(f"{path}.{f.name}", f.dataType, problems)
    elif isinstance(data_type, T.ArrayType):
        _unwritable(f"{path}.element", data_type.elementType, problems)
    elif isinstance(data_type, T.MapType):
        _unwritable(f"{path}.key", data_type.keyType, problems)
        _unwritable(f"{path}.value", data_type.valueType, problems)


# -- Arrow side ----------------------------------------------------------------------------------------------


_JAVA_SHORT_IDS = {
    "ACT": "Australia/Darwin",
    "AET": "Australia/Sydney",
    "AGT": "America/Argentina/Buenos_Aires",
    "ART": "Africa/Cairo",
    "AST": "America/Anchorage",
    "BET": "America/Sao_Paulo",
    "BST": "Asia/Dhaka",
    "CAT": "Africa/Harare",
    "CNT": "America/St_Johns",
    "CST": "America/Chicago",
    "CTT": "Asia/Shanghai",
    "EAT": "Africa/Addis_Ababa",
    "ECT": "Europe/Paris",
    "EST": "-05:00",
    "HST": "-10:00",
    "IET": "America/Indiana/Indianapolis",
    "IST": "Asia/Kolkata",
    "JST": "Asia/Tokyo",
    "MIT": "Pacific/Apia",
    "MST": "-07:00",
    "NET": "Asia/Yerevan",
    "NST": "Pacific/Auckland",
    "PLT": "Asia/Karachi",
    "PNT": "America/Phoenix",
    "PRT": "America/Puerto_Rico",
    "PST": "America/Los_Angeles",
    "SST": "Pacific/Guadalcanal",
    "VST": "Asia/Ho_Chi_Minh",
}
"""``java.time.ZoneId.SHORT_IDS``: the short ids Spark's session time zone accepts, as the JDK resolves them."""
_JAVA_OFFSET = re.compile(r"(?:GMT|UTC|UT)?([+-])(\d{1,2})(?::?(\d{2}))?(?::?(\d{2}))?")


def _known_zone(zone: str) -> bool:
    try:
        pc.strftime(one_zero(pa.timestamp("s", tz=zone)), format="%H")  # no Python value: filesink.arrowvalues
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return False
    return True


@functools.lru_cache(maxsize=64)
def arrow_zone(zone: str) -> str:
    """The time zone pyarrow knows for a zone id of Spark's session time zone (Java's ``ZoneId.of`` with its short
    ids): a short id as the JDK maps it, a zone pyarrow knows as it is, an offset in Java's forms (``Z``,
    ``GMT+05:30``, ``UTC+1``, ``+5``, ``-0530``) as ``+HH:MM``. Anything else is returned as it is, and naming a
    directory after it fails (the admission refuses such a batch before its seal)."""
    mapped = _JAVA_SHORT_IDS.get(zone)
    if mapped is None:
        if _known_zone(zone):
            return zone
        if zone == "Z":
            mapped = "+00:00"
        elif (match := _JAVA_OFFSET.fullmatch(zone)) and not int(match[4] or 0):
            mapped = f"{match[1]}{int(match[2]):02d}:{match[3] or '00'}"
    return mapped if mapped is not None and _known_zone(mapped) else zone


def _nullable_field(field: pa.Field) -> pa.Field:
    return field.with_type(nullable_type(field.type)).with_nullable(True)


def nullable_type(data_type: pa.DataType) -> pa.DataType:
    """``data_type`` with every nested field nullable (map keys stay non-null, their types made nullable inside),
    and every timestamp's zone one pyarrow knows (:func:`arrow_zone`), so readers of the files can use it."""
    if pa.types.is_timestamp(data_type) and data_type.tz is not None:
        return pa.timestamp(data_type.unit, arrow_zone(data_type.tz))
    if pa.types.is_struct(data_type):
        return pa.struct([_nullable_field(data_type.field(i)) for i in range(data_type.num_fields)])
    if pa.types.is_map(data_type):
        key = data_type.key_field
        return pa.map_(
            key.with_type(nullable_type(key.type)), _nullable_field(data_type.item_field), data_type.keys_sorted
        )
    if pa.types.is_large_list(data_type):
        return pa.large_list(_nullable_field(data_type.value_field))
    if pa.types.is_fixed_size_list(data_type):
        return pa.list_(_nullable_field(data_type.value_field), data_type.list_size)
    if pa.types.is_list(data_type):
        return pa.list_(_nullable_field(data_type.value_field))
    return data_type


def file_schema(schema: pa.Schema) -> pa.Schema:
    """The files' schema for rows of ``schema``: every field nullable at every depth, timestamps in zones pyarrow
    knows, metadata kept."""
    return pa.schema([_nullable_field(f) for f in schema], metadata=schema.metadata)


def file_schema_bytes(schema_bytes: bytes) -> bytes:
    """:func:`file_schema` of a serialized Arrow schema, serialized."""
    schema = file_schema(pa.ipc.read_schema(pa.py_buffer(schema_bytes)))
    return bytes(schema.serialize().to_pybytes())


def _strings(t: pa.DataType) -> bool:
    return bool(pa.types.is_string(t) or pa.types.is_large_string(t))


def _bytes(t: pa.DataType) -> bool:
    return bool(pa.types.is_binary(t) or pa.types.is_large_binary(t))


def _lists(t: pa.DataType) -> bool:
    return bool(pa.types.is_list(t) or pa.types.is_large_list(t))


def conformable(got: pa.DataType, expected: pa.DataType) -> bool:
    """Whether values of ``got`` become ``expected`` by a cast that changes no value: the same types up to a
    timestamp's time zone label (both with one), the nullability of nested fields, and the width of the offsets of
    strings, binary and lists (Spark sends ``large_string`` and ``large_binary`` when
    ``spark.sql.execution.arrow.useLargeVarTypes`` is on, a setting that may change between runs)."""
    if got.equals(expected):
        return True
    if pa.types.is_timestamp(got) and pa.types.is_timestamp(expected):
        return got.unit == expected.unit and (got.tz is None) == (expected.tz is None)
    if (_strings(got) and _strings(expected)) or (_bytes(got) and _bytes(expected)):
        return True
    if _lists(got) and _lists(expected):
        return conformable(got.value_type, expected.value_type)
    if got.id != expected.id or got.num_fields != expected.num_fields:
        return False
    if pa.types.is_struct(got):
        return all(
            got.field(i).name == expected.field(i).name and conformable(got.field(i).type, expected.field(i).type)
            for i in range(got.num_fields)
        )
    if pa.types.is_map(got):
        return (
            got.keys_sorted == expected.keys_sorted
            and conformable(got.key_type, expected.key_type)
            and conformable(got.item_type, expected.item_type)
        )
    if pa.types.is_fixed_size_list(got):
        return got.list_size == expected.list_size and conformable(got.value_type, expected.value_type)
    return False


def conform(batch: pa.RecordBatch, schema: pa.Schema, where: str, *, keep: tuple[str, ...] = ()) -> pa.RecordBatch:
    """``batch`` with exactly the fields of ``schema`` (in its order; the columns named in ``keep`` are kept as
    they are, at the end), or :class:`SchemaConformError` naming the first column that cannot be conformed.

    ``schema`` must be nullable at every depth (:func:`file_schema`) wherever the batch may hold nulls: a cast
    does not check nullability.
    """
    names = [n for n in batch.schema.names if n not in keep]
    expected = schema.names
    missing = [c for c in expected if c not in names]
    if missing:
        raise SchemaConformError(f"{where} lack column {missing[0]!r} of the sink schema")
    extra = [c for c in names if c not in expected]
    if extra:
        raise SchemaConformError(f"{where} have column {extra[0]!r}, which the sink schema does not have")
    if names != expected:
        column = next(a for a, b in zip(names, expected, strict=True) if a != b)
        raise SchemaConformError(f"{where} have column {column!r} out of place: {names}, expected {expected}")
    arrays = []
    for field in schema:
        column = batch.column(field.name)
        if not column.type.equals(field.type):
            if not conformable(column.type, field.type):
                raise SchemaConformError(
                    f"{where} have column {field.name!r} of type {column.type}, the sink schema says {field.type}"
                )
            try:
                column = column.cast(field.type)
            except pa.ArrowInvalid as e:  # more than 2 GiB of one batch's strings for 32-bit offsets
                raise SchemaConformError(
                    f"{where} have column {field.name!r} of type {column.type}, which does not fit the sink "
                    f"schema's {field.type}: {e}"
                ) from e
        if not field.nullable and column.null_count:
            raise SchemaConformError(
                f"{where} have nulls in column {field.name!r}, which the sink schema declares not null"
            )
        arrays.append(column)
    return assembled(batch, schema, arrays, keep)


def assembled(
    batch: pa.RecordBatch, schema: pa.Schema, arrays: list[pa.Array], keep: tuple[str, ...]
) -> pa.RecordBatch:
    """A batch of ``arrays`` (one per field of ``schema``) and, after them, the columns of ``batch`` named in
    ``keep`` as they are."""
    fields = list(schema)
    arrays = list(arrays)
    for name in keep:
        if name in batch.schema.names:
            arrays.append(batch.column(name))
            fields.append(batch.schema.field(name))
    return pa.RecordBatch.from_arrays(arrays, schema=pa.schema(fields, metadata=schema.metadata))


def arrow_schema_of(schema: Any, timezone: str = "UTC") -> pa.Schema | None:
    """The Arrow schema of the Spark ``schema`` as the append's tasks receive it (timestamps labelled ``timezone``),
    for a table format's check of its types and a schema's evolution; None where pyspark cannot convert a type (the
    append refuses it)."""
    from pyspark.sql.pandas.types import to_arrow_schema

    try:
        converted: pa.Schema = to_arrow_schema(schema, timezone=timezone)
    except Exception:
        return None
    return converted


def utc_labelled(schema: pa.Schema) -> pa.Schema:
    """``schema`` with every timestamp that has a zone labelled UTC, nested ones too: the same instants (a zone is
    only a label on UTC values), as table formats keep them (Delta and Iceberg have no other zone)."""

    def relabel(t: pa.DataType) -> pa.DataType:
        if pa.types.is_timestamp(t):
            return pa.timestamp(t.unit, tz="UTC") if t.tz is not None else t
        if pa.types.is_struct(t):
            return pa.struct([f.with_type(relabel(f.type)) for f in t])
        if pa.types.is_large_list(t):
            return pa.large_list(t.value_field.with_type(relabel(t.value_type)))
        if pa.types.is_list(t):
            return pa.list_(t.value_field.with_type(relabel(t.value_type)))
        if pa.types.is_map(t):
            return pa.map_(relabel(t.key_type), t.item_field.with_type(relabel(t.item_type)))
        return t

    return pa.schema([f.with_type(relabel(f.type)) for f in schema], metadata=schema.metadata)
