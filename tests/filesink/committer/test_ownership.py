"""Ownership of a sink is one fact: the newest term record in the durable home, created only if absent. A run
that took an older term can never act again once a newer one exists (whatever it publishes or in which order),
a paused writer of an older run never publishes, a stale state directory neither wedges nor writes twice, and
``filesink recover apply`` does not take the sink from a run that is alive.

Each scenario was a silent loss, a duplicate or a wedge before ownership was one fact.
"""

from __future__ import annotations

import shutil
from collections import Counter
from pathlib import Path

import pytest
from sink_helpers import append_epoch, batch_rows, parquet_files, read_pyarrow

from filesink import ExactlyOnceParquetSink, FencedError, Rollover
from filesink.committer.ledger import Ledger
from filesink.output.objects import LocalObject
from logstore import StateDivergedError
from logstore.home import TERMS, DurableHome
from logstore.storage import LocalStorage
from recovery.cli import main as recover_main

HOLD = Rollover(target_file_size=None, max_age_seconds=None, max_epochs=1000)
PARTS = ("event_date",)


def _open(tmp_path: Path, state: str, *, partition_by: tuple[str, ...] = (), **kwargs) -> ExactlyOnceParquetSink:
    """A sink with a local output and a log store outside its state directory (a durable volume)."""
    kwargs.setdefault("rollover", HOLD)
    return ExactlyOnceParquetSink(
        str(tmp_path / "out"),
        tmp_path / state,
        log_store=str(tmp_path / "durable" / "log"),
        vnodes=8,
        parallelism=2,
        partition_by=list(partition_by),
        **kwargs,
    )


def _crash(sink: ExactlyOnceParquetSink) -> None:
    """The driver dies: its lock goes, nothing else happens."""
    sink._state_lock.release()
    sink.log_store.close()


def test_an_older_run_that_acts_after_a_newer_one_took_its_term_is_fenced(tmp_path, monkeypatch):
    """Run A takes term 2; before it goes on, run B takes term 3 and records its base. Earlier, A then published
    2 over 3, passed every check (equality with the pointer), sealed epochs no rebuild counted, and they were lost
    after A's state directory was lost. Now A's first seal is refused, and every batch ends in the output once."""
    first = _open(tmp_path, "state-a")
    first.close()

    new_term = Ledger.new_term
    newer: list[ExactlyOnceParquetSink] = []
    started = []

    def b_starts_right_after(self: Ledger, *args: object, **kwargs: object) -> int:
        term = new_term(self, *args, **kwargs)
        if not started:  # run A just took its term: run B starts on another machine before A goes on
            started.append(term)
            newer.append(_open(tmp_path, "state-b"))
            newer[0].close()
        return term

    monkeypatch.setattr(Ledger, "new_term", b_starts_right_after)
    checkpoint = 0  # the next batch id Spark runs: it moves past a batch only if the sink took it
    try:
        a: ExactlyOnceParquetSink | None = _open(tmp_path, "state-a")
    except FencedError as e:  # A finds B's term during its own start-up
        assert f"term {started[0] + 1}" in str(e), e
        a = None
    monkeypatch.setattr(Ledger, "new_term", new_term)
    assert newer and newer[0].term == started[0] + 1
    if a is not None:
        for epoch in range(2):
            try:
                append_epoch(a, epoch, batch_rows(epoch, 100, seed=11))
            except FencedError as e:
                assert f"term {newer[0].term}" in str(e), e
                break
            checkpoint = epoch + 1
        _crash(a)
    shutil.rmtree(tmp_path / "state-a")  # A's machine is gone

    c = _open(tmp_path, "state-c")  # rebuilt from the home
    for epoch in range(checkpoint, 3):  # the query goes on from its checkpoint (replaying what was refused)
        append_epoch(c, epoch, batch_rows(epoch, 100, seed=11))
    c.flush()
    expected = sum((Counter(batch_rows(e, 100, seed=11)) for e in range(3)), Counter())
    assert read_pyarrow(c.path) == expected, "every batch the query ran is in the output once"
    c.close()


def test_a_paused_local_writer_of_an_older_run_never_publishes(tmp_path, monkeypatch):
    """A's writer stages in A's state directory and pauses right before it publishes; B, from another state
    directory, rebuilds from the home, drops A's file (not visible) and writes its rows under another name. When
    A's writer resumes, it must not publish: earlier it did (B did not know A's staging place), duplicating rows."""
    (tmp_path / "out").mkdir()
    a = _open(tmp_path, "state-a")
    assert a.output.local_staging().is_relative_to(tmp_path / "state-a"), "A stages in its state directory"
    expected: Counter = Counter()
    for epoch in range(2):
        rows = batch_rows(epoch, 100, seed=12)
        expected.update(rows)
        append_epoch(a, epoch, rows)

    publish = LocalObject.publish
    newer: list[ExactlyOnceParquetSink] = []

    def b_runs_while_a_is_paused(self: LocalObject) -> None:
        if not newer:
            b = _open(tmp_path, "state-b")
            newer.append(b)
            assert b.recovered is not None and [r.action.value for r in b.recovered.files] == ["drop"] * 2
            b.flush()  # B writes the rows of A's dropped files under names of its own
            b.close()
        publish(self)

    monkeypatch.setattr(LocalObject, "publish", b_runs_while_a_is_paused)
    with pytest.raises(FencedError):
        a.flush()
    monkeypatch.setattr(LocalObject, "publish", publish)
    _crash(a)
    assert read_pyarrow(str(tmp_path / "out")) == expected, "every row once: A's writer published nothing"


def test_a_stale_state_directory_with_a_file_a_later_run_committed_neither_wedges_nor_rewrites(tmp_path):
    """A partitioned file pending in a state directory restored from a backup was committed by a later run, which
    then released its epochs in the home. Earlier, every start and `recover apply` failed (TruncatedRangeError):
    visible with no writer records meant "write again" from epochs gone. Now it is released, and nothing is
    written twice."""
    (tmp_path / "out").mkdir()
    a = _open(tmp_path, "state-a", partition_by=PARTS)
    expected: Counter = Counter()
    for epoch in range(3):
        rows = batch_rows(epoch, 120, seed=13)
        expected.update(rows)
        append_epoch(a, epoch, rows)
    a.close()
    a = _open(tmp_path, "state-a", partition_by=PARTS)
    files, _ = a._plan(force=True)
    a.ledger.precommit(files, a.term)
    _crash(a)
    shutil.copytree(tmp_path / "state-a", tmp_path / "backup")  # the backup holds the files as pending

    again = _open(tmp_path, "state-a", partition_by=PARTS)  # nothing visible: dropped, then written and committed
    again.flush()
    for epoch in range(3, 5):
        rows = batch_rows(epoch, 120, seed=13)
        expected.update(rows)
        append_epoch(again, epoch, rows)
    again.flush()
    again.log_store.collect_garbage(sweep=True)
    again.close()
    written = parquet_files(str(tmp_path / "out"))

    shutil.rmtree(tmp_path / "state-a")
    shutil.copytree(tmp_path / "backup", tmp_path / "state-a")  # the restored backup
    restored = _open(tmp_path, "state-a", partition_by=PARTS)
    assert restored.recovered is not None
    assert {r.action.value for r in restored.recovered.files} <= {"released", "drop"}, restored.recovered.files
    restored.flush()
    assert read_pyarrow(restored.path, None, PARTS) == expected
    assert parquet_files(str(tmp_path / "out")) == written, "nothing was written again"
    restored.close()


def test_recover_apply_refuses_while_a_run_of_the_sink_is_alive(tmp_path, capsys):
    """`recover apply --log-store` takes ownership like any run: it refuses (exit 3) while the owner showed it is
    alive, and goes on once it stopped cleanly."""
    a = _open(tmp_path, "state-a")
    append_epoch(a, 0, batch_rows(0, 50, seed=14))
    log = str(tmp_path / "durable" / "log")
    assert recover_main(["apply", "--log-store", log]) == 3
    err = capsys.readouterr().err
    assert f"writer term {a.term}" in err and "--owner-lease" in err and "Nothing of the sink was changed" in err, err
    assert DurableHome(a.log_store.storage).newest_term() == a.term, "the refused apply took no term"
    append_epoch(a, 1, batch_rows(1, 50, seed=14))  # the live run goes on
    a.close()
    assert recover_main(["apply", "--log-store", log]) == 0
    assert DurableHome(LocalStorage(tmp_path / "durable" / "log")).newest_term() == a.term + 1


def test_a_term_replaced_by_a_store_that_ignores_the_condition_is_refused(tmp_path):
    """Where a store ignores create-only-if-absent, two runs can take one term; the run whose record was replaced
    finds it at once, instead of both owning the sink."""
    storage = LocalStorage(tmp_path / "log")
    create = storage.create
    other = DurableHome(LocalStorage(tmp_path / "log"))

    def ignoring(relpath: str, data: bytes) -> bool:
        created = create(relpath, data)
        if relpath.startswith(TERMS):  # another run's create of the same term lands right after, and replaces it
            other.storage.put(relpath, data.replace(b'"nonce": "', b'"nonce": "x'))
        return created

    storage.create = ignoring  # type: ignore[method-assign]
    with pytest.raises(FencedError, match="two runs took writer term 1"):
        DurableHome(storage).take_term(0)


def test_a_state_that_adopted_an_epoch_the_newer_run_deleted_as_stale_is_refused(tmp_path):
    """A run adopts epoch 0 from a record of a fenced run; the newer run, which read the home before that record,
    records its base below it, deletes the record as stale and sweeps its segment. Earlier, the adopting state's
    next start took the epoch for one sealed before the durable home and recorded it again, naming a segment
    that was gone (simulation seed 33 of the chaos tier): the start then reported damage. Now it is refused as a
    diverged state, and an empty state directory rebuilds and runs every batch once."""
    a = _open(tmp_path, "state-a")
    append_epoch(a, 0, batch_rows(0, 60, seed=15))  # in this state, epoch 0 is sealed
    a.close()
    home = DurableHome(LocalStorage(tmp_path / "durable" / "log"))
    (record,) = home.names("home/epochs")
    newer = home.take_term(home.newest_term() or 0)  # the newer run read the home before epoch 0's record
    home.record_base(newer, -1)
    home.delete(record)  # not counted in its view: deleted as stale
    with pytest.raises(StateDivergedError, match=r"holds sealed epochs 0 .*does not count.*empty one"):
        _open(tmp_path, "state-a")
    assert home.names("home/epochs") == [], "the refused start recorded nothing"

    b = _open(tmp_path, "state-b")  # an empty state directory: rebuilt from the home, epoch 0 not sealed
    assert b.log_store.last_sealed_epoch == -1
    expected: Counter = Counter()
    for epoch in range(2):  # the query's checkpoint never passed batch 0: Spark runs it again
        rows = batch_rows(epoch, 60, seed=15)
        expected.update(rows)
        append_epoch(b, epoch, rows)
    b.flush()
    assert read_pyarrow(b.path) == expected
    b.close()
