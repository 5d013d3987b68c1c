"""Where a batch's time goes: Spark reading the input, rows crossing from the JVM into Python, our append, and
Spark writing Parquet itself, each measured as a batch job over the same input.

Not a test (pytest does not collect it). Run from the repository root::

    python tests/benchmarks/bench_sinks_crossing.py [--rows N] [--repeat K]

Jobs, each over every input row, on ``local[2]``, ``--repeat`` times after one warm-up round (medians):

1. ``read``: read the input and drop it (``write.format("noop")``): Spark's reading alone;
2. ``to Python``: the sink's append job without its work: the vnode column, then ``mapInArrow`` with a
   function that only counts the rows it gets: reading plus moving the rows into Python workers as Arrow;
3. ``append``: the sink's append job: the same with ``append_segment`` into a scratch log store;
4. ``Spark Parquet (snappy)`` and ``(zstd)``: ``df.write.parquet``, what Spark's file sink does per batch.

See ``docs/benchmarks.md``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import bench_sinks_data as data
import bench_sinks_monitor as monitor
import pyarrow as pa

VNODES = 256


def tree_cpu_seconds() -> float:
    """CPU seconds of this process (the driver's Python side) and its descendants (the JVM and its Python
    workers): other work on the machine does not count, unlike wall time."""
    return time.process_time() + monitor.cpu_seconds(monitor.descendants(os.getpid()))


def count_rows(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """A ``mapInArrow`` function that only counts the rows it gets: the cost of getting them into Python."""
    rows = sum(b.num_rows for b in batches)
    yield pa.record_batch([pa.array([rows], pa.int64())], names=["rows"])


def appending(target: Any, epoch: int) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """A ``mapInArrow`` function that appends the task's rows to ``target``'s log store as ``epoch``, as the sink's
    append task does (without its admission checks), and returns how many rows it appended."""

    def task(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyspark import TaskContext

        from logstore import append_segment

        ctx = TaskContext.get()
        writer = f"p{ctx.partitionId()}-a{ctx.attemptNumber()}" if ctx else "driver"
        descriptor = append_segment(target, epoch, batches, writer_id=writer)
        yield pa.record_batch([pa.array([descriptor.rows if descriptor else 0], pa.int64())], names=["rows"])

    return task


def jobs(spark: Any, input_dir: Path, work: Path, workload: data.Workload) -> dict[str, Callable[[int], None]]:
    from pyspark.sql import functions as F

    from logstore import VNODE_COLUMN, LogStore, append_segment

    store = LogStore.open(work / "state", vnodes=VNODES)
    target = store.target

    schema = data.spark_schema(input_dir)

    def source() -> Any:
        return spark.read.schema(schema).parquet(str(input_dir))

    def frame(*, sort: bool = False) -> Any:
        vnode = F.pmod(F.hash(*[F.col(c) for c in workload.key_columns]), F.lit(VNODES)).cast("int")
        df = source().withColumn(VNODE_COLUMN, vnode)
        return df.sortWithinPartitions(VNODE_COLUMN) if sort else df

    def read(_: int) -> None:
        source().write.format("noop").mode("overwrite").save()

    def to_python(_: int) -> None:
        frame().mapInArrow(count_rows, "rows long").collect()

    def to_python_sorted(_: int) -> None:
        frame(sort=True).mapInArrow(count_rows, "rows long").collect()

    def append(i: int) -> None:
        frame().mapInArrow(appending(target, i), "rows long").collect()

    def append_sorted(i: int) -> None:
        frame(sort=True).mapInArrow(appending(target, i), "rows long").collect()

    def to_driver(_: int) -> None:
        """The rows to this process as Arrow (``toArrow``: converted in the JVM, no Python worker)."""
        frame().toArrow()

    def append_in_driver(i: int) -> None:
        """Our append of the rows collected to this process as Arrow: one segment, written here."""
        append_segment(target, 10_000 + i, frame().toArrow(), writer_id="driver")

    def spark_segments(i: int) -> None:
        """Spark itself writing what a segment holds: the rows sorted by vnode, uncompressed Parquet, no dictionary."""
        out = work / f"segments-{i}"
        frame(sort=True).write.option("compression", "none").option("parquet.enable.dictionary", "false").parquet(
            str(out)
        )
        shutil.rmtree(out)

    def parquet(codec: str) -> Callable[[int], None]:
        def run(i: int) -> None:
            out = work / f"parquet-{codec}-{i}"
            source().write.option("compression", codec).parquet(str(out))
            shutil.rmtree(out)

        return run

    def tiny_jvm(_: int) -> None:
        """What every Spark job costs: two rows, one per core, no Python."""
        spark.range(0, 2, 1, 2).collect()

    def tiny_python(_: int) -> None:
        """What every job of our sink costs (an append or a file-writing job): two rows through ``mapInArrow``."""
        spark.range(0, 2, 1, 2).mapInArrow(count_rows, "rows long").collect()

    return {
        "a 2-row job, JVM only": tiny_jvm,
        "a 2-row mapInArrow job": tiny_python,
        "read": read,
        "to Python": to_python,
        "append": append,
        "to the driver (toArrow)": to_driver,
        "append in the driver (toArrow)": append_in_driver,
        "to Python, sorted by vnode in the JVM": to_python_sorted,
        "append, sorted by vnode in the JVM": append_sorted,
        "Spark writes segments (sorted, uncompressed Parquet)": spark_segments,
        "Spark Parquet (snappy)": parquet("snappy"),
        "Spark Parquet (zstd)": parquet("zstd"),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Time of reading, crossing into Python, appending, writing.")
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--workload", choices=sorted(data.WORKLOADS), default="events")
    parser.add_argument("--jobs", default="", help="comma-separated substrings: run only the jobs whose names match")
    parser.add_argument("--dir", type=Path, default=None, help="work directory (default: a temp dir in the cwd)")
    args = parser.parse_args(argv)
    from filesink.cli.localspark import local_spark

    work = data.work_directory(args.dir, "bench_crossing-")
    try:
        input_dir = work / "input"
        workload = data.WORKLOADS[args.workload]
        workload.generate(input_dir, args.rows)
        spark = local_spark("bench-crossing", cores=2, conf={"spark.driver.memory": "4g"})
        measured = jobs(spark, input_dir, work, workload)
        wanted = [w for w in args.jobs.split(",") if w]
        keep = {"read", "to Python", "append", "Spark Parquet (snappy)"}
        measured = {n: j for n, j in measured.items() if not wanted or n in keep or any(w in n for w in wanted)}
        times: dict[str, list[float]] = {name: [] for name in measured}
        cpu_times: dict[str, list[float]] = {name: [] for name in measured}
        for round_ in range(args.repeat + 1):  # round 0 warms up the JVM and the Python workers
            for name, job in measured.items():
                start, cpu = time.perf_counter(), tree_cpu_seconds()
                job(round_)
                if round_:
                    cpu_times[name].append(tree_cpu_seconds() - cpu)
                    times[name].append(time.perf_counter() - start)
        spark.stop()
        med = {name: statistics.median(t) for name, t in times.items()}
        print(f"{args.rows:,} rows of {workload.name}, local[2], median of {args.repeat} (after a warm-up round):")
        print("| job | seconds | rows/s | CPU seconds (driver, JVM and Python workers) |")
        print("|---|---:|---:|---:|")
        for name, seconds in med.items():
            cpu = statistics.median(cpu_times[name])
            print(f"| {name} | {seconds:.2f} | {args.rows / seconds:,.0f} | {cpu:.2f} |")
        print(
            f"\nmoving the rows into Python: {med['to Python'] - med['read']:.1f} s; our append on top: "
            f"{med['append'] - med['to Python']:.1f} s; Spark's Parquet writing on top of reading: "
            f"{med['Spark Parquet (snappy)'] - med['read']:.1f} s (snappy)"
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
