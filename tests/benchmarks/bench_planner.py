"""The planner's cost per batch as the backlog grows: the backlog kept in memory (what a sink does,
``filesink/rolling/backlog.py``) next to the backlog read whole from the state database at every plan (before).

Not a test (pytest does not collect it). Run from the repository root::

    python tests/benchmarks/bench_planner.py [--epochs N] [--vnodes V] [--tasks T]

Each epoch is sealed with ``--tasks`` segments (append tasks), each holding rows for every vnode, and nothing is
truncated: the backlog of a sink whose files roll by age, e.g. the default 300 s at 1-second triggers. After
every seal the planner runs with the memory (as the sink does at every batch); at the listed backlog sizes it
also runs reading the whole backlog, five times each, and checks that both plan the same files. Figures are
medians in milliseconds. See ``docs/benchmarks.md``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa

from filesink.rolling.backlog import BacklogTracker
from filesink.rolling.planner import plan
from filesink.rolling.rollover import Rollover
from logstore import VNODE_COLUMN, LogStore

CHECKPOINTS = (10, 30, 100, 300, 600, 1000, 3000)
ROWS_PER_VNODE = 8


def timed_plans(store: LogStore, rules: Rollover, tracker: BacklogTracker | None, repeat: int) -> tuple[float, list]:
    times, result = [], []
    for _ in range(repeat):
        start = time.perf_counter()
        result = plan(store, rules, 2, now=time.time(), bytes_per_log_byte=0.3, backlog=tracker)[0]
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Planner cost per batch, backlog in memory against read whole.")
    parser.add_argument("--epochs", type=int, default=600, help="held epochs at the end (default 600)")
    parser.add_argument("--vnodes", type=int, default=256)
    parser.add_argument("--tasks", type=int, default=2, help="segments per epoch (default 2)")
    args = parser.parse_args(argv)
    rules = Rollover()  # 128 MiB, 300 s: nothing rolls during the run (no time passes in the rule's view)
    rows = [v for v in range(args.vnodes) for _ in range(ROWS_PER_VNODE)]
    table = pa.table({"amount": [float(i) for i in range(len(rows))], VNODE_COLUMN: pa.array(rows, pa.int32())})
    print(
        f"planner: {args.vnodes} vnodes, {args.tasks} segments per epoch, every vnode in every segment, "
        "parallelism 2, default Rollover(); milliseconds per plan (medians)"
    )
    print("| held epochs | (vnode, epoch, segment) rows | in memory | read whole | whole / memory |")
    print("|---:|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory(prefix="bench_planner-", dir=Path.cwd()) as work:
        store = LogStore.open(Path(work) / "state", vnodes=args.vnodes)
        tracker = BacklogTracker(store)
        kept: list[float] = []
        for epoch in range(args.epochs):
            descriptors = [store.append(epoch, table, writer_id=f"t{t}") for t in range(args.tasks)]
            store.seal(epoch, descriptors)
            seconds, _ = timed_plans(store, rules, tracker, 1)
            kept.append(seconds)
            held = epoch + 1
            if held in CHECKPOINTS or held == args.epochs:
                memory, planned = timed_plans(store, rules, tracker, 5)
                whole, planned_whole = timed_plans(store, rules, None, 5)
                if planned != planned_whole:
                    raise SystemExit(f"at {held} held epochs the two plans differ: {planned} / {planned_whole}")
                pairs = held * args.vnodes * args.tasks
                print(f"| {held:,} | {pairs:,} | {memory * 1e3:.1f} | {whole * 1e3:.1f} | {whole / memory:.0f}x |")
        store.close()
    median, longest = statistics.median(kept) * 1e3, max(kept) * 1e3
    print(f"\nin memory, the plan after each seal: median {median:.1f} ms, max {longest:.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
