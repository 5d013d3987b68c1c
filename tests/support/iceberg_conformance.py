"""Conformance of an Iceberg table's metadata to the Iceberg table spec: every metadata file, every manifest list and
every manifest, checked field by field (written for these tests from the spec's text; the Avro files are read with
``avro_records``, not with the library that wrote them).

:class:`IcebergConformance` keeps a cursor: each :meth:`IcebergConformance.check` reads only the metadata files,
manifest lists and manifests it has not checked yet (manifests and manifest lists are never rewritten). A problem
names the file, the place in it and the field; all problems of a check are raised as one :class:`AssertionError`.

What is checked:

- **metadata files** (``metadata/*.metadata.json``): the fields the format version requires, each of its type, no
  field the spec does not know; ``table-uuid`` a UUID, the same in every file of the table; ``last-column-id`` at
  least every field id of every schema; schemas (struct types, unique field ids, valid primitive, decimal, fixed,
  list, map and struct types, identifier fields that exist) and ``current-schema-id`` among them; partition specs
  (field ids from 1000, unique, at most ``last-partition-id``, source ids in the schema, known transforms) and
  ``default-spec-id`` among them; sort orders (order 0 unsorted, directions, null orders) and
  ``default-sort-order-id`` among them; ``properties`` string to string; snapshots (unique ids, a parent that is
  an older snapshot, sequence numbers increasing with time and at most ``last-sequence-number``, a summary with an
  operation and string values, a manifest list that exists); ``snapshot-log`` and ``metadata-log`` in time order;
  ``refs`` of known types and existing snapshots, ``main`` the current snapshot;
- **manifest lists**: the fields of each manifest's entry, the manifest exists with ``manifest_length`` bytes, its
  spec exists, its counts of added, existing and deleted files and rows are the manifest's, its sequence numbers
  fit the snapshot's, and the current snapshot's summary totals are its live files';
- **manifests**: their metadata (schema, spec, format version, content), each entry's status and snapshot id,
  ``data_file.file_path`` an object of ``file_size_in_bytes`` bytes whose Parquet footer holds ``record_count``
  rows, its partition tuple of the spec's fields and types, its column statistics keyed by field ids that exist,
  its bounds in their types' serialization (or, for a promoted field, the type it was promoted from) and its value
  counts, null counts and bounds those of its data; the manifest list's partition summaries cover the manifest's
  partition tuples (readers skip manifests by them).
"""

from __future__ import annotations

import itertools
import json
import re
import struct
import uuid
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlparse

import fsspec
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from avro_records import read_avro

METADATA_DIR = "metadata"
METADATA_FILE = re.compile(r"^(\d+)-[0-9a-fA-F-]+\.metadata\.json$|^v(\d+)\.metadata\.json$")

STRING, INT, LONG, BOOL, OBJECT, LIST, MAP, ANY = "string", "int", "long", "boolean", "object", "list", "map", "any"

Spec = Mapping[str, tuple[str, bool]]

TABLE: Spec = {
    "format-version": (INT, True),
    "table-uuid": (STRING, True),
    "location": (STRING, True),
    "last-sequence-number": (LONG, True),
    "last-updated-ms": (LONG, True),
    "last-column-id": (INT, True),
    "schemas": (LIST, True),
    "current-schema-id": (INT, True),
    "partition-specs": (LIST, True),
    "default-spec-id": (INT, True),
    "last-partition-id": (INT, True),
    "properties": (MAP, False),
    "current-snapshot-id": (LONG, False),
    "snapshots": (LIST, False),
    "snapshot-log": (LIST, False),
    "metadata-log": (LIST, False),
    "sort-orders": (LIST, True),
    "default-sort-order-id": (INT, True),
    "refs": (OBJECT, False),
    "statistics": (LIST, False),
    "partition-statistics": (LIST, False),
    "next-row-id": (LONG, False),
    "encryption-keys": (LIST, False),
    "schema": (OBJECT, False),
    "partition-spec": (LIST, False),
}
"""The fields of a table's metadata (format version 2; ``schema`` and ``partition-spec`` are version 1's)."""
SNAPSHOT: Spec = {
    "snapshot-id": (LONG, True),
    "parent-snapshot-id": (LONG, False),
    "sequence-number": (LONG, True),
    "timestamp-ms": (LONG, True),
    "manifest-list": (STRING, True),
    "summary": (OBJECT, True),
    "schema-id": (INT, False),
    "first-row-id": (LONG, False),
    "added-rows": (LONG, False),
    "key-id": (STRING, False),
}
REF: Spec = {
    "snapshot-id": (LONG, True),
    "type": (STRING, True),
    "min-snapshots-to-keep": (INT, False),
    "max-snapshot-age-ms": (LONG, False),
    "max-ref-age-ms": (LONG, False),
}
SCHEMA: Spec = {
    "type": (STRING, True),
    "schema-id": (INT, True),
    "fields": (LIST, True),
    "identifier-field-ids": (LIST, False),
}
FIELD: Spec = {
    "id": (INT, True),
    "name": (STRING, True),
    "required": (BOOL, True),
    "type": (ANY, True),
    "doc": (STRING, False),
    "initial-default": (ANY, False),
    "write-default": (ANY, False),
}
PARTITION_SPEC: Spec = {"spec-id": (INT, True), "fields": (LIST, True)}
PARTITION_FIELD: Spec = {
    "source-id": (INT, True),
    "field-id": (INT, True),
    "name": (STRING, True),
    "transform": (STRING, True),
}
SORT_ORDER: Spec = {"order-id": (INT, True), "fields": (LIST, True)}
SORT_FIELD: Spec = {
    "transform": (STRING, True),
    "source-id": (INT, True),
    "direction": (STRING, True),
    "null-order": (STRING, True),
}
MANIFEST_FILE: Spec = {
    "manifest_path": (STRING, True),
    "manifest_length": (LONG, True),
    "partition_spec_id": (INT, True),
    "content": (INT, True),
    "sequence_number": (LONG, True),
    "min_sequence_number": (LONG, True),
    "added_snapshot_id": (LONG, True),
    "added_files_count": (INT, True),
    "existing_files_count": (INT, True),
    "deleted_files_count": (INT, True),
    "added_rows_count": (LONG, True),
    "existing_rows_count": (LONG, True),
    "deleted_rows_count": (LONG, True),
    "partitions": (LIST, False),
    "key_metadata": (ANY, False),
    "first_row_id": (LONG, False),
}
"""A manifest list's entry (format version 2)."""
ENTRY: Spec = {
    "status": (INT, True),
    "snapshot_id": (LONG, False),
    "sequence_number": (LONG, False),
    "file_sequence_number": (LONG, False),
    "data_file": (OBJECT, True),
}
DATA_FILE: Spec = {
    "content": (INT, True),
    "file_path": (STRING, True),
    "file_format": (STRING, True),
    "partition": (OBJECT, True),
    "record_count": (LONG, True),
    "file_size_in_bytes": (LONG, True),
    "column_sizes": (ANY, False),
    "value_counts": (ANY, False),
    "null_value_counts": (ANY, False),
    "nan_value_counts": (ANY, False),
    "lower_bounds": (ANY, False),
    "upper_bounds": (ANY, False),
    "key_metadata": (ANY, False),
    "split_offsets": (LIST, False),
    "equality_ids": (LIST, False),
    "sort_order_id": (INT, False),
    "first_row_id": (LONG, False),
    "referenced_data_file": (STRING, False),
    "content_offset": (LONG, False),
    "content_size_in_bytes": (LONG, False),
}
STATISTICS = ("column_sizes", "value_counts", "null_value_counts", "nan_value_counts", "lower_bounds", "upper_bounds")
PRIMITIVES = frozenset(
    {
        "boolean",
        "int",
        "long",
        "float",
        "double",
        "date",
        "time",
        "timestamp",
        "timestamptz",
        "timestamp_ns",
        "timestamptz_ns",
        "string",
        "uuid",
        "binary",
        "unknown",
        "variant",
    }
)
DECIMAL = re.compile(r"^decimal\(\s*(\d+)\s*,\s*(\d+)\s*\)$")
FIXED = re.compile(r"^fixed\[(\d+)\]$")
TRANSFORM = re.compile(r"^(identity|year|month|day|hour|void|bucket\[\d+\]|truncate\[\d+\])$")
OPERATIONS = frozenset({"append", "replace", "overwrite", "delete"})
SUMMARY_TOTALS = {"total-data-files": "files", "total-records": "records"}


def _kind(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def _type_problem(value: Any, type_: str) -> str | None:
    integer = isinstance(value, int) and not isinstance(value, bool)
    if type_ == STRING and not isinstance(value, str):
        return f"must be a string, is {_kind(value)} {value!r:.60}"
    if type_ in (INT, LONG):
        bound = 2**31 if type_ == INT else 2**63
        if not integer:
            return f"must be an integer ({type_}), is {_kind(value)} {value!r:.60}"
        if not -bound <= value < bound:
            return f"{value} is out of an {type_}'s range"
    if type_ == BOOL and not isinstance(value, bool):
        return f"must be a boolean, is {_kind(value)} {value!r:.60}"
    if type_ == OBJECT and not isinstance(value, dict):
        return f"must be an object, is {_kind(value)} {value!r:.60}"
    if type_ == LIST and not isinstance(value, list):
        return f"must be a list, is {_kind(value)} {value!r:.60}"
    if type_ == MAP:
        if not isinstance(value, dict):
            return f"must be an object of strings, is {_kind(value)} {value!r:.60}"
        bad = {k: v for k, v in value.items() if not isinstance(v, str)}
        if bad:
            return f"values must be strings, these are not: {bad!r:.200}"
    return None


class Problems:
    def __init__(self) -> None:
        self.found: list[str] = []

    def add(self, where: str, what: str, problem: str) -> None:
        self.found.append(f"{where}: {what}: {problem}")

    def fields(self, where: str, prefix: str, value: Any, spec: Spec) -> dict[str, Any]:
        """``value``'s fields against ``spec``; returns it (an empty dict when it is no object)."""
        if not isinstance(value, dict):
            self.add(where, prefix, f"must be an object, is {_kind(value)}")
            return {}
        for name in value:
            if name not in spec:
                self.add(where, f"{prefix}.{name}", "a field the spec does not know")
        for name, (type_, required) in spec.items():
            present = value.get(name)
            if present is None:
                if required:
                    self.add(where, f"{prefix}.{name}", "required field is " + ("null" if name in value else "missing"))
                continue
            problem = _type_problem(present, type_)
            if problem:
                self.add(where, f"{prefix}.{name}", problem)
        return value

    def raise_any(self, location: str) -> None:
        if self.found:
            shown = "\n  ".join(self.found[:50])
            more = f"\n  ... and {len(self.found) - 50} more" if len(self.found) > 50 else ""
            raise AssertionError(
                f"the Iceberg table at {location} does not conform to the spec ({len(self.found)} problems):\n  "
                f"{shown}{more}"
            )


# -- schemas -----------------------------------------------------------------------------------------------------


def check_type(problems: Problems, where: str, what: str, type_: Any, ids: dict[int, Any]) -> None:
    """An Iceberg type; every field id found is recorded in ``ids`` (id -> type), a second one reported."""

    def record(at: str, field_id: Any, t: Any) -> None:
        if _type_problem(field_id, INT):
            problems.add(where, at, f"a field id must be an integer, is {field_id!r}")
        elif field_id in ids:
            problems.add(where, at, f"field id {field_id} is used twice in the schema")
        else:
            ids[field_id] = t

    if isinstance(type_, str):
        m = DECIMAL.match(type_)
        if m and not (1 <= int(m.group(1)) <= 38 and 0 <= int(m.group(2)) <= int(m.group(1))):
            problems.add(where, what, f"{type_}: a decimal's precision is 1 to 38 and its scale 0 to it")
        elif not m and not FIXED.match(type_) and type_ not in PRIMITIVES:
            problems.add(where, what, f"{type_!r} is no Iceberg type")
        return
    if not isinstance(type_, dict):
        problems.add(where, what, f"a type must be a name or an object, is {_kind(type_)}")
        return
    kind = type_.get("type")
    if kind == "struct":
        fields = type_.get("fields")
        if not isinstance(fields, list):
            problems.add(where, f"{what}.fields", "must be a list")
            return
        names: set[str] = set()
        for i, f in enumerate(fields):
            at = f"{what}.fields[{i}]"
            problems.fields(where, at, f, FIELD)
            if not isinstance(f, dict):
                continue
            if f.get("name") in names:
                problems.add(where, f"{at}.name", f"{f.get('name')!r} twice in one struct")
            names.add(f.get("name"))  # type: ignore[arg-type]
            record(f"{at}.id", f.get("id"), f.get("type"))
            check_type(problems, where, f"{at}.type", f.get("type"), ids)
    elif kind == "list":
        if set(type_) - {"type", "element-id", "element", "element-required"} or "element-required" not in type_:
            problems.add(where, what, f"a list type has type, element-id, element, element-required: {sorted(type_)}")
        record(f"{what}.element-id", type_.get("element-id"), type_.get("element"))
        check_type(problems, where, f"{what}.element", type_.get("element"), ids)
    elif kind == "map":
        keys = {"type", "key-id", "key", "value-id", "value", "value-required"}
        if set(type_) != keys:
            problems.add(where, what, f"a map type has {sorted(keys)}: {sorted(type_)}")
        record(f"{what}.key-id", type_.get("key-id"), type_.get("key"))
        record(f"{what}.value-id", type_.get("value-id"), type_.get("value"))
        check_type(problems, where, f"{what}.key", type_.get("key"), ids)
        check_type(problems, where, f"{what}.value", type_.get("value"), ids)
    else:
        problems.add(where, what, f"unknown nested type {kind!r}")


def _partition_type_problem(value: Any, source: Any, transform: str) -> str | None:
    """Why a partition value, as the manifest's Avro holds it, is not of the type ``transform`` gives a column of
    the Iceberg type ``source``."""
    if value is None:
        return None
    if transform == "identity":
        want: tuple[type, ...]
        if source in ("int", "long", "date", "time", "timestamp", "timestamptz", "timestamp_ns", "timestamptz_ns"):
            want = (int,)
        elif source in ("float", "double"):
            want = (float,)
        elif source == "boolean":
            want = (bool,)
        elif source == "string":
            want = (str,)
        else:  # binary, fixed, uuid, decimal: bytes
            want = (bytes,)
        if not isinstance(value, want) or (want == (int,) and isinstance(value, bool)):
            return f"{value!r} is not the Avro value of a {source} (identity)"
    elif (transform in ("year", "month", "day", "hour") or transform.startswith("bucket")) and (
        not isinstance(value, int) or isinstance(value, bool)
    ):
        return f"{value!r} is no integer ({transform})"
    return None


WIDTHS = {"boolean": 1, "int": 4, "date": 4, "float": 4, "long": 8, "double": 8, "time": 8, "uuid": 16}
WIDTHS.update({t: 8 for t in ("timestamp", "timestamptz", "timestamp_ns", "timestamptz_ns")})
"""The bytes of a bound of each fixed-width type (Iceberg's single-value serialization, little-endian)."""
PROMOTED = {"long": "int", "double": "float", "timestamp": "date", "timestamptz": "date"}
"""A field's type -> the type it may have been promoted from: a bound written before the promotion keeps that
type's serialization (told apart by its length), in a manifest written after it (a merge copies the entries)."""
FORMATS = {"int": "<i", "date": "<i", "long": "<q", "time": "<q", "float": "<f", "double": "<d"}
FORMATS.update({t: "<q" for t in ("timestamp", "timestamptz", "timestamp_ns", "timestamptz_ns")})


def bound_problem(raw: Any, type_: Any) -> str | None:
    """Why ``raw`` is not a bound of a field of the Iceberg type ``type_`` (None: it is, or the type says nothing)."""
    if not isinstance(raw, bytes):
        return f"a bound must be bytes, is {_kind(raw)}"
    if not isinstance(type_, str):
        return None
    fixed = FIXED.match(type_)
    width = WIDTHS.get(type_) or (int(fixed.group(1)) if fixed else None)
    promoted = PROMOTED.get(type_)
    if width is not None and len(raw) != width and not (promoted and len(raw) == WIDTHS[promoted]):
        return f"{len(raw)} bytes for a {type_} (its serialization is {width} bytes)"
    if DECIMAL.match(type_) and not 1 <= len(raw) <= 16:
        return f"{len(raw)} bytes for a {type_} (1 to 16)"
    if type_ == "string":
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError:
            return f"{raw[:20]!r}: a string's bound is UTF-8"
    return None


def decoded(raw: Any, type_: Any) -> Any:
    """A bound's value where it has an order this check compares (numbers, strings), else None."""
    if not isinstance(raw, bytes) or not isinstance(type_, str):
        return None
    try:
        promoted = PROMOTED.get(type_)
        if promoted is not None and len(raw) == WIDTHS[promoted]:
            if promoted == "date":
                return None  # days, not comparable with a timestamp's microseconds here
            type_ = promoted
        if type_ in FORMATS:
            value = struct.unpack(FORMATS[type_], raw)[0]
            return None if isinstance(value, float) and value != value else value
        if DECIMAL.match(type_):
            return int.from_bytes(raw, "big", signed=True)
        if type_ in ("string", "binary") or FIXED.match(type_) or type_ == "uuid":
            return raw
        if type_ == "boolean":
            return raw != b"\x00"
    except (struct.error, ValueError):
        return None
    return None


def _orderable(column: pa.ChunkedArray, type_: Any) -> tuple[Any, Any] | None:
    """A column's smallest and largest value in :func:`decoded`'s terms (None: no value, or a type not compared)."""
    valid = column.drop_null()
    if pa.types.is_floating(valid.type):
        valid = valid.filter(pc.invert(pc.is_nan(valid)))
    if len(valid) == 0 or not isinstance(type_, str):
        return None
    if type_ in ("int", "long", "float", "double"):
        found = pc.min_max(valid).as_py()
        return found["min"], found["max"]
    if type_ == "date":
        found = pc.min_max(valid.cast(pa.int32())).as_py()
        return found["min"], found["max"]
    if type_ in ("timestamp", "timestamptz") and pa.types.is_timestamp(valid.type) and valid.type.unit == "us":
        found = pc.min_max(valid.cast(pa.int64())).as_py()
        return found["min"], found["max"]
    if type_ == "string":
        found = pc.min_max(valid).as_py()
        return found["min"].encode(), found["max"].encode()
    if DECIMAL.match(type_) and pa.types.is_decimal(valid.type):
        found = pc.min_max(valid).as_py()
        scale = valid.type.scale
        return int(found["min"].scaleb(scale)), int(found["max"].scaleb(scale))
    return None


def _comparable(value: Any, type_: Any) -> Any:
    """A partition value as the manifest's Avro holds it, in :func:`decoded`'s terms (None: not compared)."""
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, bytes) and isinstance(type_, str) and DECIMAL.match(type_):
        return int.from_bytes(value, "big", signed=True)
    if isinstance(value, bool | int | float | bytes):
        return None if isinstance(value, float) and value != value else value
    return None


def _pairs(value: Any) -> dict[Any, Any] | None:
    """A manifest's map with non-string keys, written as an array of key/value records, as a dict."""
    if isinstance(value, dict):
        return value
    if isinstance(value, list) and all(isinstance(p, dict) and set(p) == {"key", "value"} for p in value):
        return {p["key"]: p["value"] for p in value}
    return None


class IcebergConformance:
    """The conformance checks of one Iceberg table at ``location`` (its root: the metadata files are under
    ``<location>/metadata/``), with a cursor (see the module's notes)."""

    def __init__(self, location: str, *, fs: Any = None, options: Mapping[str, Any] | None = None) -> None:
        self.location = location.removeprefix("file://").rstrip("/")
        if fs is None:
            if "://" in self.location:
                fs, root = fsspec.core.url_to_fs(self.location, **dict(options or {}))
            else:
                fs, root = fsspec.filesystem("file"), self.location
        else:
            root = fs._strip_protocol(self.location) if "://" in self.location else self.location
        self.fs = fs
        self.root = str(root).rstrip("/")
        self.uuid: str | None = None
        self.checked: set[str] = set()
        """Metadata files, manifest lists and manifests checked (paths as the file system takes them)."""
        self.manifests: dict[str, list[dict[str, Any]]] = {}
        self.types: dict[str, dict[int, Any]] = {}
        """The field types of each manifest's schema (path -> field id -> type)."""
        """The entries of each manifest read (path -> entries)."""

    def path(self, uri: str) -> str:
        parsed = urlparse(uri)
        if parsed.scheme in ("", "file"):
            return parsed.path if parsed.scheme else uri
        return self.fs._strip_protocol(uri)

    def _size(self, path: str) -> int | None:
        try:
            return int(self.fs.info(path)["size"])
        except FileNotFoundError:
            return None

    def metadata_files(self) -> list[str]:
        """The table's metadata files, oldest first (by their version number)."""
        directory = f"{self.root}/{METADATA_DIR}"
        try:
            self.fs.invalidate_cache(directory)
            names = [str(p).rsplit("/", 1)[-1] for p in self.fs.ls(directory, detail=False)]
        except FileNotFoundError:
            return []
        found = []
        for n in names:
            m = METADATA_FILE.match(n)
            if m:
                found.append((int(m.group(1) or m.group(2)), f"{directory}/{n}"))
        return [p for _, p in sorted(found)]

    def check(self, metadata_location: str | None = None) -> str | None:
        """Check the table's metadata files not checked yet, and the manifest lists and manifests they name: with
        ``metadata_location`` (the catalog's current metadata file), that file and those its ``metadata-log``
        names; without, every metadata file under ``metadata/`` (a failed commit's leftover too). Returns the
        current metadata file (``metadata_location``, else the newest: a local path, or a URL on another file
        system), None if there is no table yet."""
        problems = Problems()
        if metadata_location is not None:
            current = self.path(metadata_location)
            files = [current]
            try:
                log = json.loads(self.fs.cat_file(current)).get("metadata-log") or []
                files += [self.path(e["metadata-file"]) for e in log if isinstance(e, dict) and "metadata-file" in e]
            except (ValueError, AttributeError, TypeError):
                pass  # reported by the check of the file itself
        else:
            files = self.metadata_files()
        if (
            files
            and self.uuid is not None
            and self._uuid_of(files[0 if metadata_location else -1])
            not in (
                None,
                self.uuid,
            )
        ):  # a table made anew at the same location: checked from its start
            fs, location = self.fs, self.location
            self.__init__(location, fs=fs)  # type: ignore[misc]
        for path in files:
            if path not in self.checked:
                self._metadata(problems, path)
                self.checked.add(path)
        problems.raise_any(self.location)
        if metadata_location is not None:
            return metadata_location.removeprefix("file://")
        if not files:
            return None
        local = "file" in (self.fs.protocol if isinstance(self.fs.protocol, tuple) else (self.fs.protocol,))
        return files[-1] if local else self.fs.unstrip_protocol(files[-1])

    def _uuid_of(self, path: str) -> str | None:
        try:
            return str(uuid.UUID(str(json.loads(self.fs.cat_file(path)).get("table-uuid"))))
        except (FileNotFoundError, ValueError, AttributeError):
            return None

    # -- metadata files ------------------------------------------------------------------------------------------

    def _metadata(self, problems: Problems, path: str) -> None:
        where = path.removeprefix(self.root + "/")
        try:
            meta = json.loads(self.fs.cat_file(path))
        except FileNotFoundError:
            return  # deleted after a newer commit (write.metadata.delete-after-commit.enabled)
        except ValueError as e:
            problems.add(where, "file", f"not JSON: {e}")
            return
        problems.fields(where, "metadata", meta, TABLE)
        if not isinstance(meta, dict):
            return
        version = meta.get("format-version")
        if version not in (1, 2, 3):
            problems.add(where, "format-version", f"{version!r}: format versions are 1, 2 and 3")
        try:
            table_uuid = str(uuid.UUID(str(meta.get("table-uuid"))))
        except ValueError:
            problems.add(where, "table-uuid", f"{meta.get('table-uuid')!r} is no UUID")
        else:
            if self.uuid is not None and table_uuid != self.uuid:
                problems.add(where, "table-uuid", f"{table_uuid}, another table's metadata files have {self.uuid}")
            self.uuid = self.uuid or table_uuid
        location = meta.get("location")
        if isinstance(location, str) and not path.startswith(self.path(location).rstrip("/") + "/"):
            problems.add(where, "location", f"{location}: the metadata file is not under the table's location")
        properties = meta.get("properties")
        schemas = self._schemas(problems, where, meta)
        specs = self._specs(problems, where, meta, schemas)
        self._sort_orders(problems, where, meta, schemas)
        snapshots = self._snapshots(problems, where, meta)
        self._logs(problems, where, meta, snapshots)
        if isinstance(properties, dict):
            pass  # types checked with the table's fields
        for snapshot in snapshots.values():
            self._manifest_list(problems, where, snapshot, specs, schemas, meta)
        current = meta.get("current-snapshot-id")
        if current in snapshots:
            self._totals(problems, where, snapshots[current])

    def _schemas(self, problems: Problems, where: str, meta: dict[str, Any]) -> dict[int, dict[int, Any]]:
        """Per schema id, its field ids (-> type)."""
        out: dict[int, dict[int, Any]] = {}
        schemas = meta.get("schemas") if isinstance(meta.get("schemas"), list) else []
        for i, schema in enumerate(schemas):
            at = f"schemas[{i}]"
            problems.fields(where, at, schema, SCHEMA)
            if not isinstance(schema, dict):
                continue
            if schema.get("type") != "struct":
                problems.add(where, f"{at}.type", f"a schema is a struct, is {schema.get('type')!r}")
            ids: dict[int, Any] = {}
            check_type(problems, where, at, {"type": "struct", "fields": schema.get("fields") or []}, ids)
            schema_id = schema.get("schema-id")
            if schema_id in out:
                problems.add(where, f"{at}.schema-id", f"schema id {schema_id} twice")
            for fid in schema.get("identifier-field-ids") or []:
                if fid not in ids:
                    problems.add(where, f"{at}.identifier-field-ids", f"{fid} is no field of the schema")
            last = meta.get("last-column-id")
            if isinstance(last, int) and ids and max(ids) > last:
                problems.add(where, "last-column-id", f"{last}, and schema {schema_id} has field id {max(ids)}")
            if isinstance(schema_id, int):
                out[schema_id] = ids
        if meta.get("current-schema-id") not in out:
            problems.add(where, "current-schema-id", f"{meta.get('current-schema-id')!r} is none of the schemas' ids")
        return out

    def _specs(
        self, problems: Problems, where: str, meta: dict[str, Any], schemas: dict[int, dict[int, Any]]
    ) -> dict[int, list[dict[str, Any]]]:
        out: dict[int, list[dict[str, Any]]] = {}
        every_id = {fid for ids in schemas.values() for fid in ids}
        last = meta.get("last-partition-id")
        field_ids: dict[int, str] = {}
        specs = meta.get("partition-specs") if isinstance(meta.get("partition-specs"), list) else []
        for i, spec in enumerate(specs):
            at = f"partition-specs[{i}]"
            problems.fields(where, at, spec, PARTITION_SPEC)
            if not isinstance(spec, dict):
                continue
            names: set[str] = set()
            fields = spec.get("fields") if isinstance(spec.get("fields"), list) else []
            for j, f in enumerate(fields):
                fat = f"{at}.fields[{j}]"
                problems.fields(where, fat, f, PARTITION_FIELD)
                if not isinstance(f, dict):
                    continue
                fid, name = f.get("field-id"), f.get("name")
                if isinstance(fid, int):
                    if fid < 1000:
                        problems.add(where, f"{fat}.field-id", f"{fid}: partition field ids start at 1000")
                    if isinstance(last, int) and fid > last:
                        problems.add(where, f"{fat}.field-id", f"{fid} is past last-partition-id {last}")
                    if field_ids.get(fid, name) != name:
                        problems.add(where, f"{fat}.field-id", f"{fid} names {field_ids[fid]!r} in another spec")
                    field_ids[fid] = name  # type: ignore[assignment]
                if name in names:
                    problems.add(where, f"{fat}.name", f"{name!r} twice in one spec")
                names.add(name)  # type: ignore[arg-type]
                if f.get("source-id") not in every_id:
                    problems.add(where, f"{fat}.source-id", f"{f.get('source-id')!r} is no field of any schema")
                if isinstance(f.get("transform"), str) and not TRANSFORM.match(f["transform"]):
                    problems.add(where, f"{fat}.transform", f"{f['transform']!r} is no transform")
            if isinstance(spec.get("spec-id"), int):
                if spec["spec-id"] in out:
                    problems.add(where, f"{at}.spec-id", f"spec id {spec['spec-id']} twice")
                out[spec["spec-id"]] = fields
        if meta.get("default-spec-id") not in out:
            problems.add(where, "default-spec-id", f"{meta.get('default-spec-id')!r} is none of the specs' ids")
        if isinstance(last, int) and last < max(field_ids, default=999):
            problems.add(where, "last-partition-id", f"{last}, below the partition field id {max(field_ids)}")
        return out

    def _sort_orders(
        self, problems: Problems, where: str, meta: dict[str, Any], schemas: dict[int, dict[int, Any]]
    ) -> None:
        ids: set[int] = set()
        every_id = {fid for found in schemas.values() for fid in found}
        orders = meta.get("sort-orders") if isinstance(meta.get("sort-orders"), list) else []
        for i, order in enumerate(orders):
            at = f"sort-orders[{i}]"
            problems.fields(where, at, order, SORT_ORDER)
            if not isinstance(order, dict):
                continue
            fields = order.get("fields") if isinstance(order.get("fields"), list) else []
            if order.get("order-id") == 0 and fields:
                problems.add(where, f"{at}.fields", "sort order 0 is the unsorted order: it has no fields")
            for j, f in enumerate(fields):
                fat = f"{at}.fields[{j}]"
                problems.fields(where, fat, f, SORT_FIELD)
                if not isinstance(f, dict):
                    continue
                if f.get("direction") not in ("asc", "desc"):
                    problems.add(where, f"{fat}.direction", f"{f.get('direction')!r} is neither asc nor desc")
                if f.get("null-order") not in ("nulls-first", "nulls-last"):
                    problems.add(where, f"{fat}.null-order", f"{f.get('null-order')!r}: nulls-first or nulls-last")
                if f.get("source-id") not in every_id:
                    problems.add(where, f"{fat}.source-id", f"{f.get('source-id')!r} is no field of any schema")
            if isinstance(order.get("order-id"), int):
                ids.add(order["order-id"])
        if meta.get("default-sort-order-id") not in ids:
            problems.add(where, "default-sort-order-id", f"{meta.get('default-sort-order-id')!r} is no sort order's id")

    def _snapshots(self, problems: Problems, where: str, meta: dict[str, Any]) -> dict[int, dict[str, Any]]:
        out: dict[int, dict[str, Any]] = {}
        snapshots = meta.get("snapshots") if isinstance(meta.get("snapshots"), list) else []
        last_seq = meta.get("last-sequence-number")
        for i, snapshot in enumerate(snapshots):
            at = f"snapshots[{i}]"
            problems.fields(where, at, snapshot, SNAPSHOT)
            if not isinstance(snapshot, dict) or not isinstance(snapshot.get("snapshot-id"), int):
                continue
            sid = snapshot["snapshot-id"]
            if sid in out:
                problems.add(where, f"{at}.snapshot-id", f"snapshot id {sid} twice")
            out[sid] = snapshot
            seq = snapshot.get("sequence-number")
            if isinstance(seq, int) and isinstance(last_seq, int) and seq > last_seq:
                problems.add(where, f"{at}.sequence-number", f"{seq} is past last-sequence-number {last_seq}")
            summary = snapshot.get("summary")
            if isinstance(summary, dict):
                if summary.get("operation") not in OPERATIONS:
                    problems.add(where, f"{at}.summary.operation", f"{summary.get('operation')!r} is no operation")
                bad = {k: v for k, v in summary.items() if not isinstance(v, str)}
                if bad:
                    problems.add(where, f"{at}.summary", f"values must be strings, these are not: {bad!r:.200}")
            schema_id = snapshot.get("schema-id")
            known = {s.get("schema-id") for s in meta.get("schemas") or [] if isinstance(s, dict)}
            if schema_id is not None and schema_id not in known:
                problems.add(where, f"{at}.schema-id", f"{schema_id} is none of the schemas' ids")
        updated = meta.get("last-updated-ms")
        late = [
            sid for sid, snap in out.items() if isinstance(updated, int) and (snap.get("timestamp-ms") or 0) > updated
        ]
        if late:
            problems.add(where, "last-updated-ms", f"{updated}, before the snapshots {late[:5]} were made")
        ordered = sorted(out.values(), key=lambda s: (s.get("timestamp-ms") or 0, s.get("sequence-number") or 0))
        for before, after in itertools.pairwise(ordered):
            if (before.get("sequence-number") or 0) >= (after.get("sequence-number") or 0):
                problems.add(
                    where,
                    "snapshots.sequence-number",
                    f"snapshot {after['snapshot-id']} (sequence number {after.get('sequence-number')}) is not after "
                    f"snapshot {before['snapshot-id']} ({before.get('sequence-number')}) though it is later",
                )
        for sid, snapshot in out.items():
            parent = snapshot.get("parent-snapshot-id")
            if parent in out and (out[parent].get("sequence-number") or 0) >= (snapshot.get("sequence-number") or 0):
                problems.add(where, f"snapshot {sid}.sequence-number", f"not after its parent {parent}'s")
        current = meta.get("current-snapshot-id")
        refs = meta.get("refs") if isinstance(meta.get("refs"), dict) else {}
        for name, ref in refs.items():
            problems.fields(where, f"refs.{name}", ref, REF)
            if not isinstance(ref, dict):
                continue
            if ref.get("type") not in ("branch", "tag"):
                problems.add(where, f"refs.{name}.type", f"{ref.get('type')!r} is neither branch nor tag")
            if ref.get("snapshot-id") not in out:
                problems.add(where, f"refs.{name}.snapshot-id", f"{ref.get('snapshot-id')} is no snapshot of the table")
        if current is not None and current != -1:
            if current not in out:
                problems.add(where, "current-snapshot-id", f"{current} is no snapshot of the table")
            main = refs.get("main")
            if not isinstance(main, dict) or main.get("snapshot-id") != current:
                problems.add(where, "refs.main", f"{main!r:.80} does not point at the current snapshot {current}")
        elif "main" in refs:
            problems.add(where, "refs.main", "a main branch in a table without a current snapshot")
        return out

    def _logs(self, problems: Problems, where: str, meta: dict[str, Any], snapshots: dict[int, Any]) -> None:
        for key, name_key, type_ in (("snapshot-log", "snapshot-id", LONG), ("metadata-log", "metadata-file", STRING)):
            log = meta.get(key) if isinstance(meta.get(key), list) else []
            times: list[int] = []
            for i, item in enumerate(log):
                problems.fields(where, f"{key}[{i}]", item, {name_key: (type_, True), "timestamp-ms": (LONG, True)})
                if isinstance(item, dict) and isinstance(item.get("timestamp-ms"), int):
                    times.append(item["timestamp-ms"])
            if times != sorted(times):
                problems.add(where, key, f"entries are not in time order: {times[:10]}")
            updated = meta.get("last-updated-ms")
            if key == "metadata-log" and times and isinstance(updated, int) and times[-1] > updated:
                problems.add(where, key, f"an entry at {times[-1]} after last-updated-ms {updated}")
            if key == "snapshot-log" and log:
                last = log[-1].get("snapshot-id") if isinstance(log[-1], dict) else None
                if last != meta.get("current-snapshot-id"):
                    problems.add(
                        where,
                        key,
                        f"the newest entry is {last}, the current snapshot is {meta.get('current-snapshot-id')}",
                    )

    # -- manifest lists and manifests ------------------------------------------------------------------------------

    def _manifest_list(
        self,
        problems: Problems,
        where_meta: str,
        snapshot: dict[str, Any],
        specs: dict[int, list[dict[str, Any]]],
        schemas: dict[int, dict[int, Any]],
        meta: dict[str, Any],
    ) -> None:
        uri = snapshot.get("manifest-list")
        if not isinstance(uri, str):
            return
        path = self.path(uri)
        if path in self.checked:
            return
        where = path.removeprefix(self.root + "/")
        try:
            data = self.fs.cat_file(path)
        except FileNotFoundError:
            problems.add(where_meta, f"snapshot {snapshot.get('snapshot-id')}.manifest-list", f"{uri} does not exist")
            return
        try:
            avro = read_avro(data)
        except (ValueError, KeyError) as e:
            problems.add(where, "file", f"not an Avro file this reader reads: {e}")
            return
        self.checked.add(path)
        seq = snapshot.get("sequence-number")
        sid = snapshot.get("snapshot-id")
        for key, want in (
            ("snapshot-id", sid),
            ("sequence-number", seq),
            ("parent-snapshot-id", snapshot.get("parent-snapshot-id")),
        ):
            have = avro.metadata.get(key)
            if want is not None and have is not None and have.decode() != str(want):
                problems.add(where, f"metadata {key}", f"{have.decode()}, the snapshot has {want}")
        totals = {"files": 0, "records": 0}
        all_ids = {fid for ids in schemas.values() for fid in ids}
        for i, entry in enumerate(avro.records):
            at = f"manifest[{i}]"
            problems.fields(where, at, entry, MANIFEST_FILE)
            if not isinstance(entry, dict) or not isinstance(entry.get("manifest_path"), str):
                continue
            manifest = self.path(entry["manifest_path"])
            size = self._size(manifest)
            if size is None:
                problems.add(where, f"{at}.manifest_path", f"{entry['manifest_path']} does not exist")
                continue
            if size != entry.get("manifest_length"):
                problems.add(
                    where, f"{at}.manifest_length", f"{entry.get('manifest_length')}, the file is {size} bytes"
                )
            spec_id = entry.get("partition_spec_id")
            if spec_id not in specs:
                problems.add(where, f"{at}.partition_spec_id", f"{spec_id} is no partition spec of the table")
            if isinstance(seq, int) and isinstance(entry.get("sequence_number"), int):
                if entry["sequence_number"] > seq:
                    problems.add(
                        where, f"{at}.sequence_number", f"{entry['sequence_number']} is past the snapshot's {seq}"
                    )
                if entry.get("added_snapshot_id") == sid and entry["sequence_number"] != seq:
                    problems.add(
                        where,
                        f"{at}.sequence_number",
                        f"{entry['sequence_number']}: added by the snapshot, so its {seq}",
                    )
            partitions = entry.get("partitions")
            if isinstance(partitions, list) and spec_id in specs and len(partitions) != len(specs[spec_id]):
                problems.add(where, f"{at}.partitions", f"{len(partitions)} summaries for {len(specs[spec_id])} fields")
            entries = self._manifest(problems, manifest, entry, specs.get(spec_id or 0, []), all_ids, meta)
            if isinstance(partitions, list) and spec_id in specs and len(partitions) == len(specs[spec_id]):
                self._summaries(problems, where, at, partitions, specs[spec_id], entries, self.types.get(manifest, {}))
            counted = {0: [0, 0], 1: [0, 0], 2: [0, 0]}
            for e in entries:
                status = e.get("status")
                df = e.get("data_file") or {}
                if status in counted:
                    counted[status][0] += 1
                    counted[status][1] += df.get("record_count") or 0
                if status in (0, 1) and df.get("content") == 0:
                    totals["files"] += 1
                    totals["records"] += df.get("record_count") or 0
                sequence = e.get("sequence_number")
                if status == 1 and sequence is not None and sequence != entry.get("sequence_number"):
                    problems.add(
                        where, f"{at} entry sequence_number", f"an added entry's {sequence} is not the manifest's"
                    )
            for status, name in ((1, "added"), (0, "existing"), (2, "deleted")):
                files, rows = counted[status]
                if entry.get(f"{name}_files_count") != files:
                    problems.add(
                        where,
                        f"{at}.{name}_files_count",
                        f"{entry.get(f'{name}_files_count')}, the manifest has {files}",
                    )
                if entry.get(f"{name}_rows_count") != rows:
                    problems.add(
                        where, f"{at}.{name}_rows_count", f"{entry.get(f'{name}_rows_count')}, the manifest has {rows}"
                    )
            min_seq = entry.get("min_sequence_number")
            live = [
                e.get("sequence_number")
                for e in entries
                if e.get("status") in (0, 1) and e.get("sequence_number") is not None
            ]
            if live and isinstance(min_seq, int) and min_seq > min(live):
                problems.add(where, f"{at}.min_sequence_number", f"{min_seq}, past an entry's {min(live)}")
        snapshot["_totals"] = totals

    def _totals(self, problems: Problems, where: str, snapshot: dict[str, Any]) -> None:
        totals = snapshot.get("_totals")
        summary = snapshot.get("summary") or {}
        if totals is None:
            return
        for key, name in SUMMARY_TOTALS.items():
            if key in summary and summary[key] != str(totals[name]):
                problems.add(
                    where,
                    f"snapshot {snapshot.get('snapshot-id')}.summary.{key}",
                    f"{summary[key]}, its manifests' live data files hold {totals[name]}",
                )

    def _manifest(
        self,
        problems: Problems,
        path: str,
        listed: dict[str, Any],
        spec: list[dict[str, Any]],
        all_ids: set[int],
        meta: dict[str, Any],
    ) -> list[dict[str, Any]]:
        if path in self.manifests:
            return self.manifests[path]
        where = path.removeprefix(self.root + "/")
        try:
            avro = read_avro(self.fs.cat_file(path))
        except (ValueError, KeyError) as e:
            problems.add(where, "file", f"not an Avro file this reader reads: {e}")
            self.manifests[path] = []
            return []
        md = {k: v.decode(errors="replace") for k, v in avro.metadata.items()}
        for key in ("schema", "partition-spec", "partition-spec-id", "format-version", "content"):
            if key not in md and not (key == "content" and meta.get("format-version") == 1):
                problems.add(where, f"metadata {key}", "missing (the spec requires it in a manifest's metadata)")
        if md.get("partition-spec-id") not in (None, str(listed.get("partition_spec_id"))):
            problems.add(
                where,
                "metadata partition-spec-id",
                f"{md['partition-spec-id']}, the list says {listed.get('partition_spec_id')}",
            )
        if md.get("content") not in (None, "data", "deletes"):
            problems.add(where, "metadata content", f"{md['content']!r}: data or deletes")
        schema_ids: dict[int, Any] = {}
        if "schema" in md:
            try:
                check_type(
                    problems,
                    where,
                    "metadata schema",
                    {"type": "struct", "fields": json.loads(md["schema"]).get("fields", [])},
                    schema_ids,
                )
            except (ValueError, AttributeError) as e:
                problems.add(where, "metadata schema", f"not a schema: {e}")
        known_ids = schema_ids or {i: None for i in all_ids}
        types = {fid: t for fid, t in schema_ids.items()}
        top: dict[int, tuple[str, Any]] = {}
        try:
            for f in json.loads(md.get("schema") or "{}").get("fields", []):
                if isinstance(f, dict) and isinstance(f.get("id"), int) and isinstance(f.get("type"), str):
                    top[f["id"]] = (f.get("name"), f["type"])
        except (ValueError, AttributeError):
            pass  # reported above
        entries: list[dict[str, Any]] = []
        for i, entry in enumerate(avro.records):
            at = f"entry[{i}]"
            problems.fields(where, at, entry, ENTRY)
            if not isinstance(entry, dict):
                continue
            entries.append(entry)
            status = entry.get("status")
            if status not in (0, 1, 2):
                problems.add(where, f"{at}.status", f"{status!r}: 0 (existing), 1 (added) or 2 (deleted)")
            if status == 1 and entry.get("snapshot_id") not in (None, listed.get("added_snapshot_id")):
                problems.add(
                    where,
                    f"{at}.snapshot_id",
                    f"{entry.get('snapshot_id')}: added by {listed.get('added_snapshot_id')}",
                )
            df = problems.fields(where, f"{at}.data_file", entry.get("data_file"), DATA_FILE)
            if not df:
                continue
            if df.get("content") not in (0, 1, 2):
                problems.add(where, f"{at}.data_file.content", f"{df.get('content')!r}: 0, 1 or 2")
            if df.get("file_format") not in ("PARQUET", "AVRO", "ORC", "PUFFIN"):
                problems.add(where, f"{at}.data_file.file_format", f"{df.get('file_format')!r} is no file format")
            self._partition(problems, where, f"{at}.data_file.partition", df.get("partition"), spec, types or None)
            for key in STATISTICS:
                value = df.get(key)
                if value is None:
                    continue
                pairs = _pairs(value)
                if pairs is None:
                    problems.add(where, f"{at}.data_file.{key}", f"must be a map of field ids, is {value!r:.80}")
                    continue
                unknown = sorted(k for k in pairs if k not in known_ids)
                if unknown:
                    problems.add(where, f"{at}.data_file.{key}", f"keyed by field ids that do not exist: {unknown}")
                if key in ("value_counts", "null_value_counts", "nan_value_counts", "column_sizes"):
                    bad = {k: v for k, v in pairs.items() if not isinstance(v, int) or v < 0}
                    if bad:
                        problems.add(where, f"{at}.data_file.{key}", f"counts must be non-negative integers: {bad}")
            self._bounds(problems, where, f"{at}.data_file", df, types)
            if status in (0, 1) and isinstance(df.get("file_path"), str):
                self._data_file(problems, where, at, df, top)
        self.manifests[path] = entries
        self.types[path] = types
        self.checked.add(path)
        return entries

    def _summaries(
        self,
        problems: Problems,
        where: str,
        at: str,
        partitions: list[Any],
        spec: list[dict[str, Any]],
        entries: list[dict[str, Any]],
        types: dict[int, Any],
    ) -> None:
        """A manifest list's partition field summaries against the manifest's partition tuples: a null where
        ``contains_null`` says none, or a value outside the bounds, would make a reader skip the manifest's files."""
        for i, (summary, f) in enumerate(zip(partitions, spec, strict=True)):
            if not isinstance(summary, dict):
                continue
            transform = str(f.get("transform"))
            source = types.get(f.get("source-id"))
            result = source if transform == "identity" or transform.startswith("truncate") else "int"
            values = [
                (e.get("data_file") or {}).get("partition", {}).get(f.get("name"))
                for e in entries
                if isinstance((e.get("data_file") or {}).get("partition"), dict)
            ]
            name = f"{at}.partitions[{i}] ({f.get('name')})"
            if any(v is None for v in values) and summary.get("contains_null") is False:
                problems.add(where, f"{name}.contains_null", "false, and a file of the manifest has a null value")
            present = [_comparable(v, result) for v in values if v is not None]
            present = [v for v in present if v is not None]
            if not present or transform == "void":
                continue
            low, high = decoded(summary.get("lower_bound"), result), decoded(summary.get("upper_bound"), result)
            if summary.get("lower_bound") is None or summary.get("upper_bound") is None:
                problems.add(where, name, "no bounds, and the manifest's files have values")
                continue
            if low is not None and low > min(present):
                problems.add(where, f"{name}.lower_bound", f"{low!r} is above the value {min(present)!r} of a file")
            if high is not None and high < max(present):
                problems.add(where, f"{name}.upper_bound", f"{high!r} is below the value {max(present)!r} of a file")

    def _partition(
        self,
        problems: Problems,
        where: str,
        at: str,
        partition: Any,
        spec: list[dict[str, Any]],
        types: dict[int, Any] | None,
    ) -> None:
        if not isinstance(partition, dict):
            problems.add(where, at, f"must be a record, is {_kind(partition)}")
            return
        names = [f.get("name") for f in spec]
        if list(partition) != names:
            problems.add(where, at, f"fields {list(partition)}, the spec's are {names}")
            return
        for f in spec:
            source = (types or {}).get(f.get("source-id"))
            if types is not None and source is None:
                continue
            problem = _partition_type_problem(partition[f["name"]], source, str(f.get("transform")))
            if problem:
                problems.add(where, f"{at}.{f['name']}", problem)

    def _bounds(self, problems: Problems, where: str, at: str, df: dict[str, Any], types: dict[int, Any]) -> None:
        """Lower and upper bounds in the single-value serialization of their fields' types, lower not above upper;
        null counts not above value counts."""
        lows, highs = _pairs(df.get("lower_bounds")) or {}, _pairs(df.get("upper_bounds")) or {}
        for key, bounds in (("lower_bounds", lows), ("upper_bounds", highs)):
            for fid, raw in bounds.items():
                problem = bound_problem(raw, types.get(fid))
                if problem:
                    problems.add(where, f"{at}.{key}[{fid}]", problem)
        for fid in sorted(set(lows) & set(highs)):
            low, high = decoded(lows[fid], types.get(fid)), decoded(highs[fid], types.get(fid))
            if low is not None and high is not None and low > high:
                problems.add(where, f"{at}.lower_bounds[{fid}]", f"{low!r} is above the upper bound {high!r}")
        values, nulls = _pairs(df.get("value_counts")) or {}, _pairs(df.get("null_value_counts")) or {}
        for fid in sorted(set(values) & set(nulls)):
            if isinstance(nulls[fid], int) and isinstance(values[fid], int) and nulls[fid] > values[fid]:
                problems.add(where, f"{at}.null_value_counts[{fid}]", f"{nulls[fid]} nulls in {values[fid]} values")

    def _data_file(
        self, problems: Problems, where: str, at: str, df: dict[str, Any], top: dict[int, tuple[str, Any]]
    ) -> None:
        path = self.path(df["file_path"])
        size = self._size(path)
        if size is None:
            problems.add(where, f"{at}.data_file.file_path", f"{df['file_path']} does not exist")
            return
        if size != df.get("file_size_in_bytes"):
            problems.add(
                where,
                f"{at}.data_file.file_size_in_bytes",
                f"{df.get('file_size_in_bytes')}, the object is {size} bytes",
            )
        if df.get("file_format") == "PARQUET" and df.get("content") == 0:
            with self.fs.open(path, "rb") as f:
                parquet = pq.ParquetFile(f)
                rows = parquet.metadata.num_rows
                if rows != df.get("record_count"):
                    problems.add(
                        where,
                        f"{at}.data_file.record_count",
                        f"{df.get('record_count')}, the Parquet footer of {df['file_path']} has {rows} rows",
                    )
                names = set(parquet.schema_arrow.names)
                columns = {fid: (n, t) for fid, (n, t) in top.items() if n in names}
                data = parquet.read(columns=sorted({n for n, _ in columns.values()})) if columns else None
            if data is not None:
                self._column_stats(problems, where, f"{at}.data_file", df, columns, data)

    def _column_stats(
        self,
        problems: Problems,
        where: str,
        at: str,
        df: dict[str, Any],
        columns: dict[int, tuple[str, Any]],
        data: pa.Table,
    ) -> None:
        """A data file's statistics of its top-level columns against its data: value and null counts exact, the
        bounds at or beyond the smallest and largest value (a reader skips the file by them)."""
        counts = {k: _pairs(df.get(k)) or {} for k in ("value_counts", "null_value_counts")}
        lows, highs = _pairs(df.get("lower_bounds")) or {}, _pairs(df.get("upper_bounds")) or {}
        for fid, (name, type_) in sorted(columns.items()):
            column = data[name]
            for key, actual in (("value_counts", len(column)), ("null_value_counts", column.null_count)):
                have = counts[key].get(fid)
                if have is not None and have != actual:
                    problems.add(where, f"{at}.{key}[{fid}] ({name})", f"{have}, the file has {actual}")
            values = _orderable(column, type_)
            if values is None:
                continue
            lo, hi = values
            low, high = decoded(lows.get(fid), type_), decoded(highs.get(fid), type_)
            if low is not None and low > lo:
                problems.add(where, f"{at}.lower_bounds[{fid}] ({name})", f"{low!r}, the file holds {lo!r}")
            if high is not None and high < hi:
                problems.add(where, f"{at}.upper_bounds[{fid}] ({name})", f"{high!r}, the file holds {hi!r}")
