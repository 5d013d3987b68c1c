"""The segment file format: one task attempt's rows for one epoch, grouped by vnode.

Layout (all integers little-endian)::

    MAGIC (8 bytes)
    block 0 | block 1 | ...            Arrow IPC record batch messages, sorted by vnode
    schema block                       Arrow IPC schema message
    footer                             UTF-8 JSON describing every block (see ``SegmentDescriptor``)
    footer length (u32) | footer CRC-32 (u32) | MAGIC

A block holds rows of exactly one vnode, at most ``max_block_bytes`` of them in memory (one block is the unit
of reading, so it bounds the reader's memory). A block may be compressed: the log store compresses blocks on
object stores, where every byte crosses the network twice (:data:`logstore.append.OBJECT_STORE_COMPRESSION`).
A compressed block is the whole message compressed at once, behind a 12-byte header (a 4-byte tag naming the
codec, ``ZSTD`` or ``LZ4F``, and the message's length, u64): one codec call per block. Format 1 segments (and
the ``ipc:`` settings of :func:`serialize_block`) compress each of a message's buffers on its own instead,
which Arrow IPC records in the message; a block of 256 in a segment has dozens of small buffers, and those calls
cost 2 to 4 times as much CPU to write and to read. A reader tells the kinds apart by a block's first bytes (an
IPC message starts with ``0xFFFFFFFF``), so a segment may hold any of them. Every block and the schema carry a
CRC-32 of their bytes as stored; the descriptor is also recorded in the state database when the epoch is sealed,
so a reader never trusts the file alone.
"""

from __future__ import annotations

import json
import struct
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from .errors import SegmentCorruptError

MAGIC = b"FSLSEG01"
FORMAT_VERSION = 2
"""Written in a segment's footer. 2: blocks may be compressed whole (see the module's docstring); a reader of
format 1 only would not decode them, and refuses the file by this number. Both are read."""
READ_FORMATS = (1, 2)
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


def rows_per_block(nbytes: int, num_rows: int, max_block_bytes: int) -> int:
    """Rows per block for rows of ``nbytes`` in memory in all: about ``max_block_bytes`` of rows, at least one."""
    row_bytes = max(1, nbytes // max(1, num_rows))
    return max(1, max_block_bytes // row_bytes)


class SegmentEncoder:
    """Builds the parts of one segment file incrementally, computing offsets and checksums as it goes.

    Write :data:`MAGIC`, then the parts :meth:`blocks` yields (in vnode order), then the parts :meth:`finish`
    returns; :attr:`descriptor` describes the file they form once :meth:`finish` has run.
    """

    def __init__(self, *, name: str, epoch: int, sink_id: str, compression: str | None = None) -> None:
        self.name = name
        self.compression = compression
        self.epoch = epoch
        self.sink_id = sink_id
        self._offset = len(MAGIC)
        self._runs: list[VnodeRun] = []
        self._vnode: int | None = None
        self._blocks: list[Block] = []
        self._descriptor: SegmentDescriptor | None = None

    def _close_run(self) -> None:
        if self._vnode is not None:
            self._runs.append(VnodeRun(self._vnode, tuple(self._blocks)))
        self._vnode, self._blocks = None, []

    def block(self, vnode: int, rows: pa.RecordBatch) -> Any:
        """Serialize ``rows`` (all of ``vnode``) as the next block of the file and return its bytes.

        Consecutive blocks of the same vnode form one run of the descriptor.
        """
        if self._descriptor is not None:
            raise RuntimeError(f"segment {self.name} is already finished")
        buf = serialize_block(rows, self.compression)
        if vnode != self._vnode:
            self._close_run()
            self._vnode = vnode
        self._blocks.append(Block(self._offset, buf.size, rows.num_rows, zlib.crc32(buf)))
        self._offset += buf.size
        return buf

    def blocks(self, batch: pa.RecordBatch, runs: Iterable[tuple[int, int, int]], rows_per_block: int) -> Iterator[Any]:
        """Serialize ``(vnode, first row, row count)`` runs of ``batch`` as blocks of ``rows_per_block`` rows.

        Each run is split from its first row on; a run may continue one given earlier (same vnode, next
        rows), in which case it must start at a block boundary of that vnode's rows to split as one run would.
        """
        for vnode, start, count in runs:
            end = start + count
            for first in range(start, end, rows_per_block):
                yield self.block(vnode, batch.slice(first, min(rows_per_block, end - first)))

    def finish(self, schema: pa.Schema) -> list[bytes]:
        """The parts after the last block (schema, footer, trailer); sets :attr:`descriptor`."""
        self._close_run()
        schema_bytes = schema.serialize().to_pybytes()
        schema_block = Block(self._offset, len(schema_bytes), 0, zlib.crc32(schema_bytes))
        offset = self._offset + len(schema_bytes)
        runs = tuple(self._runs)
        described = SegmentDescriptor(self.name, self.epoch, 0, schema_block, schema_bytes, runs, self.sink_id)
        footer = json.dumps(described.footer(), separators=(",", ":")).encode()
        size = offset + len(footer) + TRAILER_SIZE
        self._descriptor = SegmentDescriptor(
            self.name, self.epoch, size, schema_block, schema_bytes, runs, self.sink_id
        )
        return [schema_bytes, footer, _TRAILER.pack(len(footer), zlib.crc32(footer)), MAGIC]

    @property
    def descriptor(self) -> SegmentDescriptor:
        """The descriptor of the file, once :meth:`finish` has run."""
        if self._descriptor is None:
            raise RuntimeError(f"segment {self.name} is not finished: its descriptor is not known yet")
        return self._descriptor


_PACKED = struct.Struct("<4sQ")
"""The header of a block compressed whole: the codec's tag, then the length of the message it holds."""
_TAGS = {"zstd": b"ZSTD", "lz4": b"LZ4F"}
_CODEC_OF_TAG = {tag: codec for codec, tag in _TAGS.items()}
IPC_PREFIX = "ipc:"
"""``ipc:zstd``, ``ipc:lz4``: Arrow IPC body compression, buffer by buffer, as format 1 segments have it."""


def serialize_block(rows: pa.RecordBatch, compression: str | None) -> Any:
    """``rows`` as one Arrow IPC record batch message: as is (None), compressed whole with ``compression``
    (``"zstd"``, ``"lz4"``) behind a header that names the codec, or with its body buffers compressed one by one
    (``"ipc:zstd"``, ``"ipc:lz4"``, as format 1 wrote them). :func:`decode_block` reads every kind, and a segment
    may hold several."""
    if compression is None:
        return rows.serialize()
    if compression.startswith(IPC_PREFIX):
        options = pa.ipc.IpcWriteOptions(compression=compression.removeprefix(IPC_PREFIX))
        stream = pa.BufferOutputStream()
        with pa.ipc.new_stream(stream, rows.schema, options=options) as writer:
            writer.write_batch(rows)
        messages = pa.ipc.MessageReader.open_stream(stream.getvalue())
        messages.read_next_message()  # the schema: a segment holds it once, after its blocks
        return messages.read_next_message().serialize()
    tag = _TAGS.get(compression)
    if tag is None:
        raise ValueError(f"unknown block compression {compression!r}: use zstd, lz4, ipc:zstd, ipc:lz4 or None")
    message = rows.serialize()
    packed = pa.compress(message, compression, asbytes=False)
    out = bytearray(_PACKED.size + packed.size)
    _PACKED.pack_into(out, 0, tag, message.size)
    out[_PACKED.size :] = packed
    return pa.py_buffer(out)


def encode(
    batch: pa.RecordBatch,
    runs: list[tuple[int, int, int]],
    *,
    name: str,
    epoch: int,
    sink_id: str,
    max_block_bytes: int,
    compression: str | None = None,
) -> tuple[list[Any], SegmentDescriptor]:
    """Serialize ``batch`` (already sorted by vnode) into segment parts, all at once.

    ``runs`` lists ``(vnode, first row, row count)`` in vnode order. Returns the byte parts to write in order
    and the descriptor of the file they form. :class:`SegmentEncoder` does the same step by step.
    """
    encoder = SegmentEncoder(name=name, epoch=epoch, sink_id=sink_id, compression=compression)
    per_block = rows_per_block(batch.nbytes, batch.num_rows, max_block_bytes)
    parts: list[Any] = [MAGIC, *encoder.blocks(batch, runs, per_block)]
    parts += encoder.finish(batch.schema)
    return parts, encoder.descriptor


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
    """The rows of a block's bytes, of any kind :func:`serialize_block` writes. Raises ``pa.ArrowInvalid`` or
    ``OSError`` for bytes that are not a block."""
    codec = _CODEC_OF_TAG.get(bytes(data[:4]))
    if codec is None:
        return pa.ipc.read_record_batch(pa.py_buffer(data), schema)
    if len(data) < _PACKED.size:
        raise pa.ArrowInvalid(f"a compressed block of {len(data)} bytes is shorter than its header")
    _, length = _PACKED.unpack_from(data)
    message = pa.decompress(memoryview(data)[_PACKED.size :], length, codec, asbytes=False)
    return pa.ipc.read_record_batch(message, schema)


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
    if meta.get("format") not in READ_FORMATS:
        raise corrupt(f"unknown segment format {meta.get('format')!r} (this version reads {READ_FORMATS})")
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
