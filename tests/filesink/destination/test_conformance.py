"""The conformance checks bite: a table the sink wrote passes them, and each deliberately broken entry of a copy of
it (a map written as a JSON array, a partition value as a number, a required field left out, statistics of a
column the table does not have, an Iceberg manifest whose record count is not its file's) is reported naming the
file and the field. The old bug planted back into the sink (a checkpoint's ``metaData`` written back with its maps
as Arrow gave them) is caught on the table the sink writes.

The tables are written through the sink without Spark (``sink_helpers.append_epoch``), in ``tmp_path``."""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from conformance import Table, check_table, check_tables, cursor
from delta_conformance import DeltaConformance
from iceberg_conformance import IcebergConformance
from sink_helpers import append_epoch, batch_rows

from filesink import ExactlyOnceParquetSink, Rollover

pytest.importorskip("deltalake")
pytest.importorskip("pyiceberg")

pytestmark = pytest.mark.timeout(180)

EVERY_2 = Rollover(target_file_size=None, max_age_seconds=None, max_epochs=2)
ENTRY_1 = "_delta_log/00000000000000000001.json"


def _write(root: Path, table_format: str, epochs: int = 4) -> Path:
    """A table partitioned by ``event_date``: a roll (a commit) every two epochs."""
    options = {"table": "db.events"} if table_format == "iceberg" else {}
    sink = ExactlyOnceParquetSink(
        str(root / "table"),
        str(root / "state"),
        vnodes=4,
        parallelism=1,
        rollover=EVERY_2,
        table_format=table_format,
        partition_by=["event_date"],
        **options,
    )
    for epoch in range(epochs):
        append_epoch(sink, epoch, batch_rows(epoch, 20))
        sink._roll(force=False)
    sink.close()
    return root / "table"


@pytest.fixture(scope="module")
def delta_table(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _write(tmp_path_factory.mktemp("delta"), "delta")


@pytest.fixture(scope="module")
def iceberg_table(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _write(tmp_path_factory.mktemp("iceberg"), "iceberg")


def _broken_copy(table: Path, tmp_path: Path, entry: str, change) -> Path:
    """A copy of ``table`` whose log entry ``entry`` has ``change`` applied to its actions (a list of dicts)."""
    copy = tmp_path / "copy"
    shutil.copytree(table, copy)
    path = copy / entry
    actions = [json.loads(line) for line in path.read_text().splitlines()]
    change(actions)
    path.write_text("".join(json.dumps(a) + "\n" for a in actions))
    return copy


def _problems(table: Path) -> str:
    with pytest.raises(AssertionError) as raised:
        DeltaConformance(str(table)).check()
    return str(raised.value)


def _first(actions: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    return next(a[kind] for a in actions if kind in a)


def test_the_sinks_tables_conform_and_both_readers_read_the_same_rows(delta_table, iceberg_table):
    check_tables([Table("delta", str(delta_table)), Table("iceberg", str(iceberg_table))])  # one DuckDB run


@pytest.mark.parametrize("table_format", ["delta", "iceberg"])
def test_a_table_made_anew_at_the_same_location_is_checked_from_its_start(tmp_path, table_format):
    table = _write(tmp_path, table_format, epochs=4)
    check_table(table_format, str(table), duckdb=False)
    shutil.rmtree(tmp_path)
    tmp_path.mkdir()
    _write(tmp_path, table_format, epochs=2)  # another table: one commit, another id
    check_table(table_format, str(table), duckdb=False)
    checker = cursor(table_format, str(table))
    if isinstance(checker, DeltaConformance):
        assert (checker.replay.version, len(checker.replay.files)) == (1, 3), "the new table's log, from version 0"
    else:  # the old table's files would have been reported: another table-uuid
        assert [p for p in checker.checked if p.endswith(".metadata.json")] == checker.metadata_files()


def test_a_map_written_as_a_json_array_is_reported(delta_table, tmp_path):
    def options_as_list(actions):
        _first(actions, "metaData")["format"]["options"] = []

    copy = _broken_copy(delta_table, tmp_path, "_delta_log/00000000000000000000.json", options_as_list)
    problems = _problems(copy)
    assert "_delta_log/00000000000000000000.json line 3 (metaData): metaData.format.options: must be a JSON object" in (
        problems
    )


def test_a_partition_value_as_a_number_is_reported(delta_table, tmp_path):
    def as_number(actions):
        values = _first(actions, "add")["partitionValues"]
        values["event_date"] = 20240101

    problems = _problems(_broken_copy(delta_table, tmp_path, ENTRY_1, as_number))
    assert f"{ENTRY_1} line 2 (add): add.partitionValues: values must be strings" in problems
    assert "20240101" in problems


def test_a_partition_value_that_is_not_of_the_columns_type_is_reported(delta_table, tmp_path):
    def with_schema(actions):  # the same table, its event_date column a date
        meta = _first(actions, "metaData")
        schema = json.loads(meta["schemaString"])
        for f in schema["fields"]:
            if f["name"] == "event_date":
                f["type"] = "date"
        meta["schemaString"] = json.dumps(schema)

    copy = _broken_copy(delta_table, tmp_path, "_delta_log/00000000000000000000.json", with_schema)
    path = copy / ENTRY_1
    actions = [json.loads(line) for line in path.read_text().splitlines()]
    _first(actions, "add")["partitionValues"]["event_date"] = "2024-13-01"
    path.write_text("".join(json.dumps(a) + "\n" for a in actions))
    problems = _problems(copy)
    assert f"{ENTRY_1} line 2 (add): add.partitionValues.event_date: '2024-13-01' does not parse as a date" in problems


def test_a_missing_required_field_is_reported(delta_table, tmp_path):
    def without_size(actions):
        del _first(actions, "add")["size"]
        del _first(actions, "txn")["appId"]

    problems = _problems(_broken_copy(delta_table, tmp_path, ENTRY_1, without_size))
    assert f"{ENTRY_1} line 2 (add): add.size: required field is missing" in problems
    assert "(txn): txn.appId: required field is missing" in problems


def test_statistics_of_an_unknown_column_are_reported(delta_table, tmp_path):
    def unknown_column(actions):
        add = _first(actions, "add")
        stats = json.loads(add["stats"])
        stats["minValues"]["nope"] = 1
        stats["nullCount"]["event_date"] = 0  # a partition column: no statistics in the files
        add["stats"] = json.dumps(stats)

    problems = _problems(_broken_copy(delta_table, tmp_path, ENTRY_1, unknown_column))
    assert f"{ENTRY_1} line 2 (add): add.stats.minValues.nope: no such column in the schema" in problems
    assert f"{ENTRY_1} line 2 (add): add.stats.nullCount.event_date: no such column" in problems


def test_two_action_keys_on_a_line_an_unknown_field_and_a_wrong_size_are_reported(delta_table, tmp_path):
    def broken(actions):
        actions[1]["txn"] = {"appId": "x", "version": 1}  # a second key on the add's line
        _first(actions, "protocol" if any("protocol" in a for a in actions) else "add")["sizeInBytes"] = 3
        actions.append({"add": {**_first(actions, "add"), "path": "event_date=2024-01-01/gone.parquet"}})

    problems = _problems(_broken_copy(delta_table, tmp_path, ENTRY_1, broken))
    assert f"{ENTRY_1} line 2: line: must be a JSON object with exactly one action key, has ['add', 'txn']" in problems
    assert "add.sizeInBytes: a field the protocol does not know" in problems
    assert "add.path: event_date=2024-01-01/gone.parquet: no such file under the table's root" in problems


def test_the_kill_campaigns_table_watch_reports_a_nonconforming_entry(delta_table, tmp_path):
    from table_checker import TableTarget, TableWatch

    def unknown_field(actions):
        _first(actions, "add")["sizeInBytes"] = 3  # readers ignore it; the protocol has no such field

    copy = _broken_copy(delta_table, tmp_path, ENTRY_1, unknown_field)
    watch = TableWatch(TableTarget("delta"), str(copy), None, Counter(), seed=5)
    with pytest.raises(AssertionError) as raised:
        watch.step("after kill 1", quiet=True, recovered=False)
    problems = str(raised.value)
    assert problems.startswith("seed 5: after kill 1: the Delta table at ")
    assert f"{ENTRY_1} line 2 (add): add.sizeInBytes: a field the protocol does not know" in problems


def test_a_gap_in_the_versions_is_reported(delta_table, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(delta_table, copy)
    (copy / ENTRY_1).rename(copy / "_delta_log/00000000000000000009.json")
    assert "_delta_log/: versions: the entries [0, 2, 9] are not contiguous from version 0" in _problems(copy)


def test_a_protocol_inconsistent_with_its_versions_and_a_bound_of_the_wrong_type_are_reported(delta_table, tmp_path):
    def broken(actions):
        _first(actions, "protocol")["readerFeatures"] = ["timestampNtz"]  # features with reader version 1
        _first(actions, "protocol")["minWriterVersion"] = 7  # writer version 7 lists its features

    copy = _broken_copy(delta_table, tmp_path, "_delta_log/00000000000000000000.json", broken)
    path = copy / ENTRY_1
    actions = [json.loads(line) for line in path.read_text().splitlines()]
    add = _first(actions, "add")
    stats = json.loads(add["stats"])
    stats["minValues"]["id"] = str(stats["minValues"]["id"])  # a long's bound as text
    stats["maxValues"]["amount"] = -1.0  # below the minimum, and below the file's values
    stats["numRecords"] += 1  # not the file's rows
    add["stats"] = json.dumps(stats)
    path.write_text("".join(json.dumps(a) + "\n" for a in actions))
    problems = _problems(copy)
    entry_0 = "_delta_log/00000000000000000000.json line 2 (protocol)"
    assert f"{entry_0}: protocol.readerFeatures: present with reader version 1 (only with 3)" in problems
    assert f"{entry_0}: protocol.writerFeatures: missing: writer version 7 lists its features" in problems
    assert f"{ENTRY_1} line 2 (add): add.stats.minValues.id: " in problems
    assert "is not a bound of a long column" in problems
    assert f"{ENTRY_1} line 2 (add): add.stats.minValues.amount: " in problems and "above the maximum -1.0" in problems
    assert f"{ENTRY_1} line 2 (add): add.stats.maxValues.amount: -1.0, the file {add['path']} holds " in problems
    assert (
        f"{ENTRY_1} line 2 (add): add.stats.numRecords: {stats['numRecords']}, the file {add['path']} has " in problems
    )


def test_iceberg_metadata_whose_main_branch_sequence_numbers_and_properties_are_wrong_is_reported(
    iceberg_table, tmp_path
):
    copy = tmp_path / "copy"
    shutil.copytree(iceberg_table, copy)
    checker = IcebergConformance(str(copy))
    newest = Path(checker.metadata_files()[-1])
    meta = json.loads(newest.read_text())
    assert len(meta["snapshots"]) == 2, "a snapshot per roll"
    first, second = meta["snapshots"]
    meta["refs"]["main"]["snapshot-id"] = first["snapshot-id"]  # not the current snapshot
    second["sequence-number"] = first["sequence-number"]  # not after the older snapshot's
    meta["properties"]["commit.retry.num-retries"] = 4  # a number, not a string
    meta["partition-specs"][0]["fields"][0]["source-id"] = 99  # no such column
    newest.write_text(json.dumps(meta))
    with pytest.raises(AssertionError) as raised:
        checker.check()
    problems = str(raised.value)
    where = f"metadata/{newest.name}"
    assert f"{where}: refs.main: " in problems and "does not point at the current snapshot" in problems
    assert f"{where}: snapshots.sequence-number: snapshot {second['snapshot-id']}" in problems
    assert f"{where}: metadata.properties: values must be strings" in problems
    assert f"{where}: partition-specs[0].fields[0].source-id: 99 is no field of any schema" in problems


def test_an_iceberg_manifest_with_a_wrong_record_count_is_reported(tmp_path):
    """The manifest of the table's newest snapshot written again (pyiceberg's writer) with its first entry's record
    count and null counts one more than its file's (the metadata names files by absolute paths: the table is a table
    of its own)."""
    from pyiceberg.manifest import write_manifest
    from pyiceberg.table import StaticTable

    table_path = _write(tmp_path, "iceberg", epochs=2)
    checker = IcebergConformance(str(table_path))
    table = StaticTable.from_metadata(f"file://{checker.metadata_files()[-1]}")
    [manifest] = table.current_snapshot().manifests(table.io)  # type: ignore[union-attr]
    entries = list(manifest.fetch_manifest_entry(table.io, discard_deleted=False))
    assert entries, "the snapshot's manifest lists the roll's files"
    target = Path(manifest.manifest_path.removeprefix("file://"))
    target.unlink()
    with write_manifest(
        format_version=2,
        spec=table.spec(),
        schema=table.schema(),
        output_file=table.io.new_output(manifest.manifest_path),
        snapshot_id=manifest.added_snapshot_id,
        avro_compression="deflate",
    ) as writer:
        for i, entry in enumerate(entries):
            if i == 0:
                entry.data_file[4] = entry.data_file.record_count + 1  # record_count, the data file's 5th field
                entry.data_file[8] = {k: v + 1 for k, v in entry.data_file.null_value_counts.items()}  # 9th
            writer.add_entry(entry)
    with pytest.raises(AssertionError) as raised:
        checker.check()
    problems = str(raised.value)
    assert f"metadata/{target.name}: entry[0].data_file.record_count: " in problems
    assert "the Parquet footer of" in problems
    assert f"metadata/{target.name}: entry[0].data_file.null_value_counts[1] (id): 1, the file has 0" in problems
    assert ".added_rows_count: " in problems  # the manifest list's count is no longer the manifest's


def test_an_iceberg_manifest_list_whose_partition_bounds_leave_out_a_file_is_reported(tmp_path):
    """The newest snapshot's manifest list written again (pyiceberg's writer) with its manifest's lower bound of
    ``event_date`` past the manifest's smallest value: a reader filtering on the partition would skip files that
    hold matching rows."""
    from pyiceberg.manifest import write_manifest_list
    from pyiceberg.table import StaticTable

    table_path = _write(tmp_path, "iceberg", epochs=2)
    checker = IcebergConformance(str(table_path))
    table = StaticTable.from_metadata(f"file://{checker.metadata_files()[-1]}")
    snapshot = table.current_snapshot()
    assert snapshot is not None
    [manifest] = snapshot.manifests(table.io)
    [summary] = manifest.partitions or []
    assert summary.lower_bound is not None and summary.lower_bound < b"2024-01-03"
    summary[2] = b"2024-01-03"  # lower_bound, the summary's 3rd field: past the manifest's first days
    Path(snapshot.manifest_list.removeprefix("file://")).unlink()
    with write_manifest_list(
        format_version=2,
        output_file=table.io.new_output(snapshot.manifest_list),
        snapshot_id=snapshot.snapshot_id,
        parent_snapshot_id=snapshot.parent_snapshot_id,
        sequence_number=snapshot.sequence_number,
        avro_compression="deflate",
    ) as writer:
        writer.add_manifests([manifest])
    with pytest.raises(AssertionError) as raised:
        checker.check()
    problems = str(raised.value)
    name = Path(snapshot.manifest_list).name
    assert f"metadata/{name}: manifest[0].partitions[0] (event_date).lower_bound: b'2024-01-03' is above" in problems


def test_the_old_bug_planted_back_is_caught_on_the_table_the_sink_writes(tmp_path, monkeypatch):
    """The sink's reader of a checkpoint giving the ``metaData`` as Arrow gives it (maps as lists of pairs): the
    restarted sink's first commit with a new column writes ``"options":[]``, which the hook reports."""
    from delta_restarts import _checkpoint_interval, _rolls

    from filesink.destination import delta_log

    def as_arrow_gives_them(table: pa.Table) -> list[dict[str, Any]]:
        return [
            {kind: row}
            for kind, column in zip(table.column_names, table.columns, strict=True)
            for row in column.filter(pc.is_valid(column)).to_pylist()
        ]

    monkeypatch.setattr(delta_log, "checkpoint_actions", as_arrow_gives_them)
    monkeypatch.setattr(delta_log, "protocol_shape", lambda kind, fields: dict(fields))
    with _checkpoint_interval(3):
        _rolls(tmp_path, range(4), 0)  # versions 1-4, a checkpoint at 3
    check_table("delta", str(tmp_path / "table"), duckdb=False)  # all conforms so far
    _rolls(tmp_path, range(4, 5), 1)  # a new sink reads the checkpoint, and takes a new column: version 5
    with pytest.raises(AssertionError) as raised:
        check_table("delta", str(tmp_path / "table"), duckdb=False)
    problems = str(raised.value)
    assert "_delta_log/00000000000000000005.json line 2 (metaData): metaData.format.options: must be a JSON object" in (
        problems
    )
    assert "metaData.configuration: must be a JSON object" in problems
