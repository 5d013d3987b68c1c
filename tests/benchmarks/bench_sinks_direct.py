"""The sink's long-history and writer-memory measurements, run in child processes of ``bench_sinks.py``.

Ten thousand Spark micro-batches take hours, so these measurements drive :class:`ExactlyOnceParquetSink`
without Spark: :class:`DirectSink` is the sink with its append step done in this process by the log store's
``append_segment`` (what each Spark task of the append job runs), and with no Spark session its files are
written in this process too (the function each Spark file-writing task runs). Everything else (seal, plan,
pre-commit, commit, garbage collection, start-up recovery) is the sink's own code.

Usage (by ``bench_sinks.py``)::

    python bench_sinks_direct.py history STATE OUTPUT EPOCHS ROWS   # prints "done" after EPOCHS epochs, goes on
    python bench_sinks_direct.py restart STATE OUTPUT               # prints the start-up time, then "ready"
    python bench_sinks_direct.py size STATE OUTPUT                  # opens and closes; prints the database size
    python bench_sinks_direct.py writer STATE OUTPUT TARGET INPUT...  # prints each file's writer peak memory
"""

from __future__ import annotations

import concurrent.futures
import json
import multiprocessing
import os
import sqlite3
import sys
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from bench_sinks_data import make_batch
from bench_sinks_monitor import status

from filesink import ExactlyOnceParquetSink, Rollover
from filesink.output import OutputLocation
from filesink.tasks.writer import FileTask, WrittenObject, write_file
from logstore import STATE_DB_NAME, VNODE_COLUMN, SegmentDescriptor, append_segment

VNODES = 256
PARALLELISM = 2
HISTORY_ROLLOVER = Rollover(target_file_size=None, max_epochs=20, max_age_seconds=None)
"""History runs: each writer writes a file every 20 epochs (small epochs, as a 1-second trigger gives)."""


class Batch:
    """What the sink uses of a Spark DataFrame (its schema), plus the rows with their vnode column."""

    sparkSession = None

    def __init__(self, table: pa.Table) -> None:
        from pyspark.sql.types import (
            DoubleType,
            LongType,
            StringType,
            StructField,
            StructType,
            TimestampType,
        )

        types = {"id": LongType(), "user_id": LongType(), "ts": TimestampType(), "amount": DoubleType()}
        self.schema = StructType([StructField(n, types.get(n, StringType())) for n in table.column_names])
        vnode = pc.cast(pc.bit_wise_and(table["user_id"], VNODES - 1), pa.int32())
        self.table = table.append_column(VNODE_COLUMN, vnode)


class DirectSink(ExactlyOnceParquetSink):
    """The sink, with the append done here instead of in a Spark job (see the module docstring)."""

    def _append(self, df: Any, epoch: int, version: Any = None) -> list[SegmentDescriptor]:
        descriptor = append_segment(self._store.target, epoch, df.table, writer_id="p0-a0")
        return [descriptor] if descriptor is not None else []


def open_sink(state: str, output: str, rollover: Rollover = HISTORY_ROLLOVER, parallelism: int = PARALLELISM) -> Any:
    return DirectSink(output, state, key_columns=["user_id"], vnodes=VNODES, parallelism=parallelism, rollover=rollover)


def history(state: str, output: str, epochs: int, rows: int) -> None:
    """Process epochs until ``epochs`` are sealed, print ``done``, then go on until killed."""
    tables = [make_batch(i * rows, rows, seed=1000 + i) for i in range(8)]
    sink = open_sink(state, output)
    epoch = sink.stats.last_epoch + 1
    started = time.perf_counter()
    while True:
        sink(Batch(tables[epoch % len(tables)]), epoch)
        epoch += 1
        if epoch == epochs:
            print(json.dumps({"done": epoch, "seconds": time.perf_counter() - started}), flush=True)


def restart(state: str, output: str) -> None:
    """Start the sink (lock, state database, recovery), print how long it took, process one epoch, wait."""
    table = make_batch(0, 1000, seed=7)
    started = time.perf_counter()
    sink = open_sink(state, output)
    seconds = time.perf_counter() - started
    recovered = len(sink.recovered.files) if sink.recovered is not None else 0
    print(json.dumps({"start_seconds": seconds, "recovered_files": recovered}), flush=True)
    sink(Batch(table), sink.stats.last_epoch + 1)
    print(json.dumps({"ready": True}), flush=True)
    time.sleep(3600)


def size(state: str, output: str) -> None:
    """Open and close the sink cleanly, then print the size of its state database."""
    open_sink(state, output).close()
    db = Path(state) / STATE_DB_NAME
    wal = db.with_name(db.name + "-wal")
    with sqlite3.connect(db) as con:
        pages, free, page_size = (
            con.execute(f"PRAGMA {p}").fetchone()[0] for p in ("page_count", "freelist_count", "page_size")
        )
    con.close()
    print(
        json.dumps(
            {
                "file_bytes": db.stat().st_size,
                "wal_bytes": wal.stat().st_size if wal.exists() else 0,
                "used_bytes": (pages - free) * page_size,
            }
        ),
        flush=True,
    )


def _measured_write(output: OutputLocation, task: FileTask) -> tuple[list[WrittenObject], int, int, int]:
    """In a fresh process: write one file; its RSS before, its peak RSS after, and pyarrow's peak allocation.

    The peak is ``VmHWM``, the high-water mark of this process's own memory. Not ``ru_maxrss``: on Linux that
    also counts the RSS of the process that started this one, at the moment it forked.
    """
    before = status(os.getpid())["VmRSS"]
    objects = write_file(output, task)
    peak = status(os.getpid())["VmHWM"]
    return objects, before, peak, pa.default_memory_pool().max_memory()


class MeasuredWriterSink(DirectSink):
    """Writes each file in a fresh process (as a Spark task would in a new Python worker) and notes its memory."""

    measured: list[dict[str, Any]]

    def _write(self, files: list[Any]) -> dict[str, list[WrittenObject]]:
        results: dict[str, list[WrittenObject]] = {}
        context = multiprocessing.get_context("spawn")
        for f in files:
            task = self._file_task(f, self._term)
            with concurrent.futures.ProcessPoolExecutor(1, mp_context=context) as pool:
                objects, before, peak, arrow_peak = pool.submit(_measured_write, self._output, task).result()
            results[task.name] = objects
            self.measured.append(
                {
                    "file": task.name,
                    "bytes": sum(o.size for o in objects),
                    "rows": sum(o.rows for o in objects),
                    "reason": f.reason,
                    "rss_before": before,
                    "rss_peak": peak,
                    "arrow_peak": arrow_peak,
                }
            )
        return results


def writer(state: str, output: str, target: int, inputs: list[str]) -> None:
    """One writer, one epoch per input file, files rolled at ``target`` bytes; then flush."""
    sink = MeasuredWriterSink(
        output,
        state,
        key_columns=["user_id"],
        vnodes=VNODES,
        parallelism=1,
        rollover=Rollover(target_file_size=target, max_age_seconds=None),
    )
    sink.measured = []
    for epoch, path in enumerate(inputs):
        sink(Batch(pq.read_table(path)), epoch)
    sink.flush()
    sink.close()
    print(json.dumps({"files": sink.measured}), flush=True)


def main() -> None:
    mode, state, output, *rest = sys.argv[1:]
    if mode == "history":
        history(state, output, int(rest[0]), int(rest[1]))
    elif mode == "restart":
        restart(state, output)
    elif mode == "size":
        size(state, output)
    elif mode == "writer":
        writer(state, output, int(rest[0]), rest[1:])
    else:
        raise SystemExit(f"unknown mode {mode!r}")
    os._exit(0)  # no waiting for stray threads: the measurement is printed


if __name__ == "__main__":
    main()
