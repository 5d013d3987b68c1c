"""The rows the sink's Spark tasks send back to the driver: an append task's segment or refusal, a file's objects.

Each row is built from Arrow buffers (:mod:`filesink.arrowvalues`): converting Python values would make pyarrow
import pandas in every Python worker.

This module runs in Spark tasks: it imports only pyarrow, the buffers' helpers and the refusal column's name.
"""

from __future__ import annotations

import pyarrow as pa

from .admission import REFUSED_COLUMN
from .arrowvalues import one_value

APPEND_COLUMNS = ["descriptor", REFUSED_COLUMN]
APPEND_SCHEMA = f"descriptor binary, {REFUSED_COLUMN} string"
"""What an append task returns: its pickled segment descriptor, or the refusal of its rows."""
WRITTEN_COLUMNS = ["name", "objects"]
WRITTEN_SCHEMA = "name string, objects binary"
"""What a file-writing task returns: the file's name and its pickled written objects."""


def appended(descriptor: bytes) -> pa.RecordBatch:
    """An append task's row for the segment it wrote (``descriptor``: the pickled descriptor)."""
    return pa.record_batch([one_value(descriptor), pa.nulls(1, pa.string())], names=APPEND_COLUMNS)


def refused(message: str) -> pa.RecordBatch:
    """An append task's row when the admission refused its rows."""
    return pa.record_batch([pa.nulls(1, pa.binary()), one_value(message)], names=APPEND_COLUMNS)


def written(name: str, objects: bytes) -> pa.RecordBatch:
    """A file-writing task's row for file ``name`` (``objects``: its pickled written objects)."""
    return pa.record_batch([one_value(name), one_value(objects)], names=WRITTEN_COLUMNS)
