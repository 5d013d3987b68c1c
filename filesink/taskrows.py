"""The rows the sink's Spark tasks send back to the driver: an append task's segment or refusal, a file's objects.

Each row is built from Arrow buffers, not from Python values. Converting a Python value (``pa.array([...])``,
``pa.scalar``) makes pyarrow import pandas, to check whether the value is one of pandas' types: 0.3 s of CPU and
tens of MB in every Python worker Spark starts, for nothing the tasks use. ``tests/filesink/test_task_imports.py``
checks that what the tasks run leaves pandas unimported.

This module runs in Spark tasks: it imports only pyarrow and the refusal column's name.
"""

from __future__ import annotations

import struct

import pyarrow as pa

from .admission import REFUSED_COLUMN

APPEND_COLUMNS = ["descriptor", REFUSED_COLUMN]
APPEND_SCHEMA = f"descriptor binary, {REFUSED_COLUMN} string"
"""What an append task returns: its pickled segment descriptor, or the refusal of its rows."""
WRITTEN_COLUMNS = ["name", "objects"]
WRITTEN_SCHEMA = "name string, objects binary"
"""What a file-writing task returns: the file's name and its pickled written objects."""


def one_value(value: str | bytes) -> pa.Array:
    """A one-row string array (``str``, a lone surrogate replaced by ``?``) or binary array (``bytes``)."""
    data = value.encode("utf-8", "replace") if isinstance(value, str) else value
    kind = pa.string() if isinstance(value, str) else pa.binary()
    offsets = pa.py_buffer(struct.pack("<ii", 0, len(data)))
    return pa.Array.from_buffers(kind, 1, [None, offsets, pa.py_buffer(data)])


def appended(descriptor: bytes) -> pa.RecordBatch:
    """An append task's row for the segment it wrote (``descriptor``: the pickled descriptor)."""
    return pa.record_batch([one_value(descriptor), pa.nulls(1, pa.string())], names=APPEND_COLUMNS)


def refused(message: str) -> pa.RecordBatch:
    """An append task's row when the admission refused its rows."""
    return pa.record_batch([pa.nulls(1, pa.binary()), one_value(message)], names=APPEND_COLUMNS)


def written(name: str, objects: bytes) -> pa.RecordBatch:
    """A file-writing task's row for file ``name`` (``objects``: its pickled written objects)."""
    return pa.record_batch([one_value(name), one_value(objects)], names=WRITTEN_COLUMNS)
