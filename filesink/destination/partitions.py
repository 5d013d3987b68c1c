"""A written object's partition values, read back from its key's Hive directories (:mod:`filesink.schema.partitioning`).

The sink's files do not hold their partition columns; a table records each file's partition values beside it
(Delta's ``partitionValues``, Iceberg's partition record). They are taken from the directories the writer named, so
that the table and the directory agree value for value.
"""

from __future__ import annotations

import datetime
import decimal
import re
from collections.abc import Sequence
from zoneinfo import ZoneInfo

import pyarrow as pa

from ..errors import TableFormatError
from ..schema.partitioning import DEFAULT_PARTITION, unescape

_OFFSET = re.compile(r"^([+-])(\d\d):(\d\d)$")


def partition_texts(key: str, columns: Sequence[str]) -> list[str | None]:
    """The directory text of each of ``columns`` in ``key`` (``<col>=<text>/.../<file>``), unescaped; None for
    null (``__HIVE_DEFAULT_PARTITION__``)."""
    dirs = key.split("/")[:-1]
    if len(dirs) != len(columns):
        raise TableFormatError(f"object {key}: expected the directories of {list(columns)}, found {dirs}")
    texts: list[str | None] = []
    for column, component in zip(columns, dirs, strict=True):
        name, sep, text = component.partition("=")
        if not sep or unescape(name) != column:
            raise TableFormatError(f"object {key}: directory {component!r} is not one of column {column!r}")
        value = unescape(text)
        texts.append(None if value == DEFAULT_PARTITION else value)
    return texts


def zone(tz: str) -> datetime.tzinfo:
    """The zone of an Arrow timestamp type (a zone name, or ``+HH:MM``)."""
    m = _OFFSET.match(tz)
    if m:
        sign = -1 if m.group(1) == "-" else 1
        return datetime.timezone(sign * datetime.timedelta(hours=int(m.group(2)), minutes=int(m.group(3))))
    if tz.upper() in ("UTC", "Z"):
        return datetime.UTC
    return ZoneInfo(tz)


def typed_value(text: str | None, type_: pa.DataType, column: str) -> object:
    """The value a directory text stands for, as Python's value of ``type_`` (timestamps with a zone as aware
    datetimes in UTC)."""
    if text is None:
        return None
    try:
        if pa.types.is_string(type_) or pa.types.is_large_string(type_):
            return text
        if pa.types.is_boolean(type_):
            return {"true": True, "false": False}[text]
        if pa.types.is_integer(type_):
            return int(text)
        if pa.types.is_floating(type_):
            return float(text)  # Java's text: "1.0E10", "NaN", "Infinity" all read back
        if pa.types.is_decimal(type_):
            return decimal.Decimal(text)
        if pa.types.is_date(type_):
            return datetime.date.fromisoformat(text)
        if pa.types.is_timestamp(type_):
            value = datetime.datetime.fromisoformat(text)
            if type_.tz is None:
                return value
            return value.replace(tzinfo=zone(type_.tz)).astimezone(datetime.UTC)
    except (ValueError, KeyError, decimal.InvalidOperation) as e:
        raise TableFormatError(f"partition column {column!r}: directory text {text!r} is not a {type_} ({e})") from e
    raise TableFormatError(
        f"partition column {column!r} of type {type_}: a table format cannot take it as a partition value; "
        "partition by a string, integer, boolean, float, decimal, date or timestamp column"
    )
