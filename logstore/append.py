"""Append: turn one task's rows for one epoch into one durable segment file.

:func:`append_segment` runs inside Spark tasks. It is a plain function of its arguments: everything it needs
travels in an :class:`AppendTarget`, which pickles.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterable
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from . import segment
from .errors import InvalidSegmentInputError
from .failpoints import failpoint
from .storage import LogLocation

VNODE_COLUMN = "__vnode"
DEFAULT_MAX_BLOCK_BYTES = 4 * 2**20
_WRITER_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


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
    if table.num_rows > 1 and not pc.all(pc.greater_equal(vnode_values[1:], vnode_values[:-1])).as_py():
        order = pc.sort_indices(vnode_values)  # stable: input order is kept within a vnode
        table = table.take(order)
        vnode_values = vnode_values.take(order)
    table = table.combine_chunks()
    runs = _vnode_runs(vnode_values, target, where)
    batches = table.drop_columns([column]).to_batches()
    batch = batches[0] if len(batches) == 1 else pa.concat_batches(batches)
    parts, descriptor = segment.encode(
        batch, runs, name=name, epoch=epoch, sink_id=target.sink_id, max_block_bytes=target.max_block_bytes
    )
    failpoint("logstore.append.before_write")
    target.location.open().write(name, parts)
    failpoint("logstore.append.after_write")
    return descriptor
