"""The rows the sink's Spark tasks send back to the driver: an append task's segment or refusal, a file's objects,
and what a task does not see of the driver's local directories (:mod:`filesink.tasks.shared`).

Each row is built from Arrow buffers (:mod:`filesink.arrowvalues`): converting Python values would make pyarrow
import pandas in every Python worker.

This module runs in Spark tasks: it imports only pyarrow, the buffers' helpers and the refusal column's name.
"""

from __future__ import annotations

import pyarrow as pa

from logstore import requestcounts

from ..arrowvalues import one_value
from .admission import REFUSED_COLUMN

UNSHARED_COLUMN = "unshared"
"""The column in which a task reports that it does not see the driver's local directories
(:mod:`filesink.tasks.shared`)."""
COUNTS_COLUMN = "counts"
"""The column in which a task reports the requests it made to object stores and the retries of its work
(:func:`logstore.requestcounts.encode`; null when none), for the driver's metrics (:mod:`filesink.metrics.figures`)."""
APPEND_COLUMNS = ["descriptor", REFUSED_COLUMN, UNSHARED_COLUMN, COUNTS_COLUMN]
APPEND_SCHEMA = f"descriptor binary, {REFUSED_COLUMN} string, {UNSHARED_COLUMN} string, {COUNTS_COLUMN} string"
"""What an append task returns: its pickled segment descriptor, the refusal of its rows, or what it does not see;
and its counts."""
WRITTEN_COLUMNS = ["name", "objects", UNSHARED_COLUMN, COUNTS_COLUMN]
WRITTEN_SCHEMA = f"name string, objects binary, {UNSHARED_COLUMN} string, {COUNTS_COLUMN} string"
"""What a file-writing task returns: the file's name and its pickled written objects, or what it does not see; and
its counts."""
PROBE_SCHEMA = f"{UNSHARED_COLUMN} string"
"""What a task of the probe job (:func:`filesink.tasks.shared.probe`) returns: what it does not see, or null."""


def _text(value: str | None) -> pa.Array:
    return one_value(value) if value is not None else pa.nulls(1, pa.string())


def appended(descriptor: bytes, counts: str | None = None) -> pa.RecordBatch:
    """An append task's row for the segment it wrote (``descriptor``: the pickled descriptor)."""
    return pa.record_batch([one_value(descriptor), _text(None), _text(None), _text(counts)], names=APPEND_COLUMNS)


def refused(message: str) -> pa.RecordBatch:
    """An append task's row when the admission refused its rows."""
    return pa.record_batch(
        [pa.nulls(1, pa.binary()), one_value(message), _text(None), _text(None)], names=APPEND_COLUMNS
    )


def unshared(problem: str) -> pa.RecordBatch:
    """An append task's row when it does not see the driver's local directories (it wrote nothing)."""
    return pa.record_batch(
        [pa.nulls(1, pa.binary()), _text(None), one_value(problem), _text(None)], names=APPEND_COLUMNS
    )


def written(name: str, objects: bytes, counts: str | None = None) -> pa.RecordBatch:
    """A file-writing task's row for file ``name`` (``objects``: its pickled written objects)."""
    return pa.record_batch([one_value(name), one_value(objects), _text(None), _text(counts)], names=WRITTEN_COLUMNS)


def not_written(name: str, problem: str) -> pa.RecordBatch:
    """A file-writing task's row for file ``name`` when it does not see the driver's local directories (it wrote
    nothing of the file)."""
    return pa.record_batch(
        [one_value(name), pa.nulls(1, pa.binary()), one_value(problem), _text(None)], names=WRITTEN_COLUMNS
    )


def task_counts(before: dict[tuple[str, str, str], int], attempt: int) -> str | None:
    """What a task reports in :data:`COUNTS_COLUMN`: the requests it made since ``before`` (a
    :func:`logstore.requestcounts.snapshot`), and ``attempt`` (Spark's attempt number: the attempts before it
    are retries); None when there is nothing to report."""
    counts = requestcounts.since(before)
    if attempt > 0:
        counts[("retries", "spark", "task")] = attempt
    return requestcounts.encode(counts) if counts else None


def probed(problem: str | None) -> pa.RecordBatch:
    """A probe task's row: what it does not see of the driver's local directories, or null."""
    return pa.record_batch([_text(problem)], names=[UNSHARED_COLUMN])
