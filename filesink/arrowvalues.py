"""Arrow values made from buffers, for the code that runs in Spark tasks.

pyarrow imports pandas whenever it converts a Python value to Arrow (``pa.array([...])``, ``pa.scalar``, a Python
number in a compute call, ``Schema.empty_table()``), to check whether the value is one of pandas' types: 0.3 s of
CPU and tens of MB in every Python worker Spark starts, for nothing the tasks use. The few values the tasks need
are made here instead. ``tests/filesink/tasks/test_task_imports.py`` checks that the tasks leave pandas unimported.
"""

from __future__ import annotations

import struct

import pyarrow as pa


def one_value(value: str | bytes) -> pa.Array:
    """A one-row string array (``str``, a lone surrogate replaced by ``?``) or binary array (``bytes``)."""
    data = value.encode("utf-8", "replace") if isinstance(value, str) else value
    kind = pa.string() if isinstance(value, str) else pa.binary()
    offsets = pa.py_buffer(struct.pack("<ii", 0, len(data)))
    return pa.Array.from_buffers(kind, 1, [None, offsets, pa.py_buffer(data)])


def int64_scalar(value: int) -> pa.Scalar:
    """``value`` as an Arrow int64 scalar."""
    return pa.Array.from_buffers(pa.int64(), 1, [None, pa.py_buffer(struct.pack("<q", value))])[0]


def one_zero(kind: pa.DataType) -> pa.Array:
    """A one-row array of a fixed-width type (a number, a timestamp) holding zero: its bytes all zero."""
    return pa.Array.from_buffers(kind, 1, [None, pa.py_buffer(bytes(kind.bit_width // 8))])
