"""A table's history against its cost: commit latency and start-up time of the Delta and Iceberg destinations after
100 rolls and after 10,000, on one local table each.

Not a test (pytest does not collect it). Run from the repository root with the ``delta`` and ``iceberg`` extras::

    python tests/benchmarks/bench_table_history.py              # 10,000 rolls per format
    python tests/benchmarks/bench_table_history.py --rolls 2000 --format delta
    python tests/benchmarks/bench_table_history.py --format delta --pause 5     # 5 ms between rolls

Each roll commits one small Parquet file of 8 vnodes through the destination (``make_visible``: what the sink's
roll does after its files are written, maintenance included: Delta's checkpoints and log clean-up, Iceberg's
snapshot expiry). At 100 and at the last roll it measures, over the 20 commits around that point, the median
commit latency, and over the last 100 commits (one checkpoint interval) the mean and the slowest; the process's
CPU time per roll over those 100 (every thread: Delta's checkpoint runs in a background thread, off the roll's
latency but not off the machine; waited for before it is read; the benchmark's own writing of each roll's file is
in it too, the same at every size); and the start-up: a new destination object (a new process's sink) opening the
table and asking whether a pending file is held (what recovery asks at every start), median of 15. Goal (issue):
commit latency and start-up at most 1.2x their value at 100 rolls. Prints the figures, ratios and the machine's
load.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from filesink.committer.ledger import PlannedFile
from filesink.destination import open_destination, table_options
from filesink.output import OutputLocation
from filesink.tasks.writer import WrittenObject

SCHEMA = pa.schema([("id", pa.int64()), ("user_id", pa.int64()), ("amount", pa.float64())])
VNODES = 8
WINDOW = 20
STARTUPS = 15
"""Start-ups measured at each point (their median is reported: a start-up takes milliseconds, and the machine's other
work shows in single ones)."""
AMORTIZED = 100
"""The mean and the slowest commit are taken over the last 100 commits: one checkpoint interval (the table's
checkpoint, made by the commit that reaches it, is in every 100th commit's time)."""


def _destination(root: Path, fmt: str):  # type: ignore[no-untyped-def]
    options = table_options(fmt, None, "bench.events" if fmt == "iceberg" else None)
    return open_destination(options, output=OutputLocation(str(root)), sink_id="bench", partition_by=())


def _roll(dest, root: Path, epoch: int) -> float:  # type: ignore[no-untyped-def]
    name = f"part-bench-{epoch:020d}"
    table = pa.table({"id": [epoch], "user_id": [epoch % VNODES], "amount": [epoch / 2]}, schema=SCHEMA)
    path = root / f"{name}.parquet"
    collected: list[pq.FileMetaData] = []
    with pq.ParquetWriter(path, SCHEMA, metadata_collector=collected) as writer:
        writer.write_table(table)
    f = PlannedFile(name, 0, VNODES - 1, dict.fromkeys(range(VNODES), epoch), epoch, 1, 100, "bench")
    obj = WrittenObject(f"{name}.parquet", path.stat().st_size, 1, collected[-1])
    started = time.perf_counter()
    dest.make_visible([f], {name: [obj]}, SCHEMA)
    dest.maintain()
    return time.perf_counter() - started


def _startup(root: Path, fmt: str, epoch: int) -> float:
    times = []
    pending = PlannedFile("next", 0, VNODES - 1, dict.fromkeys(range(VNODES), epoch + 1), epoch + 1, 1, 1, "bench")
    for _ in range(STARTUPS):
        started = time.perf_counter()
        held = _destination(root, fmt).held([pending])
        times.append(time.perf_counter() - started)
        assert held == set(), "a file past the table's marks is not held"
    return statistics.median(times)


def run(fmt: str, rolls: int, work: Path, pause: float = 0.0) -> dict[str, float]:
    root = work / fmt
    root.mkdir()
    dest = _destination(root, fmt)
    latencies: list[float] = []
    cpu: list[float] = []
    figures: dict[str, float] = {}
    started = time.monotonic()
    for epoch in range(rolls):
        cpu.append(time.process_time())
        latencies.append(_roll(dest, root, epoch))
        if pause:
            time.sleep(pause)
        if epoch + 1 in (100 + WINDOW // 2, rolls):
            at = 100 if epoch + 1 < rolls else rolls
            figures[f"commit_{at}"] = statistics.median(latencies[-WINDOW:])
            figures[f"mean_{at}"] = statistics.mean(latencies[-AMORTIZED:])
            figures[f"max_{at}"] = max(latencies[-AMORTIZED:])
            dest.settle()  # the background checkpoint's CPU belongs to these rolls; and the start-ups see it done
            figures[f"cpu_{at}"] = (time.process_time() - cpu[-AMORTIZED]) / AMORTIZED
            took = getattr(dest, "checkpoint_took", None)
            figures[f"checkpoint_{at}"] = took[1] if took is not None else float("nan")
            figures[f"startup_{at}"] = _startup(root, fmt, epoch)
        if (epoch + 1) % 1000 == 0:
            print(
                f"  {fmt}: {epoch + 1:,} rolls, last commit {latencies[-1] * 1000:.0f} ms, "
                f"{time.monotonic() - started:.0f} s",
                flush=True,
            )
    size = sum(p.stat().st_size for p in root.rglob("*") if p.is_file() and not p.name.endswith(".parquet"))
    figures["metadata_mb"] = size / 1e6
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rolls", type=int, default=10_000)
    parser.add_argument("--format", action="append", choices=["delta", "iceberg"], help="repeatable")
    parser.add_argument("--dir", type=Path, default=None)
    parser.add_argument(
        "--pause",
        type=float,
        default=0.0,
        help="milliseconds between rolls (default 0: back to back; a query's rolls are seconds apart, and a Delta "
        "checkpoint in the background that outlasts 100 rolls makes the roll at the next interval wait for it)",
    )
    args = parser.parse_args(argv)
    if args.rolls < 100 + WINDOW:
        raise SystemExit(f"--rolls must be at least {100 + WINDOW}")
    load = os.getloadavg()
    work = Path(tempfile.mkdtemp(prefix="bench-table-history-", dir=args.dir))
    lines = []
    amortized = []
    try:
        for fmt in args.format or ["delta", "iceberg"]:
            f = run(fmt, args.rolls, work, args.pause / 1000)
            n = args.rolls
            lines.append(
                f"| {fmt} | {f['commit_100'] * 1000:.1f} | {f[f'commit_{n}'] * 1000:.1f} | "
                f"**{f[f'commit_{n}'] / f['commit_100']:.2f}** | {f['startup_100'] * 1000:.0f} | "
                f"{f[f'startup_{n}'] * 1000:.0f} | **{f[f'startup_{n}'] / f['startup_100']:.2f}** | "
                f"{f['metadata_mb']:.1f} |"
            )
            amortized.append(
                f"| {fmt} | {f['mean_100'] * 1000:.1f} | {f[f'mean_{n}'] * 1000:.1f} | "
                f"**{f[f'mean_{n}'] / f['mean_100']:.2f}** | {f['max_100'] * 1000:.0f} | {f[f'max_{n}'] * 1000:.0f} | "
                f"{f['cpu_100'] * 1000:.1f} | {f[f'cpu_{n}'] * 1000:.1f} | {f[f'cpu_{n}'] / f['cpu_100']:.2f} | "
                f"{f['checkpoint_100'] * 1000:.0f} | {f[f'checkpoint_{n}'] * 1000:.0f} |"
            )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    end = os.getloadavg()
    print()
    print(
        f"| format | commit ms at 100 | at {args.rolls:,} | ratio | start-up ms at 100 | at {args.rolls:,} | ratio "
        "| metadata MB at the end |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    print("\n".join(lines))
    print()
    print(
        f"| format | mean of {AMORTIZED} commits ms at 100 | at {args.rolls:,} | ratio "
        f"| slowest of them ms at 100 | at {args.rolls:,} | CPU ms per roll, all threads, at 100 | at {args.rolls:,} "
        f"| ratio | background checkpoint ms at 100 | at {args.rolls:,} |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    print("\n".join(amortized))
    print(
        f"\n{os.cpu_count()} CPU(s); load average (1/5/15 min) at the start {load[0]:.2f}/{load[1]:.2f}/{load[2]:.2f}, "
        f"at the end {end[0]:.2f}/{end[1]:.2f}/{end[2]:.2f}; {args.pause:g} ms between rolls. Goal: commit and "
        "start-up ratios at most 1.2."
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
