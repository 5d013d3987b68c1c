"""What a sink fed by ``foreachBatch`` pays before it writes anything, next to Spark's whole Parquet sink: the
ceiling of any Python sink's throughput on a machine whose cores are busy.

Not a test (pytest does not collect it). Run from the repository root::

    python tests/benchmarks/bench_sinks_ceiling.py [--rows N] [--workload NAME] [--repeat K] [--dir DIR]

It generates the input of ``bench_sinks.py`` and runs streaming queries over it in one ``local[2]`` Spark session,
the side-by-side setup (available-now trigger, 2 input files per batch), each variant with its own checkpoint:

1. ``Spark's sink``: ``writeStream.format("parquet")``, Spark's own file sink (snappy, its default);
2. ``foreachBatch, nothing``: a ``foreachBatch`` function that does nothing (no row is read): the query's own cost;
3. ``foreachBatch, Spark writes``: ``df.write.parquet`` in ``foreachBatch``: what ``foreachBatch`` adds to
   Spark's writing;
4. ``foreachBatch, rows into Python``: the vnode column and ``mapInArrow`` with a function that only counts the
   rows: what every Python sink fed by Spark pays to get the rows (Spark turns them into Arrow in the JVM and
   streams them to its Python workers);
5. ``foreachBatch, our append``: the same with ``append_segment`` (rows sorted by vnode, segment written and
   synced): our sink's append with nothing after it (no files written, no state database);
6. ``our sink``: our whole sink as ``bench_sinks.py`` runs it side by side (its target and age rule), what it still
   holds at the end written before the clock stops.

Round 0 warms up the JVM and the Python workers; then ``--repeat`` rounds, each running the variants in turn
(the order rotates by one every round). It prints each variant's median wall time and CPU seconds, split into
the driver's Python, the JVM and the Python workers (``/proc``; other work on the machine does not count there).
See ``docs/benchmarks.md``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import bench_sinks_crossing
import bench_sinks_data as data
import bench_sinks_monitor as monitor
from bench_sinks_crossing import appending, count_rows

VNODES = 256
FILES_PER_BATCH = 2
DEADLINE_SECONDS = 1800  # one query's run; a hang fails the benchmark instead of waiting for ever


def cpu_split() -> tuple[float, float, float]:
    """CPU seconds so far of this process (the driver's Python), of the JVM and of the Python workers."""
    below = monitor.descendants(os.getpid())
    jvm = [p for p in below if monitor._exe_name(p).startswith("java")]
    workers = [p for p in below if p not in jvm]
    return time.process_time(), monitor.cpu_seconds(jvm), monitor.cpu_seconds(workers)


Variant = Callable[[Any, Path], tuple[Any, Callable[[], None]]]
"""Given the stream and a new directory: the ``DataStreamWriter`` to start, and what to do once its query ends."""


def _done() -> None:
    pass


def variants(work: Path, workload: data.Workload, rows: int) -> dict[str, Variant]:
    """The queries to compare, by name (see the module's docstring)."""
    import bench_sinks
    from pyspark import cloudpickle
    from pyspark.sql import functions as F

    from filesink import ExactlyOnceParquetSink, Rollover
    from logstore import VNODE_COLUMN, LogStore

    # Spark's Python workers do not have this directory on their path: ship the shared task functions by value
    cloudpickle.register_pickle_by_value(bench_sinks_crossing)

    target = LogStore.open(work / "state", vnodes=VNODES).target
    epochs = iter(range(1, 10**9))  # every append gets a new epoch: the variants share one log store

    def with_vnode(df: Any) -> Any:
        vnode = F.pmod(F.hash(*[F.col(c) for c in workload.key_columns]), F.lit(VNODES)).cast("int")
        return df.withColumn(VNODE_COLUMN, vnode)

    def spark_sink(stream: Any, out: Path) -> tuple[Any, Callable[[], None]]:
        return stream.writeStream.format("parquet").option("path", str(out)), _done

    def batches(body: Callable[[Any, Path], None]) -> Variant:
        def start(stream: Any, out: Path) -> tuple[Any, Callable[[], None]]:
            return stream.writeStream.foreachBatch(lambda df, _batch_id: body(df, out)), _done

        return start

    def our_sink(stream: Any, out: Path) -> tuple[Any, Callable[[], None]]:
        """Our whole sink, as ``bench_sinks.py`` runs it side by side: what it holds at the end is written too."""
        sink = ExactlyOnceParquetSink(
            str(out / "files"),
            out / "state",
            key_columns=list(workload.key_columns),
            parallelism=2,
            rollover=Rollover(**bench_sinks.side_by_side_rollover(rows, workload.name)),
        )

        def finish() -> None:
            sink.flush()
            sink.close()

        return stream.writeStream.foreachBatch(sink), finish

    def nothing(_df: Any, _out: Path) -> None:
        pass

    def spark_writes(df: Any, out: Path) -> None:
        df.write.mode("append").parquet(str(out))

    def into_python(df: Any, _out: Path) -> None:
        with_vnode(df).mapInArrow(count_rows, "rows long").collect()

    def our_append(df: Any, _out: Path) -> None:
        with_vnode(df).mapInArrow(appending(target, next(epochs)), "rows long").collect()

    return {
        "Spark's sink": spark_sink,
        "foreachBatch, nothing": batches(nothing),
        "foreachBatch, Spark writes": batches(spark_writes),
        "foreachBatch, rows into Python": batches(into_python),
        "foreachBatch, our append": batches(our_append),
        "our sink": our_sink,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="What foreachBatch pays before writing, next to Spark's sink.")
    parser.add_argument("--rows", type=int, default=4_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--workload", choices=sorted(data.WORKLOADS), default="events")
    parser.add_argument("--dir", type=Path, default=None, help="work directory (default: a temp dir in the cwd)")
    args = parser.parse_args(argv)
    from filesink.cli.localspark import local_spark

    work = data.work_directory(args.dir, "bench_ceiling-")
    try:
        input_dir = work / "input"
        workload = data.WORKLOADS[args.workload]
        workload.generate(input_dir, args.rows)
        spark = local_spark("bench-ceiling", cores=2, conf={"spark.driver.memory": "4g"})
        schema = data.spark_schema(input_dir)
        runs = variants(work, workload, args.rows)
        names = list(runs)
        figures: dict[str, list[tuple[float, float, float, float]]] = {name: [] for name in names}
        load_start = os.getloadavg()[0]
        for round_ in range(args.repeat + 1):  # round 0 warms up the JVM and the Python workers
            order = names[round_ % len(names) :] + names[: round_ % len(names)]
            for name in order:
                tag = f"{names.index(name)}-{round_}"
                stream = spark.readStream.schema(schema).option("maxFilesPerTrigger", FILES_PER_BATCH)
                writer, finish = runs[name](stream.parquet(str(input_dir)), work / f"out-{tag}")
                cpu0, start = cpu_split(), time.perf_counter()
                query = writer.option("checkpointLocation", str(work / f"checkpoint-{tag}"))
                query = query.trigger(availableNow=True).start()
                if not query.awaitTermination(DEADLINE_SECONDS):
                    query.stop()
                    raise SystemExit(f"{name}: the query did not finish in {DEADLINE_SECONDS} s")
                if query.exception() is not None:
                    raise SystemExit(f"{name}: the query failed: {query.exception()}")
                finish()
                seconds, cpu1 = time.perf_counter() - start, cpu_split()
                if round_:
                    driver, jvm, workers = (b - a for a, b in zip(cpu0, cpu1, strict=True))
                    figures[name].append((seconds, driver, jvm, workers))
                shutil.rmtree(work / f"out-{tag}", ignore_errors=True)
        spark.stop()
        print(
            f"{args.rows:,} rows of {workload.name}, local[2], available-now trigger, {FILES_PER_BATCH} input files "
            f"per batch, median of {args.repeat} rounds after a warm-up round; load average {load_start:.2f} at "
            f"the start, {os.getloadavg()[0]:.2f} at the end"
        )
        print("| query | seconds | CPU seconds | of which driver (Python) | JVM | Python workers |")
        print("|---|---:|---:|---:|---:|---:|")
        med = {name: [statistics.median(run[i] for run in figures[name]) for i in range(4)] for name in names}
        for name, (seconds, driver, jvm, workers) in med.items():
            total = driver + jvm + workers
            print(f"| {name} | {seconds:.2f} | {total:.2f} | {driver:.2f} | {jvm:.2f} | {workers:.2f} |")
        spark_s = med["Spark's sink"][0]
        print(
            f"\nrows into Python alone take {med['foreachBatch, rows into Python'][0] / spark_s:.2f}x the time of "
            f"Spark's whole sink, our append {med['foreachBatch, our append'][0] / spark_s:.2f}x, our whole sink "
            f"{med['our sink'][0] / spark_s:.2f}x (throughput {spark_s / med['our sink'][0]:.2f}x Spark's sink's)"
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
