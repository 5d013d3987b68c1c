"""What the sink reads back from a Delta checkpoint is what the log's entries wrote, in the protocol's JSON shapes:
a sink restarted after a checkpoint (its own, or delta-rs's after another writer's appends and compaction) that
takes a new column writes the table's ``metaData`` back with every map a JSON object, and every reader reads the
table (:mod:`filesink.destination.delta_actions`).

The table is ``delta_restarts.write_restarted_table``'s: real sinks without Spark's jobs, real delta-rs writers and
checkpoints in ``tmp_path``; DuckDB reads the same table in ``tests/e2e/test_tables_duckdb.py``."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

deltalake = pytest.importorskip("deltalake")

from conformance import check_table  # noqa: E402
from delta_conformance import DeltaConformance  # noqa: E402
from delta_restarts import COLUMNS, INTERVAL, write_restarted_table  # noqa: E402

from filesink.destination.delta_actions import checkpoint_actions, protocol_shape  # noqa: E402
from filesink.destination.delta_log import DeltaLog  # noqa: E402

pytestmark = pytest.mark.timeout(180)

PROTOCOL_MAPS = {
    "metaData": {("format", "options"): True, ("configuration",): True},
    "add": {("partitionValues",): True, ("tags",): False},
    "remove": {("partitionValues",): False, ("tags",): False},
}
"""The Delta protocol's ``Map[String, String]`` fields of the actions in these tables (path: whether required),
spelled out here rather than taken from the module under test."""


def _entries(log: Path) -> dict[int, list[dict[str, Any]]]:
    return {
        int(p.name.removesuffix(".json")): [json.loads(line) for line in p.read_text().splitlines() if line]
        for p in sorted(log.glob("*.json"))
    }


def _field(fields: dict[str, Any], path: tuple[str, ...]) -> Any:
    for step in path:
        fields = (fields or {}).get(step)  # type: ignore[assignment]
    return fields


def _present(fields: dict[str, Any]) -> dict[str, Any]:
    """An action's fields without those written as null (an optional field left out reads back absent)."""
    return {k: v for k, v in fields.items() if v is not None}


def _rows(table: pa.Table) -> Counter:
    return Counter(zip(*(table[c].to_pylist() for c in COLUMNS), strict=True))


def test_a_sink_restarted_after_any_checkpoint_takes_a_new_column_that_every_reader_reads(tmp_path):
    written = write_restarted_table(tmp_path)
    uri = str(tmp_path / "table")
    log = tmp_path / "table" / "_delta_log"
    assert sorted(int(p.name[:20]) for p in log.glob("*.checkpoint.parquet")) == list(written.checkpoints)
    entries = _entries(log)
    assert sorted(entries) == list(range(13))
    # every map of every action in the log is a JSON object, partition values strings or null
    for version, actions in entries.items():
        for action in actions:
            [(kind, fields)] = action.items()
            for path, required in PROTOCOL_MAPS.get(kind, {}).items():
                value = _field(fields, path)
                if value is None and not required:
                    continue
                assert isinstance(value, dict), f"version {version}: {kind}.{'.'.join(path)} is {value!r}"
                assert all(isinstance(k, str) for k in value), (version, kind, value)
                assert all(v is None or isinstance(v, str) for v in value.values()), (version, kind, value)
            if kind == "metaData":
                assert fields["partitionColumns"] == ["day"]
    # the restarted sinks' metaData actions: the table's, with one more column each
    created = next(a["metaData"] for a in entries[0] if "metaData" in a)
    configuration = {"delta.checkpointInterval": str(INTERVAL), "delta.logRetentionDuration": "interval 30 days"}
    assert created["format"] == {"provider": "parquet", "options": {}} and created["configuration"] == configuration
    for added, version in enumerate(written.schema_changes, start=1):
        [metadata] = [a["metaData"] for a in entries[version] if "metaData" in a]
        assert metadata["format"] == {"provider": "parquet", "options": {}}, version
        assert metadata["configuration"] == configuration, version
        assert (metadata["id"], metadata["createdTime"]) == (created["id"], created["createdTime"])
        names = [f["name"] for f in json.loads(metadata["schemaString"])["fields"]]
        assert names == COLUMNS[: 3 + added], version
        assert any("add" in a for a in entries[version]), "the schema changes with the files that need it"
    # readers read every row, the empty string's partition as null
    table = deltalake.DeltaTable(uri)
    assert table.version() == 12
    assert _rows(table.to_pyarrow_table()) == written.rows
    import polars as pl

    assert Counter(pl.read_delta(uri).select(COLUMNS).iter_rows()) == written.rows
    assert all(row[2] != "" for row in written.rows) and any(row[2] is None for row in written.rows)
    check_table("delta", uri)  # every entry and checkpoint conforms to the protocol; DuckDB reads the same rows
    # delta-rs checkpoints the sink's entries, and reads the table from that checkpoint alone
    table.create_checkpoint()
    check_table("delta", uri, duckdb=False)  # the checkpoint holds the state the entries replay to
    for p in log.glob("*.json"):
        p.unlink()
    assert DeltaConformance(uri).check() == 12, "a log read from its checkpoint alone conforms too"
    assert _rows(deltalake.DeltaTable(uri).to_pyarrow_table()) == written.rows
    # and a new log reader takes the checkpoint's metaData as the last entry wrote it
    state = DeltaLog(uri, {}).load()
    assert state is not None and (state.checkpoint, state.version) == (12, 12)
    [metadata] = [a["metaData"] for a in entries[12] if "metaData" in a]
    assert state.metadata == _present(metadata)
    assert state.txns == {app: deltalake.DeltaTable(uri).transaction_version(app) for app in state.txns}
    assert len(state.txns) == 4


def test_every_action_of_a_checkpoint_reads_back_as_the_entries_wrote_it(tmp_path):
    """The sink's checkpoint, delta-rs's after another writer's appends and compaction, and the sink's holding the
    compaction's tombstones: each action, read through the sink's reader, equals the entries' replayed."""
    written = write_restarted_table(tmp_path)
    log = tmp_path / "table" / "_delta_log"
    entries = _entries(log)
    for checkpoint in written.checkpoints:
        want: dict[str, dict[Any, dict[str, Any]]] = {
            "protocol": {},
            "metaData": {},
            "txn": {},
            "add": {},
            "remove": {},
        }
        for version in range(checkpoint + 1):
            for action in entries[version]:
                [(kind, fields)] = action.items()
                if kind == "add":
                    want["remove"].pop(fields["path"], None)
                    want["add"][fields["path"]] = _present(fields)
                elif kind == "remove":
                    want["add"].pop(fields["path"], None)
                    want["remove"][fields["path"]] = _present(fields)
                elif kind == "txn":
                    want["txn"][fields["appId"]] = _present(fields)
                elif kind in ("protocol", "metaData"):
                    want[kind][None] = _present(fields)
        got: dict[str, dict[Any, dict[str, Any]]] = {kind: {} for kind in want}
        for action in checkpoint_actions(pq.read_table(log / f"{checkpoint:020d}.checkpoint.parquet")):
            [(kind, fields)] = action.items()
            key = {"add": "path", "remove": "path", "txn": "appId"}.get(kind)
            got[kind][fields[key] if key else None] = fields
        assert got == want, f"checkpoint {checkpoint}"
        assert want["add"] and want["txn"] and (checkpoint == 3 or want["remove"]), "every action type is compared"
    check_table("delta", str(tmp_path / "table"), duckdb=False)


def test_arrow_shapes_of_every_action_type_are_the_protocols_json():
    """Actions a checkpoint of another writer may hold that these tables do not (tags, deletion vectors, table
    features, domain metadata, a sidecar), in the Arrow types delta-rs gives them, read as the protocol types
    them; and a map a log entry holds as a list (an earlier release of this sink wrote ``"options":[]``)."""
    map_ = pa.map_(pa.string(), pa.string())
    features = pa.list_(pa.field("element", pa.string(), nullable=False))
    vector = pa.struct(
        [
            ("storageType", pa.string()),
            ("pathOrInlineDv", pa.string()),
            ("offset", pa.int32()),
            ("sizeInBytes", pa.int32()),
            ("cardinality", pa.int64()),
        ]
    )
    schema = pa.schema(
        [
            (
                "add",
                pa.struct(
                    [
                        ("path", pa.string()),
                        ("partitionValues", map_),
                        ("size", pa.int64()),
                        ("modificationTime", pa.int64()),
                        ("dataChange", pa.bool_()),
                        ("stats", pa.string()),
                        ("tags", map_),
                        ("deletionVector", vector),
                        ("partitionValues_parsed", pa.struct([("day", pa.date32())])),
                    ]
                ),
            ),
            (
                "metaData",
                pa.struct(
                    [
                        ("id", pa.string()),
                        ("name", pa.string()),
                        ("format", pa.struct([("provider", pa.string()), ("options", map_)])),
                        ("schemaString", pa.string()),
                        ("partitionColumns", features),
                        ("configuration", map_),
                    ]
                ),
            ),
            (
                "protocol",
                pa.struct(
                    [
                        ("minReaderVersion", pa.int32()),
                        ("minWriterVersion", pa.int32()),
                        ("readerFeatures", features),
                        ("writerFeatures", features),
                    ]
                ),
            ),
            (
                "domainMetadata",
                pa.struct([("domain", pa.string()), ("configuration", pa.string()), ("removed", pa.bool_())]),
            ),
            ("sidecar", pa.struct([("path", pa.string()), ("sizeInBytes", pa.int64()), ("tags", map_)])),
        ]
    )
    dv = {
        "storageType": "u",
        "pathOrInlineDv": "ab^-aqEH.-t@S}K{vb[*k^",
        "offset": 1,
        "sizeInBytes": 36,
        "cardinality": 2,
    }
    add = {
        "path": "day=__HIVE_DEFAULT_PARTITION__/a.parquet",
        "partitionValues": [("day", None)],
        "size": 10,
        "modificationTime": 5,
        "dataChange": True,
        "stats": '{"numRecords":2}',
        "tags": [("INSERTION_TIME", "1"), ("k", None)],
        "deletionVector": {**dv, "offset": None},
        "partitionValues_parsed": {"day": None},
    }
    metadata = {
        "id": "t",
        "name": None,
        "format": {"provider": "parquet", "options": []},
        "schemaString": "{}",
        "partitionColumns": ["day"],
        "configuration": [("delta.appendOnly", "true")],
    }
    protocol = {
        "minReaderVersion": 3,
        "minWriterVersion": 7,
        "readerFeatures": ["deletionVectors"],
        "writerFeatures": ["deletionVectors", "domainMetadata"],
    }
    rows = [
        {"add": add},
        {"add": {**add, "path": "b.parquet", "partitionValues": [("day", "")], "tags": None, "deletionVector": dv}},
        {"metaData": metadata},
        {"protocol": protocol},
        {"protocol": {**protocol, "readerFeatures": None, "writerFeatures": []}},
        {
            "domainMetadata": {
                "domain": "delta.rowTracking",
                "configuration": '{"rowIdHighWaterMark":4}',
                "removed": False,
            }
        },
        {"sidecar": {"path": "s.parquet", "sizeInBytes": 3, "tags": None}},
    ]
    table = pa.Table.from_pylist([{name: row.get(name) for name in schema.names} for row in rows], schema=schema)
    got = checkpoint_actions(table)
    base = {k: v for k, v in add.items() if k not in ("tags", "deletionVector", "partitionValues_parsed")}
    assert got == [
        {
            "add": {
                **base,
                "partitionValues": {"day": None},
                "tags": {"INSERTION_TIME": "1", "k": None},
                "deletionVector": {k: v for k, v in dv.items() if k != "offset"},
            }
        },
        {"add": {**base, "path": "b.parquet", "partitionValues": {"day": ""}, "deletionVector": dv}},
        {
            "metaData": {
                "id": "t",
                "format": {"provider": "parquet", "options": {}},
                "schemaString": "{}",
                "partitionColumns": ["day"],
                "configuration": {"delta.appendOnly": "true"},
            }
        },
        {"protocol": protocol},
        {"protocol": {"minReaderVersion": 3, "minWriterVersion": 7, "writerFeatures": []}},
        {
            "domainMetadata": {
                "domain": "delta.rowTracking",
                "configuration": '{"rowIdHighWaterMark":4}',
                "removed": False,
            }
        },
        {"sidecar": {"path": "s.parquet", "sizeInBytes": 3}},
    ]
    # a log entry's map written as a list (of pairs, or of key/value records), or left out where it is required
    entry = {"id": "t", "format": {"provider": "parquet", "options": []}, "configuration": [["a", "1"]]}
    assert protocol_shape("metaData", entry) == {
        "id": "t",
        "format": {"provider": "parquet", "options": {}},
        "configuration": {"a": "1"},
    }
    records = {"path": "p", "partitionValues": [{"key": "day", "value": None}], "tags": None}
    assert protocol_shape("add", records) == {"path": "p", "partitionValues": {"day": None}, "tags": None}
    assert protocol_shape("metaData", {"id": "t", "format": {"provider": "parquet"}}) == {
        "id": "t",
        "format": {"provider": "parquet", "options": {}},
        "configuration": {},
    }
