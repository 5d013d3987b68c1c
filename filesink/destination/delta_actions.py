"""Delta log actions in the JSON shapes the Delta protocol gives them, whether read from a checkpoint's Parquet
columns or from a log entry: the one place where the sink's reader turns what it read into actions it may write
back (a ``metaData`` action with a new column is the table's ``metaData`` with another ``schemaString``).

A checkpoint holds each action type as a struct column (``add``, ``remove``, ``metaData``, ``protocol``, ``txn``,
``domainMetadata``, ``sidecar``, ...), and pyarrow gives its values in Arrow's shapes: a map (``partitionValues``,
``tags``, ``configuration``, ``format.options``) as a list of ``(key, value)`` pairs, an optional field that is
absent as None, and a checkpoint may add columns of its own (``stats_parsed``, ``partitionValues_parsed``). The
protocol's JSON has a map as an object (``{}`` when empty), leaves an absent optional field out, and knows no
``*_parsed`` field. A map written as a JSON array (``"options":[]``) makes delta-rs, Polars and DuckDB refuse the
table from that version on, and delta-rs then cannot write the checkpoint that would pass it by.

- :func:`checkpoint_actions`: a checkpoint's rows (its Arrow table) as actions, each ``{type: fields}``.
- :func:`protocol_shape`: one action's fields in the protocol's shapes, whatever reader produced them: every map
  the protocol types as one is an object (a list of pairs, or of ``{"key": ..., "value": ...}`` records, made one;
  a required map that is absent made ``{}``), checkpoint-only fields left out. The sink applies it to the
  ``metaData`` and ``protocol`` actions it reads from log entries too, so that a table whose log already holds a
  map as a list (written by another writer, or by an earlier release of this sink) gets it right in the next
  ``metaData`` the sink writes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

MAPS: Mapping[str, tuple[tuple[str, ...], ...]] = {
    "metaData": (("format", "options"), ("configuration",)),
    "add": (("partitionValues",), ("tags",)),
    "remove": (("partitionValues",), ("tags",)),
    "cdc": (("partitionValues",), ("tags",)),
    "sidecar": (("tags",),),
    "checkpointMetadata": (("tags",),),
}
"""Per action type, the paths of the fields the protocol types as ``Map[String, String]``."""
REQUIRED_MAPS: Mapping[str, tuple[tuple[str, ...], ...]] = {
    "metaData": (("format", "options"), ("configuration",)),
    "add": (("partitionValues",),),
    "cdc": (("partitionValues",),),
}
"""The map fields the protocol requires: an absent one is the empty map."""
CHECKPOINT_ONLY = frozenset({"stats_parsed", "partitionValues_parsed"})
"""Fields a checkpoint may hold in its ``add`` and ``remove`` columns that are no part of an action."""


def json_value(value: Any, type_: pa.DataType) -> Any:
    """A value pyarrow read from a column of type ``type_`` in the shapes of JSON: a map as an object, a struct as an
    object without its absent (null) fields, a list as a list; a map's or a list's null values are kept."""
    if value is None:
        return None
    if isinstance(type_, pa.MapType):
        pairs = value.items() if isinstance(value, Mapping) else value
        return {k: json_value(v, type_.item_type) for k, v in pairs}
    if isinstance(type_, pa.StructType):
        fields = {f.name: f.type for f in type_}
        return {k: json_value(v, fields[k]) for k, v in value.items() if v is not None}
    if isinstance(type_, pa.ListType | pa.LargeListType | pa.FixedSizeListType):
        return [json_value(v, type_.value_type) for v in value]
    return value


def _as_object(value: Any) -> dict[str, Any]:
    """A map field's value as a JSON object: from an object, a list of pairs, or a list of key/value records."""
    if isinstance(value, Mapping):
        return dict(value)
    out: dict[str, Any] = {}
    for item in value:
        if isinstance(item, Mapping):
            out[item["key"]] = item.get("value")
        else:
            key, val = item
            out[key] = val
    return out


def protocol_shape(kind: str, fields: Mapping[str, Any]) -> dict[str, Any]:
    """The fields of an action of type ``kind`` in the protocol's JSON shapes (see the module's notes)."""
    out = {k: v for k, v in fields.items() if k not in CHECKPOINT_ONLY}
    required = REQUIRED_MAPS.get(kind, ())
    for path in MAPS.get(kind, ()):
        parent = out
        for step in path[:-1]:
            child = parent.get(step)
            if not isinstance(child, Mapping):
                break
            parent[step] = dict(child)
            parent = parent[step]
        else:
            name = path[-1]
            value = parent.get(name)
            if value is not None:
                parent[name] = _as_object(value)
            elif path in required:
                parent[name] = {}
    return out


def checkpoint_actions(table: pa.Table) -> list[dict[str, Any]]:
    """A checkpoint's (or a part's) rows as actions, ``{type: fields}`` in the protocol's JSON shapes, in the order
    of the table's columns and rows; a row's null columns are no action."""
    actions: list[dict[str, Any]] = []
    for kind, column in zip(table.column_names, table.columns, strict=True):
        for row in column.filter(pc.is_valid(column)).to_pylist():
            actions.append({kind: protocol_shape(kind, json_value(row, column.type))})
    return actions
