"""The segment cache (logstore.segment_cache): the segments a host appended to an S3 log store are read back from
local copies, each checked once per read plan against S3 (a HEAD: size and ETag); a copy that is damaged or does
not match S3 is never what the rows come from, and a segment damaged on S3 fails as it would without the cache.

Requests are counted at a fault proxy in front of the SeaweedFS test server (it injects nothing here)."""

from __future__ import annotations

import dataclasses
import logging
import os
import random
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from faultproxy import FaultProxy

from filesink.demo.s3server import S3Settings
from logstore import LogStore, SegmentCorruptError, SegmentMissingError, append_segment, read_plan
from logstore.segment_cache import BYTES_VAR, DIR_VAR, TEMP_GRACE_SECONDS, SegmentCache

VNODES = 8
SEGMENTS = 4


@pytest.fixture
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The test's own cache (on, with the default limit)."""
    monkeypatch.setenv(DIR_VAR, str(tmp_path / "cache"))
    monkeypatch.delenv(BYTES_VAR, raising=False)
    return tmp_path / "cache"


@dataclasses.dataclass
class Log:
    store: LogStore
    rows: list[tuple[Any, ...]]
    """Every row appended, as a read of every vnode gives them: (vnode, epoch, segment, id, text)."""

    def read(self) -> list[tuple[Any, ...]]:
        plan = self.store.plan_read(dict.fromkeys(range(VNODES), -1), 1)
        return rows_of(read_plan(self.store.location.open(), plan))

    def segments(self) -> list[str]:
        return self.store.segments()


def rows_of(batches: Iterator[Any]) -> list[tuple[Any, ...]]:
    return [(b.vnode, b.epoch, b.segment, r["id"], r["text"]) for b in batches for r in b.batch.to_pylist()]


def appended(tmp_path: Path, s3_server: S3Settings, proxy: FaultProxy) -> Log:
    """A log store on S3 (through ``proxy``) of 2 epochs of 2 segments, in small blocks, read back once with
    the cache off, from S3, for the rows to expect."""
    options = dataclasses.replace(s3_server, endpoint=proxy.endpoint).storage_options()
    url = s3_server.url(f"test-{uuid.uuid4().hex}", "log")
    store = LogStore.open(tmp_path / "state", url, vnodes=VNODES, storage_options=options)
    target = dataclasses.replace(store.target, max_block_bytes=2048)
    rng = random.Random(5)
    for epoch in range(2):
        descriptors = []
        for task in range(SEGMENTS // 2):
            first = (epoch * 2 + task) * 400
            vnodes = [rng.randrange(VNODES) for _ in range(400)]
            table = pa.table(
                {
                    "id": pa.array(range(first, first + 400), pa.int64()),
                    "text": [f"row {first + i} " * rng.randrange(1, 8) for i in range(400)],
                    "__vnode": pa.array(vnodes, pa.int32()),
                }
            )
            descriptors.append(append_segment(target, epoch, table, writer_id=f"p{task}"))
        store.seal(epoch, descriptors)
    log = Log(store, [])
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(BYTES_VAR, "0")
        log.rows = log.read()
    assert len(log.rows) == 4 * 400
    return log


@pytest.fixture
def log(tmp_path: Path, s3_server: S3Settings, fault_proxy: FaultProxy, cache_dir: Path) -> Iterator[Log]:
    made = appended(tmp_path, s3_server, fault_proxy)
    yield made
    made.store.close()


def copies(cache_dir: Path) -> dict[str, Path]:
    """The cache's copies: segment name -> file."""
    return {"/".join(p.name.split(".", 1)): p for p in cache_dir.rglob("*.seg") if not p.name.startswith(".")}


def test_reads_of_segments_appended_here_come_from_their_copies(log, cache_dir, fault_proxy, s3_server):
    assert sorted(copies(cache_dir)) == sorted(log.segments())
    before = fault_proxy.requests.copy()
    assert log.read() == log.rows
    assert fault_proxy.requests - before == Counter({"HeadObject": SEGMENTS}), "one HEAD per segment, no GET"
    # a range read gives S3's bytes, up to the end of the segment as a ranged GET does
    storage, direct = log.store.location.open(), s3_server.filesystem()
    for name in log.segments():
        whole = direct.cat_file(storage._full(name))
        for offset, length in ((0, 8), (100, 5000), (len(whole) - 10, 100), (len(whole) + 5, 10)):
            assert storage.read_range(name, offset, length) == whole[offset : offset + length]


def test_a_damaged_copy_is_not_what_the_rows_come_from(log, cache_dir, fault_proxy):
    """A flipped byte in a block (its CRC-32 fails: the block is read again from S3), a truncated copy and one of
    random bytes (not used: no HEAD for them): the rows are S3's, and the three copies are dropped."""
    flipped, truncated, garbage, _ = log.segments()
    sizes = dict(log.store.storage.list_files())
    for victim in (flipped, truncated, garbage):
        path = copies(cache_dir)[victim]
        data = bytearray(path.read_bytes())
        if victim == flipped:
            block = next(i for i in log.store.plan_read({VNODES - 1: -1}, 1) if i.segment == victim).blocks[-1]
            data[len(data) - sizes[victim] + block.offset + block.length // 2] ^= 0x10  # the copy's header first
        elif victim == truncated:
            del data[-100:]
        else:
            data[:] = random.Random(1).randbytes(len(data))
        path.write_bytes(bytes(data))
    before = fault_proxy.requests.copy()
    assert log.read() == log.rows
    spent = fault_proxy.requests - before
    assert spent["HeadObject"] == 2 and spent["GetObject"] > 0, spent
    assert sorted(copies(cache_dir)) == [log.segments()[3]], "the damaged copies are dropped"


def test_a_segment_damaged_on_s3_fails_as_without_the_cache(log, cache_dir, s3_server):
    """The copies are whole and right, yet a segment deleted or changed on S3 behind the sink's back reads as S3
    has it: S3 is the truth, and the damage checks and recovery (which look at S3) agree with the reads."""
    gone, changed = log.segments()[0], log.segments()[3]
    direct, root = s3_server.filesystem(), log.store.location.open()
    data = bytearray(direct.cat_file(root._full(changed)))
    data[100] ^= 0x01  # the first block: same size, another ETag
    direct.pipe_file(root._full(changed), bytes(data))
    with pytest.raises(SegmentCorruptError, match=rf"{changed}.*checksum mismatch"):
        log.read()
    assert changed not in copies(cache_dir), "a copy S3 no longer holds is dropped"
    data[100] ^= 0x01
    direct.pipe_file(root._full(changed), bytes(data))  # repaired on S3: read from there
    assert log.read() == log.rows
    direct.rm_file(root._full(gone))
    assert gone in copies(cache_dir)
    with pytest.raises(SegmentMissingError, match=rf"{gone}.*missing"):
        log.read()


def test_deletes_drop_the_copies(log, cache_dir):
    first, *rest = log.segments()
    log.store.storage.delete(first)
    assert sorted(copies(cache_dir)) == sorted(rest)
    log.store.truncate(dict.fromkeys(range(VNODES), 1))
    log.store.collect_garbage()  # a bulk delete (DeleteObjects) of the released segments
    assert copies(cache_dir) == {}


def test_the_environment_turns_it_off(tmp_path, s3_server, fault_proxy, cache_dir, monkeypatch, caplog):
    monkeypatch.setenv(BYTES_VAR, "lots")
    with caplog.at_level(logging.WARNING, logger="logstore.segment_cache"):
        log = appended(tmp_path, s3_server, fault_proxy)
    assert f"{BYTES_VAR}='lots' is not a number of bytes" in caplog.text
    assert not cache_dir.exists()
    monkeypatch.setenv(BYTES_VAR, "0")
    before = fault_proxy.requests.copy()
    assert log.read() == log.rows
    assert set(fault_proxy.requests - before) == {"GetObject"}
    log.store.close()


@pytest.mark.parametrize("place", ["a file", "writable by others"])
def test_a_cache_that_cannot_be_used_changes_nothing(tmp_path, s3_server, fault_proxy, monkeypatch, place):
    where = tmp_path / "cache"
    if place == "a file":
        where.write_bytes(b"")
    else:
        where.mkdir()
        where.chmod(0o777)
    monkeypatch.setenv(DIR_VAR, str(where))
    log = appended(tmp_path, s3_server, fault_proxy)  # the appends succeed
    before = fault_proxy.requests.copy()
    assert log.read() == log.rows
    assert set(fault_proxy.requests - before) == {"GetObject"}
    assert place == "a file" or copies(where) == {}
    log.store.close()


def test_eviction_keeps_the_limit_oldest_first(tmp_path):
    root = tmp_path / "cache"
    names = [f"{0:020d}/w{i}-{uuid.uuid4().hex}.seg" for i in range(5)]
    other = SegmentCache(root, root / "other-store", limit=10**9)
    other.put(names[0], b"o" * 1000, '"etag"')  # the limit is shared by every log store's copies
    time.sleep(0.02)
    cache = SegmentCache(root, root / "store", limit=3500)
    for name in names[1:]:
        cache.put(name, b"x" * 1000, '"etag"')
        time.sleep(0.02)  # distinct modification times: the oldest go first
    kept = sorted(p.name for p in root.rglob("*.seg"))
    assert kept == sorted(name.replace("/", ".") for name in names[-3:])
    assert sum(p.stat().st_size for p in root.rglob("*.seg")) <= 3500
    # what a process killed while writing a copy left behind goes too, once old enough
    stale = root / "store" / f".{kept[0]}.tmp-0123456789ab"
    stale.write_bytes(b"x")
    os.utime(stale, (time.time() - 2 * TEMP_GRACE_SECONDS,) * 2)
    cache.put(f"{1:020d}/w9-{uuid.uuid4().hex}.seg", b"y" * 10, '"etag"')
    assert not stale.exists()
    cache.put(f"{1:020d}/big-{uuid.uuid4().hex}.seg", b"z" * 4000, '"etag"')  # above the limit: not kept
    assert not list(root.rglob("*big-*"))
