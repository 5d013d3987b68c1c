"""Append: turn one task's rows for one epoch into one durable segment file.

:func:`append_segment` runs inside Spark tasks. It is a plain function of its arguments: everything it needs
travels in an :class:`AppendTarget`, which pickles.

The rows are sorted by vnode and encoded step by step while the storage writes what is ready: for local
storage a writer thread writes one group of blocks while the next group is sorted (``take``) and serialized,
so the CPU work overlaps the disk and only about one group of sorted rows is in memory at a time. The file is
byte for byte the one that sorting the whole table at once and encoding it with :func:`segment.encode`
would give (see ``_sorted_groups`` for what that takes).
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Literal

import pyarrow as pa
import pyarrow.compute as pc

from . import segment
from .errors import InvalidSegmentInputError
from .failpoints import failpoint
from .storage import LogLocation

VNODE_COLUMN = "__vnode"
DEFAULT_MAX_BLOCK_BYTES = 4 * 2**20
_WRITER_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")

GROUP_BYTES = 8 * 2**20
"""Unsorted input rows are sorted and encoded in groups of about this many bytes (whole blocks), one group at a
time, while the storage writes the previous ones."""
_LOOKAHEAD_ROWS = 512
_LOOKAHEAD_DATA_BYTES = 64


@dataclass(frozen=True)
class AppendTarget:
    """Everything a task needs to append to one log store."""

    location: LogLocation
    vnodes: int
    sink_id: str
    vnode_column: str = VNODE_COLUMN
    max_block_bytes: int = DEFAULT_MAX_BLOCK_BYTES


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


_FIXED_WIDTH: tuple[Callable[[pa.DataType], bool], ...] = (
    pa.types.is_boolean,
    pa.types.is_integer,
    pa.types.is_floating,
    pa.types.is_temporal,
    pa.types.is_decimal,
    pa.types.is_fixed_size_binary,
)
_VARIABLE_WIDTH: tuple[Callable[[pa.DataType], bool], ...] = (
    pa.types.is_string,
    pa.types.is_binary,
    pa.types.is_large_string,
    pa.types.is_large_binary,
)


@dataclass
class _Column:
    """One data column of the input (a single chunk) and how to produce its rows in vnode order."""

    values: pa.Array
    kind: Literal["fixed", "variable", "other"]
    """``fixed`` or ``variable`` (width): taken group by group; ``other`` (nested, view, extension, null types):
    taken whole up front (``sorted``) and sliced, as these are rare and their IPC slicing is harder to match."""
    sorted: pa.Array | None = None

    def sorted_nbytes(self, order: pa.Array) -> int:
        """``nbytes`` of the whole column taken in ``order``, as ``take`` would make it, without taking it all.

        ``take`` gives a fresh array: its values (and the offsets of strings) cover exactly ``len(order)`` rows,
        string data holds the non-null values only, and it has a validity bitmap when the input may have nulls
        (``values.MayHaveNulls()`` in Arrow, which does not depend on the indices: a one-row take shows it).
        """
        if self.kind == "other":
            self.sorted = pc.take(self.values, order)
            return int(self.sorted.nbytes)
        n = len(order)
        has_bitmap = pc.take(self.values, order.slice(0, 1)).buffers()[0] is not None
        size = (n + 7) // 8 if has_bitmap else 0
        if self.kind == "fixed":
            return size + (n * int(self.values.type.bit_width) + 7) // 8
        offset_width = (
            8 if pa.types.is_large_string(self.values.type) or pa.types.is_large_binary(self.values.type) else 4
        )
        data = pc.sum(pc.binary_length(self.values)).as_py() or 0
        return size + offset_width * n + int(data)


def _column(values: pa.Array) -> _Column:
    type_ = values.type
    if any(test(type_) for test in _FIXED_WIDTH):
        return _Column(values, "fixed")
    if any(test(type_) for test in _VARIABLE_WIDTH):
        return _Column(values, "variable")
    return _Column(values, "other")


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


def _data_after(array: pa.Array, row: int) -> int:
    """Bytes of string data of ``array`` in rows ``row`` and after (for a fresh ``take`` output, whose null
    values are empty, the bytes its data buffer holds after row ``row`` begins)."""
    return int(pc.sum(pc.binary_length(array.slice(row))).as_py() or 0)


def _sorted_groups(
    data: pa.Table,
    order: pa.Array,
    runs: list[tuple[int, int, int]],
    encoder: segment.SegmentEncoder,
    max_block_bytes: int,
) -> Iterator[Any]:
    """The parts of the segment of ``data`` taken in ``order`` (stable, by vnode), sorted and encoded group by group.

    Equal, byte for byte, to sorting the whole table (``data.take(order)``) and encoding it: the block size
    comes from the ``nbytes`` the whole sorted table would have, and every block is serialized from a slice
    with the same surroundings as in the whole sorted table. Arrow's IPC writer sends the bytes that follow a
    sliced buffer as padding (up to 63 bytes of string data, 7 of values) and, for a slice at offset 0, keeps
    a buffer whole when it is barely longer than the slice. So each group is taken with one row before it
    (no block is at offset 0 of a group, except the table's first block, as before) and at least
    ``_LOOKAHEAD_ROWS`` rows and ``_LOOKAHEAD_DATA_BYTES`` of string data after it, or up to the last row.
    """
    yield segment.MAGIC
    columns = [_column(column.chunk(0)) for column in data.combine_chunks().columns]
    n = len(order)
    nbytes = sum(column.sorted_nbytes(order) for column in columns)
    rows_per_block = segment.rows_per_block(nbytes, n, max_block_bytes)
    group_rows = max(1, GROUP_BYTES // max(1, nbytes // n))

    def take(lo: int, end: int) -> pa.RecordBatch:
        ahead = _LOOKAHEAD_ROWS
        while True:
            hi = min(n, end + ahead)
            indices = order.slice(lo, hi - lo)
            arrays = [
                pc.take(column.values, indices) if column.sorted is None else column.sorted.slice(lo, hi - lo)
                for column in columns
            ]
            if hi == n or all(
                _data_after(array, end - lo) >= _LOOKAHEAD_DATA_BYTES
                for array, column in zip(arrays, columns, strict=True)
                if column.kind == "variable"
            ):
                return pa.RecordBatch.from_arrays(arrays, schema=data.schema)
            ahead *= 8

    for start, end, pieces in _groups(runs, rows_per_block, group_rows):
        lo = start - 1 if start else 0
        batch = take(lo, end)
        yield from encoder.blocks(batch, [(v, first - lo, count) for v, first, count in pieces], rows_per_block)
        del batch
    yield from encoder.finish(data.schema)


def _in_order(
    data: pa.Table, runs: list[tuple[int, int, int]], encoder: segment.SegmentEncoder, max_block_bytes: int
) -> Iterator[Any]:
    """The parts of the segment of ``data``, already in vnode order: blocks are slices of the input."""
    yield segment.MAGIC
    batches = data.combine_chunks().to_batches()
    batch = batches[0] if len(batches) == 1 else pa.concat_batches(batches)
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
    encoder = segment.SegmentEncoder(name=name, epoch=epoch, sink_id=target.sink_id)
    if order is None or data.num_columns == 0:
        parts = _in_order(data, runs, encoder, target.max_block_bytes)
    else:
        parts = _sorted_groups(data, order, runs, encoder, target.max_block_bytes)
    failpoint("logstore.append.before_write")
    target.location.open().write(name, parts)  # sorts and encodes the rows as it writes them
    failpoint("logstore.append.after_write")
    return encoder.descriptor
