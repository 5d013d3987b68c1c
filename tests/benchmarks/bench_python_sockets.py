"""What a Python job costs in Spark with its Python workers on TCP (loopback) and on Unix domain sockets.

Not a test (pytest does not collect it). Run from the repository root::

    python tests/benchmarks/bench_python_sockets.py [--jobs N] [--rounds K]

Each round starts two fresh ``local[2]`` sessions, each in a process of its own, one per setting of
``spark.python.unix.domain.socket.enabled`` (the order alternates by round). Each session runs 5 warm-up rounds,
then ``--jobs`` times, alternating:

1. ``2 rows``: a ``mapInArrow`` job of 2 tasks of 1 row each; the function notes when it started, when its first
   input arrived and when it ended (wall clock, same machine);
2. ``400,000 rows``: a ``mapInArrow`` job of 2 tasks that only count their rows (5 columns: longs, doubles, a text);
3. ``toArrow``: the 2-row input collected to the driver, a job with no Python worker.

It prints the medians of each setting and their ratio, and the machine's load. See ``docs/benchmarks.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator

import pyarrow as pa

from filesink.cli.localspark import UNIX_SOCKETS, local_spark

WARMUP = 5
CHILD_DEADLINE_SECONDS = 600


def timed(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """Notes when the function started, when its first input arrived and when it ended."""
    started = time.time()
    first = None
    for _ in batches:
        first = first or time.time()
    yield pa.record_batch(
        [pa.array([started]), pa.array([first or started]), pa.array([time.time()])], names=["s", "f", "e"]
    )


def count(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    yield pa.record_batch([pa.array([sum(b.num_rows for b in batches)], pa.int64())], names=["rows"])


def child(unix_sockets: bool, jobs: int) -> dict[str, float]:
    spark = local_spark("bench-python-sockets", conf={UNIX_SOCKETS: str(unix_sockets).lower()})
    small = spark.range(0, 2, 1, 2)
    big = spark.range(0, 400_000, 1, 2).selectExpr(
        "id", "id * 7 AS user_id", "id / 3.0 AS amount", "id * 1.5 AS score", "concat('user-', id) AS name"
    )
    schema = "s double, f double, e double"
    figures: dict[str, list[float]] = {k: [] for k in ("job", "to_fn", "to_first", "to_collect", "big", "arrow")}
    for i in range(WARMUP + jobs):
        t0 = time.time()
        rows = small.mapInArrow(timed, schema).collect()
        t1 = time.time()
        total = big.mapInArrow(count, "rows long").collect()
        t3 = time.time()
        small.toArrow()
        t4 = time.time()
        assert sum(r.rows for r in total) == 400_000
        if i < WARMUP:
            continue
        figures["job"].append(t1 - t0)
        figures["to_fn"].append(min(r.s for r in rows) - t0)
        figures["to_first"].append(max(r.f - r.s for r in rows))
        figures["to_collect"].append(t1 - max(r.e for r in rows))
        figures["big"].append(t3 - t1)
        figures["arrow"].append(t4 - t3)
    spark.stop()
    return {k: statistics.median(v) * 1000 for k, v in figures.items()}


def run_child(unix_sockets: bool, jobs: int) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, __file__, "--child", "unix" if unix_sockets else "tcp", "--jobs", str(jobs)],
        capture_output=True,
        text=True,
        timeout=CHILD_DEADLINE_SECONDS,
        check=True,
    ).stdout
    result: dict[str, float] = json.loads(out.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--child", choices=["tcp", "unix"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child == "unix", args.jobs)))
        return
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    load = os.getloadavg()
    started = time.monotonic()
    results: dict[bool, list[dict[str, float]]] = {False: [], True: []}
    for r in range(args.rounds):
        for unix_sockets in (r % 2 == 0, r % 2 != 0):
            results[unix_sockets].append(run_child(unix_sockets, args.jobs))
            print(f"round {r}, {'Unix sockets' if unix_sockets else 'TCP'}: {results[unix_sockets][-1]}", flush=True)

    def med(unix_sockets: bool, key: str) -> float:
        return statistics.median(x[key] for x in results[unix_sockets])

    rows: list[tuple[str, str]] = [
        ("2-row `mapInArrow` job", "job"),
        ("of which: submitted to the function's start", "to_fn"),
        ("of which: the function's start to its first input", "to_first"),
        ("of which: the function's end to `collect()` returning", "to_collect"),
        ("400,000-row `mapInArrow` job (rows counted)", "big"),
        ("`toArrow()` of the 2 rows (no Python worker)", "arrow"),
    ]
    print()
    print("| ms (medians) | TCP | Unix sockets | Unix / TCP |")
    print("|---|---:|---:|---:|")
    for label, key in rows:
        tcp, unix = med(False, key), med(True, key)
        print(f"| {label} | {tcp:.0f} | {unix:.0f} | {unix / tcp:.2f} |")
    end = os.getloadavg()
    print()
    print(
        f"{os.cpu_count()} CPU(s); {args.rounds} rounds of {args.jobs} jobs each; load average (1/5/15 min) at the "
        f"start {load[0]:.2f}/{load[1]:.2f}/{load[2]:.2f}, at the end {end[0]:.2f}/{end[1]:.2f}/{end[2]:.2f}; "
        f"{(time.monotonic() - started) / 60:.1f} minutes."
    )


if __name__ == "__main__":
    main()
