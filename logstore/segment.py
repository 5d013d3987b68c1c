"""The segment file format: one task attempt's rows for one epoch, grouped by vnode.

Layout (all integers little-endian)::

    MAGIC (8 bytes)
    block 0 | block 1 | ...            Arrow IPC record batch messages, sorted by vnode
    schema block                       Arrow IPC schema message
    footer                             UTF-8 JSON describing every block (see ``SegmentDescriptor``)
    footer length (u32) | footer CRC-32 (u32) | MAGIC

A block holds rows of exactly one vnode, at most ``max_block_bytes`` of them (one block is the unit of
reading, so it bounds the reader's memory). Every block and the schema carry a CRC-32 of their bytes; the
descriptor is also recorded in the state database when the epoch is sealed, so a reader never trusts the file
alone.
"""

from __future__ import annotations

import json
import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from .errors import SegmentCorruptError

MAGIC = b"FSLSEG01"
FORMAT_VERSION = 1
SUFFIX = ".seg"
_TRAILER = struct.Struct("<II")
TRAILER_SIZE = _TRAILER.size + len(MAGIC)


@dataclass(frozen=True)
class Block:
    """A byte range of a segment file with its row count and CRC-32."""

    offset: int
    length: int
    rows: int
    crc32: int

    def to_json(self) -> list[int]:
        return [self.offset, self.length, self.rows, self.crc32]

    @classmethod
    def from_json(cls, value: list[int]) -> Block:
        return cls(*value)


@dataclass(frozen=True)
class VnodeRun:
    """All rows of one vnode in one segment."""

    vnode: int
    blocks: tuple[Block, ...]

    @property
    def rows(self) -> int:
        return sum(b.rows for b in self.blocks)

    @property
    def bytes(self) -> int:
        return sum(b.length for b in self.blocks)


@dataclass(frozen=True)
class SegmentDescriptor:
    """What seal records about one segment file; returned by append, picklable."""

    name: str
    """Path relative to the log store root: ``<epoch, 20 digits>/<writer id>-<random>.seg``."""
    epoch: int
    size: int
    schema: Block
    schema_bytes: bytes
    runs: tuple[VnodeRun, ...]
    sink_id: str = ""

    @property
    def rows(self) -> int:
        return sum(r.rows for r in self.runs)

    @property
    def vnodes(self) -> list[int]:
        return [r.vnode for r in self.runs]

    def footer(self) -> dict[str, Any]:
        return {
            "format": FORMAT_VERSION,
            "sink_id": self.sink_id,
            "epoch": self.epoch,
            "name": self.name,
            "schema": self.schema.to_json(),
            "vnodes": [[r.vnode, [b.to_json() for b in r.blocks]] for r in self.runs],
        }


def epoch_dir(epoch: int) -> str:
    return f"{epoch:020d}"


def parse_name(relpath: str) -> tuple[int, bool] | None:
    """``(epoch, is_temp)`` for a path that the log store could have written, else None."""
    head, sep, base = relpath.partition("/")
    if not sep or "/" in base or len(head) != 20 or not head.isdigit():
        return None
    if base.startswith(".") and ".seg.tmp-" in base:
        return int(head), True
    if base.endswith(SUFFIX) and not base.startswith("."):
        return int(head), False
    return None


def describe_vnodes(vnodes: list[int]) -> str:
    if len(vnodes) <= 8:
        return ", ".join(map(str, vnodes))
    return f"{', '.join(map(str, vnodes[:8]))}, ... ({len(vnodes)} vnodes)"


def encode(
    batch: pa.RecordBatch,
    runs: list[tuple[int, int, int]],
    *,
    name: str,
    epoch: int,
    sink_id: str,
    max_block_bytes: int,
) -> tuple[list[Any], SegmentDescriptor]:
    """Serialize ``batch`` (already sorted by vnode) into segment parts.

    ``runs`` lists ``(vnode, first row, row count)`` in vnode order. Returns the byte parts to write in order
    and the descriptor of the file they form.
    """
    parts: list[Any] = [MAGIC]
    offset = len(MAGIC)
    row_bytes = max(1, batch.nbytes // max(1, batch.num_rows))
    rows_per_block = max(1, max_block_bytes // row_bytes)
    out_runs: list[VnodeRun] = []
    for vnode, start, count in runs:
        blocks = []
        for first in range(start, start + count, rows_per_block):
            n = min(rows_per_block, start + count - first)
            buf = batch.slice(first, n).serialize()
            blocks.append(Block(offset, buf.size, n, zlib.crc32(buf)))
            parts.append(buf)
            offset += buf.size
        out_runs.append(VnodeRun(vnode, tuple(blocks)))
    schema_bytes = batch.schema.serialize().to_pybytes()
    schema = Block(offset, len(schema_bytes), 0, zlib.crc32(schema_bytes))
    parts.append(schema_bytes)
    offset += len(schema_bytes)
    descriptor = SegmentDescriptor(name, epoch, 0, schema, schema_bytes, tuple(out_runs), sink_id)
    footer = json.dumps(descriptor.footer(), separators=(",", ":")).encode()
    parts += [footer, _TRAILER.pack(len(footer), zlib.crc32(footer)), MAGIC]
    size = offset + len(footer) + TRAILER_SIZE
    return parts, SegmentDescriptor(name, epoch, size, schema, schema_bytes, tuple(out_runs), sink_id)


def block_problem(data: bytes, block: Block) -> str | None:
    """Why ``data`` is not exactly the bytes ``block`` describes, or None if it is."""
    if len(data) != block.length:
        return (
            f"short read, expected {block.length} bytes at offset {block.offset}, got {len(data)} "
            "(the file was truncated)"
        )
    crc = zlib.crc32(data)
    if crc != block.crc32:
        return (
            f"checksum mismatch in the {block.length} bytes at offset {block.offset} "
            f"(expected CRC-32 {block.crc32:08x}, got {crc:08x})"
        )
    return None


def decode_schema(data: bytes) -> pa.Schema:
    return pa.ipc.read_schema(pa.py_buffer(data))


def decode_block(data: bytes, schema: pa.Schema) -> pa.RecordBatch:
    return pa.ipc.read_record_batch(pa.py_buffer(data), schema)


def parse_file(data: bytes, *, where: str) -> SegmentDescriptor:
    """Check a whole segment file (magic, footer and every block checksum) and return its descriptor."""

    def corrupt(why: str) -> SegmentCorruptError:
        return SegmentCorruptError(f"{where}: {why}")

    if len(data) < len(MAGIC) + TRAILER_SIZE or data[: len(MAGIC)] != MAGIC or data[-len(MAGIC) :] != MAGIC:
        raise corrupt(f"not a complete segment file ({len(data)} bytes; header or trailer magic missing)")
    footer_len, footer_crc = _TRAILER.unpack_from(data, len(data) - TRAILER_SIZE)
    footer_end = len(data) - TRAILER_SIZE
    footer = data[footer_end - footer_len : footer_end]
    if footer_len > footer_end or zlib.crc32(footer) != footer_crc:
        raise corrupt("footer checksum mismatch")
    meta = json.loads(footer)
    if meta.get("format") != FORMAT_VERSION:
        raise corrupt(f"unknown segment format {meta.get('format')!r}")
    schema = Block.from_json(meta["schema"])
    runs = tuple(VnodeRun(vnode, tuple(Block.from_json(b) for b in blocks)) for vnode, blocks in meta["vnodes"])
    for block in [schema, *(b for r in runs for b in r.blocks)]:
        problem = block_problem(data[block.offset : block.offset + block.length], block)
        if problem:
            raise corrupt(problem)
    schema_bytes = data[schema.offset : schema.offset + schema.length]
    return SegmentDescriptor(meta["name"], meta["epoch"], len(data), schema, schema_bytes, runs, meta["sink_id"])


def iter_blocks(runs: tuple[VnodeRun, ...]) -> Iterator[tuple[int, Block]]:
    for run in runs:
        for block in run.blocks:
            yield run.vnode, block
