"""Conformance of a Delta table's log to the Delta protocol: every log entry, every checkpoint and
``_last_checkpoint``, checked field by field (written for these tests from the protocol's text, not taken from any
reader or writer).

:class:`DeltaConformance` keeps a cursor: each :meth:`DeltaConformance.check` reads only the entries and
checkpoints that are new since the last one, replaying the log (the newest ``protocol`` and ``metaData``, the
application transactions, the active files) so that later actions are checked against the table as it was then.
A problem names the file, the line (or checkpoint row), the action and the field; all problems of a check are
raised together as one :class:`AssertionError`.

What is checked:

- **the log**: entries ``<version %020d>.json`` contiguous from 0 (or from the oldest checkpoint, where a clean-up
  removed older entries), version 0 holding ``protocol`` and ``metaData``, a version holding at most one of each;
- **each line**: a JSON object with exactly one key, an action the protocol knows, no field it does not know, every
  required field present (not null), every field of the protocol's type (a map a JSON object of strings, an array
  of strings, an int or long an integer, ...);
- ``protocol``: versions in range, ``readerFeatures`` exactly when the reader version is 3, ``writerFeatures``
  exactly when the writer version is 7, every reader feature also a writer feature, and ``timestampNtz`` in both
  when the schema has a ``timestamp_ntz``;
- ``metaData``: ``id`` a UUID, ``format`` ``{provider, options}``, ``schemaString`` a Delta schema (struct, fields
  with name, type, nullable and metadata; primitive, decimal, array, map and struct types), ``partitionColumns``
  distinct top-level columns of the schema, ``configuration`` string to string;
- ``add`` (and ``remove``, ``cdc``): ``partitionValues`` holding exactly the partition columns, each a string that
  parses as the column's type, or null; ``stats`` a JSON string with an integer ``numRecords`` and
  ``minValues``/``maxValues``/``nullCount`` keyed by the schema's columns (nested for structs, never partition
  columns); the file exists under the table's root with the ``size`` the action gives, and its statistics are
  its data's (``numRecords`` its rows, ``nullCount`` its nulls, the bounds at or beyond its smallest and largest
  values: readers skip files by them); a path added once per version;
- ``txn``, ``domainMetadata``, ``commitInfo``: their fields' types;
- **checkpoints** (single-file and multi-part): the Parquet columns' types (maps as maps of strings, ...), one action
  a row, each action checked as above, and the checkpoint holding exactly the table's state at its version (the
  protocol, the metadata, the transactions, the active files) as the entries replay it;
- ``_last_checkpoint``: its fields' types, the checkpoint it names exists, and its ``size``, ``parts``,
  ``numOfAddFiles`` and ``sizeInBytes`` are the checkpoint's.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import date, datetime
from decimal import Decimal, InvalidOperation
from typing import Any
from urllib.parse import unquote, urlparse

import fsspec
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

LOG_DIR = "_delta_log"
ENTRY = re.compile(r"^(\d{20})\.json$")
CHECKPOINT = re.compile(r"^(\d{20})\.checkpoint(?:\.(\d{10})\.(\d{10}))?\.parquet$")
INT_MAX = 2**31 - 1
LONG_MAX = 2**63 - 1

# -- field types ------------------------------------------------------------------------------------------------

STRING, INT, LONG, BOOL, MAP, STRINGS, OBJECT, ANY = "string", "int", "long", "boolean", "map", "strings", "obj", "any"
NULLABLE_MAP = "map-nullable"
"""A ``Map[String, String]`` whose values may be null (partition values)."""

Spec = Mapping[str, tuple[str, bool]]
"""Per field of an action: its type and whether the protocol requires it."""

_FILE = {
    "path": (STRING, True),
    "partitionValues": (NULLABLE_MAP, True),
    "size": (LONG, True),
    "modificationTime": (LONG, True),
    "dataChange": (BOOL, True),
    "stats": (STRING, False),
    "tags": (MAP, False),
    "deletionVector": (OBJECT, False),
    "baseRowId": (LONG, False),
    "defaultRowCommitVersion": (LONG, False),
    "clusteringProvider": (STRING, False),
}
ACTIONS: Mapping[str, Spec] = {
    "protocol": {
        "minReaderVersion": (INT, True),
        "minWriterVersion": (INT, True),
        "readerFeatures": (STRINGS, False),
        "writerFeatures": (STRINGS, False),
    },
    "metaData": {
        "id": (STRING, True),
        "name": (STRING, False),
        "description": (STRING, False),
        "format": (OBJECT, True),
        "schemaString": (STRING, True),
        "partitionColumns": (STRINGS, True),
        "createdTime": (LONG, False),
        "configuration": (MAP, True),
    },
    "add": _FILE,
    "remove": {
        "path": (STRING, True),
        "deletionTimestamp": (LONG, False),
        "dataChange": (BOOL, True),
        "extendedFileMetadata": (BOOL, False),
        "partitionValues": (NULLABLE_MAP, False),
        "size": (LONG, False),
        "stats": (STRING, False),
        "tags": (MAP, False),
        "deletionVector": (OBJECT, False),
        "baseRowId": (LONG, False),
        "defaultRowCommitVersion": (LONG, False),
    },
    "cdc": {
        "path": (STRING, True),
        "partitionValues": (NULLABLE_MAP, True),
        "size": (LONG, True),
        "dataChange": (BOOL, True),
        "tags": (MAP, False),
    },
    "txn": {"appId": (STRING, True), "version": (LONG, True), "lastUpdated": (LONG, False)},
    "domainMetadata": {"domain": (STRING, True), "configuration": (STRING, True), "removed": (BOOL, True)},
    "commitInfo": {},  # any JSON object: provenance is free-form
    "checkpointMetadata": {"version": (LONG, True), "tags": (MAP, False)},
    "sidecar": {
        "path": (STRING, True),
        "sizeInBytes": (LONG, True),
        "modificationTime": (LONG, True),
        "tags": (MAP, False),
    },
}
"""The protocol's actions and their fields."""
FORMAT: Spec = {"provider": (STRING, True), "options": (MAP, False)}
LAST_CHECKPOINT: Spec = {
    "version": (LONG, True),
    "size": (LONG, True),
    "parts": (LONG, False),
    "sizeInBytes": (LONG, False),
    "numOfAddFiles": (LONG, False),
    "checkpointSchema": (OBJECT, False),
    "checksum": (STRING, False),
    "tags": (MAP, False),
    "v2Checkpoint": (OBJECT, False),
}
STATS_KEYS = {"numRecords", "minValues", "maxValues", "nullCount", "tightBounds"}

ARROW: Mapping[str, Mapping[str, Callable[[pa.DataType], bool]]] = {
    "add": {
        "path": pa.types.is_string,
        "partitionValues": lambda t: _is_string_map(t),
        "size": pa.types.is_int64,
        "modificationTime": pa.types.is_int64,
        "dataChange": pa.types.is_boolean,
        "stats": pa.types.is_string,
        "tags": lambda t: _is_string_map(t),
    },
    "remove": {
        "path": pa.types.is_string,
        "deletionTimestamp": pa.types.is_int64,
        "dataChange": pa.types.is_boolean,
        "partitionValues": lambda t: _is_string_map(t),
        "size": pa.types.is_int64,
        "tags": lambda t: _is_string_map(t),
    },
    "metaData": {
        "id": pa.types.is_string,
        "schemaString": pa.types.is_string,
        "partitionColumns": lambda t: pa.types.is_list(t) and pa.types.is_string(t.value_type),
        "configuration": lambda t: _is_string_map(t),
        "createdTime": pa.types.is_int64,
        "format": lambda t: (
            pa.types.is_struct(t) and t.get_field_index("options") >= 0 and _is_string_map(t.field("options").type)
        ),
    },
    "protocol": {
        "minReaderVersion": pa.types.is_int32,
        "minWriterVersion": pa.types.is_int32,
        "readerFeatures": lambda t: pa.types.is_list(t) and pa.types.is_string(t.value_type),
        "writerFeatures": lambda t: pa.types.is_list(t) and pa.types.is_string(t.value_type),
    },
    "txn": {"appId": pa.types.is_string, "version": pa.types.is_int64, "lastUpdated": pa.types.is_int64},
}
"""The Parquet (Arrow) types of a checkpoint's action columns' fields, where the protocol's types say them."""


def _is_string_map(t: pa.DataType) -> bool:
    return pa.types.is_map(t) and pa.types.is_string(t.key_type) and pa.types.is_string(t.item_type)


def _kind(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def _type_problem(value: Any, type_: str) -> str | None:
    """Why ``value`` is not of the protocol's ``type_`` (None: it is)."""
    integer = isinstance(value, int) and not isinstance(value, bool)
    if type_ == STRING:
        return None if isinstance(value, str) else f"must be a string, is {_kind(value)} {value!r}"
    if type_ in (INT, LONG):
        bound = INT_MAX if type_ == INT else LONG_MAX
        if not integer:
            return f"must be an integer ({type_}), is {_kind(value)} {value!r}"
        return None if -bound - 1 <= value <= bound else f"{value} is out of a {type_}'s range"
    if type_ == BOOL:
        return None if isinstance(value, bool) else f"must be a boolean, is {_kind(value)} {value!r}"
    if type_ in (MAP, NULLABLE_MAP):
        if not isinstance(value, dict):
            return f"must be a JSON object (a Map[String, String]), is {_kind(value)} {value!r}"
        bad = {k: v for k, v in value.items() if not (isinstance(v, str) or (v is None and type_ == NULLABLE_MAP))}
        return f"values must be strings, these are not: {bad!r}" if bad else None
    if type_ == STRINGS:
        if not isinstance(value, list):
            return f"must be a JSON array of strings, is {_kind(value)} {value!r}"
        bad_items = [v for v in value if not isinstance(v, str)]
        return f"items must be strings, these are not: {bad_items!r}" if bad_items else None
    if type_ == OBJECT:
        return None if isinstance(value, dict) else f"must be a JSON object, is {_kind(value)} {value!r}"
    return None


class Problems:
    """The problems of one check, each naming the file, the place in it and the field."""

    def __init__(self) -> None:
        self.found: list[str] = []

    def add(self, where: str, what: str, problem: str) -> None:
        self.found.append(f"{where}: {what}: {problem}")

    def fields(self, where: str, prefix: str, value: Mapping[str, Any], spec: Spec) -> None:
        """The fields of ``value`` against ``spec``: unknown ones, missing required ones, wrong types."""
        for name in value:
            if name not in spec:
                self.add(where, f"{prefix}.{name}", "a field the protocol does not know")
        for name, (type_, required) in spec.items():
            present = value.get(name)
            if present is None:
                if required:
                    state = "null" if name in value else "missing"
                    self.add(where, f"{prefix}.{name}", f"required field is {state}")
                continue
            problem = _type_problem(present, type_)
            if problem:
                self.add(where, f"{prefix}.{name}", problem)

    def raise_any(self, location: str) -> None:
        if self.found:
            shown = "\n  ".join(self.found[:50])
            more = f"\n  ... and {len(self.found) - 50} more" if len(self.found) > 50 else ""
            raise AssertionError(
                f"the Delta table at {location} does not conform to the protocol ({len(self.found)} problems):\n  "
                f"{shown}{more}"
            )


# -- schemas -----------------------------------------------------------------------------------------------------

PRIMITIVES = frozenset(
    {
        "string",
        "long",
        "integer",
        "short",
        "byte",
        "float",
        "double",
        "boolean",
        "binary",
        "date",
        "timestamp",
        "timestamp_ntz",
        "variant",
    }
)
DECIMAL = re.compile(r"^decimal\((\d+),\s*(\d+)\)$")


def check_schema(problems: Problems, where: str, what: str, schema: Any) -> None:
    """A parsed ``schemaString``: a struct type, recursively valid."""
    if not isinstance(schema, dict) or schema.get("type") != "struct":
        problems.add(where, what, f'must be a struct type ({{"type": "struct", ...}}), is {schema!r:.80}')
        return
    _check_type(problems, where, what, schema)


def _check_type(problems: Problems, where: str, what: str, type_: Any) -> None:
    if isinstance(type_, str):
        m = DECIMAL.match(type_)
        if m:
            precision, scale = int(m.group(1)), int(m.group(2))
            if not (1 <= precision <= 38 and 0 <= scale <= precision):
                problems.add(where, what, f"{type_}: a decimal's precision is 1 to 38 and its scale 0 to it")
        elif type_ not in PRIMITIVES:
            problems.add(where, what, f"{type_!r} is no Delta type")
        return
    if not isinstance(type_, dict):
        problems.add(where, what, f"a type must be a name or an object, is {_kind(type_)}")
        return
    kind = type_.get("type")
    if kind == "struct":
        extra = set(type_) - {"type", "fields"}
        if extra:
            problems.add(where, what, f"a struct type has only type and fields, this has {sorted(extra)}")
        fields = type_.get("fields")
        if not isinstance(fields, list):
            problems.add(where, f"{what}.fields", f"must be an array, is {_kind(fields)}")
            return
        seen: set[str] = set()
        for f in fields:
            name = f.get("name") if isinstance(f, dict) else None
            at = f"{what}.{name}"
            if not isinstance(f, dict) or not isinstance(name, str):
                problems.add(where, f"{what}.fields", f"a field must be an object with a string name, is {f!r:.80}")
                continue
            if name.lower() in seen:
                problems.add(where, at, "a second field of this name (names are case-insensitive)")
            seen.add(name.lower())
            extra = set(f) - {"name", "type", "nullable", "metadata"}
            if extra:
                problems.add(where, at, f"fields the protocol does not know: {sorted(extra)}")
            if not isinstance(f.get("nullable"), bool):
                problems.add(where, f"{at}.nullable", f"must be a boolean, is {_kind(f.get('nullable'))}")
            if not isinstance(f.get("metadata"), dict):
                problems.add(where, f"{at}.metadata", f"must be a JSON object, is {_kind(f.get('metadata'))}")
            _check_type(problems, where, f"{at}.type", f.get("type"))
    elif kind == "array":
        if set(type_) != {"type", "elementType", "containsNull"}:
            problems.add(where, what, f"an array type has type, elementType, containsNull; this has {sorted(type_)}")
        if not isinstance(type_.get("containsNull"), bool):
            problems.add(where, f"{what}.containsNull", "must be a boolean")
        _check_type(problems, where, f"{what}.elementType", type_.get("elementType"))
    elif kind == "map":
        if set(type_) != {"type", "keyType", "valueType", "valueContainsNull"}:
            problems.add(
                where, what, f"a map type has type, keyType, valueType, valueContainsNull; has {sorted(type_)}"
            )
        if not isinstance(type_.get("valueContainsNull"), bool):
            problems.add(where, f"{what}.valueContainsNull", "must be a boolean")
        _check_type(problems, where, f"{what}.keyType", type_.get("keyType"))
        _check_type(problems, where, f"{what}.valueType", type_.get("valueType"))
    else:
        problems.add(where, what, f"unknown nested type {kind!r}")


def _has_type(type_: Any, name: str) -> bool:
    if isinstance(type_, str):
        return type_ == name
    if isinstance(type_, dict):
        return any(_has_type(v, name) for k, v in type_.items() if k not in ("metadata", "name"))
    if isinstance(type_, list):
        return any(_has_type(v, name) for v in type_)
    return False


def bound_problem(value: Any, type_: Any) -> str | None:
    """Why ``value`` is not a statistic (minimum or maximum) of a column of the Delta type ``type_`` in the JSON
    shape the protocol's readers take: a number for a number, text for a string, a date or a timestamp."""
    if value is None or not isinstance(type_, str):
        return None
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if type_ in ("long", "integer", "short", "byte"):
        ok = number and isinstance(value, int)
    elif type_ in ("float", "double") or type_.startswith("decimal"):
        ok = number
    elif type_ == "string":
        ok = isinstance(value, str)
    elif type_ == "boolean":
        ok = isinstance(value, bool)
    elif type_ == "date":
        try:
            ok = isinstance(value, str) and bool(date.fromisoformat(value))
        except ValueError:
            ok = False
    elif type_ in ("timestamp", "timestamp_ntz"):
        ok = isinstance(value, str) and bool(_TIMESTAMP.match(value))
    else:
        return None
    return None if ok else f"{value!r} is not a bound of a {type_} column"


_TIMESTAMP = re.compile(r"^\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}:\d{2}(\.\d{1,9})?(Z|[+-]\d{2}:?\d{2})?$")


def partition_value_problem(text: str, type_: Any) -> str | None:
    """Why ``text`` is not a partition value of the Delta type ``type_`` as the protocol serializes it."""
    try:
        if type_ in ("long", "integer", "short", "byte"):
            bits = {"long": 64, "integer": 32, "short": 16, "byte": 8}[type_]
            value = int(text)
            if not -(2 ** (bits - 1)) <= value < 2 ** (bits - 1):
                return f"{text!r} is out of a {type_}'s range"
        elif type_ in ("float", "double"):
            float(text)
        elif type_ == "boolean":
            if text.lower() not in ("true", "false"):
                return f"{text!r} is no boolean (true or false)"
        elif type_ == "date":
            date.fromisoformat(text)
        elif type_ in ("timestamp", "timestamp_ntz"):
            if not _TIMESTAMP.match(text):
                return f"{text!r} is no timestamp (yyyy-MM-dd HH:mm:ss[.SSSSSS])"
            datetime.fromisoformat(text[:19].replace(" ", "T"))
        elif isinstance(type_, str) and type_.startswith("decimal"):
            Decimal(text)
        elif not isinstance(type_, str):
            return f"a partition column of a nested type ({type_!r:.60})"
    except (ValueError, InvalidOperation):
        return f"{text!r} does not parse as a {type_}"
    return None


# -- the table ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class State:
    """The table's state at one version, as the entries replay it (to compare a checkpoint written later with)."""

    protocol: dict[str, Any] | None
    metadata: dict[str, Any] | None
    txns: dict[str, int]
    files: dict[str, int | None]


@dataclass
class Replay:
    """The table's state as the entries checked so far replay it."""

    version: int = -1
    protocol: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None
    schema: dict[str, Any] | None = None
    """The parsed ``schemaString`` of :attr:`metadata` (None if it did not parse)."""
    txns: dict[str, int] = field(default_factory=dict)
    files: dict[str, int | None] = field(default_factory=dict)
    """The active files: path (as the actions give it) -> size."""

    def snapshot(self) -> State:
        return State(self.protocol, self.metadata, dict(self.txns), dict(self.files))

    @property
    def columns(self) -> dict[str, Any]:
        """The top-level fields of the schema by name."""
        fields = (self.schema or {}).get("fields") or []
        return {f["name"]: f for f in fields if isinstance(f, dict) and isinstance(f.get("name"), str)}

    @property
    def partition_columns(self) -> list[str]:
        return [c for c in (self.metadata or {}).get("partitionColumns") or [] if isinstance(c, str)]


class DeltaConformance:
    """The conformance checks of one Delta table, with a cursor (see the module's notes).

    ``location`` is the table's root, a local path or an fsspec URL; ``fs`` an fsspec file system for it (default:
    the URL's, with ``options``, the sink's s3fs options)."""

    def __init__(self, location: str, *, fs: Any = None, options: Mapping[str, Any] | None = None) -> None:
        self.location = location
        if fs is None:
            if "://" in location and not location.startswith("file://"):
                fs, root = fsspec.core.url_to_fs(location, **dict(options or {}))
            else:
                fs, root = fsspec.filesystem("file"), location.removeprefix("file://")
        else:
            root = fs._strip_protocol(location) if "://" in location else location
        self.fs = fs
        self.root = str(root).rstrip("/")
        self.log = f"{self.root}/{LOG_DIR}"
        self.replay = Replay()
        self.checkpoints: set[str] = set()
        """The checkpoint files checked."""
        self.last_checkpoint: str | None = None
        """The text of ``_last_checkpoint`` when last checked."""
        self.states: dict[int, State] = {}
        """The state at each version replayed."""
        self.first_entry: bytes | None = None
        """Version 0's bytes: a table made anew at the same location starts the cursor again."""

    # -- reading -------------------------------------------------------------------------------------------------

    def _names(self) -> list[str]:
        try:
            self.fs.invalidate_cache(self.log)
            paths = self.fs.ls(self.log, detail=False)
        except FileNotFoundError:
            return []
        return [str(p).rstrip("/").rsplit("/", 1)[-1] for p in paths]

    def _read(self, name: str) -> bytes:
        return self.fs.cat_file(f"{self.log}/{name}")

    def _size(self, path: str) -> int | None:
        try:
            return int(self.fs.info(path)["size"])
        except FileNotFoundError:
            return None

    def data_path(self, path: str) -> str:
        """Where an action's path (a relative URI, or an absolute one) is."""
        parsed = urlparse(path)
        if parsed.scheme:
            return self.fs._strip_protocol(path) if parsed.scheme != "file" else unquote(parsed.path)
        return f"{self.root}/{unquote(path)}"

    # -- checking ------------------------------------------------------------------------------------------------

    def check(self) -> int:
        """Check what is new since the last call; return the newest version checked (-1: no table yet). Raises
        AssertionError naming every problem found."""
        problems = Problems()
        names = self._names()
        versions = sorted(int(m.group(1)) for n in names if (m := ENTRY.match(n)))
        if 0 in versions:
            first = self._read(f"{0:020d}.json")
            if self.first_entry is not None and first != self.first_entry:  # a new table at the same location
                self.__init__(self.location, fs=self.fs)  # type: ignore[misc]
            self.first_entry = first
        replay = self.replay
        checkpoints = self._checkpoints(names)
        if replay.version < 0 and checkpoints and (not versions or versions[0] != 0):
            older = [v for v in checkpoints if v + 1 >= versions[0]] if versions else [max(checkpoints)]
            if not older:
                problems.add(
                    f"{LOG_DIR}/",
                    "versions",
                    f"the oldest entry is version {versions[0]}, and no checkpoint stands for the versions before it",
                )
                problems.raise_any(self.location)
            start = min(older)
            self._from_checkpoint(problems, start, checkpoints[start])
        new = [v for v in versions if v > replay.version]
        expected = list(range(replay.version + 1, replay.version + 1 + len(new)))
        if new != expected:
            problems.add(
                f"{LOG_DIR}/",
                "versions",
                f"the entries {new[:20]} are not contiguous from version {replay.version + 1}",
            )
        added: list[tuple[str, str, int | None, str | None]] = []
        for version in new:
            if version != replay.version + 1:
                break
            added += self._entry(problems, version)
            self.states[version] = replay.snapshot()
        for version, parts in sorted(checkpoints.items()):
            names_of = self._checkpoint_names(version, parts)
            if all(n in self.checkpoints for n in names_of) or version > replay.version:
                continue
            self._checkpoint(problems, version, names_of)
        if checkpoints:  # a checkpoint older than the newest one is not written any more: its state is not needed
            newest = max(v for v in checkpoints if v <= replay.version) if min(checkpoints) <= replay.version else -1
            for version in [v for v in self.states if v < newest]:
                del self.states[version]
        for where, path, size, stats in added:
            if path not in replay.files:
                continue  # removed since (a compaction): a vacuum may have deleted it
            found = self._size(self.data_path(path))
            if found is None:
                problems.add(where, "add.path", f"{path}: no such file under the table's root {self.root}")
            elif found != size:
                problems.add(where, "add.size", f"{path} is {found} bytes, the action says {size}")
            elif isinstance(stats, str):
                self._file_stats(problems, where, path, stats)
        self._last_checkpoint(problems, names, checkpoints)
        problems.raise_any(self.location)
        return replay.version

    def _file_stats(self, problems: Problems, where: str, path: str, text: str) -> None:
        """An ``add``'s statistics against its file's data: ``numRecords`` the footer's rows, each top-level
        column's ``nullCount`` its nulls, ``minValues``/``maxValues`` at or beyond its smallest and largest value
        (a reader skips the file by them)."""
        try:
            stats = json.loads(text)
        except ValueError:
            return  # reported with the action
        if not isinstance(stats, dict):
            return
        with self.fs.open(self.data_path(path), "rb") as f:
            parquet = pq.ParquetFile(f)
            rows = parquet.metadata.num_rows
            if "numRecords" in stats and stats["numRecords"] != rows:
                problems.add(where, "add.stats.numRecords", f"{stats['numRecords']}, the file {path} has {rows} rows")
            keyed = [stats.get(k) if isinstance(stats.get(k), dict) else {} for k in ("minValues", "maxValues")]
            nulls = stats.get("nullCount") if isinstance(stats.get("nullCount"), dict) else {}
            names = set(parquet.schema_arrow.names)
            wanted = sorted(n for n in set(keyed[0]) | set(keyed[1]) | set(nulls) if n in names)
            data = parquet.read(columns=wanted) if wanted else None
        for name in wanted:
            column = data[name] if data is not None else None
            if column is None:
                continue
            count = nulls.get(name)
            if isinstance(count, int) and not isinstance(count, dict) and count != column.null_count:
                problems.add(where, f"add.stats.nullCount.{name}", f"{count}, the file {path} has {column.null_count}")
            if not (pa.types.is_integer(column.type) or pa.types.is_floating(column.type)) and not (
                pa.types.is_string(column.type) or pa.types.is_date(column.type)
            ):
                continue
            valid = column.drop_null()
            if pa.types.is_floating(column.type):
                valid = valid.filter(pc.invert(pc.is_nan(valid)))
            if len(valid) == 0:
                continue
            actual = pc.min_max(valid).as_py()
            lo, hi = actual["min"], actual["max"]
            if pa.types.is_date(column.type):
                lo, hi = lo.isoformat(), hi.isoformat()
            low, high = keyed[0].get(name), keyed[1].get(name)
            if _comparable(low, lo) and low > lo:
                problems.add(where, f"add.stats.minValues.{name}", f"{low!r}, the file {path} holds {lo!r}")
            if _comparable(high, hi) and high < hi:
                problems.add(where, f"add.stats.maxValues.{name}", f"{high!r}, the file {path} holds {hi!r}")

    def _checkpoints(self, names: list[str]) -> dict[int, int | None]:
        """The complete checkpoints in the log: version -> parts (None: a single file)."""
        found: dict[int, tuple[int | None, set[int]]] = {}
        for n in names:
            m = CHECKPOINT.match(n)
            if m:
                total = int(m.group(3)) if m.group(3) else None
                found.setdefault(int(m.group(1)), (total, set()))[1].add(int(m.group(2) or 1))
        return {v: total for v, (total, parts) in found.items() if len(parts) == (total or 1)}

    @staticmethod
    def _checkpoint_names(version: int, parts: int | None) -> list[str]:
        if parts:
            return [f"{version:020d}.checkpoint.{i:010d}.{parts:010d}.parquet" for i in range(1, parts + 1)]
        return [f"{version:020d}.checkpoint.parquet"]

    def _entry(self, problems: Problems, version: int) -> list[tuple[str, str, int | None, str | None]]:
        """Check the entry at ``version`` and replay it; return its ``add`` actions (where, path, size)."""
        name = f"{version:020d}.json"
        where_file = f"{LOG_DIR}/{name}"
        data = self._read(name)
        kinds: dict[str, int] = {}
        paths: dict[tuple[str, str], int] = {}
        replay = self.replay
        added: list[tuple[str, str, int | None, str | None]] = []
        lines = data.decode("utf-8", errors="replace").split("\n")
        if lines and lines[-1] == "":
            lines.pop()
        for number, line in enumerate(lines, 1):
            where = f"{where_file} line {number}"
            if not line.strip():
                problems.add(where, "line", "an empty line in a log entry")
                continue
            try:
                action = json.loads(line)
            except ValueError as e:
                problems.add(where, "line", f"not JSON: {e}")
                continue
            if not isinstance(action, dict) or len(action) != 1:
                keys = sorted(action) if isinstance(action, dict) else _kind(action)
                problems.add(where, "line", f"must be a JSON object with exactly one action key, has {keys}")
                continue
            [(kind, fields)] = action.items()
            kinds[kind] = kinds.get(kind, 0) + 1
            if kind in ("add", "remove") and isinstance(fields, dict) and isinstance(fields.get("path"), str):
                key = (kind, fields["path"])
                if key in paths:
                    problems.add(where, f"{kind}.path", f"{fields['path']} is in line {paths[key]} of this entry too")
                paths[key] = number
            self.action(problems, f"{where} ({kind})", kind, fields)
            if not isinstance(fields, dict):
                continue
            if kind == "protocol":
                replay.protocol = fields
            elif kind == "metaData":
                replay.metadata = fields
                try:
                    replay.schema = json.loads(fields.get("schemaString") or "null")
                except ValueError:
                    replay.schema = None
            elif kind == "txn" and isinstance(fields.get("appId"), str):
                replay.txns[fields["appId"]] = fields.get("version")  # type: ignore[assignment]
            elif kind == "add" and isinstance(fields.get("path"), str):
                replay.files[fields["path"]] = fields.get("size")
                added.append((f"{where} (add)", fields["path"], fields.get("size"), fields.get("stats")))
            elif kind == "remove" and isinstance(fields.get("path"), str):
                replay.files.pop(fields["path"], None)
        for kind in ("protocol", "metaData"):
            if kinds.get(kind, 0) > 1:
                problems.add(where_file, kind, f"{kinds[kind]} {kind} actions in one version (at most one)")
        if version == 0:
            for kind in ("protocol", "metaData"):
                if kind not in kinds:
                    problems.add(where_file, kind, "version 0 must hold a protocol and a metaData action")
        self._cross(problems, where_file)
        replay.version = version
        return added

    def _cross(self, problems: Problems, where: str) -> None:
        """What the newest protocol and metadata require of each other."""
        protocol, schema = self.replay.protocol or {}, self.replay.schema
        if schema is not None and _has_type(schema, "timestamp_ntz"):
            for key, _version in (("readerFeatures", 3), ("writerFeatures", 7)):
                if "timestampNtz" not in (protocol.get(key) or ()):
                    problems.add(
                        where, f"protocol.{key}", f"the schema has timestamp_ntz: {key} must list timestampNtz"
                    )

    def action(self, problems: Problems, where: str, kind: str, fields: Any) -> None:
        """One action's fields (from an entry's line, or a checkpoint's row)."""
        spec = ACTIONS.get(kind)
        if spec is None:
            problems.add(where, kind, "an action the protocol does not know")
            return
        if not isinstance(fields, dict):
            problems.add(where, kind, f"an action must be a JSON object, is {_kind(fields)}")
            return
        if kind == "commitInfo":
            for name in ("timestamp", "inCommitTimestamp"):
                if name in fields and _type_problem(fields[name], LONG):
                    problems.add(where, f"commitInfo.{name}", _type_problem(fields[name], LONG) or "")
            return
        problems.fields(where, kind, fields, spec)
        check = getattr(self, f"_check_{kind}", None)
        if check is not None:
            check(problems, where, fields)

    def _check_protocol(self, problems: Problems, where: str, fields: dict[str, Any]) -> None:
        reader, writer = fields.get("minReaderVersion"), fields.get("minWriterVersion")
        if isinstance(reader, int) and not 1 <= reader <= 3:
            problems.add(where, "protocol.minReaderVersion", f"{reader}: reader versions are 1 to 3")
        if isinstance(writer, int) and not 1 <= writer <= 7:
            problems.add(where, "protocol.minWriterVersion", f"{writer}: writer versions are 1 to 7")
        for key, version, at in (("readerFeatures", 3, reader), ("writerFeatures", 7, writer)):
            present = fields.get(key) is not None
            if present and at != version:
                problems.add(where, f"protocol.{key}", f"present with {key[:6]} version {at} (only with {version})")
            if not present and at == version:
                problems.add(where, f"protocol.{key}", f"missing: {key[:6]} version {version} lists its features")
        readers, writers = fields.get("readerFeatures"), fields.get("writerFeatures")
        if isinstance(readers, list) and isinstance(writers, list):
            missing = sorted(set(map(str, readers)) - set(map(str, writers)))
            if missing:
                problems.add(where, "protocol.writerFeatures", f"lacks the reader features {missing}")

    def _check_metaData(self, problems: Problems, where: str, fields: dict[str, Any]) -> None:
        if isinstance(fields.get("id"), str):
            try:
                uuid.UUID(fields["id"])
            except ValueError:
                problems.add(where, "metaData.id", f"{fields['id']!r} is no GUID")
        fmt = fields.get("format")
        if isinstance(fmt, dict):
            problems.fields(where, "metaData.format", fmt, FORMAT)
        schema: Any = None
        if isinstance(fields.get("schemaString"), str):
            try:
                schema = json.loads(fields["schemaString"])
            except ValueError as e:
                problems.add(where, "metaData.schemaString", f"not JSON: {e}")
            else:
                check_schema(problems, where, "metaData.schemaString", schema)
        columns = fields.get("partitionColumns")
        if isinstance(columns, list) and isinstance(schema, dict):
            top = {f.get("name"): f for f in schema.get("fields") or [] if isinstance(f, dict)}
            for c in columns:
                if c not in top:
                    problems.add(where, "metaData.partitionColumns", f"{c!r} is no top-level column of the schema")
                elif not isinstance(top[c].get("type"), str):
                    problems.add(where, "metaData.partitionColumns", f"{c!r} is of a nested type")
            if len(set(map(str, columns))) != len(columns):
                problems.add(where, "metaData.partitionColumns", f"a column twice: {columns}")

    def _partition_values(self, problems: Problems, where: str, kind: str, values: Any) -> None:
        if not isinstance(values, dict) or self.replay.metadata is None:
            return
        want = self.replay.partition_columns
        if set(values) != set(want):
            problems.add(
                where, f"{kind}.partitionValues", f"keys {sorted(values)} are not the partition columns {sorted(want)}"
            )
        columns = self.replay.columns
        for name, text in values.items():
            if isinstance(text, str) and name in columns:
                problem = partition_value_problem(text, columns[name].get("type"))
                if problem:
                    problems.add(where, f"{kind}.partitionValues.{name}", problem)

    def _stats(self, problems: Problems, where: str, kind: str, text: str) -> None:
        at = f"{kind}.stats"
        try:
            stats = json.loads(text)
        except ValueError as e:
            problems.add(where, at, f"not JSON: {e}")
            return
        if not isinstance(stats, dict):
            problems.add(where, at, f"must be a JSON object, is {_kind(stats)}")
            return
        for name in set(stats) - STATS_KEYS:
            problems.add(where, f"{at}.{name}", "a statistic the protocol does not know")
        records = stats.get("numRecords")
        if "numRecords" in stats and (_type_problem(records, LONG) or records < 0):
            problems.add(where, f"{at}.numRecords", f"must be a non-negative integer, is {records!r}")
        if "tightBounds" in stats and not isinstance(stats["tightBounds"], bool):
            problems.add(where, f"{at}.tightBounds", "must be a boolean")
        if self.replay.schema is None:
            return
        partitions = set(self.replay.partition_columns)
        fields = {n: f for n, f in self.replay.columns.items() if n not in partitions}
        for key in ("minValues", "maxValues", "nullCount"):
            if key in stats:
                self._stat_values(problems, where, f"{at}.{key}", stats[key], fields, key == "nullCount", records)
        lows, highs = stats.get("minValues"), stats.get("maxValues")
        if isinstance(lows, dict) and isinstance(highs, dict):
            for name in sorted(set(lows) & set(highs)):
                low, high = lows[name], highs[name]
                same = isinstance(low, str) == isinstance(high, str) and not isinstance(low, dict | list | bool)
                if same and low is not None and high is not None and low > high:
                    problems.add(where, f"{at}.minValues.{name}", f"{low!r} is above the maximum {high!r}")

    def _stat_values(
        self,
        problems: Problems,
        where: str,
        at: str,
        values: Any,
        fields: Mapping[str, Any],
        counts: bool,
        records: Any,
    ) -> None:
        if not isinstance(values, dict):
            problems.add(where, at, f"must be a JSON object keyed by columns, is {_kind(values)}")
            return
        for name, value in values.items():
            f = fields.get(name)
            if f is None:
                problems.add(where, f"{at}.{name}", "no such column in the schema (or a partition column)")
                continue
            type_ = f.get("type")
            if isinstance(type_, dict) and type_.get("type") == "struct":
                nested = {g["name"]: g for g in type_.get("fields") or [] if isinstance(g, dict) and "name" in g}
                self._stat_values(problems, where, f"{at}.{name}", value, nested, counts, records)
            elif counts:
                if _type_problem(value, LONG) or value < 0:
                    problems.add(where, f"{at}.{name}", f"a null count must be a non-negative integer, is {value!r}")
                elif isinstance(records, int) and value > records:
                    problems.add(where, f"{at}.{name}", f"{value} nulls in {records} records")
            elif isinstance(value, dict | list):
                problems.add(where, f"{at}.{name}", f"a bound of a {type_!r:.40} column must be a single value")
            else:
                problem = bound_problem(value, type_)
                if problem:
                    problems.add(where, f"{at}.{name}", problem)

    def _check_file(self, problems: Problems, where: str, kind: str, fields: dict[str, Any]) -> None:
        if "partitionValues" in fields:
            self._partition_values(problems, where, kind, fields["partitionValues"])
        if isinstance(fields.get("stats"), str):
            self._stats(problems, where, kind, fields["stats"])
        if isinstance(fields.get("path"), str) and not fields["path"]:
            problems.add(where, f"{kind}.path", "an empty path")
        if isinstance(fields.get("size"), int) and fields["size"] < 0:
            problems.add(where, f"{kind}.size", f"a negative size {fields['size']}")

    def _check_add(self, problems: Problems, where: str, fields: dict[str, Any]) -> None:
        self._check_file(problems, where, "add", fields)

    def _check_remove(self, problems: Problems, where: str, fields: dict[str, Any]) -> None:
        self._check_file(problems, where, "remove", fields)

    def _check_cdc(self, problems: Problems, where: str, fields: dict[str, Any]) -> None:
        self._check_file(problems, where, "cdc", fields)

    # -- checkpoints -----------------------------------------------------------------------------------------------

    def _checkpoint_rows(self, problems: Problems, name: str) -> list[tuple[str, str, dict[str, Any]]]:
        """A checkpoint file's actions (where, kind, fields), its columns' types checked."""
        from filesink.destination.delta_actions import json_value

        where_file = f"{LOG_DIR}/{name}"
        table = pq.read_table(self.fs.open(f"{self.log}/{name}", "rb"))
        for kind, column in zip(table.column_names, table.columns, strict=True):
            if kind not in ACTIONS:
                problems.add(where_file, kind, "a checkpoint column that is no action of the protocol")
                continue
            if not pa.types.is_struct(column.type):
                problems.add(where_file, kind, f"an action's column must be a struct, is {column.type}")
                continue
            for f in column.type:
                check = ARROW.get(kind, {}).get(f.name)
                if check is not None and not check(f.type):
                    problems.add(where_file, f"{kind}.{f.name}", f"the column's type {f.type} is not the protocol's")
        rows = table.to_pylist()
        out: list[tuple[str, str, dict[str, Any]]] = []
        for number, row in enumerate(rows, 1):
            where = f"{where_file} row {number}"
            present = [k for k, v in row.items() if v is not None]
            if len(present) != 1:
                problems.add(where, "row", f"must hold exactly one action, holds {present}")
                continue
            kind = present[0]
            fields = json_value(row[kind], table.schema.field(kind).type)
            for extra in ("stats_parsed", "partitionValues_parsed"):
                fields.pop(extra, None)  # a checkpoint's own columns, no part of the action
            out.append((f"{where} ({kind})", kind, fields))
        return out

    def _checkpoint(self, problems: Problems, version: int, names: list[str]) -> None:
        """A checkpoint at ``version`` (the replay is at ``version`` or later: it is compared with the state at
        ``version`` only when the replay is exactly there)."""
        actions: list[tuple[str, str, dict[str, Any]]] = []
        for name in names:
            actions += self._checkpoint_rows(problems, name)
        for where, kind, fields in actions:
            self.action(problems, where, kind, fields)
        self.checkpoints.update(names)
        self._compare(problems, f"{LOG_DIR}/{names[0]}", version, actions)

    def _compare(
        self, problems: Problems, where: str, version: int, actions: list[tuple[str, str, dict[str, Any]]]
    ) -> None:
        """The checkpoint's state against the replay's, when the replay is at its version and complete."""
        replay = self.states.get(version)
        if replay is None:
            return
        kinds = [k for _, k, _ in actions]
        for kind in ("protocol", "metaData"):
            if kinds.count(kind) != 1:
                problems.add(
                    where, kind, f"a checkpoint holds exactly one {kind} action, this holds {kinds.count(kind)}"
                )
        state: dict[str, Any] = {"txn": {}, "add": {}}
        for _, kind, fields in actions:
            if kind == "txn":
                state["txn"][fields.get("appId")] = fields.get("version")
            elif kind == "add":
                state["add"][fields.get("path")] = fields.get("size")
            elif kind in ("protocol", "metaData"):
                state[kind] = fields
        if state["txn"] != replay.txns:
            diff = sorted(set(state["txn"].items()) ^ set(replay.txns.items()), key=str)[:5]
            problems.add(where, "txn", f"the application transactions are not the log's at version {version}: {diff}")
        if state["add"] != replay.files:
            diff = sorted(set(state["add"].items()) ^ set(replay.files.items()), key=str)[:5]
            problems.add(where, "add", f"the active files are not the log's at version {version}: {diff}")
        for kind, have in (("protocol", replay.protocol), ("metaData", replay.metadata)):
            got = state.get(kind)
            if got is not None and have is not None and _present(got) != _present(have):
                problems.add(where, kind, f"not the log's newest {kind} at version {version}: {got} / {have}")

    def _from_checkpoint(self, problems: Problems, version: int, parts: int | None) -> None:
        """Start the replay from a checkpoint (the entries before it were cleaned up)."""
        names = self._checkpoint_names(version, parts)
        actions: list[tuple[str, str, dict[str, Any]]] = []
        for name in names:
            actions += self._checkpoint_rows(problems, name)
        replay = self.replay
        for _, kind, fields in actions:
            if kind == "protocol":
                replay.protocol = fields
            elif kind == "metaData":
                replay.metadata = fields
                replay.schema = json.loads(fields.get("schemaString") or "null")
        for where, kind, fields in actions:
            self.action(problems, where, kind, fields)
            if kind == "txn":
                replay.txns[fields["appId"]] = fields["version"]
            elif kind == "add":
                replay.files[fields["path"]] = fields.get("size")
        replay.version = version
        self.states[version] = replay.snapshot()
        self.checkpoints.update(names)

    def _last_checkpoint(self, problems: Problems, names: list[str], checkpoints: dict[int, int | None]) -> None:
        if "_last_checkpoint" not in names:
            return
        text = self._read("_last_checkpoint").decode("utf-8", errors="replace")
        if text == self.last_checkpoint:
            return
        self.last_checkpoint = text
        where = f"{LOG_DIR}/_last_checkpoint"
        try:
            hint = json.loads(text)
        except ValueError as e:
            problems.add(where, "file", f"not JSON: {e}")
            return
        if not isinstance(hint, dict):
            problems.add(where, "file", f"must be a JSON object, is {_kind(hint)}")
            return
        problems.fields(where, "_last_checkpoint", hint, LAST_CHECKPOINT)
        version, parts = hint.get("version"), hint.get("parts")
        if not isinstance(version, int):
            return
        if version not in checkpoints:
            problems.add(where, "_last_checkpoint.version", f"names checkpoint {version}, which is not in the log")
            return
        if (parts or None) != checkpoints[version]:
            problems.add(where, "_last_checkpoint.parts", f"{parts}, the checkpoint has {checkpoints[version]} parts")
        files = self._checkpoint_names(version, checkpoints[version])
        metas = [pq.ParquetFile(self.fs.open(f"{self.log}/{n}", "rb")).metadata for n in files]
        rows = sum(m.num_rows for m in metas)
        if isinstance(hint.get("size"), int) and hint["size"] != rows:
            problems.add(where, "_last_checkpoint.size", f"{hint['size']}, the checkpoint holds {rows} actions")
        if isinstance(hint.get("sizeInBytes"), int):
            total = sum(self._size(f"{self.log}/{n}") or 0 for n in files)
            if hint["sizeInBytes"] != total:
                problems.add(where, "_last_checkpoint.sizeInBytes", f"{hint['sizeInBytes']}, the files are {total}")
        if isinstance(hint.get("numOfAddFiles"), int):
            adds = 0
            for n in files:
                column = pq.read_table(self.fs.open(f"{self.log}/{n}", "rb"), columns=["add"])["add"]
                adds += len(column) - column.null_count
            if hint["numOfAddFiles"] != adds:
                problems.add(
                    where, "_last_checkpoint.numOfAddFiles", f"{hint['numOfAddFiles']}, the checkpoint has {adds}"
                )


def _comparable(bound: Any, value: Any) -> bool:
    """Whether a statistic and a file's value are of kinds this check orders (numbers, or text)."""
    if isinstance(bound, bool) or isinstance(value, bool):
        return False
    numbers = isinstance(bound, int | float) and isinstance(value, int | float)
    return numbers or (isinstance(bound, str) and isinstance(value, str))


def _present(fields: Mapping[str, Any]) -> dict[str, Any]:
    """An action's fields without those that are null (absent and null are the same for an optional field)."""
    return {k: (_present(v) if isinstance(v, dict) else v) for k, v in fields.items() if v is not None}
