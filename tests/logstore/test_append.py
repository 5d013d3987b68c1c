"""Append sorts and encodes rows group by group while a writer thread writes them: the file must hold the rows
of a stable sort by vnode, and errors on either side must leave no file and no thread."""

from __future__ import annotations

import errno
import random
import threading
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from helpers import COLUMN_KINDS, random_column

from logstore import AppendTarget, LogLocation, LogStore, append_segment, reorder, segment, storage
from logstore import append as append_module
from logstore.append import VNODE_COLUMN


def expected_rows(table: pa.Table) -> list[tuple[int, dict]]:
    """(vnode, row) in the order a segment must hold them: stable sort by vnode, vnode column dropped."""
    vnodes = table[VNODE_COLUMN].to_pylist()
    rows = table.drop_columns([VNODE_COLUMN]).to_pylist()
    return sorted(zip(vnodes, rows, strict=True), key=lambda r: r[0])


def file_rows(data: bytes) -> list[tuple[int, dict]]:
    """(vnode, row) in file order, from a segment file checked whole."""
    desc = segment.parse_file(data, where="test")
    schema = segment.decode_schema(desc.schema_bytes)
    out = []
    for vnode, block in segment.iter_blocks(desc.runs):
        batch = segment.decode_block(data[block.offset : block.offset + block.length], schema)
        out += [(vnode, row) for row in batch.to_pylist()]
    return out


def random_table(rng: random.Random, n: int, vnodes: int) -> pa.Table:
    """A random table, with nulls (none, some, most or all per column), skewed vnodes, sliced or chunked."""
    null_share = rng.choice([0.0, 0.05, 0.5, 0.95, 1.0])
    kinds = ["string", *rng.sample(COLUMN_KINDS, rng.randint(1, 5))]
    columns = {
        f"c{i}_{kind}": random_column(rng, kind, n, rng.choice([0.0, null_share])) for i, kind in enumerate(kinds)
    }
    hot = rng.random()  # share of rows on a few hot vnodes: long runs split over several groups
    columns[VNODE_COLUMN] = pa.array(
        [rng.randrange(min(vnodes, 3)) if rng.random() < hot else rng.randrange(vnodes) for _ in range(n)],
        rng.choice([pa.int32(), pa.int64(), pa.uint16()]),
    )
    table = pa.table(columns)
    shape = rng.choice(["plain", "sliced", "chunked"])
    if shape == "sliced":  # slices of arrays with nulls have an unknown null count until it is computed
        offset = rng.randrange(1, n)
        table = pa.concat_tables([table, table]).slice(offset, n)
    elif shape == "chunked":
        cuts = sorted(rng.sample(range(1, n), 3))
        table = pa.concat_tables([table.slice(a, b - a) for a, b in zip([0, *cuts], [*cuts, n], strict=True)])
    return table


@pytest.fixture
def groups_seen(monkeypatch):
    """Counts the groups the pipelined path sorts and encodes."""
    seen = []
    original = append_module._groups

    def counting(*args):
        for group in original(*args):
            seen.append(group[:2])
            yield group

    monkeypatch.setattr(append_module, "_groups", counting)
    return seen


@pytest.mark.parametrize("seed", range(40))
def test_pipelined_append_holds_the_rows_in_stable_vnode_order(tmp_path, monkeypatch, groups_seen, seed):
    rng = random.Random(seed)
    n = rng.choice([600, 2000, 5000])
    vnodes = rng.choice([2, 5, 32, 256])
    table = random_table(rng, n, vnodes)
    # Small groups and blocks so that every table is cut in many groups, and runs across groups.
    monkeypatch.setattr(append_module, "GROUP_BYTES", rng.choice([1, 500, 3_000]))
    # Variable-width columns taken in one pass, or in two with windows of one row to many.
    monkeypatch.setattr(reorder, "TWO_PASS_BYTES", rng.choice([0, 2_000, reorder.TWO_PASS_BYTES]))
    monkeypatch.setattr(reorder, "WINDOW_BYTES", rng.choice([1, 700, reorder.WINDOW_BYTES]))
    target = AppendTarget(LogLocation(str(tmp_path)), vnodes, "sink", max_block_bytes=rng.choice([500, 8_000, 2**20]))

    desc = append_segment(target, 3, table, writer_id="t")

    data = (tmp_path / desc.name).read_bytes()
    assert file_rows(data) == expected_rows(table)
    assert segment.parse_file(data, where="test") == desc
    assert max(b.length for _, b in segment.iter_blocks(desc.runs)) <= max(target.max_block_bytes * 2, 4096)
    assert len(groups_seen) > 1


@pytest.mark.parametrize("rows", [1, 7, 1000])
def test_small_and_sorted_inputs(tmp_path, rows):
    rng = random.Random(rows)
    table = pa.table(
        {"s": [f"v{i}" * (i % 5) for i in range(rows)], VNODE_COLUMN: [rng.randrange(8) for _ in range(rows)]}
    )
    target = AppendTarget(LogLocation(str(tmp_path)), 8, "sink")
    for data in (table, table.take(pc.sort_indices(table[VNODE_COLUMN])), table.select([VNODE_COLUMN])):
        desc = append_segment(target, 0, data)
        assert file_rows((tmp_path / desc.name).read_bytes()) == expected_rows(data)


def test_groups_of_the_default_kind_on_a_larger_table(tmp_path, monkeypatch, groups_seen):
    """Blocks of the default size, groups of about 1 MB (GROUP_BYTES is 8 MiB; this table is 3 MB)."""
    monkeypatch.setattr(append_module, "GROUP_BYTES", 1_000_000)
    rng = random.Random(7)
    n = 200_000
    table = pa.table(
        {
            "id": pa.array(range(n), pa.int64()),
            "event": pa.array(rng.choice(["click", "view", None, "add_to_cart"]) for _ in range(n)),
            VNODE_COLUMN: pa.array([rng.randrange(64) for _ in range(n)], pa.int32()),
        }
    )
    target = AppendTarget(LogLocation(str(tmp_path)), 64, "sink")
    desc = append_segment(target, 0, table)
    assert file_rows((tmp_path / desc.name).read_bytes()) == expected_rows(table)
    assert len(groups_seen) >= 3


def test_object_store_write_is_one_whole_body(monkeypatch):
    """fsspec storage joins the parts into one body for one PUT."""
    fsspec = pytest.importorskip("fsspec")
    monkeypatch.setattr(append_module, "GROUP_BYTES", 5_000)
    table = random_table(random.Random(99), 3000, 16)
    target = AppendTarget(LogLocation("memory://append-test/log"), 16, "sink", max_block_bytes=4000)
    desc = append_segment(target, 1, table)
    data = fsspec.filesystem("memory").cat_file(f"/append-test/log/{desc.name}")
    assert file_rows(data) == expected_rows(table)
    assert len(data) == desc.size


def test_rows_keep_their_input_order_within_a_vnode(tmp_path, monkeypatch):
    monkeypatch.setattr(append_module, "GROUP_BYTES", 1_000)
    rng = random.Random(5)
    vnode_of = [rng.randrange(4) for _ in range(3000)]
    table = pa.table({"i": list(range(3000)), VNODE_COLUMN: pa.array(vnode_of, pa.int32())})
    store = LogStore.open(tmp_path / "state", vnodes=4)
    try:
        target = AppendTarget(store.target.location, 4, store.sink_id, max_block_bytes=512)
        store.seal(0, [append_segment(target, 0, table)])
        got = [(item.vnode, i) for item in store.read(range(4), -1, 0) for i in item.batch.column("i").to_pylist()]
    finally:
        store.close()
    assert got == sorted(((v, i) for i, v in enumerate(vnode_of)), key=lambda r: r[0])


# -- errors on either side of the pipeline ---------------------------------------------------------------


def _files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


def _failing_table() -> pa.Table:
    rng = random.Random(3)
    return pa.table(
        {
            "s": pa.array(["x" * rng.randrange(50) for _ in range(20_000)]),
            VNODE_COLUMN: pa.array([rng.randrange(16) for _ in range(20_000)], pa.int32()),
        }
    )


def test_producer_error_removes_the_temp_file_and_stops_the_writer(tmp_path, monkeypatch):
    monkeypatch.setattr(append_module, "GROUP_BYTES", 20_000)
    monkeypatch.setattr(storage, "WRITE_CHUNK_BYTES", 1)  # hand every part to the writer at once
    calls = []
    original = segment.SegmentEncoder.block

    class Boom(Exception):
        pass

    def block(self, vnode, rows):
        calls.append(vnode)
        if len(calls) == 10:
            assert any(p.name.startswith(".") for p in tmp_path.rglob("*")), "the temp file is being written"
            raise Boom("serializing failed")
        return original(self, vnode, rows)

    monkeypatch.setattr(segment.SegmentEncoder, "block", block)
    threads = threading.active_count()
    target = AppendTarget(LogLocation(str(tmp_path)), 16, "sink", max_block_bytes=4096)
    with pytest.raises(Boom, match="serializing failed"):
        append_segment(target, 0, _failing_table())
    assert threading.active_count() == threads
    assert _files(tmp_path) == []


def test_writer_error_is_raised_in_the_caller_and_removes_the_temp_file(tmp_path, monkeypatch):
    monkeypatch.setattr(append_module, "GROUP_BYTES", 20_000)
    monkeypatch.setattr(storage, "WRITE_CHUNK_BYTES", 1)
    monkeypatch.setattr(storage, "SYNC_EVERY_BYTES", 1)  # the writer syncs after its first chunk, and fails
    produced = []
    original = segment.SegmentEncoder.block

    def block(self, vnode, rows):
        produced.append(vnode)
        return original(self, vnode, rows)

    error = OSError(errno.ENOSPC, "No space left on device")

    def fdatasync(fd):
        raise error

    table = _failing_table()
    target = AppendTarget(LogLocation(str(tmp_path)), 16, "sink", max_block_bytes=1024)
    complete = append_segment(target, 0, table)  # without failures, for its block count
    blocks = sum(len(r.blocks) for r in complete.runs)
    (tmp_path / complete.name).unlink()
    monkeypatch.setattr(segment.SegmentEncoder, "block", block)
    monkeypatch.setattr(storage, "_fdatasync", fdatasync)
    threads = threading.active_count()
    with pytest.raises(OSError) as raised:
        append_segment(target, 0, table)
    # the writer thread's own exception, as the cause of an error that names the segment and the epoch
    assert raised.value.__cause__ is error and raised.value.errno == error.errno
    assert "append to epoch" in str(raised.value) and ".seg" in str(raised.value)
    assert threading.active_count() == threads
    assert _files(tmp_path) == []
    assert len(produced) < min(50, blocks), "the producer stopped soon after the writer failed"


class _FailingFile:
    """A file whose ``write`` fails with ENOSPC once ``limit`` bytes are written."""

    def __init__(self, f, limit: int) -> None:
        self.f, self.limit, self.written = f, limit, 0

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.f.close()

    def write(self, data) -> int:
        size = memoryview(data).nbytes
        if self.written + size > self.limit:
            raise OSError(errno.ENOSPC, "No space left on device")
        self.written += size
        return self.f.write(data)

    def flush(self) -> None:
        self.f.flush()

    def fileno(self) -> int:
        return self.f.fileno()


def test_write_error_in_the_writer_thread(tmp_path, monkeypatch):
    real_open = open
    monkeypatch.setattr(storage, "open", lambda *a, **k: _FailingFile(real_open(*a, **k), 100_000), raising=False)
    threads = threading.active_count()
    target = AppendTarget(LogLocation(str(tmp_path)), 16, "sink", max_block_bytes=4096)
    with pytest.raises(OSError) as raised:
        append_segment(target, 0, _failing_table())
    assert raised.value.errno == errno.ENOSPC
    assert threading.active_count() == threads
    assert _files(tmp_path) == []


@pytest.mark.parametrize("bad", [None, 42, "text"])
def test_write_durable_refuses_parts_that_are_not_bytes(tmp_path, bad):
    threads = threading.active_count()
    with pytest.raises(TypeError):
        storage.write_durable(tmp_path / "d" / "f.seg", [b"abc", b"def" * 1000, bad, b"never"])
    assert threading.active_count() == threads
    assert _files(tmp_path) == []


def test_write_durable_writes_every_part_and_syncs(tmp_path, monkeypatch):
    monkeypatch.setattr(storage, "SYNC_EVERY_BYTES", 10_000)
    monkeypatch.setattr(storage, "WRITE_CHUNK_BYTES", 3_000)
    syncs = []
    monkeypatch.setattr(storage, "_fdatasync", lambda fd: syncs.append(fd))
    parts = [bytes([i % 256]) * (i * 37 % 5000) for i in range(200)]
    threads = threading.active_count()
    path = tmp_path / "e" / "f.seg"
    assert storage.write_durable(path, iter(parts)) == sum(map(len, parts))
    assert path.read_bytes() == b"".join(parts)
    assert len(syncs) >= sum(map(len, parts)) // 18_000  # a sync at least every 10,000 + one chunk (< 8,000)
    assert threading.active_count() == threads
    assert _files(tmp_path) == ["e/f.seg"]


def test_incremental_encoding_is_encode():
    """SegmentEncoder step by step (runs cut at block boundaries) gives what segment.encode gives at once."""
    batch = pa.record_batch({"a": pa.array(range(100)), "s": pa.array([f"r{i}" for i in range(100)])})
    runs = [(0, 0, 40), (3, 40, 60)]
    whole, desc = segment.encode(
        batch, runs, name="00000000000000000000/w-x.seg", epoch=0, sink_id="s", max_block_bytes=200
    )
    per_block = segment.rows_per_block(batch.nbytes, batch.num_rows, 200)
    encoder = segment.SegmentEncoder(name=desc.name, epoch=0, sink_id="s")
    parts = [segment.MAGIC]
    parts += encoder.blocks(batch, [(0, 0, 40)], per_block)
    parts += encoder.blocks(batch, [(3, 40, 2 * per_block)], per_block)  # vnode 3 cut after two blocks
    parts += encoder.blocks(batch, [(3, 40 + 2 * per_block, 60 - 2 * per_block)], per_block)
    with pytest.raises(RuntimeError, match="not finished"):
        _ = encoder.descriptor
    parts += encoder.finish(batch.schema)
    assert b"".join(parts) == b"".join(whole)
    assert encoder.descriptor == desc
    assert [r.vnode for r in desc.runs] == [0, 3] and len(desc.runs[1].blocks) > 2
