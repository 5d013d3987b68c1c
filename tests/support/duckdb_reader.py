"""Read tables with DuckDB's ``delta_scan`` and ``iceberg_scan``, in the pinned environment of ``duckdb_env.py``
(only the standard library and ``duckdb`` there): ``python duckdb_reader.py '<request JSON>'`` prints one JSON
answer per scan of the request.

A request is a list of scans, each ``{"format": "delta" | "iceberg", "location": ..., "where": {column: value}}``:
a Delta table's directory, or an Iceberg table's current metadata file (``Table.metadata_location``); ``where``
(optional) keeps the rows whose columns equal the values, as a DuckDB filter. An answer is ``{"columns": [...],
"types": [DuckDB's type names], "rows": [[...], ...], "files_read": N}``, with values made JSON-safe: dates,
times and timestamps as ISO text (a ``TIMESTAMP WITH TIME ZONE`` column in UTC, with ``+00:00``), decimals as
text, bytes as hex. ``files_read`` is how many data files the scan opened (from ``EXPLAIN ANALYZE``; None when
the plan does not say): what a filter on partition columns pruned.
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
import os
import re
import sys
from typing import Any

import duckdb

SCANS = {"delta": "delta_scan", "iceberg": "iceberg_scan"}
EXTENSIONS = ("avro", "iceberg", "delta")
"""Loaded in this order (Iceberg's manifests are Avro files)."""


def extensions_directory() -> str:
    """The extension wheels' directory: ``duckdb_ext/extensions`` (a namespace package), the layout DuckDB keeps
    under its ``extension_directory`` (``v<version>/<platform>/<name>.duckdb_extension``)."""
    import duckdb_ext  # the extension wheels' namespace package

    for base in duckdb_ext.__path__:
        path = os.path.join(base, "extensions")
        if os.path.isdir(path):
            return path
    raise RuntimeError(f"no extensions directory in {list(duckdb_ext.__path__)}")


def connect() -> duckdb.DuckDBPyConnection:
    """A DuckDB connection with the wheels' extensions loaded; nothing is installed or downloaded."""
    con = duckdb.connect(config={"extension_directory": extensions_directory(), "autoinstall_known_extensions": False})
    for name in EXTENSIONS:
        con.execute(f"LOAD {name}")
    con.execute("SET TimeZone = 'UTC'")
    return con


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _jsonable(value: Any) -> Any:
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).hex()
    if isinstance(value, dict):
        return {k if isinstance(k, str) else json.dumps(_jsonable(k)): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return str(value)  # UUID, interval (timedelta), ...


def scan(con: duckdb.DuckDBPyConnection, fmt: str, location: str, where: dict[str, Any] | None = None) -> dict:
    """One scan's answer (see the module's docstring)."""
    source = f"{SCANS[fmt]}(?)"
    described = con.execute(f"DESCRIBE SELECT * FROM {source}", [location]).fetchall()
    columns = [row[0] for row in described]
    types = [row[1] for row in described]
    # Python's conversion of TIMESTAMP WITH TIME ZONE needs pytz, which the pinned environment does not have
    select = [
        f"strftime(timezone('UTC', {_quote(c)}), '%Y-%m-%dT%H:%M:%S.%f') || '+00:00'"
        if t == "TIMESTAMP WITH TIME ZONE"
        else _quote(c)
        for c, t in zip(columns, types, strict=True)
    ]
    where = where or {}
    sql = f"SELECT {', '.join(select)} FROM {source}"
    if where:
        sql += " WHERE " + " AND ".join(f"{_quote(c)} = ?" for c in where)
    parameters = [location, *where.values()]
    rows = con.execute(sql, parameters).fetchall()
    plan = "".join(text for _, text in con.execute(f"EXPLAIN ANALYZE {sql}", parameters).fetchall())
    read = re.search(r"Total Files Read: (\d+)", plan)
    return {
        "columns": columns,
        "types": types,
        "rows": [_jsonable(list(r)) for r in rows],
        "files_read": int(read.group(1)) if read else None,
    }


def main(argv: list[str]) -> None:
    request = json.loads(argv[1])
    con = connect()
    answers = [scan(con, s["format"], s["location"], s.get("where")) for s in request]
    print(json.dumps(answers))


if __name__ == "__main__":
    main(sys.argv)
