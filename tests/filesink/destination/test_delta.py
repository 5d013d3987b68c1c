"""The Delta destination, through the sink without Spark: a roll's files committed once into a Delta table, with
per-vnode application transactions; recovery decides from the table alone; readers agree."""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pytest
from conformance import check_table
from sink_helpers import COLUMNS, append_epoch, batch_rows

from filesink import ExactlyOnceParquetSink, Rollover
from filesink.errors import TableFormatError

deltalake = pytest.importorskip("deltalake")

HOLD = Rollover(target_file_size=None, max_age_seconds=None, max_epochs=1000)
EVERY_2 = Rollover(target_file_size=None, max_age_seconds=None, max_epochs=2)


def _open(tmp_path: Path, out: str | None = None, **kwargs) -> ExactlyOnceParquetSink:
    options = {"vnodes": 8, "parallelism": 2, "rollover": HOLD, "table_format": "delta", **kwargs}
    return ExactlyOnceParquetSink(out or str(tmp_path / "table"), str(tmp_path / "state"), **options)


def table_rows(path: str, options: dict | None = None) -> Counter:
    from filesink.destination.delta import storage_options

    table = deltalake.DeltaTable(path, storage_options=storage_options(options or {}) or None)
    data = table.to_pyarrow_table(columns=COLUMNS)
    return Counter(zip(*(data[c].to_pylist() for c in COLUMNS), strict=True))


def _epochs(sink: ExactlyOnceParquetSink, epochs: range) -> Counter:
    expected: Counter = Counter()
    for epoch in epochs:
        rows = batch_rows(epoch, 40)
        append_epoch(sink, epoch, rows)
        expected.update(rows)
    return expected


def test_a_roll_is_one_commit_holding_its_files_and_the_marks(tmp_path):
    sink = _open(tmp_path, rollover=EVERY_2, partition_by=["event_date"])
    expected = Counter()
    for epoch in range(4):
        expected += _epochs(sink, range(epoch, epoch + 1))
        sink._roll(force=False)
    sink.close()
    table = deltalake.DeltaTable(str(tmp_path / "table"))
    assert table_rows(str(tmp_path / "table")) == expected
    # version 0 creates the table; then one commit per roll that wrote files (2 rolls of 2 epochs), not per batch
    assert table.version() == 2
    history = [h for h in table.history() if h.get("filesink.sink_id")]
    assert len(history) == 3  # the creation and the two rolls
    files = [h["filesink.files"].split(",") for h in history if "filesink.files" in h]
    assert [len(f) for f in files] == [2, 2]  # two writers, one file each per roll
    # the files the rollover rules wrote are the files the table holds, not rewritten: same paths, same sizes
    actions = pa.table(table.get_add_actions(flatten=True))
    on_disk = {
        p.relative_to(tmp_path / "table").as_posix(): p.stat().st_size
        for p in (tmp_path / "table").rglob("*.parquet")
        if "_delta_log" not in p.parts
    }
    assert dict(zip(actions["path"].to_pylist(), actions["size_bytes"].to_pylist(), strict=True)) == on_disk
    # partition values equal the directories, and a filter on them reads the right rows
    dates = {Path(p).parts[0] for p in on_disk}
    assert dates == {f"event_date={d}" for _, _, d, _ in expected}
    import polars as pl

    day = "2024-01-02"
    got = pl.scan_delta(str(tmp_path / "table")).filter(pl.col("event_date") == day).collect()
    assert Counter(got.select(COLUMNS).iter_rows()) == Counter(r for r in expected.elements() if r[2] == day)
    # per vnode, the table's mark is the epoch the vnode's files reach
    sink_id = history[0]["filesink.sink_id"]
    assert {table.transaction_version(f"{sink_id}-v{v}") for v in range(8)} == {3}
    check_table("delta", str(tmp_path / "table"))  # every entry conforms to the protocol; DuckDB reads the same rows


def test_a_commit_that_did_not_land_is_made_once_by_the_next_start(tmp_path, monkeypatch):
    from filesink.destination import delta
    from filesink.errors import TableCommitFailedError

    sink = _open(tmp_path, partition_by=["event_date"])
    expected = _epochs(sink, range(3))

    put = delta.DeltaLog.put

    def refuse(self, version, body):
        if version == 0:  # the table's creation goes through
            return put(self, version, body)
        raise OSError("the table's store refused the log entry")

    monkeypatch.setattr(delta.DeltaLog, "put", refuse)
    with pytest.raises(TableCommitFailedError, match="did not land"):
        sink.flush()
    monkeypatch.undo()
    sink.close()
    assert not (tmp_path / "table" / "_delta_log" / f"{1:020d}.json").exists()
    reopened = _open(tmp_path, partition_by=["event_date"])  # recovery: objects whole, not held: committed once
    reopened.close()
    assert table_rows(str(tmp_path / "table")) == expected
    again = _open(tmp_path, partition_by=["event_date"])
    again.close()
    assert deltalake.DeltaTable(str(tmp_path / "table")).version() == 1
    check_table("delta", str(tmp_path / "table"), duckdb=False)
    assert delta.app_id("x", 3) == "x-v3"


def test_a_commit_that_landed_is_not_made_again_even_when_its_files_are_gone(tmp_path, monkeypatch):
    """A user's compaction and vacuum can remove the files after the table held them: the table alone decides."""
    sink = _open(tmp_path)
    expected = _epochs(sink, range(3))
    from filesink.committer import ledger as ledger_module

    def crash(self, *args, **kwargs):
        raise RuntimeError("the driver died after the table's commit")

    monkeypatch.setattr(ledger_module.Ledger, "commit", crash)
    with pytest.raises(RuntimeError, match="driver died"):
        sink.flush()
    monkeypatch.undo()
    sink.close()
    table_dir = tmp_path / "table"
    assert table_rows(str(table_dir)) == expected
    for f in table_dir.glob("*.parquet"):  # what a compaction plus vacuum would leave: the table, no file of ours
        shutil.copy(f, tmp_path / f.name)
    reopened = _open(tmp_path)
    assert reopened.recovered.files and all(r.held for r in reopened.recovered.files)
    reopened.close()
    assert deltalake.DeltaTable(str(table_dir)).version() == 1, "committed once"
    assert table_rows(str(table_dir)) == expected
    check_table("delta", str(table_dir), duckdb=False)


def test_an_existing_table_with_other_columns_or_partitions_is_refused(tmp_path):
    other = tmp_path / "table"
    deltalake.write_deltalake(str(other), pa.table({"x": [1]}))
    sink = _open(tmp_path)
    with pytest.raises(TableFormatError, match="other columns"):
        _epochs(sink, range(1))
        sink.flush()
    sink.close()
    assert deltalake.DeltaTable(str(other)).version() == 0, "nothing committed to it"
    check_table("delta", str(other), duckdb=False)
    unpartitioned = tmp_path / "unpartitioned"
    deltalake.write_deltalake(str(unpartitioned), pa.table({"x": [1]}))
    with pytest.raises(TableFormatError, match="partitioned by"):  # refused at the start, before any state
        _open(tmp_path / "b", str(unpartitioned), partition_by=["event_date"]).close()
    assert not (tmp_path / "b" / "state").exists()


def test_table_options_are_checked_before_anything_is_written(tmp_path):
    with pytest.raises(TableFormatError, match="is not one of"):
        _open(tmp_path, table_format="hudi")
    with pytest.raises(TableFormatError, match="options of table_format='iceberg'"):
        _open(tmp_path, table="db.events")
    assert not (tmp_path / "state").exists() and not (tmp_path / "table").exists()


def test_the_table_format_is_kept_for_life(tmp_path):
    sink = _open(tmp_path)
    _epochs(sink, range(1))
    sink.close()
    with pytest.raises(Exception, match="table_format"):
        ExactlyOnceParquetSink(str(tmp_path / "table"), str(tmp_path / "state"), vnodes=8, rollover=HOLD).close()


def test_the_sink_closes_after_its_checkpoint_in_the_background(tmp_path, monkeypatch):
    """The roll that reaches the checkpoint interval starts the checkpoint in the background and returns; the sink's
    close waits for it."""
    import threading
    import time

    from filesink.destination import delta

    monkeypatch.setattr(delta, "CONFIGURATION", {**delta.CONFIGURATION, "delta.checkpointInterval": "2"})
    entered = threading.Event()
    checkpoint = deltalake.DeltaTable.create_checkpoint

    def slow(self):  # type: ignore[no-untyped-def]
        entered.set()
        time.sleep(0.5)
        return checkpoint(self)

    monkeypatch.setattr(deltalake.DeltaTable, "create_checkpoint", slow)
    sink = _open(tmp_path, rollover=EVERY_2)
    expected = Counter()
    for epoch in range(4):  # rolls at epochs 1 and 3: versions 1 and 2
        expected += _epochs(sink, range(epoch, epoch + 1))
        sink._roll(force=False)
    assert entered.wait(30), "the roll at version 2 started the checkpoint"
    hint = tmp_path / "table" / "_delta_log" / "_last_checkpoint"
    sink.close()
    assert json.loads(hint.read_text())["version"] == 2, "the close waited for the checkpoint"
    assert deltalake.DeltaTable(str(tmp_path / "table")).version() == 2
    assert table_rows(str(tmp_path / "table")) == expected
    check_table("delta", str(tmp_path / "table"), duckdb=False)  # the checkpoint and _last_checkpoint too


def test_a_table_on_s3(tmp_path, s3_prefix, s3_options):
    out = s3_prefix + "/table"
    sink = _open(tmp_path, out, storage_options=s3_options, partition_by=["event_date"])
    expected = _epochs(sink, range(3))
    sink.flush()
    assert sink._destination.delta_rs is None, "the sink's own writer commits on S3 (If-None-Match: *)"
    sink.close()
    assert table_rows(out, s3_options) == expected
    import polars as pl

    from filesink.destination.delta import storage_options

    got = pl.scan_delta(out, storage_options=storage_options(s3_options)).collect()
    assert Counter(got.select(COLUMNS).iter_rows()) == expected
    check_table("delta", out, options=s3_options)  # the log as the S3 server holds it


def test_statistics_are_taken_from_the_footers(tmp_path):
    sink = _open(tmp_path)
    expected = _epochs(sink, range(2))
    sink.flush()
    sink.close()
    table = deltalake.DeltaTable(str(tmp_path / "table"))
    actions = pa.table(table.get_add_actions(flatten=True)).to_pylist()
    assert sum(a["num_records"] for a in actions) == sum(expected.values())
    ids = [r[0] for r in expected.elements()]
    assert min(a["min.id"] for a in actions) == min(ids) and max(a["max.id"] for a in actions) == max(ids)
    assert json.dumps(actions[0]["null_count.amount"]) == "0"
    check_table("delta", str(tmp_path / "table"), duckdb=False)


def _durable(tmp_path: Path, state: str, table_format: str = "delta", **kwargs) -> ExactlyOnceParquetSink:
    """A sink whose log store (its durable home) is outside its state directory: the state can be lost."""
    options = {"vnodes": 8, "parallelism": 2, "rollover": HOLD, "partition_by": ["event_date"], **kwargs}
    if table_format == "iceberg":
        options["table"] = "db.events"
    return ExactlyOnceParquetSink(
        str(tmp_path / "table"),
        str(tmp_path / state),
        log_store=str(tmp_path / "durable" / "log"),
        table_format=table_format,
        **options,
    )


def _read(tmp_path: Path, table_format: str) -> Counter:
    if table_format == "delta":
        return table_rows(str(tmp_path / "table"))
    from pyiceberg.catalog.sql import SqlCatalog

    from filesink.destination.iceberg import CATALOG_NAME, EMBEDDED_CATALOG

    root = tmp_path / "table"
    catalog = SqlCatalog(CATALOG_NAME, uri=f"sqlite:///{root / EMBEDDED_CATALOG}", warehouse=f"file://{root}")
    data = catalog.load_table("db.events").scan(selected_fields=tuple(COLUMNS)).to_arrow()
    return Counter(zip(*(data[c].to_pylist() for c in COLUMNS), strict=True))


@pytest.mark.parametrize("table_format", ["delta", "iceberg"])
def test_a_paused_older_driver_never_commits_to_the_table(tmp_path, table_format):
    """Driver A pauses after writing a roll's files, before its table commit; driver B (another machine, a state
    rebuilt from the durable home) takes over, resolves A's files and goes on. When A wakes, its commit is refused
    by the term check: the table holds every row once."""
    if table_format == "iceberg":
        pytest.importorskip("pyiceberg")
    a = _durable(tmp_path, "state-a", table_format)
    expected = _epochs(a, range(3))
    paused = []

    def pause(self, files, written, schema):  # what A would do next, kept for when it wakes
        paused.append((files, written, schema))
        raise KeyboardInterrupt("paused")

    original = type(a._destination).make_visible
    type(a._destination).make_visible = pause
    try:
        with pytest.raises(KeyboardInterrupt):
            a.flush()
    finally:
        type(a._destination).make_visible = original
    b = _durable(tmp_path, "state-b", table_format, parallelism=3)  # rebuilt, rescaled
    expected += _epochs(b, range(3, 5))
    b.flush()
    b.close()
    from filesink.errors import FencedError

    with pytest.raises(FencedError):  # A wakes and goes on where it paused: the term check before the commit
        a._store.check_term("commit to the table")
    a._destination.make_visible(*paused[0])  # past the check (paused right after it): the table holds them already
    a._state_lock.release()
    a.log_store.close()
    assert _read(tmp_path, table_format) == expected
    check_table(table_format, str(tmp_path / "table"), duckdb=False)


@pytest.mark.parametrize("table_format", ["delta", "iceberg"])
def test_a_lost_state_directory_and_a_rescale_finish_the_table_exactly_once(tmp_path, table_format):
    """The driver dies after the table commit and before the state records it; its state directory is lost. A new
    driver with another parallelism rebuilds from the durable home, finds the files in the table, and goes on."""
    if table_format == "iceberg":
        pytest.importorskip("pyiceberg")
    from filesink.committer import ledger as ledger_module

    sink = _durable(tmp_path, "state-a", table_format)
    expected = _epochs(sink, range(3))
    commit = ledger_module.Ledger.commit

    def die(self, files, *args, **kwargs):
        if files:
            raise RuntimeError("the driver died after the table's commit")
        return commit(self, files, *args, **kwargs)

    ledger_module.Ledger.commit = die
    try:
        with pytest.raises(RuntimeError, match="driver died"):
            sink.flush()
    finally:
        ledger_module.Ledger.commit = commit
    sink._state_lock.release()
    sink.log_store.close()
    shutil.rmtree(tmp_path / "state-a")
    rebuilt = _durable(tmp_path, "state-b", table_format, parallelism=4)
    assert rebuilt.recovered.files and all(r.held for r in rebuilt.recovered.files)
    expected += _epochs(rebuilt, range(3, 6))
    rebuilt.flush()
    rebuilt.close()
    assert _read(tmp_path, table_format) == expected
    check_table(table_format, str(tmp_path / "table"), duckdb=False)


def _creations(path: str, options: dict | None = None) -> list[dict]:
    from filesink.destination.delta import storage_options

    history = deltalake.DeltaTable(path, storage_options=storage_options(options or {}) or None).history()
    return [h for h in history if h.get("operation") == "CREATE TABLE"]


def test_the_sink_writes_the_tables_creation_itself(tmp_path):
    """Version 0 is the sink's own conditional create, as delta-rs writes a new table's: readers take it."""
    sink = _open(tmp_path, partition_by=["event_date"])
    expected = _epochs(sink, range(2))
    sink.flush()
    sink.close()
    out = str(tmp_path / "table")
    [created] = _creations(out)
    assert created["version"] == 0 and created["engineInfo"] == "exactly-once-parquet-sink", created
    assert created["filesink.sink_id"] == sink._store.sink_id
    table = deltalake.DeltaTable(out)
    assert table.metadata().partition_columns == ["event_date"]
    assert table.metadata().configuration["delta.checkpointInterval"] == "100"
    assert table_rows(out) == expected
    import polars as pl

    assert Counter(pl.read_delta(out).select(COLUMNS).iter_rows()) == expected
    check_table("delta", out)  # the sink's version 0 conforms to the protocol; DuckDB reads the same rows


def test_a_lost_answer_to_the_tables_creation_creates_it_once(
    tmp_path, s3_prefix, s3_options, proxy_options, fault_proxy
):
    """The client's retry of the creation's PUT meets the version 0 its first request wrote: the sink reads it and
    commits at version 1 (delta-rs's own create wrote the creation again at version 1 there)."""
    out = s3_prefix + "/table"
    sink = _open(tmp_path, out, storage_options=proxy_options)
    expected = _epochs(sink, range(2))
    fault_proxy.inject("lost_response", "PutObject")  # the next PUT: version 0, the roll's first
    sink.flush()
    sink.close()
    assert fault_proxy.faults == {("lost_response", "PutObject"): 1}
    [created] = _creations(out, s3_options)  # read from the server itself, not through the proxy
    assert created["version"] == 0
    assert table_rows(out, s3_options) == expected
    from filesink.destination.delta import storage_options

    assert deltalake.DeltaTable(out, storage_options=storage_options(s3_options)).version() == 1
    check_table("delta", out, options=s3_options)
