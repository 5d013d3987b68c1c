"""The file writer's codec and encoder settings next to the peers' defaults, on one workload's rows in memory:
seconds to write a file with pyarrow's Parquet writer, its bytes, and seconds to read it back whole.

Not a test (pytest does not collect it). Run from the repository root::

    python tests/benchmarks/bench_codecs.py                    # 1,000,000 rows of events, 3 rounds
    python tests/benchmarks/bench_codecs.py --workload strings --rows 500000

Settings: snappy (Spark's, Delta's and delta-rs's default codec), zstd at pyarrow's default level (our writer's
default: codec zstd, no level given), at levels 1 and 3, and without dictionaries. Every setting is written and
read once per round, the order alternating from round to round; medians, with the machine's load before and after.
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import time

import bench_sinks_data as data
import pyarrow as pa
import pyarrow.parquet as pq

SETTINGS: dict[str, dict[str, object]] = {
    "snappy": {"compression": "snappy"},
    "zstd (default level)": {"compression": "zstd"},
    "zstd-1": {"compression": "zstd", "compression_level": 1},
    "zstd-3": {"compression": "zstd", "compression_level": 3},
    "zstd, no dictionary": {"compression": "zstd", "use_dictionary": False},
}
ROW_GROUP_ROWS = 1_000_000


def measure(table: pa.Table, options: dict[str, object]) -> tuple[float, int, float]:
    buffer = io.BytesIO()
    started = time.perf_counter()
    pq.write_table(table, buffer, row_group_size=ROW_GROUP_ROWS, **options)  # type: ignore[arg-type]
    written = time.perf_counter() - started
    raw = buffer.getvalue()
    started = time.perf_counter()
    pq.read_table(pa.BufferReader(raw))
    return written, len(raw), time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workload", default="events", choices=sorted(data.WORKLOADS))
    args = parser.parse_args()
    table = data.WORKLOADS[args.workload].make_batch(0, args.rows, 1)
    load = os.getloadavg()[0]
    results: dict[str, list[tuple[float, int, float]]] = {name: [] for name in SETTINGS}
    names = list(SETTINGS)
    for round_ in range(args.rounds):
        for name in names if round_ % 2 == 0 else names[::-1]:
            results[name].append(measure(table, SETTINGS[name]))
    print(f"{args.workload}, {args.rows:,} rows, {args.rounds} rounds; load {load:.1f} -> {os.getloadavg()[0]:.1f}")
    print("| setting | write s | MB | read s |\n|---|---:|---:|---:|")
    for name, runs in results.items():
        write = statistics.median(r[0] for r in runs)
        read = statistics.median(r[2] for r in runs)
        print(f"| {name} | {write:.2f} | {runs[0][1] / 1e6:.1f} | {read:.2f} |")


if __name__ == "__main__":
    main()
