"""Append: turn one task's rows for one epoch into one durable segment file.

:func:`append_segment` runs inside Spark tasks. It is a plain function of its arguments: everything it needs
travels in an :class:`AppendTarget`, which pickles.

The rows are sorted by vnode and encoded step by step while the storage writes what is ready: for local
storage a writer thread writes one group of blocks while the next group is sorted (``take``) and serialized,
so the CPU work overlaps the disk and only about one group of sorted rows is in memory at a time (large
string, binary and nested columns are reordered in two passes, see :mod:`logstore.reorder`). The rows and
their order are those of sorting the whole table at once (stable, by vnode).
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from . import segment
from .diagnosis import diagnose
from .errors import InvalidSegmentInputError, LogStoreError, LogWriteError
from .failpoints import failpoint
from .reorder import Reorder
from .storage import LogLocation, is_local

VNODE_COLUMN = "__vnode"
DEFAULT_MAX_BLOCK_BYTES = 4 * 2**20
_WRITER_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")

OBJECT_STORE_COMPRESSION: str | None = "zstd"
"""Block compression of a log store on an object store: its segments are written to the store and read back by
the file writers (and the size rule's sample), through the network and the store's server. zstd at its default
level shrinks typical rows several times for a fraction of that cost; a local log store goes through the page
cache, where compressing costs more than it saves, and stays uncompressed."""


def compression_for(location: LogLocation) -> str | None:
    """The block compression of a log store at ``location``: :data:`OBJECT_STORE_COMPRESSION` on an object
    store, none on local disk."""
    return None if is_local(location.url) else OBJECT_STORE_COMPRESSION


GROUP_BYTES = 8 * 2**20
"""Unsorted input rows are sorted and encoded in groups of about this many bytes (whole blocks), one group at a
time, while the storage writes the previous ones."""


@dataclass(frozen=True)
class AppendTarget:
    """Everything a task needs to append to one log store."""

    location: LogLocation
    vnodes: int
    sink_id: str
    vnode_column: str = VNODE_COLUMN
    max_block_bytes: int = DEFAULT_MAX_BLOCK_BYTES
    compression: str | None = None
    """How block bodies are compressed (:func:`logstore.segment.serialize_block`); see :func:`compression_for`."""


def _as_table(data: pa.Table | pa.RecordBatch | Iterable[pa.RecordBatch]) -> pa.Table | None:
    if isinstance(data, pa.Table):
        return data
    if isinstance(data, pa.RecordBatch):
        return pa.Table.from_batches([data])
    batches = list(data)
    return pa.Table.from_batches(batches) if batches else None


def _vnode_runs(vnodes: pa.Array, target: AppendTarget, where: str) -> list[tuple[int, int, int]]:
    """``(vnode, first row, count)`` for each run of the sorted vnode column, after checking its values."""
    if vnodes.null_count:
        raise InvalidSegmentInputError(f"{where}: column {target.vnode_column!r} has {vnodes.null_count} nulls")
    encoded = pc.run_end_encode(vnodes)
    values = encoded.values.to_pylist()
    ends = encoded.run_ends.to_pylist()
    if values[0] < 0 or values[-1] >= target.vnodes:
        bad = values[0] if values[0] < 0 else values[-1]
        raise InvalidSegmentInputError(
            f"{where}: vnode {bad} is outside 0..{target.vnodes - 1} (this log store has {target.vnodes} vnodes)"
        )
    starts = [0, *ends[:-1]]
    return [(int(v), s, e - s) for v, s, e in zip(values, starts, ends, strict=True)]


def _groups(
    runs: list[tuple[int, int, int]], rows_per_block: int, group_rows: int
) -> Iterator[tuple[int, int, list[tuple[int, int, int]]]]:
    """Cut the vnode runs into consecutive groups of about ``group_rows`` rows, at block boundaries.

    Yields ``(first row, end row, pieces)``, where the pieces are ``(vnode, first row, count)`` parts of runs;
    a run cut in several pieces is cut after a whole number of blocks, so it splits into the same blocks.
    """
    pieces: list[tuple[int, int, int]] = []
    start = size = 0
    for vnode, first, count in runs:
        end = first + count
        while first < end:
            n = end - first
            if n > group_rows - size:
                n = (group_rows - size) // rows_per_block * rows_per_block
                if n <= 0:
                    if size:
                        yield start, first, pieces
                        pieces, start, size = [], first, 0
                        continue
                    n = min(rows_per_block, end - first)
            pieces.append((vnode, first, n))
            size += n
            first += n
            if size >= group_rows:
                yield start, first, pieces
                pieces, start, size = [], first, 0
    if pieces:
        yield start, pieces[-1][1] + pieces[-1][2], pieces


def _one_batch(table: pa.Table) -> pa.RecordBatch:
    batches = table.combine_chunks().to_batches()
    return batches[0] if len(batches) == 1 else pa.concat_batches(batches)


def _sorted_groups(
    data: pa.Table,
    order: pa.Array,
    runs: list[tuple[int, int, int]],
    encoder: segment.SegmentEncoder,
    max_block_bytes: int,
) -> Iterator[Any]:
    """The parts of the segment of ``data`` taken in ``order`` (stable, by vnode), sorted and encoded group by
    group, so that only one group of sorted rows is in memory and the storage writes while the next is made."""
    yield segment.MAGIC
    data = data.combine_chunks()
    rows_per_block = segment.rows_per_block(data.nbytes, data.num_rows, max_block_bytes)
    group_rows = max(1, GROUP_BYTES // max(1, data.nbytes // max(1, data.num_rows)))
    rows = Reorder(data, order)
    for start, end, pieces in _groups(runs, rows_per_block, group_rows):
        batch = _one_batch(rows.take(start, end))
        yield from encoder.blocks(batch, [(v, first - start, count) for v, first, count in pieces], rows_per_block)
    yield from encoder.finish(data.schema)


def _in_order(
    data: pa.Table, runs: list[tuple[int, int, int]], encoder: segment.SegmentEncoder, max_block_bytes: int
) -> Iterator[Any]:
    """The parts of the segment of ``data``, already in vnode order: blocks are slices of the input."""
    yield segment.MAGIC
    batch = _one_batch(data)
    yield from encoder.blocks(batch, runs, segment.rows_per_block(batch.nbytes, batch.num_rows, max_block_bytes))
    yield from encoder.finish(batch.schema)


def append_segment(
    target: AppendTarget,
    epoch: int,
    data: pa.Table | pa.RecordBatch | Iterable[pa.RecordBatch],
    *,
    writer_id: str = "w",
) -> segment.SegmentDescriptor | None:
    """Write ``data`` for ``epoch`` as one segment file and return its descriptor (None if there are no rows).

    ``data`` must hold the vnode column (``target.vnode_column``, integers in ``0..vnodes-1``); the segment
    stores the other columns, sorted by vnode with the input order kept within each vnode. ``writer_id``
    identifies the writer attempt in the file name (letters, digits, ``-`` and ``_``); a random suffix makes
    the name unique even when an attempt id repeats. The file is durable when this returns; it becomes part
    of the log only when the driver seals the epoch with the returned descriptor.
    """
    if epoch < 0:
        raise InvalidSegmentInputError(f"epoch {epoch} is negative; epochs are Spark batch ids (0, 1, 2, ...)")
    if not _WRITER_ID.match(writer_id):
        raise InvalidSegmentInputError(
            f"writer id {writer_id!r} must be 1 to 64 letters, digits, '-' or '_' (it becomes part of a file name)"
        )
    name = f"{segment.epoch_dir(epoch)}/{writer_id}-{uuid.uuid4().hex}{segment.SUFFIX}"
    where = f"append to epoch {epoch} ({name})"
    table = _as_table(data)
    if table is None or table.num_rows == 0:
        return None
    column = target.vnode_column
    if column not in table.column_names:
        raise InvalidSegmentInputError(f"{where}: the rows have no vnode column {column!r}")
    if not pa.types.is_integer(table.schema.field(column).type):
        raise InvalidSegmentInputError(
            f"{where}: vnode column {column!r} must be an integer, not {table.schema.field(column).type}"
        )
    for field in table.schema:
        if pa.types.is_dictionary(field.type):
            raise InvalidSegmentInputError(
                f"{where}: column {field.name!r} is dictionary-encoded; decode it before appending"
            )
    vnode_values = table[column].combine_chunks()
    order = None
    if table.num_rows > 1 and not pc.all(pc.greater_equal(vnode_values[1:], vnode_values[:-1])).as_py():
        order = pc.sort_indices(vnode_values)  # stable: input order is kept within a vnode
        vnode_values = vnode_values.take(order)
    runs = _vnode_runs(vnode_values, target, where)
    data = table.drop_columns([column])
    encoder = segment.SegmentEncoder(name=name, epoch=epoch, sink_id=target.sink_id, compression=target.compression)
    if order is None or data.num_columns == 0:
        parts = _in_order(data, runs, encoder, target.max_block_bytes)
    else:
        parts = _sorted_groups(data, order, runs, encoder, target.max_block_bytes)
    failpoint("logstore.append.before_write")
    storage = target.location.open()
    try:
        storage.write(name, parts)  # sorts and encodes the rows as it writes them
    except LogStoreError:
        raise
    except OSError as e:
        found = diagnose(e, target.location.canonical)
        message = (
            f"{where}: cannot write {storage.display(name)}: {found.cause}. Nothing of this epoch is sealed, so "
            f"nothing is lost: {found.advise('restart the query; the epoch is appended again')}"
        )
        raise (LogWriteError(message) if e.errno is None else LogWriteError(e.errno, message)) from e
    failpoint("logstore.append.after_write")
    return encoder.descriptor
