"""The conformance hook for the sink's tables: one call after a commit checks that everything new in the table
conforms to its format's specification and that independent readers read the same rows.

    from conformance import check_table

    check_table("delta", str(tmp_path / "table"))                    # after each commit, or at a test's end
    check_table("iceberg", str(tmp_path / "table"), metadata_location=table.metadata_location)
    check_table("delta", str(tmp_path / "table"), duckdb=False)      # the log checks and deltalake only: cheap
    check_tables([Table("delta", a), Table("iceberg", b)])           # several tables, one DuckDB subprocess

:func:`check_table` raises :class:`AssertionError` naming the file, the action (or entry) and the field of every
problem, or the rows on which the readers differ; it returns nothing.

- **The specification checks** (:mod:`delta_conformance`, :mod:`iceberg_conformance`) keep a cursor per table
  location in this process: a call checks only the log entries, checkpoints, metadata files, manifest lists and
  manifests that are new since the previous call on the same location (a table made anew there is noticed and
  checked from its start), so calling it after every commit costs what the commit wrote.
- **The readers** (the whole table, at every call): deltalake (delta-rs) and DuckDB's ``delta_scan`` for Delta;
  pyiceberg and DuckDB's ``iceberg_scan`` (of the current metadata file) for Iceberg. Their rows are compared as
  exact multisets, every value in the JSON shapes of ``duckdb_reader.py`` (timestamps as ISO text in UTC, decimals
  as text, bytes as hex, maps as objects). DuckDB runs in its pinned environment (``duckdb_env.py``), one
  subprocess per call (about a second; :func:`check_tables` reads several tables in one): ``duckdb=False`` leaves
  it out (the first reader still reads the whole table). DuckDB reads local tables only (a table on S3 is read by
  the first reader alone), and where its environment cannot be built the call warns and compares nothing.
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
import math
import warnings
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
from delta_conformance import DeltaConformance
from iceberg_conformance import IcebergConformance

READ_DEADLINE = 120.0
"""Seconds for the DuckDB reader's subprocess."""

_CURSORS: dict[tuple[str, str], DeltaConformance | IcebergConformance] = {}
_DUCKDB: list[tuple[Path | None, str]] = []
"""The pinned DuckDB's interpreter (or the reason there is none), once asked for in this process."""


def cursor(table_format: str, location: str, *, fs: Any = None, options: Mapping[str, Any] | None = None):
    """The specification checker (with its cursor) of the table at ``location``: made at the first call."""
    key = (table_format, str(location).rstrip("/"))
    found = _CURSORS.get(key)
    if found is None:
        kind = DeltaConformance if table_format == "delta" else IcebergConformance
        if table_format not in ("delta", "iceberg"):
            raise ValueError(f"table_format must be delta or iceberg, not {table_format!r}")
        found = _CURSORS[key] = kind(str(location), fs=fs, options=options)
    return found


@dataclass(frozen=True)
class Table:
    """A table to check (the arguments of :func:`check_table`), for :func:`check_tables`."""

    format: str
    """``"delta"`` or ``"iceberg"``."""
    location: str
    """The table's root: a local path or an fsspec URL."""
    fs: Any = None
    """An fsspec file system for ``location`` (default: the URL's, with ``options``)."""
    options: Mapping[str, Any] | None = None
    """The sink's s3fs options for a table on S3."""
    metadata_location: str | None = None
    """Iceberg: the catalog's current metadata file (default: the newest under ``<location>/metadata/``)."""


def check_table(
    table_format: str,
    location: str,
    *,
    fs: Any = None,
    options: Mapping[str, Any] | None = None,
    metadata_location: str | None = None,
    duckdb: bool = True,
) -> None:
    """Check the table of ``table_format`` (``"delta"`` or ``"iceberg"``) at ``location`` (its root: a local path or
    an fsspec URL, read through ``fs`` or with ``options``, the sink's s3fs options): every entry or metadata file
    new since the last call conforms to the specification, and the readers read the same rows (see the module's
    notes). ``metadata_location`` is an Iceberg table's current metadata file (default: the newest under
    ``<location>/metadata/``). Raises AssertionError naming the file, action and field of each problem."""
    check_tables([Table(table_format, location, fs, options, metadata_location)], duckdb=duckdb)


def check_tables(tables: Sequence[Table], *, duckdb: bool = True) -> None:
    """:func:`check_table` for several tables, with one DuckDB subprocess for all of them."""
    firsts: list[tuple[Table, Rows]] = []
    scans: list[dict[str, Any]] = []
    for table in tables:
        checker = cursor(table.format, table.location, fs=table.fs, options=table.options)
        if isinstance(checker, DeltaConformance):
            if checker.check() < 0:
                continue  # no table yet
            first = delta_rows(table.location, table.options)
            scan = {"format": "delta", "location": str(table.location).removeprefix("file://")}
        else:
            newest = checker.check(table.metadata_location)
            if newest is None:
                continue
            first = iceberg_rows(newest, table.options)
            scan = {"format": "iceberg", "location": newest}
        if duckdb and "://" not in scan["location"]:  # DuckDB reads local tables only
            firsts.append((table, first))
            scans.append(scan)
    if not scans:
        return
    seconds = duckdb_rows(scans)
    if seconds is None:
        return
    for (table, first), second in zip(firsts, seconds, strict=True):
        reader = "deltalake" if table.format == "delta" else "pyiceberg"
        compare(first, second, f"{table.format} table at {table.location}", (reader, "DuckDB"))


# -- readers -----------------------------------------------------------------------------------------------------

Rows = tuple[list[str], Counter[tuple[str, ...]]]
"""A reader's columns and its rows, each value as compact JSON text (hashable, comparable across readers)."""


def _jsonable(value: Any, type_: pa.DataType | None = None) -> Any:
    """A value in the shapes ``duckdb_reader.py`` gives DuckDB's values (``type_``: the Arrow type it was read as)."""
    if value is None:
        return None
    if isinstance(value, dt.datetime):
        if value.tzinfo is not None:
            return value.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%f") + "+00:00"
        return value.isoformat()
    if isinstance(value, dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).hex()
    if isinstance(value, float) and math.isnan(value):
        return "NaN"
    if type_ is not None and pa.types.is_map(type_):
        pairs = value.items() if isinstance(value, dict) else value
        return {
            k if isinstance(k, str) else json.dumps(_jsonable(k, type_.key_type)): _jsonable(v, type_.item_type)
            for k, v in pairs
        }
    if isinstance(value, dict):
        fields = {f.name: f.type for f in type_} if type_ is not None and pa.types.is_struct(type_) else {}
        return {
            k if isinstance(k, str) else json.dumps(_jsonable(k)): _jsonable(v, fields.get(k)) for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        inner = type_.value_type if type_ is not None and hasattr(type_, "value_type") else None
        return [_jsonable(v, inner) for v in value]
    return value


def _text(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def arrow_rows(table: pa.Table) -> Rows:
    columns = [table[c].to_pylist() for c in table.column_names]
    types = [f.type for f in table.schema]
    rows: Counter[tuple[str, ...]] = Counter(
        tuple(_text(_jsonable(v, t)) for v, t in zip(row, types, strict=True)) for row in zip(*columns, strict=True)
    )
    if not table.column_names:
        rows = Counter({(): table.num_rows})
    return list(table.column_names), rows


def delta_rows(location: str, options: Mapping[str, Any] | None) -> Rows:
    import deltalake

    from filesink.destination.delta import storage_options, table_uri

    table = deltalake.DeltaTable(table_uri(str(location)), storage_options=storage_options(dict(options or {})) or None)
    return arrow_rows(table.to_pyarrow_table())


def iceberg_rows(metadata_path: str, options: Mapping[str, Any] | None) -> Rows:
    from pyiceberg.table import StaticTable

    from filesink.destination.iceberg import file_io_properties

    uri = metadata_path if "://" in metadata_path else f"file://{metadata_path}"
    table = StaticTable.from_metadata(uri, properties=file_io_properties(dict(options or {})) if options else {})
    return arrow_rows(table.scan().to_arrow())


def duckdb_rows(scans: list[dict[str, Any]]) -> list[Rows] | None:
    """DuckDB's columns and rows of each scan (``duckdb_reader.py``, one subprocess for all); None where its
    environment cannot be built."""
    from duckdb_env import pinned_duckdb
    from helpers import SUPPORT, run

    if not _DUCKDB:
        _DUCKDB.append(pinned_duckdb())
    python, reason = _DUCKDB[0]
    if python is None:
        warnings.warn(f"the tables are not read with DuckDB: {reason}", stacklevel=3)
        return None
    done = run(
        [str(python), str(SUPPORT / "duckdb_reader.py"), json.dumps(scans)],
        READ_DEADLINE,
        "DuckDB reading the tables",
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, (
        f"DuckDB could not read {[s['location'] for s in scans]} (exit {done.returncode}):\n{done.stderr[-3000:]}"
    )
    out: list[Rows] = []
    for answer in json.loads(done.stdout):
        rows: Counter[tuple[str, ...]] = Counter(
            tuple(_text("NaN" if isinstance(v, float) and math.isnan(v) else v) for v in row) for row in answer["rows"]
        )
        out.append((answer["columns"], rows))
    return out


def compare(first: Rows, second: Rows, what: str, names: tuple[str, str]) -> None:
    """Two readers' rows as exact multisets, the second's columns put in the first's order."""
    (columns_a, rows_a), (columns_b, rows_b) = first, second
    assert sorted(columns_a) == sorted(columns_b), (
        f"the {what}: {names[0]} reads the columns {columns_a}, {names[1]} {columns_b}"
    )
    order = [columns_b.index(c) for c in columns_a]
    rows_b = Counter({tuple(row[i] for i in order): n for row, n in rows_b.items()})
    if rows_a != rows_b:
        only_a, only_b = rows_a - rows_b, rows_b - rows_a
        raise AssertionError(
            f"the {what}: {names[0]} and {names[1]} read different rows ({sum(rows_a.values())} and "
            f"{sum(rows_b.values())}); only {names[0]}: {list(only_a.elements())[:5]}; only {names[1]}: "
            f"{list(only_b.elements())[:5]} (columns {columns_a})"
        )
