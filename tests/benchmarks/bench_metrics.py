"""What the sink's metrics cost per batch: the same run with and without ``metrics_port`` (scraped after every
batch, far more often than Prometheus does), alternating, side by side; the time the metrics' own bookkeeping
takes in each batch (it runs in both: ``sink.metrics()`` is always there); one ``sink.metrics()`` call; one scrape.

Not a test (pytest does not collect it). Run from the repository root::

    python tests/benchmarks/bench_metrics.py [--batches N] [--rows R] [--rounds K] [--vnodes V]

Local Spark (``local[2]``), a local log store and output, a file rolled every two batches. Batch times are
medians in milliseconds over the batches of a run (the first two, Spark warming up, left out) and over the rounds;
the machine's load average is printed before and after. See ``docs/benchmarks.md``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import pyarrow as pa

from filesink import ExactlyOnceParquetSink, Rollover
from filesink.cli.localspark import local_spark
from filesink.metrics import figures as metrics_hooks


def frames(spark: Any, batches: int, rows: int) -> list[Any]:
    """The batches' DataFrames (cached: the append job reads them from memory)."""
    out = []
    for b in range(batches):
        first = b * rows
        table = pa.table(
            {
                "id": pa.array(range(first, first + rows), pa.int64()),
                "user_id": pa.array([i % 9973 for i in range(first, first + rows)], pa.int64()),
                "amount": pa.array([float(i % 1000) / 10 for i in range(rows)], pa.float64()),
            }
        )
        df = spark.createDataFrame(table.to_pandas()).cache()
        df.count()
        out.append(df)
    return out


class HookClock:
    """Adds up the time spent in the metrics' hooks that do more than add numbers: what the log store holds, summed
    from the backlog in memory after each plan, and brought up to date after each commit."""

    NAMES = ("held_now", "planned")

    def __init__(self) -> None:
        self.seconds = 0.0
        self._hooks = {name: getattr(metrics_hooks, name) for name in self.NAMES}

    def __enter__(self) -> HookClock:
        for name, hook in self._hooks.items():
            setattr(metrics_hooks, name, self._timed(hook))
        return self

    def _timed(self, hook: Any) -> Any:
        def timed(book: Any, backlog: Any) -> None:
            start = time.perf_counter()
            hook(book, backlog)
            self.seconds += time.perf_counter() - start

        return timed

    def __exit__(self, *exc: object) -> None:
        for name, hook in self._hooks.items():
            setattr(metrics_hooks, name, hook)


def one_run(spark: Any, dfs: list[Any], work: Path, vnodes: int, serve: bool) -> tuple[list[float], float, Any]:
    """Batch times (seconds), the hooks' time, and the sink's last snapshot of one run."""
    sink = ExactlyOnceParquetSink(
        str(work / "out"),
        work / "state",
        vnodes=vnodes,
        parallelism=2,
        rollover=Rollover(target_file_size=None, max_epochs=2, max_age_seconds=None),
        metrics_port=0 if serve else None,
    )
    times = []
    with HookClock() as clock:
        try:
            for b, df in enumerate(dfs):
                start = time.perf_counter()
                sink(df, b)
                times.append(time.perf_counter() - start)
                if serve:
                    assert sink.metrics_url is not None
                    with urllib.request.urlopen(sink.metrics_url, timeout=10) as answer:
                        answer.read()
            snapshot = sink.metrics()
        finally:
            sink.close()
    return times[2:], clock.seconds, snapshot


def call_costs(work: Path) -> tuple[float, float]:
    """Microseconds of one ``sink.metrics()`` and of one scrape over HTTP (medians), on an open sink."""
    sink = ExactlyOnceParquetSink(str(work / "out"), work / "state", metrics_port=0)
    try:
        url = sink.metrics_url
        assert url is not None
        calls = []
        for _ in range(2000):
            start = time.perf_counter()
            sink.metrics()
            calls.append(time.perf_counter() - start)
        scrapes = []
        for _ in range(200):
            start = time.perf_counter()
            with urllib.request.urlopen(url, timeout=10) as answer:
                answer.read()
            scrapes.append(time.perf_counter() - start)
    finally:
        sink.close()
    return statistics.median(calls) * 1e6, statistics.median(scrapes) * 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="The cost of the sink's metrics per batch.")
    parser.add_argument("--batches", type=int, default=12)
    parser.add_argument("--rows", type=int, default=50_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--vnodes", type=int, default=256)
    args = parser.parse_args(argv)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())} ({os.cpu_count()} CPUs)")
    spark = local_spark("bench-metrics", cores=2)
    spark.sparkContext.setLogLevel("ERROR")
    dfs = frames(spark, args.batches, args.rows)
    with tempfile.TemporaryDirectory(prefix="bench_metrics-", dir=Path.cwd()) as tmp:
        work = Path(tmp)
        one_run(spark, dfs[:3], work / "warm-up", args.vnodes, serve=False)
        results: dict[bool, list[float]] = {False: [], True: []}
        hooks: dict[bool, float] = {False: 0.0, True: 0.0}
        for r in range(args.rounds):
            for serve in (False, True) if r % 2 == 0 else (True, False):  # alternating, so that drift hits both
                times, hook_seconds, snapshot = one_run(spark, dfs, work / f"run-{r}-{serve}", args.vnodes, serve)
                assert snapshot.rows_appended == args.batches * args.rows, snapshot
                results[serve] += times
                hooks[serve] += hook_seconds
        metrics_call, scrape = call_costs(work / "calls")
    spark.stop()
    off, on = (statistics.median(results[s]) * 1e3 for s in (False, True))
    batches = args.rounds * args.batches
    print(
        f"{args.batches} batches of {args.rows:,} rows x {args.rounds} rounds, {args.vnodes} vnodes, local[2], "
        "a roll every 2 batches; milliseconds per batch (medians, first two batches of a run left out)"
    )
    print("| | per batch (ms) | metrics' bookkeeping per batch (ms) | bookkeeping / batch |")
    print("|---|---:|---:|---:|")
    for serve, median in ((False, off), (True, on)):
        per_batch = hooks[serve] / batches * 1e3
        label = "with metrics_port, scraped after every batch" if serve else "without metrics_port"
        print(f"| {label} | {median:.1f} | {per_batch:.2f} | {per_batch / median:.2%} |")
    print(f"with / without: {on / off:.3f}")
    print(f"one sink.metrics(): {metrics_call:.1f} µs; one scrape over HTTP: {scrape:.0f} µs")
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
