"""Spark's Python workers, started while the query plans its first batch.

A Spark session starts its Python workers at its first Python job: the daemon starts, forks a worker per core,
and each worker imports PySpark's worker module and pyarrow before it runs a task (about 2 s on two cores,
``docs/benchmarks.md``). Without a warm-up that job is the sink's first append, so every start of a query pays it
after the query has planned and read its first batch. :func:`start_python_workers` runs a job of one empty task
per core in a daemon thread, right before the query starts: the workers start while the query plans, and Spark
reuses them (``spark.python.worker.reuse``, on by default) for the append.

Nothing waits for it and nothing depends on it: if it fails (the session stops), the first append starts the
workers, as it would without it.

Only under a ``local`` master. On a cluster the sink's first Python job is its probe of the executors
(:func:`filesink.tasks.shared.probe`), which starts the workers anyway, and which counts on idle executors to spread its
tasks over every one of them: a warm-up job holding some cores at that moment could leave an executor unprobed.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from typing import Any

import pyarrow as pa

from ..tasks.shared import on_cluster

log = logging.getLogger(__name__)


def _pass_through(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    yield from batches


def start_python_workers(spark: Any, tasks: int) -> threading.Thread | None:
    """Start a job of ``tasks`` one-row tasks through ``mapInArrow`` in a daemon thread, and return the thread; on a
    cluster, nothing (None: see the module's docstring)."""
    if on_cluster(spark):
        return None

    def run() -> None:
        try:
            spark.range(0, tasks, 1, tasks).mapInArrow(_pass_through, "id long").collect()
        except Exception as e:  # the first append starts the workers instead
            log.debug("the Python workers' warm-up job did not run: %s", e)

    thread = threading.Thread(target=run, name="filesink-python-workers", daemon=True)
    thread.start()
    return thread
