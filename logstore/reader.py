"""Reading sealed log data back: :func:`read_plan` fetches, checks and decodes the blocks of a read plan.

Kept apart from :mod:`logstore.store` so that Spark tasks, which read segments but never the state database,
do not import the state database's dependencies (``sqlite_utils``, which imports pandas).

Two ways to fetch the bytes, the same checks and the same rows in the same order either way:

- **Block by block** (local disk, and any storage without ``coalesced_reads``): one read per block, one block
  in memory at a time; a local read is a ``pread`` on a file kept open (:meth:`Storage.reading`).
- **Coalesced** (object stores, :class:`logstore.storage.FsspecStorage`): a plan's blocks of one segment lie in
  one contiguous byte range (a writer's vnodes are a contiguous range, and a segment is sorted by vnode), so the
  plan is read as few ranged reads as possible, each ending before ``max_read_bytes``, several in flight at once
  and the next ones fetched while the current rows are decoded and written. Each request to an object store
  costs a round trip, which made a roll of one GET per block slow. Segments this host wrote to S3 are read from
  their local copies instead, each checked once per plan against S3 (:mod:`logstore.segment_cache`); a block of
  a copy that fails its checks is read again from S3.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Generator, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import pyarrow as pa

from . import segment
from .diagnosis import told
from .errors import SEGMENT_WAY_OUT, SegmentCorruptError, SegmentMissingError
from .segment import Block, describe_vnodes
from .storage import ReadRange, Storage


class LogBatch(NamedTuple):
    """Rows read back from the log: one block of one vnode from one segment."""

    vnode: int
    epoch: int
    segment: str
    batch: pa.RecordBatch


@dataclass(frozen=True)
class ReadItem:
    """One vnode's rows of one sealed segment: what :func:`read_plan` fetches, checks and decodes."""

    vnode: int
    epoch: int
    segment: str
    segment_vnodes: tuple[int, ...]
    schema_bytes: bytes
    blocks: tuple[Block, ...]


@dataclass(frozen=True)
class ReadLimits:
    """How a coalesced read (object stores) joins a plan's blocks into ranged reads, and what it may hold."""

    max_read_bytes: int = 32 * 2**20
    """A ranged read ends before this many bytes (it holds at least one block, whatever the block's size)."""
    buffer_bytes: int = 256 * 2**20
    """Bytes fetched and not yet used up, and bytes being fetched: reads ahead of the one needed now are started
    only while this holds. A read's bytes are held from the first block of it the plan reaches to the last, so
    while the plan goes vnode by vnode, a read is held per segment; reads are made smaller (down to one block)
    where that would take more than half of this, so the rest is left for reading ahead."""
    concurrency: int = 4
    """Ranged reads in flight at most (threads of the read)."""
    merge_gap_bytes: int = 2**20
    """Blocks of a segment at most this many bytes apart are read in one request (the bytes between them are
    read and dropped): a request costs more than reading a megabyte more."""
    deadline_seconds: float = 900.0
    """The longest wait for one ranged read. The storage client's own timeouts and retries end a read that gets
    no answer long before (about a minute with the defaults of :func:`logstore.storage.s3_client_options`)."""

    def __post_init__(self) -> None:
        for name in ("max_read_bytes", "buffer_bytes", "concurrency"):
            if getattr(self, name) < 1:
                raise ValueError(f"ReadLimits.{name} must be at least 1, not {getattr(self, name)!r}")
        if self.merge_gap_bytes < 0 or self.deadline_seconds <= 0:
            raise ValueError("ReadLimits.merge_gap_bytes must be >= 0 and deadline_seconds > 0")


READ_LIMITS = ReadLimits()
"""The limits :func:`read_plan` reads an object store with, unless given others."""


def read_plan(
    storage: Storage, plan: Iterable[ReadItem], limits: ReadLimits | None = None
) -> Generator[LogBatch, None, None]:
    """Fetch, check and decode the blocks of ``plan`` in order, yielding one block's rows at a time.

    Every block's length and CRC-32 are checked against the plan before it is decoded; a segment that is gone
    raises :class:`SegmentMissingError` (a ``FileNotFoundError``), bytes that do not match
    :class:`SegmentCorruptError`, each when the read reaches the segment's first block in the plan (rows before
    it are yielded first). On object stores (``coalesced_reads``), the plan's blocks are fetched in few ranged
    reads (:class:`ReadLimits`); elsewhere, one block at a time. Close the generator (or run it to its end) to
    stop the threads of a coalesced read.
    """
    if getattr(storage, "coalesced_reads", False):
        yield from _read_coalesced(storage, tuple(plan), limits or READ_LIMITS)
        return
    schemas: dict[bytes, pa.Schema] = {}
    with storage.reading() as read:  # local segments stay open: a plan reads each one vnode after vnode
        for item in plan:
            schema = _schema(schemas, item)
            for block in item.blocks:
                try:
                    data = read(item.segment, block.offset, block.length)
                except FileNotFoundError as e:
                    raise _missing(storage, item) from e
                yield LogBatch(item.vnode, item.epoch, item.segment, _decode(storage, read, item, block, data, schema))


def _schema(schemas: dict[bytes, pa.Schema], item: ReadItem) -> pa.Schema:
    schema = schemas.get(item.schema_bytes)
    if schema is None:
        schema = schemas[item.schema_bytes] = segment.decode_schema(item.schema_bytes)
    return schema


def _missing(storage: Storage, item: ReadItem) -> SegmentMissingError:
    return SegmentMissingError(
        f"{_where(storage, item)}: the segment file of a sealed epoch is missing. {SEGMENT_WAY_OUT}."
    )


def _decode(
    storage: Storage, read: ReadRange, item: ReadItem, block: Block, data: bytes, schema: pa.Schema
) -> pa.RecordBatch:
    """The rows of ``block``, once its bytes ``data`` are checked (length, CRC-32).

    Bytes that fail the check and came from the local segment cache (``read.again``, see
    :mod:`logstore.segment_cache`) are read again from the store, and it is the store's bytes that are checked."""
    problem = segment.block_problem(data, block)
    again = getattr(read, "again", None)
    if problem and again is not None:
        try:
            fresh = again(item.segment, block.offset, block.length)
        except FileNotFoundError as e:
            raise _missing(storage, item) from e
        if fresh is not None:
            data, problem = fresh, segment.block_problem(fresh, block)
    if problem:
        raise SegmentCorruptError(f"segment {_where(storage, item)}: {problem}. {SEGMENT_WAY_OUT}.")
    try:
        return segment.decode_block(data, schema)
    except (pa.ArrowInvalid, OSError) as e:
        raise SegmentCorruptError(
            f"segment {_where(storage, item)}: block at offset {block.offset}: {told(e)}. {SEGMENT_WAY_OUT}."
        ) from e


def _where(storage: Storage, item: ReadItem) -> str:
    return f"{storage.display(item.segment)} (epoch {item.epoch}, vnodes {describe_vnodes(list(item.segment_vnodes))})"


# -- coalesced reads ---------------------------------------------------------------------------------------


@dataclass
class RangeRead:
    """One ranged read of a coalesced plan: ``length`` bytes of ``segment`` at ``offset``, holding whole blocks."""

    segment: str
    offset: int
    length: int
    first_use: int
    """Position in the plan (blocks counted in plan order) of the first block read from it."""
    last_use: int
    """Position of the last block read from it: its bytes are dropped after that block."""


def plan_reads(plan: Sequence[ReadItem], limits: ReadLimits = READ_LIMITS) -> tuple[list[RangeRead], list[int]]:
    """The ranged reads of ``plan``, in the order the plan first needs them, and for each block of the plan (in
    plan order) the index of the read that holds it.

    Per segment, the plan's blocks in file order are joined while the gap to the next is at most
    ``merge_gap_bytes`` and the read stays within the size cap: ``max_read_bytes``, or less where reads of that
    size, one held per segment, would take more than half of ``buffer_bytes``.
    """
    by_segment: dict[str, list[tuple[int, int, int]]] = {}  # segment -> [(offset, end, position)]
    position = 0
    for item in plan:
        spans = by_segment.setdefault(item.segment, [])
        for block in item.blocks:
            spans.append((block.offset, block.offset + block.length, position))
            position += 1
    for spans in by_segment.values():
        spans.sort()
    cap = _read_cap(by_segment.values(), limits)
    reads: list[RangeRead] = []
    read_of = [0] * position
    for name, spans in by_segment.items():
        current: RangeRead | None = None
        for offset, end, pos in spans:
            if current is not None:
                joined_end = max(current.offset + current.length, end)
                if (
                    offset - (current.offset + current.length) <= limits.merge_gap_bytes
                    and joined_end - current.offset <= cap
                ):
                    current.length = joined_end - current.offset
                    current.first_use = min(current.first_use, pos)
                    current.last_use = max(current.last_use, pos)
                    read_of[pos] = len(reads) - 1
                    continue
            current = RangeRead(name, offset, end - offset, pos, pos)
            reads.append(current)
            read_of[pos] = len(reads) - 1
    order = sorted(range(len(reads)), key=lambda i: reads[i].first_use)
    rank = {index: n for n, index in enumerate(order)}
    return [reads[i] for i in order], [rank[i] for i in read_of]


def _read_cap(segments: Iterable[list[tuple[int, int, int]]], limits: ReadLimits) -> int:
    """The size cap of one ranged read: ``max_read_bytes``, or the largest cap at which one read held per segment
    (each as long as the segment's longest joined span, or the cap) takes at most half of ``buffer_bytes``."""
    longest: list[int] = []
    for spans in segments:
        best = start = end = 0
        for i, (offset, stop, _pos) in enumerate(spans):
            if i == 0 or offset - end > limits.merge_gap_bytes:
                start = offset
            end = max(end, stop) if i else stop
            best = max(best, end - start)
        longest.append(best)
    budget = limits.buffer_bytes // 2
    if sum(min(n, limits.max_read_bytes) for n in longest) <= budget:
        return limits.max_read_bytes
    # Water-filling: the largest cap c with sum(min(n, c)) <= budget, over the spans sorted by length.
    longest.sort()
    below = 0
    for i, n in enumerate(longest):
        rest = len(longest) - i
        if below + n * rest > budget:
            return max(1, (budget - below) // rest)
        below += n
    return limits.max_read_bytes  # not reached: the sum of min(n, max_read_bytes) exceeds the budget


def _read_coalesced(storage: Storage, plan: tuple[ReadItem, ...], limits: ReadLimits) -> Iterator[LogBatch]:
    reads, read_of = plan_reads(plan, limits)
    if not reads:
        return
    with storage.reading() as read:  # with the segment cache, one check of each copy against S3 per plan
        yield from _fetch_coalesced(storage, read, plan, reads, read_of, limits)


def _fetch_coalesced(
    storage: Storage,
    read_range: ReadRange,
    plan: tuple[ReadItem, ...],
    reads: list[RangeRead],
    read_of: list[int],
    limits: ReadLimits,
) -> Iterator[LogBatch]:
    schemas: dict[bytes, pa.Schema] = {}
    fetched: dict[int, concurrent.futures.Future[bytes]] = {}
    started = 0  # reads are started in the order the plan first needs them
    held = 0  # bytes of the started reads not yet dropped
    pool = concurrent.futures.ThreadPoolExecutor(
        max_workers=min(limits.concurrency, len(reads)), thread_name_prefix="logstore-read"
    )

    def start(needed: int) -> None:
        """Start every read up to ``needed`` and, within ``buffer_bytes``, the ones after it."""
        nonlocal started, held
        while started < len(reads):
            read = reads[started]
            if started > needed and held + read.length > limits.buffer_bytes:
                return
            fetched[started] = pool.submit(read_range, read.segment, read.offset, read.length)
            held += read.length
            started += 1

    try:
        position = 0
        for item in plan:
            schema = _schema(schemas, item)
            for block in item.blocks:
                index = read_of[position]
                read = reads[index]
                start(index)
                future = fetched[index]
                if not concurrent.futures.wait([future], timeout=limits.deadline_seconds).done:
                    raise TimeoutError(
                        f"reading {read.length} bytes at {read.offset} of {_where(storage, item)}: no answer in "
                        f"{limits.deadline_seconds:g} s"
                    )
                try:
                    data = future.result()  # raises what the read raised (a storage error names the file)
                except FileNotFoundError as e:
                    raise _missing(storage, item) from e
                at = block.offset - read.offset
                piece = data[at : at + block.length]  # a copy: the rows do not keep the whole read in memory
                if position == read.last_use:  # drop the read's bytes (``piece`` is a copy, or all of them)
                    del fetched[index], future, data
                    held -= read.length
                position += 1
                batch = _decode(storage, read_range, item, block, piece, schema)
                yield LogBatch(item.vnode, item.epoch, item.segment, batch)
    finally:
        for future in fetched.values():
            future.cancel()
        fetched.clear()
        pool.shutdown(wait=True, cancel_futures=True)
