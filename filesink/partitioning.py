"""Hive-style partition directories: ``<column>=<value>/`` with values escaped so that any value is safe.

Escaping follows Hive (``%XX`` of the UTF-8 bytes, which Spark, pyarrow, DuckDB and Trino decode) for the
characters Hive escapes, and additionally for ``%`` and ``/`` (always), every character Python does not
consider printable, and the dots of a value made only of dots (``.`` and ``..``). Null and the empty string
become ``__HIVE_DEFAULT_PARTITION__``, which readers turn back into null. No value can therefore add a path
separator, form a ``.``/``..`` component, or leave the output prefix.
"""

from __future__ import annotations

import datetime
import decimal
from collections.abc import Sequence
from urllib.parse import unquote

DEFAULT_PARTITION = "__HIVE_DEFAULT_PARTITION__"

# The characters Hive's FileUtils escapes in partition path names, beyond control characters.
_HIVE_SPECIAL = frozenset("\"#%'*/:=?\\{[]^")


def _needs_escape(ch: str) -> bool:
    return ch in _HIVE_SPECIAL or not ch.isprintable() or ord(ch) < 0x20 or ord(ch) == 0x7F


def _percent(ch: str) -> str:
    return "".join(f"%{b:02X}" for b in ch.encode("utf-8", "surrogatepass"))


def escape(text: str) -> str:
    """Escape one path component (a partition column name or a value already turned into text)."""
    if text.strip(".") == "":
        return "".join(_percent(ch) for ch in text)  # ".", "..", "...": never a relative path component
    return "".join(_percent(ch) if _needs_escape(ch) else ch for ch in text)


def unescape(text: str) -> str:
    return unquote(text, encoding="utf-8", errors="surrogatepass")


def value_text(value: object) -> str | None:
    """The text a partition value is written as (None for null), matching what Spark writes."""
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


def partition_dir(columns: Sequence[str], values: Sequence[object]) -> str:
    """``col1=v1/col2=v2`` (no leading or trailing slash) for one combination of partition values."""
    if len(columns) != len(values):
        raise ValueError(f"{len(columns)} partition columns but {len(values)} values")
    parts = []
    for column, value in zip(columns, values, strict=True):
        text = value_text(value)
        parts.append(f"{escape(column)}={DEFAULT_PARTITION if not text else escape(text)}")
    return "/".join(parts)
