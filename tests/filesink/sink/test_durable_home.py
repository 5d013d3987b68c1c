"""The sink survives the loss of its state directory when its log store (the durable home) outlives the driver:
a new state directory is rebuilt from the home, rows held and files pending are neither lost nor written twice.
And once a newer run started on the same home (split brain), an older one cannot seal, pre-commit, commit or
delete anything.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from helpers import SUPPORT, communicate, kill, support_env, wait_for_line
from sink_helpers import append_epoch, batch_rows, input_file, parquet_files, read_pyarrow, run_query

from filesink import ExactlyOnceParquetSink, FencedError, Rollover
from logstore.failpoints import ENV_VAR, FailpointError
from logstore.home import EPOCHS, FILES, TERMS

HOLD = Rollover(target_file_size=None, max_age_seconds=None, max_epochs=1000)


@pytest.fixture(params=["s3", "shared-disk"])
def home(request, tmp_path):
    """(output, log store location, storage options): on S3, or on a local directory outside the state directory
    (a durable volume that outlives the driver's machine)."""
    if request.param == "s3":
        prefix = request.getfixturevalue("s3_prefix")
        return prefix + "/out", prefix + "/log", request.getfixturevalue("s3_options")
    return str(tmp_path / "out"), str(tmp_path / "durable" / "log"), None


def _open(tmp_path: Path, home, state: str = "state", **kwargs) -> ExactlyOnceParquetSink:
    out, log, options = home
    kwargs.setdefault("rollover", HOLD)
    kwargs.setdefault("parallelism", 2)
    return ExactlyOnceParquetSink(out, tmp_path / state, log_store=log, vnodes=8, storage_options=options, **kwargs)


def _seal_epochs(sink: ExactlyOnceParquetSink, epochs: int, rows: int, *, seed: int) -> Counter:
    """Seal epochs ``0..epochs-1`` of ``rows`` rows each (held in the log store); return every row sealed."""
    expected: Counter = Counter()
    for epoch in range(epochs):
        batch = batch_rows(epoch, rows, seed=seed)
        expected.update(batch)
        append_epoch(sink, epoch, batch)
    return expected


def _home_files(sink: ExactlyOnceParquetSink, prefix: str) -> list[str]:
    return sorted(name for name, _ in sink.log_store.storage.list_files(prefix))


def test_a_query_whose_state_directory_is_lost_goes_on_from_the_durable_home(spark, tmp_path, home):
    """The measured loss: 3 batches held in the log store, the state directory lost, the query restarted with
    its checkpoint and 3 more files. Every row of the 6 batches is in the output once."""
    source = tmp_path / "input"
    expected: Counter = Counter()
    for b in range(3):
        expected += input_file(source, b)
    sink = _open(tmp_path, home)
    sink_id = sink.log_store.sink_id
    assert run_query(spark, sink, source, tmp_path / "checkpoint") is None
    assert sink.log_store.held_totals().rows == sum(expected.values()), "every row is held, none written"
    query_id = sink.ledger.query_id()
    sink.close()
    shutil.rmtree(tmp_path / "state")  # the driver's machine is gone, with its disk

    for b in range(3, 6):
        expected += input_file(source, b)
    again = _open(tmp_path, home)
    assert again.log_store.rebuilt and again.log_store.sink_id == sink_id
    assert again.log_store.last_sealed_epoch == 2
    assert again.log_store.held_totals().rows == 900
    assert again.ledger.query_id() == query_id, "the query id came back with the rebuild"
    assert run_query(spark, again, source, tmp_path / "checkpoint") is None
    again.flush()
    assert read_pyarrow(again.path, home[2]) == expected
    again.close()


@pytest.mark.parametrize("point", ["filesink.precommit.home_written", "filesink.write.after", "filesink.commit.after"])
def test_files_pending_when_the_state_was_lost_are_resolved_once(tmp_path, home, point):
    """A rollover dies at ``point`` and the state directory is lost: the rebuilt sink takes the pending files from
    the home and resolves them by visibility; every row ends up in the output exactly once."""
    sink = _open(tmp_path, home)
    expected = _seal_epochs(sink, 3, 120, seed=3)
    os.environ[ENV_VAR] = f"{point}=raise"
    try:
        with pytest.raises(FailpointError):
            sink.flush()
    finally:
        del os.environ[ENV_VAR]
    pending = _home_files(sink, FILES)
    assert len(pending) == (0 if point == "filesink.commit.after" else 2), pending
    sink._state_lock.release()  # the driver dies
    sink.log_store.close()
    shutil.rmtree(tmp_path / "state")

    again = _open(tmp_path, home, parallelism=3)
    assert again.log_store.rebuilt
    assert again.recovered is not None and len(again.recovered.from_home) == len(pending)
    assert again.ledger.pending_names() == [] and _home_files(again, FILES) == []
    again.flush()
    assert read_pyarrow(again.path, home[2]) == expected
    again.close()


def test_a_second_driver_fences_the_first_on_the_same_durable_home(tmp_path, home):
    """Split brain: two drivers with state directories of their own (another machine, or a state directory where
    locks do not hold) on one durable home. Once the newer one started, the older cannot seal, pre-commit,
    commit or delete; the output is exact."""
    old = _open(tmp_path, home, "state-old")
    expected: Counter = Counter()
    for epoch in range(2):
        rows = batch_rows(epoch, 100, seed=5)
        expected.update(rows)
        append_epoch(old, epoch, rows)

    new = _open(tmp_path, home, "state-new")  # started on another machine: rebuilt from the home
    assert new.log_store.rebuilt and new.term > old.term
    assert new.log_store.last_sealed_epoch == 1
    before = sorted(name for name, _ in new.log_store.storage.list_files())

    with pytest.raises(FencedError, match=r"cannot seal epoch 2.*term"):
        append_epoch(old, 2, batch_rows(2, 100, seed=5))
    assert old.log_store.last_sealed_epoch == 1, "the old driver sealed nothing"
    with pytest.raises(FencedError, match=r"cannot pre-commit"):
        old.flush()
    assert old.ledger.pending_names() == []
    with pytest.raises(FencedError):
        old.log_store.collect_garbage(sweep=True, unsealed=True)
    with pytest.raises(FencedError):
        old.ledger.commit([], {}, range(8), old.term)  # its commit of idle vnodes changes nothing either
    old._state_lock.release()
    old.log_store.close()

    after = sorted(name for name, _ in new.log_store.storage.list_files())
    assert [n for n in before if n not in after] == [], "the old driver deleted nothing"
    assert parquet_files(new.path, home[2]) == [], "the old driver wrote no file"
    view = new.log_store.home.view()  # the old driver's seal record of epoch 2 came after the newer run read the home
    assert [int(r["epoch"]) for r in view.epochs] == [0, 1] and view.stale_epochs in ([], [2]), view

    rows = batch_rows(2, 100, seed=6)  # the new driver's epoch 2 (Spark's replay of the batch)
    expected.update(rows)
    append_epoch(new, 2, rows)
    new.flush()
    assert read_pyarrow(new.path, home[2]) == expected
    new.close()


def test_the_durable_home_is_bounded_by_open_work(tmp_path, home):
    """Records are pruned with truncation: after many epochs written to files, the home holds the last sealed
    epoch's record, the newest terms and no pre-commit record."""
    sink = _open(tmp_path, home, rollover=Rollover(target_file_size=None, max_epochs=2, max_age_seconds=None))
    expected: Counter = Counter()
    for epoch in range(45):
        rows = batch_rows(epoch, 10, seed=9)
        expected.update(rows)
        append_epoch(sink, epoch, rows)
        sink._roll(force=False)
    sink.flush()
    sink.log_store.collect_garbage(sweep=True)
    epochs = _home_files(sink, EPOCHS)
    assert len(epochs) <= 2 and epochs[-1].rsplit("/", 1)[-1].startswith("00000000000000000044-"), epochs
    assert _home_files(sink, FILES) == []
    assert len(_home_files(sink, TERMS)) == 1
    assert read_pyarrow(sink.path, home[2]) == expected
    sink.close()


def test_a_sink_from_before_the_durable_home_makes_its_state_durable_at_its_next_start(tmp_path, home):
    """A sink whose log store has no ``home/`` yet (created by an earlier version): its next start writes the
    records of every epoch it holds, so a later loss of its state directory loses nothing."""
    sink = _open(tmp_path, home)
    expected = _seal_epochs(sink, 3, 80, seed=8)
    storage = sink.log_store.storage
    for name, _ in list(storage.list_files("home")):
        storage.delete(name)
    sink.close()

    again = _open(tmp_path, home)  # the upgraded sink's first start
    assert len(_home_files(again, EPOCHS)) == 3
    again.close()
    shutil.rmtree(tmp_path / "state")
    rebuilt = _open(tmp_path, home)
    assert rebuilt.log_store.rebuilt and rebuilt.log_store.held_totals().rows == 240
    rebuilt.flush()
    assert read_pyarrow(rebuilt.path, home[2]) == expected
    rebuilt.close()


def test_two_driver_processes_on_one_durable_home(tmp_path, home):
    """Split brain with two processes: the older driver (a subprocess, never stopped) cannot seal, pre-commit,
    commit or delete once the newer one started; the newer one's output is exact."""
    out, log, options = home
    env = support_env(SPLIT_BRAIN_S3=json.dumps(options or {}))
    old = subprocess.Popen(
        [sys.executable, str(SUPPORT / "split_brain_job.py"), out, log, str(tmp_path / "state-old")],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        wait_for_line(old, "ready\n", 240, "the older driver to seal epochs 0 and 1")
        new = _open(tmp_path, home, "state-new")
        assert new.log_store.rebuilt and new.log_store.last_sealed_epoch == 1
        segments = sorted(n for n, _ in new.log_store.storage.list_files() if n.endswith(".seg"))
        assert old.stdin is not None
        old.stdin.write("go\n")
        old.stdin.flush()
        lines, err = communicate(old, 240, "the older driver's attempts")
    finally:
        kill(old, group=True)
    assert old.returncode == 0, err[-3000:]
    assert lines.split("\n")[:5] == ["seal: fenced", "pre-commit: fenced", "commit: fenced", "sweep: fenced", "end"]
    kept = sorted(n for n, _ in new.log_store.storage.list_files() if n.endswith(".seg"))
    assert [n for n in segments if n not in kept] == [], "the older driver deleted none of the segments"
    assert parquet_files(out, options) == [], "the older driver wrote no file"

    expected = Counter(batch_rows(0, 100, seed=5)) + Counter(batch_rows(1, 100, seed=5))
    rows = batch_rows(2, 100, seed=6)
    expected.update(rows)
    append_epoch(new, 2, rows)
    new.flush()
    assert read_pyarrow(out, options) == expected
    new.close()


def test_a_batch_that_rolls_nothing_costs_one_record_and_one_term_check(tmp_path, monkeypatch):
    """Per batch that writes no file, the durable home costs the epoch's record and one term check (the seal's):
    on S3 each is a request. A commit that would change nothing (no file, no idle vnode behind) is skipped."""
    from logstore.home import DurableHome

    sink = _open(tmp_path, (str(tmp_path / "out"), str(tmp_path / "durable" / "log"), None))
    calls: Counter = Counter()
    for name in ("newest_term", "write", "create", "delete"):
        real = getattr(DurableHome, name)

        def counted(self, *args, _real=real, _name=name, **kwargs):
            calls[_name] += 1
            return _real(self, *args, **kwargs)

        monkeypatch.setattr(DurableHome, name, counted)
    for epoch in range(3):
        calls.clear()
        rows = [(100 * epoch + 2 * v + i, v, "2026-01-01", 1.0) for v in range(8) for i in range(2)]
        append_epoch(sink, epoch, rows)  # rows in every vnode: none idle
        sink._roll(force=False)
        assert dict(calls) == {"write": 1, "newest_term": 1} or (epoch == 0 and calls["write"] == 2), (epoch, calls)
    sink.close()
