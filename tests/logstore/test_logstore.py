"""Log store contract tests: each runs on local disk and on the S3 test server."""

from __future__ import annotations

import dataclasses
import multiprocessing
import os
import pickle
import random
from queue import Empty

import pyarrow as pa
import pytest
from helpers import expected_order, flatten, make_rows, random_rows

import logstore.storage
from logstore import (
    EpochNotSealedError,
    EpochOrderError,
    EpochSealedError,
    InvalidSegmentInputError,
    LogStore,
    SegmentMissingError,
    StateMismatchError,
    TruncatedRangeError,
    TruncateOrderError,
    append_segment,
    read_plan,
)
from logstore.home import is_home_record


def test_read_returns_sealed_rows_in_vnode_epoch_segment_row_order(open_store):
    store = open_store(vnodes=16)
    rng = random.Random(1)
    sealed = {}
    next_id = 0
    for epoch in range(3):
        segs = []
        for writer in ("a", "b", "c"):
            table = random_rows(rng, next_id, 200, 16)
            next_id += 200
            desc = append_segment(store.target, epoch, table, writer_id=f"task-{writer}")
            segs.append((desc, table))
        store.seal(epoch, [d for d, _ in segs])
        sealed[epoch] = [(d.name, t) for d, t in segs]

    got = flatten(store.read(range(0, 16), -1, 2))
    assert got == expected_order(sealed, range(0, 16))
    assert sorted(row[2] for row in got) == list(range(1800))

    window = flatten(store.read(range(3, 9), 0, 1))
    assert window == expected_order({1: sealed[1]}, range(3, 9))


def test_blocks_bound_the_rows_held_in_memory(open_store):
    store = open_store(vnodes=4)
    target = dataclasses.replace(store.target, max_block_bytes=2048)
    table = make_rows(range(5000), [i % 2 for i in range(5000)])
    desc = append_segment(target, 0, table, writer_id="w")
    store.seal(0, [desc])
    items = list(store.read(range(0, 4), -1, 0))
    assert len(items) > 20, "a vnode's rows must be split into several blocks"
    assert max(item.batch.nbytes for item in items) <= 4096
    assert flatten(items) == expected_order({0: [(desc.name, table)]}, range(0, 4))


def test_reading_a_plan_opens_each_local_segment_once_and_closes_it(open_store, monkeypatch):
    """A plan reads vnode after vnode across the same segments: each local segment is opened once (not once per
    vnode or block), no more than ``OPEN_FOR_READS`` stay open, and none is left open once the plan is read."""
    store = open_store(vnodes=16)
    rng = random.Random(3)
    sealed = {}
    for epoch in range(3):
        segs = []
        for writer in ("a", "b"):
            table = random_rows(rng, 1000 * (2 * epoch + len(segs)), 300, 16)
            segs.append((append_segment(store.target, epoch, table, writer_id=writer), table))
        store.seal(epoch, [d for d, _ in segs])
        sealed[epoch] = [(d.name, t) for d, t in segs]
    plan = store.plan_read(dict.fromkeys(range(16), -1), 2)
    assert len(plan) > 60, "every vnode's rows of every segment: one item each"
    opened: list[str] = []
    real_open = os.open

    def counting_open(path, flags, *args, **kwargs):
        opened.append(str(path))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", counting_open)
    segment_names = {d for epoch in sealed.values() for d, _ in epoch}
    copies = {name.replace("/", ".") for name in segment_names}  # the segment cache's (logstore.segment_cache)
    segment_names |= copies
    local = store.storage.display("x").startswith("/")  # object stores have no open files but the cache's copies

    def open_segments() -> int:
        return sum(1 for fd in os.listdir("/proc/self/fd") if _points_to(fd, segment_names))

    for keep_open in (logstore.storage.OPEN_FOR_READS, 4):
        monkeypatch.setattr(logstore.storage, "OPEN_FOR_READS", keep_open)
        opened.clear()
        got, most_open = [], 0
        for item in read_plan(store.storage, plan):
            got.append(item)
            most_open = max(most_open, open_segments())
        assert flatten(got) == expected_order(sealed, range(16))
        assert open_segments() == 0, "nothing is left open"
        if not local:
            assert len(opened) == len(set(opened)) <= 6, "each copy opened once per plan, at most"
            assert all(path.endswith(tuple(copies)) for path in opened), opened
        elif keep_open > 6:
            assert len(opened) == len(set(opened)) == 6, "each of the 6 segments opened once"
            assert most_open == 6
        else:
            assert len(set(opened)) == 6 and len(opened) > 6, "2 segments beyond the 4 kept open: opened per read"
            assert 1 <= most_open <= 5, "4 kept open, and the one being read"


def _points_to(fd: str, names: set[str]) -> bool:
    try:
        target = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return False
    return any(target.endswith(name) for name in names)


def test_read_range_reads_up_to_the_end_of_the_file(open_store):
    storage = open_store(vnodes=4).storage
    data = bytes(range(256)) * 40
    storage.write("segment", [data])
    ranges = [(0, 10), (5000, 300), (10230, 100), (7, 0)]  # the third runs past the end
    with storage.reading() as read:
        assert [read("segment", o, n) for o, n in ranges] == [data[o : o + n] for o, n in ranges]
        with pytest.raises(FileNotFoundError):
            read("gone", 0, 10)
    assert [storage.read_range("segment", o, n) for o, n in ranges] == [data[o : o + n] for o, n in ranges]


def test_empty_appends_and_empty_epochs(open_store):
    store = open_store(vnodes=4)
    assert append_segment(store.target, 0, make_rows([], [])) is None
    assert append_segment(store.target, 0, []) is None
    store.seal(0, [None])
    store.seal(1, [])
    assert store.last_sealed_epoch == 1
    assert store.sealed_epochs() == [0, 1]
    assert list(store.read(range(0, 4), -1, 1)) == []


def test_append_accepts_batches_and_chunked_tables(open_store):
    store = open_store(vnodes=8)
    t1 = make_rows(range(0, 50), [i % 8 for i in range(50)])
    t2 = make_rows(range(50, 80), [7 - i % 8 for i in range(30)])
    chunked = pa.concat_tables([t1, t2])
    d1 = append_segment(store.target, 0, chunked.to_batches(), writer_id="batches")
    d2 = append_segment(store.target, 0, chunked, writer_id="chunked")
    store.seal(0, [d1, d2])
    got = flatten(store.read(range(0, 8), -1, 0))
    assert got == expected_order({0: [(d1.name, chunked), (d2.name, chunked)]}, range(0, 8))


def test_backlog_counts_what_each_vnode_holds(open_store):
    store = open_store(vnodes=4)
    d0 = append_segment(store.target, 0, make_rows(range(6), [0, 0, 1, 1, 1, 3]))
    store.seal(0, [d0])
    d1 = append_segment(store.target, 1, make_rows(range(6, 8), [1, 3]))
    store.seal(1, [d1])
    store.truncate({3: 0})
    backlog = {b.vnode: b for b in store.backlog()}
    assert [(b.rows, b.epochs, b.first_epoch) for b in backlog.values()] == [
        (2, 1, 0),
        (4, 2, 0),
        (0, 0, None),
        (1, 1, 1),
    ]
    assert backlog[3].truncated_epoch == 0
    assert backlog[1].bytes == sum(r.bytes for d in (d0, d1) for r in d.runs if r.vnode == 1)
    assert backlog[0].first_sealed_at is not None and backlog[2].first_sealed_at is None


def _append_in_child(target, epoch, ids, vnodes, queue):
    queue.put(append_segment(target, epoch, make_rows(ids, vnodes), writer_id="child"))


def test_append_is_a_plain_picklable_function(open_store):
    """Spark tasks run append in other processes with only the pickled target."""
    store = open_store(vnodes=8)
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    ids = list(range(100))
    vnodes = [i * 7 % 8 for i in ids]
    proc = ctx.Process(target=_append_in_child, args=(store.target, 0, ids, vnodes, queue))
    proc.start()
    try:
        try:
            desc = queue.get(timeout=120)
        except Empty:
            pytest.fail(f"the child process sent no segment within 120 s (exit code {proc.exitcode})")
        proc.join(60)
        assert proc.exitcode == 0, f"the child's exit code: {proc.exitcode} (None: still running after 60 s)"
    finally:
        if proc.is_alive():  # a child left running would also hang the interpreter's exit (it joins children)
            proc.kill()
            proc.join(10)
    store.seal(0, [desc])
    assert sorted(r[2] for r in flatten(store.read(range(0, 8), -1, 0))) == ids


def test_seal_joins_an_outer_transaction(open_store):
    """The file sink seals inside its own transaction; a failure after seal rolls the seal back."""
    store = open_store(vnodes=4)
    desc = append_segment(store.target, 0, make_rows(range(10), [1] * 10))
    with pytest.raises(RuntimeError, match="later step failed"), store.db.atomic():
        store.seal(0, [desc])
        raise RuntimeError("later step failed")
    assert store.last_sealed_epoch == -1
    store.seal(0, [desc])
    assert len(flatten(store.read(range(0, 4), -1, 0))) == 10


# -- misuse is refused with a clear error, and nothing is lost ------------------------------------------


def _sealed_store(open_store, epochs=2, vnodes=4):
    store = open_store(vnodes=vnodes)
    tables = {}
    for epoch in range(epochs):
        table = make_rows(range(epoch * 10, epoch * 10 + 10), [i % vnodes for i in range(10)])
        desc = append_segment(store.target, epoch, table)
        store.seal(epoch, [desc])
        tables[epoch] = [(desc.name, table)]
    return store, tables


def test_appending_to_or_resealing_a_sealed_epoch_is_refused(open_store):
    store, tables = _sealed_store(open_store)
    with pytest.raises(EpochSealedError, match="epoch 1: it is already sealed"):
        store.append(1, make_rows([99], [0]))
    late = append_segment(store.target, 1, make_rows([99], [0]))
    with pytest.raises(EpochSealedError, match="cannot seal epoch 1"):
        store.seal(1, [late])
    assert flatten(store.read(range(0, 4), -1, 1)) == expected_order(tables, range(0, 4))


def test_sealing_below_the_last_sealed_epoch_is_refused(open_store):
    store, tables = _sealed_store(open_store, epochs=3)
    store.collect_garbage()
    with pytest.raises(EpochOrderError, match=r"epoch 0: epoch 2 is already sealed.*checkpoint"):
        store.seal(0, [])
    with pytest.raises(EpochOrderError):
        store.append(1, make_rows([1], [1]))
    assert store.last_sealed_epoch == 2
    assert flatten(store.read(range(0, 4), -1, 2)) == expected_order(tables, range(0, 4))


def test_reading_unsealed_or_truncated_ranges_is_refused(open_store):
    store, tables = _sealed_store(open_store)
    with pytest.raises(EpochNotSealedError, match=r"last sealed epoch .* is 1"):
        store.read(range(0, 4), -1, 2)
    store.truncate({2: 0})
    with pytest.raises(TruncatedRangeError, match="vnode 2 after epoch -1: truncated up to epoch 0"):
        store.read(range(0, 4), -1, 1)
    assert flatten(store.read(range(0, 2), -1, 1)) == expected_order(tables, range(0, 2))
    assert flatten(store.read(range(2, 3), 0, 1)) == expected_order({1: tables[1]}, range(2, 3))
    with pytest.raises(ValueError, match="contiguous"):
        store.read(range(0, 5), -1, 1)


def test_read_plans_take_per_vnode_starts_and_travel_without_the_database(open_store):
    store, tables = _sealed_store(open_store, epochs=3)
    store.truncate({1: 1})
    plan = pickle.loads(pickle.dumps(store.plan_read({0: -1, 1: 1}, 2)))
    got = flatten(read_plan(store.target.location.open(), plan))
    assert got == expected_order(tables, range(0, 1)) + expected_order({2: tables[2]}, range(1, 2))
    with pytest.raises(TruncatedRangeError, match="vnode 1 after epoch 0"):
        store.plan_read({1: 0}, 2)


def test_truncate_only_moves_forward_and_only_over_sealed_epochs(open_store):
    store, _ = _sealed_store(open_store)
    store.truncate({0: 1, 1: 0})
    with pytest.raises(TruncateOrderError, match="vnode 0 to epoch 0: it is already truncated to epoch 1"):
        store.truncate({0: 0})
    with pytest.raises(EpochNotSealedError, match="vnode 1 to epoch 5"):
        store.truncate({1: 5})
    with pytest.raises(ValueError, match="vnode 9"):
        store.truncate({9: 0})
    assert store.truncate_points() == {0: 1, 1: 0, 2: -1, 3: -1}


@pytest.mark.parametrize(
    ("table", "match"),
    [
        (pa.table({"id": [1, 2]}), "no vnode column '__vnode'"),
        (make_rows([1, 2], [0, 4]), "vnode 4 is outside 0..3"),
        (make_rows([1, 2], [-1, 0]), "vnode -1 is outside"),
        (pa.table({"id": [1], "__vnode": pa.array(["x"])}), "must be an integer"),
        (pa.table({"id": [1, 2], "__vnode": pa.array([1, None], pa.int32())}), "1 nulls"),
        (
            pa.table({"c": pa.array(["a"]).dictionary_encode(), "__vnode": pa.array([0], pa.int32())}),
            "column 'c' is dictionary-encoded",
        ),
    ],
)
def test_bad_rows_are_refused_before_anything_is_written(open_store, table, match):
    store = open_store(vnodes=4)
    with pytest.raises(InvalidSegmentInputError, match=match):
        append_segment(store.target, 0, table)
    assert [n for n, _ in store.storage.list_files() if not is_home_record(n)] == []


def test_bad_writer_ids_and_epochs_are_refused(open_store):
    store = open_store(vnodes=4)
    with pytest.raises(InvalidSegmentInputError, match=r"writer id '\.\./x'"):
        append_segment(store.target, 0, make_rows([1], [0]), writer_id="../x")
    with pytest.raises(InvalidSegmentInputError, match="epoch -1 is negative"):
        append_segment(store.target, -1, make_rows([1], [0]))


def test_seal_checks_each_descriptor(open_store):
    store = open_store(vnodes=4)
    d0 = append_segment(store.target, 0, make_rows([1], [0]))
    with pytest.raises(ValueError, match="appended for epoch 0"):
        store.seal(1, [d0])
    with pytest.raises(ValueError, match="listed twice"):
        store.seal(0, [d0, d0])
    gone = append_segment(store.target, 0, make_rows([2], [1]))
    store.storage.delete(gone.name)
    with pytest.raises(SegmentMissingError, match=rf"{gone.name}.*epoch 0, vnodes 1.*not in the log store"):
        store.seal(0, [d0, gone])
    assert store.last_sealed_epoch == -1
    store.seal(0, [d0])
    assert flatten(store.read(range(0, 4), -1, 0)) == [(0, 0, 1, "row-1row-1")]


def test_state_database_of_another_vnode_count_or_location_is_refused(open_store, tmp_path, log_url):
    store, _ = _sealed_store(open_store, vnodes=4)
    store.close()
    url, options = log_url
    with pytest.raises(StateMismatchError, match="created with 4 vnodes, not 8"):
        LogStore.open(tmp_path / "state", url, vnodes=8, storage_options=options)
    with pytest.raises(StateMismatchError, match="belongs to the log store at"):
        LogStore.open(tmp_path / "state", str(tmp_path / "elsewhere"), vnodes=4)
    reopened = LogStore.open(tmp_path / "state", url, storage_options=options)
    assert reopened.vnodes == 4 and reopened.last_sealed_epoch == 1
    reopened.close()


# -- truncation and garbage collection ---------------------------------------------------------------


def _files(store):
    return sorted(name for name, _ in store.storage.list_files() if not is_home_record(name))


def test_garbage_collection_deletes_only_what_no_vnode_needs(open_store):
    store = open_store(vnodes=2)
    d0 = append_segment(store.target, 0, make_rows([0, 1], [0, 1]))
    store.seal(0, [d0])
    d1a = append_segment(store.target, 1, make_rows([2], [0]))
    d1b = append_segment(store.target, 1, make_rows([3], [1]))
    store.seal(1, [d1a, d1b])
    store.truncate({0: 1})  # vnode 1 still needs both epochs
    report = store.collect_garbage()
    assert report.released_segments == 1  # d1a: only vnode 0, which moved past epoch 1
    assert _files(store) == sorted([d0.name, d1b.name])
    assert flatten(store.read(range(1, 2), -1, 1)) == [(1, 0, 1, "row-1row-1"), (1, 1, 3, "row-3")]

    store.truncate({1: 0})
    report = store.collect_garbage()
    assert (report.released_segments, report.epochs_pruned) == (1, 1)
    assert _files(store) == [d1b.name]
    assert store.sealed_epochs() == [1]

    store.truncate({1: 1})
    report = store.collect_garbage()
    assert (report.released_segments, report.epochs_pruned) == (1, 1)
    assert _files(store) == [] and store.segments() == [] and store.sealed_epochs() == []
    assert store.last_sealed_epoch == 1


def test_sweep_removes_unsealed_segments_but_spares_the_epoch_in_progress(open_store):
    store = open_store(vnodes=2)
    failed_attempt = append_segment(store.target, 0, make_rows([0], [0]), writer_id="attempt0")
    kept = append_segment(store.target, 0, make_rows([0], [0]), writer_id="attempt1")
    store.seal(0, [kept])
    in_progress = append_segment(store.target, 1, make_rows([1], [1]))
    store.storage.write("notes/readme.txt", [b"not the log store's"])

    before = _files(store)
    preview = store.preview_garbage(unsealed=False)
    assert (preview.orphan_segments, preview.bytes_freed) == (1, failed_attempt.size)
    assert _files(store) == before, "a preview deletes nothing"
    report = store.collect_garbage()
    assert report.orphan_segments == 1
    assert _files(store) == sorted([kept.name, in_progress.name, "notes/readme.txt"])
    assert failed_attempt.name not in _files(store)

    report = store.collect_garbage(unsealed=True)  # at start-up, when no append can be running
    assert report.orphan_segments == 1
    assert _files(store) == sorted([kept.name, "notes/readme.txt"])
    assert flatten(store.read(range(0, 2), -1, 0)) == [(0, 0, 0, "row-0")]


def test_state_stays_bounded_by_open_work(open_store, log_url):
    epochs = 300 if log_url[0].startswith("/") else 40
    store = open_store(vnodes=8)
    rng = random.Random(7)
    held_files, held_rows = [], []
    for epoch in range(epochs):
        descs = [append_segment(store.target, epoch, random_rows(rng, epoch * 100 + w * 50, 50, 8)) for w in range(2)]
        store.seal(epoch, descs)
        if epoch >= 2:
            store.truncate({v: epoch - 2 for v in range(8)})  # keep the last two epochs open
        store.collect_garbage(sweep=epoch % 10 == 0)
        held_files.append(len(store.segments()))
        held_rows.append(store.db.execute("SELECT COUNT(*) FROM log_segment_vnodes").fetchone()[0])
    assert max(held_files) <= 6
    assert max(held_rows) <= 6 * 8
    assert store.sealed_epochs() == [epochs - 2, epochs - 1]
    assert len(_files(store)) == 4
    assert sorted(r[2] for r in flatten(store.read(range(0, 8), epochs - 3, epochs - 1))) == list(
        range((epochs - 2) * 100, epochs * 100)
    )


def test_create_writes_a_new_file_only_once(open_store):
    """The conditional create behind the log store's claim: local disk (a hard link) and S3 (If-None-Match)."""
    storage = open_store(vnodes=4).storage
    assert storage.create("claims/one.json", b"first") is True
    assert storage.create("claims/one.json", b"second") is False, "an existing file is never replaced"
    assert storage.read_all("claims/one.json") == b"first"
    assert [n for n, _ in storage.list_files("claims")] == ["claims/one.json"], "no temp file is left"
