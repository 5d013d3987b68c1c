"""Damaged log segments: the sink and ``filesink recover apply`` stop, naming the segment, its epoch and vnodes and
the way out, before anything is deleted; ``recover apply --drop-damaged`` gives up exactly those rows, records
it (state database, durable home), and the sink goes on writing every other row exactly once."""

from __future__ import annotations

import json
import logging
import os
import shutil
import sys
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pytest
import run_server
from helpers import run
from sink_helpers import COLUMNS, TYPES, batch_rows, input_file, parquet_files, read_pyarrow, run_query

from filesink import ExactlyOnceParquetSink, Rollover
from filesink.cli.main import main
from filesink.errors import EXIT_DAMAGED, DamagedLogError
from filesink.schema.conform import file_schema_bytes
from logstore import VNODE_COLUMN, LogLocation, LogStore, read_plan
from logstore.failpoints import DIR_VAR, ENV_VAR, FailpointError, fired
from logstore.home import GIVEN_UP, given_up_path

HOLD = Rollover(target_file_size=None, max_age_seconds=None, max_epochs=1000)
VNODES = 8
VICTIM_VNODES = {1, 2}
"""The victim segment of each test holds the rows of these vnodes of its epoch (vnode = user_id % VNODES)."""


class Setup:
    """A sink's locations (local, or log store and output on the S3 test server) and how to open it."""

    def __init__(self, tmp_path: Path, where: str, request: pytest.FixtureRequest, monkeypatch) -> None:
        self.tmp = tmp_path
        self.state = tmp_path / "state"
        if where == "local":
            self.out, self.log, self.options = str(tmp_path / "out"), str(tmp_path / "log"), {}
            self.flags: list[str] = []
        else:
            s3 = request.getfixturevalue("s3_server")
            prefix = request.getfixturevalue("s3_prefix")
            self.out, self.log, self.options = prefix + "/out", prefix + "/log", s3.storage_options()
            self.flags = ["--endpoint-url", s3.endpoint, "--region", s3.region]
            monkeypatch.setenv("AWS_ACCESS_KEY_ID", s3.access_key)
            monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3.secret_key)

    def open(self, state: Path | None = None) -> ExactlyOnceParquetSink:
        return ExactlyOnceParquetSink(
            self.out,
            state or self.state,
            log_store=self.log,
            vnodes=VNODES,
            parallelism=2,
            rollover=HOLD,
            storage_options=self.options,
        )

    def recover(self, capsys, *args: str) -> tuple[int, str, str]:
        """``filesink recover ARGS --state-dir STATE`` in this process: exit code, stdout, stderr."""
        capsys.readouterr()
        code = main(["recover", *args, *self.flags])
        out, err = capsys.readouterr()
        return code, out, err

    def listing(self) -> list[tuple[str, int]]:
        """The log store's segment files (not the home's records or the writers' term), with their sizes."""
        return sorted((p, s) for p, s in storage(self).list_files() if p.endswith(".seg"))


def storage(setup: Setup):
    """The storage of the log store's location (its files, relative to it)."""
    return LogLocation(setup.log, setup.options).open()


def append(sink: ExactlyOnceParquetSink, epoch: int, parts: list[list[tuple]]) -> list[str]:
    """Append ``parts`` as one segment each for ``epoch`` and seal them (what the Spark append does, in this
    process); return the segments' names in the order of ``parts``."""
    store = sink.log_store
    names, descriptors = [], []
    for i, rows in enumerate(parts):
        columns = list(zip(*rows, strict=True))
        table = pa.table({c: pa.array(v, t) for c, v, t in zip(COLUMNS, columns, TYPES, strict=True)})
        table = table.append_column(VNODE_COLUMN, pa.array([u % VNODES for u in columns[1]], pa.int32()))
        d = store.append(epoch, table, writer_id=f"w{i}")
        assert d is not None
        descriptors.append(d)
        names.append(d.name)
    store.seal(epoch, descriptors)
    if sink.ledger.arrow_schema() is None:
        sink.ledger.record_schema("[]", file_schema_bytes(descriptors[0].schema_bytes))
    return names


def hold_epochs(setup: Setup, epochs: int = 4, victim_epoch: int = 1) -> tuple[Counter, Counter, str]:
    """A sink holding ``epochs`` epochs of 100 rows, each in two segments; returns every row, the rows of the
    victim segment (vnodes 1 and 2 of ``victim_epoch``) and its name."""
    sink = setup.open()
    everything: Counter = Counter()
    victim_rows: Counter = Counter()
    victim = ""
    for epoch in range(epochs):
        rows = batch_rows(epoch, 100, seed=11)
        inside = [r for r in rows if r[1] % VNODES in VICTIM_VNODES]
        names = append(sink, epoch, [inside, [r for r in rows if r not in inside]])
        everything.update(rows)
        if epoch == victim_epoch:
            victim_rows.update(inside)
            victim = names[0]
    sink.close()
    return everything, victim_rows, victim


@pytest.fixture(params=["local", "s3"])
def setup(tmp_path, request, monkeypatch):
    return Setup(tmp_path, request.param, request, monkeypatch)


def _state(setup: Setup) -> list[str]:
    return ["--state-dir", str(setup.state)]


def test_a_missing_segment_stops_everything_until_it_is_given_up_then_every_other_row_is_written_once(
    setup, capsys, caplog
):
    everything, victim_rows, victim = hold_epochs(setup)
    assert len(victim_rows) > 0
    storage(setup).delete(victim)
    before = setup.listing()

    # The sink refuses to start, naming the segment, its epoch and vnodes and the way out; nothing is deleted.
    with pytest.raises(DamagedLogError) as refused:
        setup.open()
    message = str(refused.value)
    assert victim in message and "epoch 1" in message and "vnodes 1, 2" in message, message
    assert f"{sum(victim_rows.values())} rows" in message and "missing" in message, message
    assert "--drop-damaged" in message and "restore" in message.lower(), message
    assert refused.value.exit_code == EXIT_DAMAGED == 5
    assert setup.listing() == before, "a refused start deletes nothing"

    # status and plan report it; apply without the flag exits 5 and gives nothing up.
    code, out, _ = setup.recover(capsys, "status", *_state(setup), "--json")
    assert code == 0
    status = json.loads(out)
    [damaged] = status["damaged_segments"]
    assert (damaged["segment"], damaged["epoch"], damaged["vnodes"]) == (victim, 1, [1, 2])
    assert damaged["rows"] == sum(victim_rows.values()) and status["given_up"] == []
    code, out, _ = setup.recover(capsys, "plan", *_state(setup))
    assert code == 0 and "DAMAGED log segments the sink still needs: 1" in out and "--drop-damaged" in out, out
    code, _, err = setup.recover(capsys, "apply", *_state(setup))
    assert code == EXIT_DAMAGED, err
    assert victim in err and "epoch 1" in err and "--drop-damaged" in err, err
    assert setup.listing() == before, "a refused apply deletes nothing"
    code, out, _ = setup.recover(capsys, "status", *_state(setup), "--json")
    assert json.loads(out)["given_up"] == []

    # --drop-damaged gives up exactly that (epoch, vnodes) slice, and says so.
    with caplog.at_level(logging.WARNING):
        code, out, err = setup.recover(capsys, "apply", *_state(setup), "--drop-damaged", "--json")
    assert code == 0, err
    [given] = json.loads(out)["given_up"]
    assert (given["segment"], given["epoch"], given["vnodes"], given["rows"]) == (
        victim,
        1,
        [1, 2],
        sum(victim_rows.values()),
    )
    assert any("gave up the damaged segment" in r.getMessage() and victim in r.getMessage() for r in caplog.records)
    home = storage(setup)
    record = json.loads(home.read_all(given_up_path(1, victim)))
    per_vnode = Counter(r[1] % VNODES for r in victim_rows.elements())
    assert record["vnodes"] == [[v, per_vnode[v]] for v in sorted(VICTIM_VNODES)], record

    # Idempotent: again, nothing to give up, nothing to do.
    code, out, err = setup.recover(capsys, "apply", *_state(setup), "--drop-damaged", "--json")
    assert code == 0, err
    again = json.loads(out)
    assert again["given_up"] == [] and again["damaged_segments"] == [] and again["nothing_to_do"], again

    # From then on status shows what was given up; the sink starts, says so once, and writes every other row.
    code, out, _ = setup.recover(capsys, "status", *_state(setup))
    assert code == 0 and "damaged log segments given up so far (`--drop-damaged`): 1" in out, out
    assert "log segments: all verified" in out
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="filesink.sink"):
        sink = setup.open()
    said = [r.getMessage() for r in caplog.records if r.name == "filesink.sink"]
    assert len(said) == 1 and "1 damaged log segment was given up" in said[0] and "epoch 1 vnodes 1, 2" in said[0]
    assert [g.segment for g in sink.given_up] == [victim]
    sink.flush()
    sink.close()
    assert read_pyarrow(setup.out, setup.options) == everything - victim_rows


def test_a_given_up_segment_never_comes_back_even_when_its_file_is_restored(tmp_path, capsys, request, monkeypatch):
    """Given up is for good: a restored file is garbage (the sweep deletes it), and a state rebuilt from the
    durable home neither reads it nor forgets what was given up."""
    setup = Setup(tmp_path, "local", request, monkeypatch)
    everything, victim_rows, victim = hold_epochs(setup)
    files = storage(setup)
    saved = files.read_all(victim)
    files.delete(victim)
    code, _, err = setup.recover(capsys, "apply", *_state(setup), "--drop-damaged")
    assert code == 0, err

    files.put(victim, saved)  # the backup turns up after all
    shutil.rmtree(setup.state)  # and the driver's machine is lost: rebuild from the home
    code, out, err = setup.recover(capsys, "status", "--log-store", setup.log, "--json")
    assert code == 0, err
    status = json.loads(out)
    assert [g["segment"] for g in status["given_up"]] == [victim] and status["damaged_segments"] == []
    assert status["backlog"]["rows"] == sum(everything.values()) - sum(victim_rows.values())

    sink = setup.open(tmp_path / "state-new")
    assert sink.log_store.rebuilt
    assert victim not in sink.log_store.segments(1)
    assert [g.segment for g in sink.log_store.given_up()] == [victim]
    assert victim not in dict(files.list_files()), "the restored file is garbage: start-up's sweep deleted it"
    sink.flush()
    sink.close()
    assert read_pyarrow(setup.out, setup.options) == everything - victim_rows


def _flip(storage, name: str, offset: int) -> None:
    data = bytearray(storage.read_all(name))
    data[offset] ^= 0x40
    storage.put(name, bytes(data))


def test_changed_bytes_stop_the_roll_then_apply_finds_them_and_drop_damaged_gives_them_up(
    tmp_path, capsys, request, monkeypatch
):
    """A flipped byte keeps the size: the start's listing cannot see it, the roll's read does (and names it, not a
    raw traceback); ``recover apply`` reads every needed segment, so it exits 5 until ``--drop-damaged``."""
    setup = Setup(tmp_path, "local", request, monkeypatch)
    everything, victim_rows, victim = hold_epochs(setup, victim_epoch=2)
    files = storage(setup)
    _flip(files, victim, 40)
    sink = setup.open()  # the size is right: start-up's listing finds nothing
    with pytest.raises(DamagedLogError) as stopped:
        sink.flush()
    message = str(stopped.value)
    assert victim in message and "epoch 2" in message and "checksum mismatch" in message, message
    assert "--drop-damaged" in message and "resolved by recovery at the next start" in message, message
    assert parquet_files(setup.out) == [], "no file of the failed roll is visible"
    sink.close()

    code, _, err = setup.recover(capsys, "apply", *_state(setup), "--no-verify")
    assert code == 0, "listing only: the changed bytes are not seen (the files the roll pre-committed are dropped)"
    code, _, err = setup.recover(capsys, "apply", *_state(setup))
    assert code == EXIT_DAMAGED and victim in err and "checksum mismatch" in err, err
    code, out, err = setup.recover(capsys, "apply", *_state(setup), "--drop-damaged")
    assert code == 0, err
    assert "damaged log segments given up now (`--drop-damaged`): 1" in out, out
    sink = setup.open()
    sink.flush()
    sink.close()
    assert read_pyarrow(setup.out, setup.options) == everything - victim_rows


def test_a_segment_lost_while_the_sink_runs_stops_its_roll_before_the_pre_commit(tmp_path, request, monkeypatch):
    setup = Setup(tmp_path, "local", request, monkeypatch)
    sink = setup.open()
    names = append(sink, 0, [batch_rows(0, 50, seed=3)])
    storage(setup).delete(names[0])
    with pytest.raises(DamagedLogError, match=rf"{names[0]} \(epoch 0, vnodes .*missing.*--drop-damaged"):
        sink.flush()
    assert sink.ledger.pending_names() == [], "refused before the pre-commit"
    assert sink.log_store.segments(0) == names, "nothing was given up or deleted"
    sink.close()


def test_drop_damaged_is_refused_while_a_live_query_holds_the_sink(tmp_path, capsys, request, monkeypatch):
    setup = Setup(tmp_path, "local", request, monkeypatch)
    _, _, victim = hold_epochs(setup, epochs=2)
    storage(setup).delete(victim)
    from filesink.lock import StateLock

    lock = StateLock(setup.state)  # what a live sink holds
    try:
        code, _, err = setup.recover(capsys, "apply", *_state(setup), "--drop-damaged")
    finally:
        lock.release()
    assert code == 3, err
    code, out, _ = setup.recover(capsys, "status", *_state(setup), "--json")
    assert json.loads(out)["given_up"] == [] and len(json.loads(out)["damaged_segments"]) == 1


@pytest.mark.parametrize("point", ["logstore.give_up.home_written", "logstore.give_up.before_commit"])
def test_drop_damaged_killed_half_way_and_run_again_ends_the_same(tmp_path, capsys, request, monkeypatch, point):
    setup = Setup(tmp_path, "local", request, monkeypatch)
    everything, victim_rows, victim = hold_epochs(setup)
    storage(setup).delete(victim)
    shared = tmp_path / "failpoints"
    shared.mkdir()
    args = [sys.executable, "-m", "recovery", "apply", *_state(setup), "--drop-damaged"]
    env = dict(os.environ, **{ENV_VAR: f"{point}=kill", DIR_VAR: str(shared)})
    killed = run(args, 120, f"recover apply with {point}=kill", env=env, capture_output=True, text=True)
    assert killed.returncode == -9, killed.stderr
    assert [name for name, _pid, _detail in fired(str(shared))] == [point]
    home = storage(setup)
    assert [p for p, _ in home.list_files(GIVEN_UP)] == [given_up_path(1, victim)], "the home records it first"

    # Run again (without the flag: the home's record is the operator's decision, and the start finishes it).
    code, _, err = setup.recover(capsys, "apply", *_state(setup), "--json")
    assert code == 0, err
    store = LogStore.open_existing(setup.state, readonly=True)
    try:
        [given] = store.given_up()
        assert (given.segment, given.epoch, given.vnodes, given.rows) == (victim, 1, [1, 2], sum(victim_rows.values()))
        assert victim not in store.segments(1)
    finally:
        store.close()
    sink = setup.open()
    sink.flush()
    sink.close()
    assert read_pyarrow(setup.out, setup.options) == everything - victim_rows


# -- a real Spark query, end to end -------------------------------------------------------------------------------


def _query(spark, sink: ExactlyOnceParquetSink, source: Path, checkpoint: Path) -> None:
    """An available-now run of a streaming query over ``source``, two files per micro-batch (two tasks, so two
    segments per epoch)."""
    error = run_query(spark, sink, source, checkpoint, files_per_batch=2)
    assert error is None, error


def _segment_rows(store: LogStore, name: str) -> dict[int, Counter]:
    """Per vnode, the rows a held segment holds (read back through the log store, before it is damaged)."""
    plan = store.plan_read(store.truncate_points(), store.last_sealed_epoch)
    rows: dict[int, Counter] = {}
    for batch in read_plan(store.storage, [item for item in plan if item.segment == name]):
        d = batch.batch.to_pydict()
        rows.setdefault(batch.vnode, Counter()).update(zip(*(d[c] for c in COLUMNS), strict=True))
    return rows


def _of(rows: dict[int, Counter], vnodes: list[int]) -> Counter:
    return sum((rows[v] for v in vnodes), Counter())


def _cli(*args: str) -> tuple[int, str, str]:
    done = run_server.filesink(args, 240)
    return done.returncode, done.stdout, done.stderr


@pytest.mark.timeout(600)
def test_a_spark_query_whose_held_segment_is_lost_resumes_after_drop_damaged_without_exactly_those_rows(
    spark, tmp_path
):
    source, checkpoint, state, out = tmp_path / "in", tmp_path / "checkpoint", tmp_path / "state", tmp_path / "out"
    expected: Counter = Counter()
    for i in range(6):  # three micro-batches of two files
        expected += input_file(source, i, rows=200)

    def open_sink() -> ExactlyOnceParquetSink:  # filesink run's defaults: 256 vnodes, all columns as the key
        return ExactlyOnceParquetSink(str(out), state, parallelism=2, rollover=HOLD)

    sink = open_sink()
    _query(spark, sink, source, checkpoint)
    store = sink.log_store
    assert store.last_sealed_epoch == 2 and store.held_totals().rows == 1200 and parquet_files(str(out)) == []
    victim = store.segments(1)[0]
    assert len(store.segments(1)) == 2, "two tasks, two segments: the victim is part of its epoch"
    victim_rows = _of(per_vnode := _segment_rows(store, victim), sorted(per_vnode))
    assert 0 < sum(victim_rows.values()) < 400
    sink.close()
    LogLocation(str(state / "log")).open().delete(victim)

    # The sink refuses to start; so does `filesink run` (before Spark starts), and `recover apply` exits 5.
    with pytest.raises(DamagedLogError, match=rf"{victim} \(epoch 1, vnodes .*missing.*--drop-damaged"):
        open_sink()
    run_args = ["run", "--input", str(source), "--output", str(out), "--state-dir", str(state)]
    run_args += ["--checkpoint", str(checkpoint), "--available-now", "--parallelism", "2"]
    code, _, err = _cli(*run_args)
    assert code == EXIT_DAMAGED and victim in err and "--drop-damaged" in err, err
    code, _, err = _cli("recover", "apply", "--state-dir", str(state))
    assert code == EXIT_DAMAGED and victim in err and "epoch 1" in err, err
    code, out_text, err = _cli("recover", "apply", "--state-dir", str(state), "--drop-damaged", "--json")
    assert code == 0, err
    [given] = json.loads(out_text)["given_up"]
    assert given["segment"] == victim and given["epoch"] == 1 and given["rows"] == sum(victim_rows.values())

    # The query resumes with two more micro-batches; then a segment of one of them gets a changed byte: the roll's
    # Spark write fails on it and the sink names it (not a raw Spark traceback).
    for i in range(6, 10):
        expected += input_file(source, i, rows=200)
    sink = open_sink()
    assert [g.segment for g in sink.given_up] == [victim]
    _query(spark, sink, source, checkpoint)
    assert sink.log_store.last_sealed_epoch == 4
    second = sink.log_store.segments(3)[1]
    second_rows = _segment_rows(sink.log_store, second)
    files = LogLocation(str(state / "log")).open()
    data = bytearray(files.read_all(second))
    data[20] ^= 0x01
    files.put(second, bytes(data))
    with pytest.raises(DamagedLogError) as stopped:
        sink.flush()
    message = str(stopped.value)
    assert second in message and "epoch 3" in message and "checksum mismatch" in message, message
    assert "--drop-damaged" in message, message
    sink.close()
    code, _, err = _cli("recover", "apply", "--state-dir", str(state))
    assert code == EXIT_DAMAGED and second in err, err
    code, _, err = _cli("recover", "apply", "--state-dir", str(state), "--drop-damaged")
    assert code == 0, err

    code, status, err = _cli("recover", "status", "--state-dir", str(state), "--json")
    assert code == 0, err
    first, given = json.loads(status)["given_up"]
    assert (first["segment"], given["segment"], given["epoch"]) == (victim, second, 3)
    # Only the vnodes still needed: a file of the failed roll that its other task made visible was committed.
    second_given = _of(second_rows, given["vnodes"])
    assert sum(second_given.values()) == given["rows"] > 0

    # `filesink run` says what was given up, and writes every other row exactly once.
    code, run_out, err = _cli(*run_args)
    assert code == 0, err
    assert "2 damaged log segments were given up" in run_out, run_out
    assert read_pyarrow(str(out)) == expected - victim_rows - second_given


def test_a_segment_whose_rows_a_visible_pending_file_holds_blocks_nothing(tmp_path, request, monkeypatch):
    """Only segments the sink still needs count: a file made visible before the crash is committed at the start,
    so the loss of a segment it was written from stops nothing and gives nothing up."""
    setup = Setup(tmp_path, "local", request, monkeypatch)
    everything, _, victim = hold_epochs(setup, epochs=3)
    sink = setup.open()
    monkeypatch.setattr("logstore.failpoints._hits", {})
    monkeypatch.setenv(ENV_VAR, "filesink.commit.before=raise")
    with pytest.raises(FailpointError, match=r"filesink\.commit\.before"):
        sink.flush()  # every file is visible, none committed
    monkeypatch.delenv(ENV_VAR)
    assert sink.ledger.pending_names()
    sink.close()
    storage(setup).delete(victim)

    sink = setup.open()  # recovery commits the visible files: nothing needs the segment any more
    assert sink.recovered is not None and {r.action.value for r in sink.recovered.files} == {"commit"}
    assert sink.recovered.damaged == [] and sink.given_up == []
    sink.close()
    assert read_pyarrow(setup.out, setup.options) == everything


def test_a_run_fenced_while_it_gives_up_leaves_no_record(tmp_path, request, monkeypatch):
    """A newer run that starts while ``--drop-damaged`` writes its records owns the sink: the fenced run's records
    are removed and its database is unchanged."""
    from logstore.errors import FencedError

    setup = Setup(tmp_path, "local", request, monkeypatch)
    _, _, victim = hold_epochs(setup, epochs=2)
    storage(setup).delete(victim)
    store = LogStore.open(setup.state, setup.log)
    store.term = store.home.newest_term()
    assert store.term is not None
    damaged = store.damaged(quick=True)
    assert [d.name for d in damaged] == [victim]
    write = store.home.write_given_up

    def write_then_newer_run_starts(record):
        write(record)
        store.home.take_term(store.term)

    monkeypatch.setattr(store.home, "write_given_up", write_then_newer_run_starts)
    with pytest.raises(FencedError):
        store.give_up(damaged)
    assert list(store.home.storage.list_files(GIVEN_UP)) == []
    assert store.given_up() == [] and victim in store.segments(1)
    store.close()


def test_a_truncated_segment_stops_the_start_and_a_damaged_footer_stops_nothing(tmp_path, capsys, request, monkeypatch):
    """What counts is what a read checks: the size and the CRC-32 of each block the seal recorded. A truncated file
    is found by the start's listing; a changed byte in another file's footer (never read: the seal recorded its
    blocks) gives up nothing, and its rows are written."""
    setup = Setup(tmp_path, "local", request, monkeypatch)
    everything, victim_rows, victim = hold_epochs(setup)
    store = LogStore.open_existing(setup.state, readonly=True)
    [footer_victim] = [n for n in store.segments(2) if n.rsplit("/", 1)[1].startswith("w1-")]
    store.close()
    files = storage(setup)
    data = files.read_all(victim)
    files.put(victim, data[: len(data) // 2])
    _flip(files, footer_victim, len(files.read_all(footer_victim)) - 20)

    with pytest.raises(DamagedLogError, match=rf"{victim} \(epoch 1, vnodes 1, 2\): \d+ bytes, sealed with \d+"):
        setup.open()
    code, out, _ = setup.recover(capsys, "status", *_state(setup), "--json")
    assert code == 0 and [d["segment"] for d in json.loads(out)["damaged_segments"]] == [victim]
    code, out, err = setup.recover(capsys, "apply", *_state(setup), "--drop-damaged", "--json")
    assert code == 0, err
    assert [g["segment"] for g in json.loads(out)["given_up"]] == [victim]
    sink = setup.open()
    sink.flush()
    sink.close()
    assert read_pyarrow(setup.out, setup.options) == everything - victim_rows
