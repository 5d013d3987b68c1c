"""The Delta destination's own log writer (:mod:`filesink.destination.delta_log`): a roll's entry created only if
absent, races with other writers decided from the winning entries, start-up from a checkpoint and the entries after
it, checkpoints and clean-up by the sink, and readers (deltalake, Polars) reading exactly the rows committed.

Real deltalake tables in ``tmp_path``; the other writers are real writers of the same table (delta-rs, or a second
destination), run between this destination's read of the log and its conditional create by a ``DeltaLog`` whose
``put`` lets them go first."""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from filesink.committer.ledger import PlannedFile
from filesink.destination import open_destination, table_options
from filesink.errors import TableCommitFailedError
from filesink.output import OutputLocation
from filesink.schema.partitioning import escape
from filesink.tasks.writer import WrittenObject

deltalake = pytest.importorskip("deltalake")

from filesink.destination.delta import DeltaDestination  # noqa: E402
from filesink.destination.delta_log import DeltaLog, add_path, entry_name  # noqa: E402

pytestmark = pytest.mark.timeout(180)

SCHEMA = pa.schema([("id", pa.int64()), ("user_id", pa.int64()), ("day", pa.string())])
VNODES = 4


def _destination(root: Path, sink_id: str = "s1", partition_by: tuple[str, ...] = ("day",)) -> DeltaDestination:
    dest = open_destination(
        table_options("delta"), output=OutputLocation(str(root)), sink_id=sink_id, partition_by=partition_by
    )
    assert isinstance(dest, DeltaDestination)
    return dest


def _file(
    root: Path, name: str, rows: list[tuple[int, int, str]], starts: dict[int, int], end: int, partitioned: bool = True
) -> tuple[PlannedFile, dict[str, list[WrittenObject]]]:
    """A file of ``rows`` written under the table's root (one object per day), and its plan."""
    objects = []
    for day in sorted({r[2] for r in rows}):
        part = [r for r in rows if r[2] == day]
        key = f"day={escape(day)}/{name}.parquet" if partitioned else f"{name}-{day}.parquet"
        path = root / key
        path.parent.mkdir(parents=True, exist_ok=True)
        data = pa.table({c: [r[i] for r in part] for i, c in enumerate(SCHEMA.names)}, schema=SCHEMA)
        if partitioned:
            data = data.drop_columns(["day"])
        collected: list[pq.FileMetaData] = []
        with pq.ParquetWriter(path, data.schema, metadata_collector=collected) as writer:
            writer.write_table(data)
        objects.append(WrittenObject(key, path.stat().st_size, len(part), collected[-1]))
    plan = PlannedFile(name, 0, VNODES - 1, starts, end, len(rows), 100, "test")
    return plan, {name: objects}


def _rows(root: Path) -> Counter:
    data = deltalake.DeltaTable(str(root)).to_pyarrow_table(columns=SCHEMA.names)
    return Counter(zip(*(data[c].to_pylist() for c in SCHEMA.names), strict=True))


def _polars_rows(root: Path) -> Counter:
    import polars as pl

    return Counter(pl.scan_delta(str(root)).select(SCHEMA.names).collect().iter_rows())


def _epoch_rows(epoch: int, day: str = "2024-01-01") -> list[tuple[int, int, str]]:
    return [(epoch * 100 + v, v, day) for v in range(VNODES)]


def _commit(dest: DeltaDestination, root: Path, epoch: int, name: str | None = None) -> Counter:
    rows = _epoch_rows(epoch, f"2024-01-0{1 + epoch % 3}")
    plan, written = _file(root, name or f"part-{epoch:05d}", rows, dict.fromkeys(range(VNODES), epoch), epoch)
    dest.make_visible([plan], written, SCHEMA)
    dest.maintain()
    dest.settle()  # the checkpoint runs in the background: its outcome is what these tests look at
    return Counter(rows)


class _Racing(DeltaLog):
    """A log whose next ``put`` first runs another writer's commit (once): the race between our read of the log and
    our conditional create, with a real second writer."""

    def __init__(self, log: DeltaLog, other: Callable[[], None]) -> None:
        self.storage = log.storage
        self.other: Callable[[], None] | None = other
        self.puts: list[tuple[int, str]] = []

    def put(self, version: int, body: bytes):  # type: ignore[no-untyped-def]
        if self.other is not None:
            other, self.other = self.other, None
            other()
        answer = super().put(version, body)
        self.puts.append((version, answer.value))
        return answer


def test_entries_are_what_delta_rs_writes_and_readers_read_them_exactly(tmp_path):
    root = tmp_path / "t"
    dest = _destination(root)
    expected = Counter()
    for epoch in range(3):
        expected += _commit(dest, root, epoch)
    assert dest.delta_rs is None, "the table delta-rs created is one the sink's own writer commits to"
    lines = [json.loads(x) for x in (root / "_delta_log" / f"{1:020d}.json").read_text().splitlines()]
    assert list(lines[0]) == ["commitInfo"] and lines[0]["commitInfo"]["operation"] == "WRITE"
    assert lines[0]["commitInfo"]["filesink.files"] == "part-00000"
    add = lines[1]["add"]
    assert add["path"] == "day=2024-01-01/part-00000.parquet" and add["partitionValues"] == {"day": "2024-01-01"}
    assert add["dataChange"] is True and isinstance(add["stats"], str) and json.loads(add["stats"])["numRecords"] == 4
    assert [x["txn"] for x in lines[2:]] == [{"appId": f"s1-v{v}", "version": 0} for v in range(VNODES)]
    table = deltalake.DeltaTable(str(root))
    assert table.version() == 3
    assert {table.transaction_version(f"s1-v{v}") for v in range(VNODES)} == {2}
    assert _rows(root) == expected
    assert _polars_rows(root) == expected


def test_paths_are_percent_encoded_as_delta_rs_encodes_them(tmp_path):
    """Keys with characters a URI must encode (the sink's own %XX escapes included) are found by readers."""
    root = tmp_path / "t"
    dest = _destination(root)
    day = "a b:c#é%"
    assert "%" in escape(day), "the directory holds the sink's escapes, which the add path encodes again"
    rows = [(1, 0, day), (2, 1, day)]
    plan, written = _file(root, "part-odd name", rows, {0: 0, 1: 0}, 0)
    dest.make_visible([plan], written, SCHEMA)
    assert add_path("day=a b%3Ac#é/x y.parquet") == "day=a%20b%253Ac%23%C3%A9/x%20y.parquet"
    assert sorted(deltalake.DeltaTable(str(root)).file_uris()) == sorted(
        str(root / o.key) for o in written["part-odd name"]
    )
    assert _rows(root) == Counter(rows)
    assert _polars_rows(root) == Counter(rows)


def test_a_commit_by_another_writer_between_our_read_and_our_put_is_passed_by(tmp_path):
    root = tmp_path / "t"
    dest = _destination(root)
    expected = _commit(dest, root, 0)
    other_rows = [(900, 9, "2024-01-09")]

    def other() -> None:  # another application appends to the table with delta-rs
        deltalake.write_deltalake(
            str(root),
            pa.table({c: [r[i] for r in other_rows] for i, c in enumerate(SCHEMA.names)}, schema=SCHEMA),
            mode="append",
            partition_by=["day"],
        )

    racing = _Racing(dest._log, other)
    dest._log = racing
    expected += _commit(dest, root, 1)
    assert racing.puts == [(2, "exists"), (3, "created")], "lost version 2 to the other writer, then took 3"
    table = deltalake.DeltaTable(str(root))
    assert table.version() == 3
    assert {table.transaction_version(f"s1-v{v}") for v in range(VNODES)} == {1}
    assert _rows(root) == expected + Counter(other_rows)
    assert _polars_rows(root) == expected + Counter(other_rows)


def test_a_race_lost_on_a_table_read_again_from_its_checkpoint_is_passed_by(tmp_path):
    """On a table with a short log retention the sink reads the log again (from its checkpoint) after a lost race:
    only what changed since its state counts, not its own marks of earlier rolls, so another application's append
    is passed by."""
    root = tmp_path / "t"
    _short_history(root)
    dest = _destination(root)
    expected = Counter()
    for epoch in range(12):  # a checkpoint at 10
        expected += _commit(dest, root, epoch)
    other_rows = [(900, 9, "2024-01-09")]

    def other() -> None:
        deltalake.write_deltalake(
            str(root),
            pa.table({c: [r[i] for r in other_rows] for i, c in enumerate(SCHEMA.names)}, schema=SCHEMA),
            mode="append",
            partition_by=["day"],
        )

    racing = _Racing(dest._log, other)
    dest._log = racing
    expected += _commit(dest, root, 12)
    assert racing.puts == [(13, "exists"), (14, "created")]
    assert _rows(root) == expected + Counter(other_rows)


def test_a_lost_race_to_another_run_of_the_same_sink_with_the_same_files_is_landed(tmp_path):
    """An older and a newer driver of one sink commit the same roll: the loser reads the winner's entry, which
    holds its files: landed, and the table holds them once."""
    root = tmp_path / "t"
    old = _destination(root)
    expected = _commit(old, root, 0)
    new = _destination(root)
    rows = _epoch_rows(1)
    plan, written = _file(root, "part-00001", rows, dict.fromkeys(range(VNODES), 1), 1)
    racing = _Racing(old._log, lambda: new.make_visible([plan], written, SCHEMA))
    old._log = racing
    old._light("read")  # the old driver's read, before the new one commits
    old.make_visible([plan], written, SCHEMA)
    assert racing.puts == [(2, "exists")]
    assert deltalake.DeltaTable(str(root)).version() == 2
    assert old.held([plan]) == {"part-00001"}
    assert _rows(root) == expected + Counter(rows)


def test_a_lost_race_to_marks_of_our_vnodes_that_do_not_hold_the_files_is_refused(tmp_path):
    root = tmp_path / "t"
    dest = _destination(root)
    expected = _commit(dest, root, 0)
    other = _destination(root)  # another run of the sink commits epoch 1 of vnode 0 only, under its mark
    other_rows = [(100, 0, "2024-01-01")]
    other_plan, other_written = _file(root, "part-other", other_rows, {0: 1}, 1)
    rows = [(200 + v, v, "2024-01-01") for v in range(VNODES)]
    plan, written = _file(root, "part-00002", rows, dict.fromkeys(range(VNODES), 2), 2)
    racing = _Racing(dest._log, lambda: other.make_visible([other_plan], other_written, SCHEMA))
    dest._log = racing
    with pytest.raises(TableCommitFailedError, match=r"holds this sink's application transaction s1-v0"):
        dest.make_visible([plan], written, SCHEMA)
    assert racing.puts == [(2, "exists")]
    assert deltalake.DeltaTable(str(root)).version() == 2, "nothing of the refused commit is in the table"
    assert _rows(root) == expected + Counter(other_rows)
    dest.make_visible([plan], written, SCHEMA)  # what the next start does: the file is still pending
    assert dest.held([plan]) == {"part-00002"}
    assert _rows(root) == expected + Counter(other_rows) + Counter(rows)


def test_start_up_reads_the_last_checkpoint_and_the_entries_after_it(tmp_path):
    """A table with a checkpoint every 10 versions (made by the sink's maintenance) and its old entries cleaned
    up (by another writer): a new destination reads the checkpoint's transactions and the entries after it, and
    agrees with delta-rs."""
    root = tmp_path / "t"
    deltalake.DeltaTable.create(
        str(root),
        schema=SCHEMA,
        partition_by=["day"],
        configuration={"delta.checkpointInterval": "10", "delta.logRetentionDuration": "interval 0 seconds"},
    )
    dest = _destination(root)
    expected = Counter()
    for epoch in range(25):
        expected += _commit(dest, root, epoch)
        if epoch == 12:  # another sink's marks, before the checkpoint at 20 and kept by it
            expected += _commit(_destination(root, "s2"), root, 1000, "part-s2")
    deltalake.DeltaTable(str(root)).cleanup_metadata()  # another writer's clean-up
    log = root / "_delta_log"
    assert json.loads((log / "_last_checkpoint").read_text())["version"] == 20
    assert (log / f"{20:020d}.checkpoint.parquet").exists()
    assert not (log / f"{0:020d}.json").exists(), "the clean-up removed the entries before the checkpoint"
    table = deltalake.DeltaTable(str(root))
    assert table.version() == 26
    fresh = _destination(root)
    state = fresh._light("read")
    assert state is not None and fresh.delta_rs is None
    assert (state.checkpoint, state.version) == (20, 26)
    wanted = {f"s1-v{v}": table.transaction_version(f"s1-v{v}") for v in range(VNODES)}
    wanted |= {f"s2-v{v}": table.transaction_version(f"s2-v{v}") for v in range(VNODES)}
    assert (
        state.txns == wanted == {**{f"s1-v{v}": 24 for v in range(VNODES)}, **{f"s2-v{v}": 1000 for v in range(VNODES)}}
    )
    held_plan = PlannedFile("part-00024", 0, VNODES - 1, dict.fromkeys(range(VNODES), 24), 24, 4, 1, "t")
    next_plan = PlannedFile("next", 0, VNODES - 1, dict.fromkeys(range(VNODES), 25), 25, 4, 1, "t")
    assert fresh.held([held_plan, next_plan]) == {"part-00024"}
    (log / "_last_checkpoint").unlink()  # a hint only: the listing finds the newest checkpoint
    again = _destination(root)
    state = again._light("read")
    assert state is not None and (state.checkpoint, state.version) == (20, 26) and state.txns == wanted
    expected += _commit(again, root, 25)
    assert _rows(root) == expected
    assert _polars_rows(root) == expected


def test_a_table_with_a_writer_feature_the_sink_does_not_honour_is_committed_through_delta_rs(tmp_path):
    root = tmp_path / "t"
    table = deltalake.DeltaTable.create(str(root), schema=SCHEMA, partition_by=["day"])
    table.alter.add_constraint({"positive_id": "id >= 0"})  # writer version 3
    dest = _destination(root)
    expected = _commit(dest, root, 0)
    assert dest.delta_rs is not None and "writer version 3" in dest.delta_rs
    assert dest.held([PlannedFile("part-00000", 0, VNODES - 1, dict.fromkeys(range(VNODES), 0), 0, 4, 1, "t")]) == {
        "part-00000"
    }
    assert deltalake.DeltaTable(str(root)).version() == 2, "the constraint's version, then the commit"
    assert _rows(root) == expected
    assert _polars_rows(root) == expected


def _short_history(root: Path) -> None:
    """A table with a checkpoint every 10 versions and no log retention: a clean-up removes every entry before the
    newest checkpoint (what a 30-day retention does to an idle sink's entries after 30 days)."""
    deltalake.DeltaTable.create(
        str(root),
        schema=SCHEMA,
        partition_by=["day"],
        configuration={"delta.checkpointInterval": "10", "delta.logRetentionDuration": "interval 0 seconds"},
    )


def test_an_idle_sink_behind_a_checkpoint_and_a_clean_up_commits_after_the_newest_version(tmp_path):
    """The sink's state is at version 1; another sink then commits past a checkpoint whose clean-up removes
    version 2 and after. The next entry's name is free again: the sink must not take it (no reader would see it)."""
    root = tmp_path / "t"
    _short_history(root)
    idle = _destination(root)
    expected = _commit(idle, root, 0)
    busy = _destination(root, "s2")
    for epoch in range(1000, 1012):
        expected += _commit(busy, root, epoch, f"part-s2-{epoch}")
    deltalake.DeltaTable(str(root)).cleanup_metadata()
    log = root / "_delta_log"
    assert not (log / f"{2:020d}.json").exists(), "the clean-up removed the versions after the idle sink's state"
    assert json.loads((log / "_last_checkpoint").read_text())["version"] == 10
    expected += _commit(idle, root, 1)
    table = deltalake.DeltaTable(str(root))
    assert table.version() == 14 and (log / f"{14:020d}.json").exists() and not (log / f"{2:020d}.json").exists()
    assert {table.transaction_version(f"s1-v{v}") for v in range(VNODES)} == {1}
    assert _rows(root) == expected
    assert _polars_rows(root) == expected


def test_a_stale_checkpoint_hint_is_passed_by_from_the_listing(tmp_path):
    """``_last_checkpoint`` names checkpoint 10 (a writer died between its next checkpoint and the hint), the
    entries before checkpoint 20 are gone: the start lists the log and reads from checkpoint 20."""
    root = tmp_path / "t"
    _short_history(root)
    dest = _destination(root)
    expected = Counter()
    for epoch in range(12):
        expected += _commit(dest, root, epoch)
    log = root / "_delta_log"
    stale = (log / "_last_checkpoint").read_text()
    assert json.loads(stale)["version"] == 10
    for epoch in range(12, 22):
        expected += _commit(dest, root, epoch)
    deltalake.DeltaTable(str(root)).cleanup_metadata()
    assert json.loads((log / "_last_checkpoint").read_text())["version"] == 20
    assert not (log / f"{10:020d}.checkpoint.parquet").exists() and not (log / f"{19:020d}.json").exists()
    (log / "_last_checkpoint").write_text(stale)
    fresh = _destination(root)
    state = fresh._light("read")
    assert state is not None and fresh.delta_rs is None and (state.checkpoint, state.version) == (20, 22)
    assert state.txns == {f"s1-v{v}": 21 for v in range(VNODES)}
    expected += _commit(fresh, root, 22)
    assert deltalake.DeltaTable(str(root)).version() == 23
    assert _rows(root) == expected


def test_the_sink_checkpoints_every_interval_and_cleans_up_every_tenth_checkpoint(tmp_path):
    root = tmp_path / "t"
    deltalake.DeltaTable.create(
        str(root),
        schema=SCHEMA,
        partition_by=["day"],
        configuration={"delta.checkpointInterval": "2", "delta.logRetentionDuration": "interval 0 seconds"},
    )
    dest = _destination(root)
    log = root / "_delta_log"
    expected = Counter()
    for epoch in range(19):
        expected += _commit(dest, root, epoch)
    assert json.loads((log / "_last_checkpoint").read_text())["version"] == 18
    assert (log / f"{0:020d}.json").exists(), "no clean-up before the 10th checkpoint"
    expected += _commit(dest, root, 19)  # version 20: the 10th checkpoint, and the clean-up
    assert json.loads((log / "_last_checkpoint").read_text())["version"] == 20
    assert not (log / f"{0:020d}.json").exists() and not (log / f"{19:020d}.json").exists()
    assert not (log / f"{18:020d}.checkpoint.parquet").exists()
    fresh = _destination(root)
    state = fresh._light("read")
    assert state is not None and (state.checkpoint, state.version) == (20, 20)
    assert state.txns == {f"s1-v{v}": 19 for v in range(VNODES)}
    assert _rows(root) == expected
    assert _polars_rows(root) == expected


def test_a_table_on_s3_is_read_from_its_checkpoint_and_the_names_after_it(tmp_path, s3_prefix, s3_options):
    """On S3 the start lists only the names after the checkpoint's (ListObjectsV2 StartAfter); every entry is a
    PUT with If-None-Match: *."""
    from filesink.destination.delta import storage_options

    out = s3_prefix + "/t"
    delta_options = storage_options(s3_options)
    deltalake.DeltaTable.create(
        out,
        schema=SCHEMA,
        partition_by=["day"],
        configuration={"delta.checkpointInterval": "2"},
        storage_options=delta_options,
    )
    dest = open_destination(
        table_options("delta"), output=OutputLocation(out, s3_options), sink_id="s1", partition_by=("day",)
    )
    assert isinstance(dest, DeltaDestination)
    staging = tmp_path / "files"
    expected = Counter()
    for epoch in range(5):
        rows = _epoch_rows(epoch)
        plan, written = _file(staging, f"part-{epoch:05d}", rows, dict.fromkeys(range(VNODES), epoch), epoch)
        for obj in written[plan.name]:
            dest._log.storage.fs.put_file(str(staging / obj.key), f"{out}/{obj.key}")
        dest.make_visible([plan], written, SCHEMA)
        dest.maintain()
        dest.settle()
        expected += Counter(rows)
    assert dest.delta_rs is None
    assert dest._log._listed(4) == [
        f"{4:020d}.checkpoint.parquet",
        f"{4:020d}.json",
        f"{5:020d}.json",
        "_last_checkpoint",
    ]
    fresh = open_destination(
        table_options("delta"), output=OutputLocation(out, s3_options), sink_id="s1", partition_by=("day",)
    )
    assert isinstance(fresh, DeltaDestination)
    state = fresh._light("read")
    assert state is not None and (state.checkpoint, state.version) == (4, 5)
    assert state.txns == {f"s1-v{v}": 4 for v in range(VNODES)}
    table = deltalake.DeltaTable(out, storage_options=delta_options)
    assert table.version() == 5
    data = table.to_pyarrow_table(columns=SCHEMA.names)
    assert Counter(zip(*(data[c].to_pylist() for c in SCHEMA.names), strict=True)) == expected


# -- start-up without a listing, and checkpoints in the background ---------------------------------------------


def _table(root: Path, interval: int = 10, retention: str = "interval 30 days") -> None:
    deltalake.DeltaTable.create(
        str(root),
        schema=SCHEMA,
        partition_by=["day"],
        configuration={"delta.checkpointInterval": str(interval), "delta.logRetentionDuration": retention},
    )


def _listings(monkeypatch: pytest.MonkeyPatch) -> list[int | None]:
    """Record the log's listings (their starting version)."""
    seen: list[int | None] = []
    listed = DeltaLog._listed

    def spy(self: DeltaLog, since: int | None) -> list[str]:
        seen.append(since)
        return listed(self, since)

    monkeypatch.setattr(DeltaLog, "_listed", spy)
    return seen


def _hint(log: Path, version: int) -> None:
    (log / "_last_checkpoint").write_text(json.dumps({"version": version, "size": 1}))


def _wanted(root: Path, sinks: tuple[str, ...] = ("s1",)) -> dict[str, int]:
    table = deltalake.DeltaTable(str(root))
    return {f"{s}-v{v}": table.transaction_version(f"{s}-v{v}") for s in sinks for v in range(VNODES)}


def test_retention_is_read_as_delta_writes_it():
    from filesink.destination.delta_log import DEFAULT_RETENTION, retention

    assert retention({}) == DEFAULT_RETENTION == 30 * 86400
    assert retention({"delta.logRetentionDuration": "interval 30 days"}) == 30 * 86400
    assert retention({"delta.logRetentionDuration": "interval 1 week 2 hours"}) == 7 * 86400 + 7200
    assert retention({"delta.logRetentionDuration": "interval 0 seconds"}) == 0
    assert retention({"delta.logRetentionDuration": "30 days"}) == 30 * 86400
    assert retention({"delta.logRetentionDuration": "interval 2 fortnights"}) == 0, "unknown: nothing is safe"


def test_a_start_reads_on_from_the_hint_without_listing_the_log(tmp_path, monkeypatch):
    """The hint names the newest checkpoint, or an older one (a writer died between its checkpoint and the hint):
    either way the start reads on from it, entry after entry, and lists nothing."""
    root = tmp_path / "t"
    _table(root)
    dest = _destination(root)
    expected = Counter()
    for epoch in range(25):
        expected += _commit(dest, root, epoch)
    log = root / "_delta_log"
    assert json.loads((log / "_last_checkpoint").read_text())["version"] == 20
    listings = _listings(monkeypatch)
    state = _destination(root)._light("read")
    assert state is not None and (state.checkpoint, state.version) == (20, 25) and state.txns == _wanted(root)
    _hint(log, 10)  # behind the newest checkpoint, with every entry still there: read on from 10
    fresh = _destination(root)
    state = fresh._light("read")
    assert state is not None and (state.checkpoint, state.version) == (10, 25) and state.txns == _wanted(root)
    assert listings == [], "neither start listed the log"
    expected += _commit(fresh, root, 25)
    assert deltalake.DeltaTable(str(root)).version() == 26
    assert _rows(root) == expected


def test_a_clean_up_during_the_start_is_followed_to_the_newer_checkpoint(tmp_path, monkeypatch):
    """The start reads the hint (10), then a clean-up after checkpoint 20 removes entries 11 to 19: the start finds
    11 absent, reads the hint again, and reads from checkpoint 20 on, without a listing."""
    root = tmp_path / "t"
    _table(root)
    dest = _destination(root)
    expected = Counter()
    for epoch in range(23):
        expected += _commit(dest, root, epoch)
    log = root / "_delta_log"
    for v in range(11, 20):
        (log / entry_name(v)).unlink()  # what the clean-up removed (the checkpoint at 10 not yet)
    listings = _listings(monkeypatch)
    fresh = _destination(root)
    hints = iter([(10, None)])
    read_hint = DeltaLog._last_checkpoint
    monkeypatch.setattr(fresh._log, "_last_checkpoint", lambda: next(hints, None) or read_hint(fresh._log))
    state = fresh._light("read")
    assert state is not None and (state.checkpoint, state.version) == (20, 23)
    assert state.txns == {f"s1-v{v}": 22 for v in range(VNODES)}
    assert listings == []
    expected += _commit(fresh, root, 23)
    assert deltalake.DeltaTable(str(root)).version() == 24 and (log / entry_name(24)).exists()
    assert _rows(root) == expected


def test_a_hint_set_back_behind_a_clean_up_is_listed_where_the_entries_are_old(tmp_path, monkeypatch):
    """A writer set the hint back to 10 after a clean-up after checkpoint 20 removed entries 11 to 19 (checkpoint 10
    kept): reading on from 10 ends at 10, the hint says nothing newer, but entry 10 is older than the retention, so
    a later one may have been cleaned up: the log is listed, and read from checkpoint 20."""
    root = tmp_path / "t"
    _table(root)
    dest = _destination(root)
    for epoch in range(23):
        _commit(dest, root, epoch)
    log = root / "_delta_log"
    for v in range(11, 20):
        (log / entry_name(v)).unlink()
    _hint(log, 10)
    listings = _listings(monkeypatch)
    young = _destination(root)._light("read")
    assert young is not None and young.version == 10, "young entries: the protocol's clean-ups cannot have made a gap"
    assert listings == []
    old = time.time() - 40 * 86400
    for path in log.iterdir():
        os.utime(path, (old, old))
    fresh = _destination(root)
    state = fresh._light("read")
    assert listings == [10]
    assert state is not None and (state.checkpoint, state.version) == (20, 23)
    assert state.txns == {f"s1-v{v}": 22 for v in range(VNODES)}


def test_an_idle_sink_reads_the_log_again_after_the_retention(tmp_path, monkeypatch):
    """A sink whose state's end was seen longer ago than the retention reads the log again before its commit (the
    hint could have been set back since a clean-up); a busy one only reads on."""
    root = tmp_path / "t"
    _table(root)
    dest = _destination(root)
    expected = Counter()
    for epoch in range(3):
        expected += _commit(dest, root, epoch)
    loads: list[int] = []
    load = DeltaLog.load

    def spy(self: DeltaLog):  # type: ignore[no-untyped-def]
        loads.append(1)
        return load(self)

    monkeypatch.setattr(DeltaLog, "load", spy)
    expected += _commit(dest, root, 3)
    assert loads == []
    assert dest._state is not None
    dest._state.ended_at = time.time() - 40 * 86400
    expected += _commit(dest, root, 4)
    assert loads == [1]
    assert dest._state is not None and dest._state.version == 5 and time.time() - dest._state.ended_at < 60
    assert _rows(root) == expected


def test_two_writers_racing_with_checkpoints_in_the_background(tmp_path):
    """Two sinks commit to one table at once, each from its own thread, with a checkpoint every 5 versions in the
    background: every file is in the table once, and a start agrees with delta-rs."""
    import threading

    root = tmp_path / "t"
    _table(root, interval=5)
    sinks = {name: _destination(root, name) for name in ("s1", "s2")}
    expected: dict[str, Counter] = {name: Counter() for name in sinks}
    errors: list[BaseException] = []

    def run(name: str) -> None:
        try:
            for epoch in range(15):
                expected[name] += _commit(sinks[name], root, epoch, f"part-{name}-{epoch:05d}")
        except BaseException as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(name,)) for name in sinks]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    assert all(d.settle(60) for d in sinks.values())
    table = deltalake.DeltaTable(str(root))
    assert table.version() == 30
    assert json.loads((root / "_delta_log" / "_last_checkpoint").read_text())["version"] >= 25
    assert _rows(root) == expected["s1"] + expected["s2"]
    state = _destination(root)._light("read")
    assert state is not None and state.version == 30 and state.txns == _wanted(root, ("s1", "s2"))
    assert set(state.txns.values()) == {14}


def test_a_checkpoint_runs_off_the_roll_and_is_waited_for_by_settle(tmp_path, monkeypatch):
    """The roll that reaches the interval starts the checkpoint and returns; later rolls do not wait for it, nor
    start another, until the next is due an interval later: that roll waits for it, then starts the next. settle
    waits for it too."""
    import threading

    root = tmp_path / "t"
    _table(root, interval=3)
    dest = _destination(root)
    for epoch in range(2):
        _commit(dest, root, epoch)
    entered, release = threading.Event(), threading.Event()
    started: list[int] = []
    checkpoint = deltalake.DeltaTable.create_checkpoint

    def slow(self):  # type: ignore[no-untyped-def]
        started.append(self.version())
        entered.set()
        assert release.wait(60)
        return checkpoint(self)

    monkeypatch.setattr(deltalake.DeltaTable, "create_checkpoint", slow)
    log = root / "_delta_log"

    def roll(epoch: int) -> float:
        plan, written = _file(root, f"part-{epoch:05d}", _epoch_rows(epoch), dict.fromkeys(range(VNODES), epoch), epoch)
        began = time.monotonic()
        dest.make_visible([plan], written, SCHEMA)
        dest.maintain()
        return time.monotonic() - began

    roll(2)  # version 3: the checkpoint starts
    assert entered.wait(60)
    assert [roll(e) < 5 for e in (3, 4)] == [True, True], "versions 4 and 5 do not wait for it"
    assert started == [3] and not (log / "_last_checkpoint").exists(), "one checkpoint, still running"
    assert not dest.settle(0.1), "still running"
    threading.Timer(0.5, release.set).start()
    assert roll(5) >= 0.4, "version 6: the next is due, and the roll waits for the one running"
    assert dest.settle(60)
    assert started == [3, 6]
    assert json.loads((log / "_last_checkpoint").read_text())["version"] == 6
    assert dest.checkpoint_took is not None and dest.checkpoint_took[0] == 6
    _commit(dest, root, 6)
    state = _destination(root)._light("read")
    assert state is not None and (state.checkpoint, state.version) == (6, 7) and state.txns == _wanted(root)


def test_a_checkpoint_that_hangs_is_waited_for_once_an_interval(tmp_path, monkeypatch):
    import threading

    from filesink.destination import delta

    monkeypatch.setattr(delta, "CHECKPOINT_WAIT", 0.3)
    root = tmp_path / "t"
    _table(root, interval=2)
    dest = _destination(root)
    _commit(dest, root, 0)
    entered, release = threading.Event(), threading.Event()
    checkpoint = deltalake.DeltaTable.create_checkpoint

    def hanging(self):  # type: ignore[no-untyped-def]
        entered.set()
        assert release.wait(60)
        return checkpoint(self)

    monkeypatch.setattr(deltalake.DeltaTable, "create_checkpoint", hanging)

    def roll(epoch: int) -> float:
        plan, written = _file(root, f"part-{epoch:05d}", _epoch_rows(epoch), dict.fromkeys(range(VNODES), epoch), epoch)
        began = time.monotonic()
        dest.make_visible([plan], written, SCHEMA)
        dest.maintain()
        return time.monotonic() - began

    roll(1)  # version 2: the checkpoint starts, and hangs
    assert entered.wait(60)
    waits = [roll(e) >= 0.25 for e in range(2, 6)]  # versions 3 to 6
    assert waits == [False, True, False, True], "the roll at each next interval waits, and only that one"
    release.set()
    assert dest.settle(60)
    _commit(dest, root, 6)  # version 7: takes checkpoint 2's outcome, and checkpoints
    assert json.loads((root / "_delta_log" / "_last_checkpoint").read_text())["version"] == 7


def test_a_failed_background_checkpoint_is_logged_and_tried_again_later(tmp_path, monkeypatch, caplog):
    root = tmp_path / "t"
    _table(root, interval=2)
    dest = _destination(root)

    def failing(self):  # type: ignore[no-untyped-def]
        raise OSError("disk full")

    monkeypatch.setattr(deltalake.DeltaTable, "create_checkpoint", failing)
    expected = Counter()
    for epoch in range(3):
        expected += _commit(dest, root, epoch)
    assert "the checkpoint at version 2 failed (disk full)" in caplog.text
    assert dest._checkpoint_retry == 12, "tried again 10 versions later"
    monkeypatch.undo()
    for epoch in range(3, 12):
        expected += _commit(dest, root, epoch)
    assert json.loads((root / "_delta_log" / "_last_checkpoint").read_text())["version"] == 12
    assert _rows(root) == expected


def test_the_background_checkpoint_never_sets_the_hint_back(tmp_path, monkeypatch):
    """Another writer's checkpoint at or past the version the thread read is left as the newest."""
    root = tmp_path / "t"
    _table(root, interval=100)
    dest = _destination(root)
    for epoch in range(3):
        _commit(dest, root, epoch)
    made: list[int] = []
    monkeypatch.setattr(deltalake.DeltaTable, "create_checkpoint", lambda self: made.append(self.version()))
    monkeypatch.setattr(dest._log, "last_checkpoint", lambda: 40)
    dest._checkpoint(3, False)
    assert made == [] and dest._outcome == (40, False)
    monkeypatch.setattr(dest._log, "last_checkpoint", lambda: 2)
    dest._checkpoint(3, False)
    assert made == [3] and dest._outcome == (3, False)


def test_a_listing_that_missed_an_entry_created_meanwhile_is_listed_again(tmp_path, monkeypatch):
    """A listing of a local directory may miss an entry created while it runs and show the next: a gap, listed
    again; one that stays is a log this reader does not read."""
    root = tmp_path / "t"
    _table(root)
    dest = _destination(root)
    for epoch in range(5):
        _commit(dest, root, epoch)
    assert not (root / "_delta_log" / "_last_checkpoint").exists(), "no checkpoint yet: the start lists the log"
    listed = DeltaLog._listed
    missed = [1]

    def once(self: DeltaLog, since: int | None) -> list[str]:
        names = listed(self, since)
        if missed:
            missed.pop()
            names.remove(entry_name(3))
        return names

    monkeypatch.setattr(DeltaLog, "_listed", once)
    state = _destination(root)._light("read")
    assert state is not None and state.version == 5 and not missed
    monkeypatch.setattr(DeltaLog, "_listed", lambda self, since: [n for n in listed(self, since) if n != entry_name(3)])
    fresh = _destination(root)
    assert fresh._light("read") is None and fresh.delta_rs is not None and "a gap" in fresh.delta_rs
