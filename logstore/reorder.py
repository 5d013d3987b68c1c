"""Reorder: the rows of a table in vnode order, group by group, in two passes for large variable-width columns.

An append takes the rows of its table in vnode order (a stable sort's indices) and encodes them group by
group. ``take`` in that order jumps across the whole table; for a fixed-width column that is cheap, but for a
large string, binary or nested column every row costs dependent reads far apart in memory (its offsets, then
its bytes), and the take runs 5 to 10 times slower than a take in row order.

So a large variable-width column is taken twice:

1. **By window.** The rows are cut into windows of consecutive rows (:data:`WINDOW_BYTES` of the largest such
   column) and taken window after window, in vnode order inside each window. Reads go forward through
   memory, one small window at a time.
2. **By group.** Each group's rows are taken from that copy. Inside a window the rows of one vnode are now
   consecutive, so each vnode's rows come in a few runs instead of one read per row.

The result is the same rows in the same order as ``table.take(order)``. The copy of the first pass holds these
columns once more while the groups are written. Fixed-width columns are taken in one pass, which is faster for
them, and so are variable-width columns of fewer than :data:`TWO_PASS_BYTES` in all: the positions of the two
passes cost the same for one column or many, and a small table's columns stay in the CPU's caches.
Measured in ``docs/benchmarks.md`` ("The reorder in two passes").
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

WINDOW_BYTES = 256 * 2**10
"""Bytes of the largest two-pass column in one window of the first pass."""

TWO_PASS_BYTES = 6 * 2**20
"""Variable-width columns of fewer bytes than this in all are taken in one pass."""


def fixed_width(type_: pa.DataType) -> bool:
    """Whether every value of ``type_`` has the same size in memory (no offsets to follow)."""
    return bool(
        pa.types.is_primitive(type_)
        or pa.types.is_decimal(type_)
        or pa.types.is_fixed_size_binary(type_)
        or pa.types.is_null(type_)
    )


class Reorder:
    """The rows of ``data`` (one chunk per column) in ``order``, as tables of consecutive parts of the order.

    ``order`` holds row indices (a stable sort's, so that each vnode's rows are in input order); the table of
    :meth:`take` ``(start, end)`` equals ``data.take(order[start:end])``.
    """

    def __init__(self, data: pa.Table, order: pa.Array) -> None:
        self.data = data
        self.order = order
        self._second: pa.Array | None = None
        self._first: dict[int, pa.ChunkedArray] = {}
        two_pass = [i for i, field in enumerate(data.schema) if not fixed_width(field.type)]
        if (
            not two_pass
            or data.num_rows == 0
            or sum(data.column(i).nbytes for i in two_pass) < TWO_PASS_BYTES
            or not hasattr(pc, "inverse_permutation")  # pyarrow before 19
        ):
            return
        widest = max(data.column(i).nbytes for i in two_pass) / data.num_rows
        window = max(1, int(WINDOW_BYTES // max(1.0, widest)))
        by_window = pc.sort_indices(pc.divide(order, window))  # stable: vnode order is kept inside a window
        first_order = order.take(by_window)
        index = pa.int32() if len(order) < 2**31 else pa.int64()
        # Where each row of `order` went in the first pass, of the type of its input (no options: pyarrow
        # versions before InversePermutationOptions reached Python take none).
        self._second = pc.inverse_permutation(by_window.cast(index))
        del by_window
        self._first = {i: data.column(i).take(first_order) for i in two_pass}

    @property
    def two_pass_columns(self) -> list[str]:
        """The names of the columns taken in two passes."""
        return [self.data.schema.field(i).name for i in sorted(self._first)]

    def take(self, start: int, end: int) -> pa.Table:
        """The rows ``order[start:end]`` of the table, in that order."""
        direct = self.order.slice(start, end - start)
        second = self._second.slice(start, end - start) if self._second is not None else None
        columns = [
            self._first[i].take(second) if second is not None and i in self._first else column.take(direct)
            for i, column in enumerate(self.data.columns)
        ]
        return pa.Table.from_arrays(columns, schema=self.data.schema)
