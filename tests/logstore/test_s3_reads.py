"""Reading the log back from S3 in few requests: a file writer's vnodes are one contiguous byte range in each
segment, so a read plan costs about one ranged GET per segment (counted at the fault proxy in front of the
SeaweedFS test server), and gives exactly the rows appended, in the log store's order."""

from __future__ import annotations

import dataclasses
import itertools
import random
import threading
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from faultproxy import FaultProxy

from filesink.demo.s3server import S3Settings
from filesink.output import OutputLocation
from filesink.rolling.sizing import first_rows, sample_ratio
from filesink.tasks.writer import FileTask, write_file
from logstore import (
    LogLocation,
    LogStore,
    ReadItem,
    SegmentCorruptError,
    SegmentError,
    SegmentMissingError,
    append_segment,
    read_plan,
)
from logstore.reader import ReadLimits, plan_reads
from logstore.segment_cache import BYTES_VAR
from logstore.storage import LocalStorage

VNODES = 32
EPOCHS = 3
TASKS = 3
"""Append tasks per epoch: each writes one segment of the epoch."""
WRITERS = 4
"""File writers of a roll: each reads a contiguous quarter of the vnodes."""
SLACK = 2
"""Requests a read plan may take beyond one per segment."""
SCHEMA = pa.schema([("id", pa.int64()), ("vnode", pa.int32()), ("text", pa.string())])


def table(rng: random.Random, first_id: int, rows: int) -> pa.Table:
    vnodes = [rng.randrange(VNODES) for _ in range(rows)]
    return pa.table(
        {
            "id": pa.array(range(first_id, first_id + rows), pa.int64()),
            "vnode": pa.array(vnodes, pa.int32()),
            "text": [f"row {first_id + i} " * rng.randrange(1, 6) for i in range(rows)],
            "__vnode": pa.array(vnodes, pa.int32()),
        }
    )


@pytest.fixture(scope="module")
def proxy(s3_server: S3Settings) -> Iterator[FaultProxy]:
    """A proxy in front of the S3 test server that counts requests (it injects no faults here)."""
    with FaultProxy(s3_server.endpoint) as started:
        yield started


@dataclasses.dataclass
class Log:
    store: LogStore
    written: Counter[tuple[Any, ...]]
    """(vnode, epoch, id, text) of every row appended."""

    def plans(self) -> list[tuple[ReadItem, ...]]:
        """Each file writer's read plan of everything sealed: a contiguous range of VNODES // WRITERS vnodes."""
        share = VNODES // WRITERS
        vnodes = [range(w * share, (w + 1) * share) for w in range(WRITERS)]
        return [tuple(self.store.plan_read(dict.fromkeys(v, -1), EPOCHS - 1)) for v in vnodes]

    def written_by(self, writer: int) -> Counter[tuple[Any, ...]]:
        """The rows appended for ``writer``'s vnodes."""
        share = VNODES // WRITERS
        return Counter({r: n for r, n in self.written.items() if r[0] // share == writer})


def build(state: Path, url: str, options: dict[str, Any]) -> Log:
    """A log store on S3 with EPOCHS epochs of TASKS segments each, small blocks (many per vnode and segment)."""
    store = LogStore.open(state, url, vnodes=VNODES, storage_options=options)
    target = dataclasses.replace(store.target, max_block_bytes=1024)
    rng = random.Random(11)
    written: Counter[tuple[Any, ...]] = Counter()
    for epoch in range(EPOCHS):
        descriptors = []
        for task in range(TASKS):
            rows = table(rng, (epoch * TASKS + task) * 600, 600)
            descriptors.append(append_segment(target, epoch, rows, writer_id=f"p{task}-a0"))
            written.update((r["vnode"], epoch, r["id"], r["text"]) for r in rows.to_pylist())
        store.seal(epoch, descriptors)
    return Log(store, written)


@pytest.fixture(scope="module")
def shared(s3_server: S3Settings, proxy: FaultProxy, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Log]:
    """One log store for the tests that only read it, through :func:`proxy`; appended without the segment cache,
    so that its reads are S3's requests (tests/logstore/test_segment_cache.py reads through the cache)."""
    options = dataclasses.replace(s3_server, endpoint=proxy.endpoint).storage_options()
    url = s3_server.url(f"test-{uuid.uuid4().hex}", "log")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(BYTES_VAR, "0")
        log = build(tmp_path_factory.mktemp("s3-reads") / "state", url, options)
    yield log
    log.store.close()


@pytest.fixture
def sealed(tmp_path: Path, s3_prefix: str, s3_options: dict[str, Any]) -> Iterator[Log]:
    """A log store of the test's own, for tests that damage it."""
    log = build(tmp_path / "state", s3_prefix + "/log", s3_options)
    yield log
    log.store.close()


def rows_of(batches: Iterator[Any]) -> list[tuple[Any, ...]]:
    return [(b.vnode, b.epoch, b.segment, row["id"], row["text"]) for b in batches for row in b.batch.to_pylist()]


def check_order(read: list[tuple[Any, ...]]) -> None:
    """Rows come by vnode, epoch, segment name, then in the order appended (ids ascending here)."""
    keys = [r[:3] for r in read]
    assert keys == sorted(keys)
    for before, after in itertools.pairwise(read):
        if before[:3] == after[:3]:
            assert before[3] < after[3]


def test_a_read_plan_is_one_get_per_segment_and_gives_every_row(shared, proxy, tmp_path):
    segments = EPOCHS * TASKS
    local = tmp_path / "copy"  # the segments on local disk, read block by block there
    for relpath, _size in shared.store.storage.list_files():
        (local / relpath).parent.mkdir(parents=True, exist_ok=True)
        (local / relpath).write_bytes(shared.store.storage.read_all(relpath))
    for w, plan in enumerate(shared.plans()):
        blocks = sum(len(item.blocks) for item in plan)
        assert blocks > 4 * segments, "small blocks: reading them one by one would take many more requests"
        before = proxy.requests.copy()
        read = rows_of(read_plan(shared.store.location.open(), plan))
        requests = proxy.requests - before
        assert requests == Counter({"GetObject": requests["GetObject"]}), "GETs only, no HEAD"
        assert requests["GetObject"] <= segments + SLACK
        assert Counter((r[0], r[1], r[3], r[4]) for r in read) == shared.written_by(w)
        check_order(read)
        assert read == rows_of(read_plan(LocalStorage(local), plan)), "the same rows in the same order"


def test_a_roll_reads_at_most_one_get_per_segment_and_writer(shared, proxy, tmp_path):
    """Each writer's file task of a roll, written as the sink's Spark tasks write them (output local here, so
    every GET counted is a log read): GETs <= segments x writers + a few, and the files hold exactly the rows."""
    output = OutputLocation(str(tmp_path / "out"))
    schema_bytes = SCHEMA.serialize().to_pybytes()
    before = proxy.requests["GetObject"]
    written = []
    for w, plan in enumerate(shared.plans()):
        task = FileTask(name=f"part-{w}", log=shared.store.location, plan=plan, schema_bytes=schema_bytes)
        written += write_file(output, task)
    gets = proxy.requests["GetObject"] - before
    assert gets <= EPOCHS * TASKS * WRITERS + SLACK
    got: Counter[tuple[Any, ...]] = Counter()
    for obj in written:
        got.update((r["vnode"], r["id"], r["text"]) for r in pq.read_table(tmp_path / "out" / obj.key).to_pylist())
    assert got == Counter({(r[0], r[2], r[3]): n for r, n in shared.written.items()})


@pytest.mark.parametrize(
    "limits",
    [
        ReadLimits(max_read_bytes=2048),  # several reads per segment
        ReadLimits(buffer_bytes=8192),  # too little to hold a read per segment: smaller reads, reading ahead little
        ReadLimits(concurrency=1, merge_gap_bytes=0),
    ],
    ids=["small reads", "small buffer", "one at a time"],
)
def test_limits_change_the_requests_not_the_rows(shared, proxy, limits):
    plan = shared.plans()[1]
    whole = rows_of(read_plan(shared.store.location.open(), plan))
    reads, _ = plan_reads(plan, limits)
    before = proxy.requests["GetObject"]
    assert rows_of(read_plan(shared.store.location.open(), plan, limits)) == whole
    assert proxy.requests["GetObject"] - before == len(reads)
    if limits.max_read_bytes < ReadLimits().max_read_bytes:
        assert len(reads) > EPOCHS * TASKS
        assert all(r.length <= limits.max_read_bytes for r in reads)


def test_plan_reads_joins_near_blocks_and_caps_reads():
    from logstore.segment import Block

    def item(vnode: int, name: str, *spans: tuple[int, int]) -> ReadItem:
        blocks = tuple(Block(offset, length, 1, 0) for offset, length in spans)
        return ReadItem(vnode, 0, name, (0, 1, 2), b"", blocks)

    plan = [
        item(0, "a", (8, 100), (108, 100)),
        item(0, "b", (8, 50)),
        item(1, "a", (208, 100)),
        item(1, "b", (58, 50), (5000, 10)),  # 4,892 bytes after the previous block
        item(2, "a", (400, 100)),  # 92 bytes after vnode 1's
    ]
    reads, read_of = plan_reads(plan, ReadLimits(merge_gap_bytes=100))
    assert [(r.segment, r.offset, r.length, r.first_use, r.last_use) for r in reads] == [
        ("a", 8, 492, 0, 6),
        ("b", 8, 100, 2, 4),
        ("b", 5000, 10, 5, 5),
    ]
    assert read_of == [0, 0, 1, 0, 1, 2, 0]
    capped, _ = plan_reads(plan, ReadLimits(merge_gap_bytes=100, max_read_bytes=250))
    assert [(r.segment, r.offset, r.length) for r in capped] == [
        ("a", 8, 200),
        ("b", 8, 100),
        ("a", 208, 100),
        ("b", 5000, 10),
        ("a", 400, 100),
    ]
    # a buffer of 300 bytes: half of it for a read held per segment (a: 492 bytes, b: 100) caps reads at 75
    small, _ = plan_reads(plan, ReadLimits(merge_gap_bytes=100, buffer_bytes=300))
    assert max(r.length for r in small) == 100  # one block, whatever the cap
    assert len(small) == 7


def test_a_missing_segment_stops_the_read_where_it_comes(sealed):
    plan = sealed.plans()[2]
    victim = plan[len(plan) // 2].segment
    sealed.store.storage.delete(victim)
    got: list[Any] = []
    with pytest.raises(SegmentMissingError, match=r"the segment file of a sealed epoch is missing") as raised:
        for batch in read_plan(sealed.store.location.open(), plan):
            got.append(batch)
    assert isinstance(raised.value, FileNotFoundError)
    assert victim in str(raised.value)
    first = next(n for n, i in enumerate(plan) if i.segment == victim)
    assert rows_of(iter(got)) == rows_of(read_plan(sealed.store.location.open(), plan[:first]))
    assert not reading_threads()


def test_a_changed_byte_or_a_short_object_is_found(sealed):
    plan = sealed.plans()[0]
    storage = sealed.store.storage
    name = plan[-1].segment
    block = plan[-1].blocks[-1]
    data = bytearray(storage.read_all(name))
    data[block.offset + 3] ^= 0xFF
    storage.write(name, [bytes(data)])
    with pytest.raises(SegmentCorruptError, match=rf"{name}.*checksum mismatch.*at offset {block.offset}"):
        list(read_plan(sealed.store.location.open(), plan))
    storage.write(name, [bytes(data[: block.offset + 5])])
    with pytest.raises(SegmentCorruptError, match=rf"{name}.*short read, expected {block.length} bytes"):
        list(read_plan(sealed.store.location.open(), plan))
    assert not reading_threads()


def test_a_read_left_early_stops_its_threads(shared):
    plan = shared.plans()[3]
    batches = read_plan(shared.store.location.open(), plan, ReadLimits(max_read_bytes=2048))
    next(batches)
    assert reading_threads()
    batches.close()
    assert not reading_threads()


def reading_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("logstore-read")]


def test_a_read_that_fails_after_its_retries_is_raised_naming_the_segment(shared, proxy):
    plan = shared.plans()[0]
    location = shared.store.location
    fewer = {**location.storage_options, "config_kwargs": {"retries": {"mode": "standard", "max_attempts": 1}}}
    proxy.inject("5xx", "GetObject", count=2)  # the first read's attempt and its one retry
    try:
        with pytest.raises(OSError, match=rf"cannot read \d+ bytes at \d+ of .*{plan[0].segment}") as raised:
            list(read_plan(LogLocation(location.url, fewer).open(), plan, ReadLimits(concurrency=1)))
    finally:
        proxy.clear_injected()
    assert not isinstance(raised.value, (SegmentError, FileNotFoundError))
    assert not reading_threads()


def test_a_listing_is_one_request_also_when_the_prefix_holds_nothing(shared, proxy):
    """Most of the durable home's prefixes are empty at a start: each listing is one ListObjectsV2, never the HEAD
    and second listing s3fs's ``find`` adds for an empty prefix."""
    storage = shared.store.storage
    before = proxy.requests.copy()
    assert list(storage.list_files("home/no-such-prefix")) == []
    segments = sorted(storage.list_files(f"{0:020d}"))
    spent = proxy.requests - before
    assert spent == Counter({"ListObjectsV2": 2}), spent
    assert len(segments) == TASKS and all(size > 0 for _, size in segments), segments
    assert all(path.startswith(f"{0:020d}/") and path.endswith(".seg") for path, _ in segments), segments


def test_the_size_rules_sample_fetches_only_the_blocks_it_encodes(shared, proxy):
    """The reader fetches ahead of the rows it yields; the sample reads a plan cut to its rows, so it does not
    fetch the rest of a writer's share of the log (it once read about as much as the files' writers did)."""
    plan = shared.plans()[2]
    task = FileTask(
        name="part-sample", log=shared.store.location, plan=plan, schema_bytes=SCHEMA.serialize().to_pybytes()
    )
    cut = first_rows(plan, 50)
    assert 50 <= sum(b.rows for item in cut for b in item.blocks) < sum(b.rows for item in plan for b in item.blocks)
    before = proxy.requests["GetObject"]
    sample = sample_ratio(task, 50)
    gets = proxy.requests["GetObject"] - before
    assert sample.rows >= 50 and sample.ratio > 0
    assert gets == len(plan_reads(cut)[0]) < len(plan_reads(plan)[0]), gets
