"""``python -m logstore demo``: a small end-to-end run of the log store on local directories."""

from __future__ import annotations

import argparse
import random
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pyarrow as pa

from . import AppendTarget, LogStore, SegmentDescriptor, append_segment

VNODES = 16


def _ids(epoch: int, task: int, rows: int) -> range:
    first = (epoch * 100 + task) * rows
    return range(first, first + rows)


def _task_rows(epoch: int, task: int, rows: int) -> pa.Table:
    rng = random.Random(epoch * 1000 + task)
    users = [rng.randrange(10_000) for _ in range(rows)]
    return pa.table(
        {
            "event_id": pa.array(_ids(epoch, task, rows), pa.int64()),
            "user_id": pa.array(users, pa.int64()),
            "amount": pa.array([rng.random() * 100 for _ in range(rows)], pa.float64()),
            "__vnode": pa.array([u % VNODES for u in users], pa.int32()),
        }
    )


def _task(target: AppendTarget, epoch: int, task: int, rows: int) -> SegmentDescriptor | None:
    """What a Spark task does: append its rows for the epoch (in another process, from pickled arguments)."""
    return append_segment(target, epoch, _task_rows(epoch, task, rows), writer_id=f"task{task}")


def demo(directory: Path, epochs: int, tasks: int, rows: int) -> int:
    directory = directory.absolute()
    state_dir = directory / "state"
    store = LogStore.open(state_dir, vnodes=VNODES)
    report = store.collect_garbage(unsealed=True)
    first = store.last_sealed_epoch + 1
    print(f"log store example: {epochs} epochs x {tasks} tasks x {rows:,} rows, {VNODES} vnodes")
    print(f"  state database: {state_dir / 'state.sqlite'}")
    print(f"  segments:       {store.location.canonical}")
    if report.orphan_segments or report.temp_files:
        print(f"  start-up clean-up removed {report.orphan_segments} unsealed segments, {report.temp_files} temp files")
    started = time.perf_counter()
    with ProcessPoolExecutor(max_workers=min(tasks, 2)) as pool:
        for epoch in range(first, first + epochs):
            descs = list(pool.map(_task, [store.target] * tasks, [epoch] * tasks, range(tasks), [rows] * tasks))
            store.seal(epoch, descs)
            size = sum(d.size for d in descs if d)
            print(f"  epoch {epoch}: sealed {len(descs)} segments, {tasks * rows:,} rows, {size / 2**20:.1f} MiB")
    last = store.last_sealed_epoch
    halves = [range(0, VNODES // 2), range(VNODES // 2, VNODES)]
    read: list[int] = []
    for r in halves:
        ids = pa.chunked_array([item.batch.column("event_id") for item in store.read(r, first - 1, last)], pa.int64())
        read += ids.to_pylist()
        print(f"  writer for vnodes {r.start}..{r.stop - 1} reads {len(ids):,} rows of epochs {first}..{last}")
    expected = [i for e in range(first, first + epochs) for t in range(tasks) for i in _ids(e, t, rows)]
    store.truncate(dict.fromkeys(range(VNODES), last))
    report = store.collect_garbage()
    elapsed = time.perf_counter() - started
    print(
        f"  truncated every vnode to epoch {last}; garbage collection released {report.released_segments} "
        f"segments ({report.bytes_freed / 2**20:.1f} MiB) in {elapsed:.1f} s overall"
    )
    store.close()
    if sorted(read) != sorted(expected):
        print(f"error: read back {len(read):,} rows, appended {len(expected):,}, or not the same ids", file=sys.stderr)
        return 1
    print(f"ok: the {len(expected):,} appended rows were read back exactly once each; state kept in {directory}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m logstore", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("demo", help="append, seal, read back, truncate and collect a few epochs locally")
    run.add_argument("--dir", type=Path, default=Path("demo-output"), help="where to keep state (default: %(default)s)")
    run.add_argument("--epochs", type=int, default=5, help="epochs to append (default: %(default)s)")
    run.add_argument("--tasks", type=int, default=4, help="appending tasks per epoch (default: %(default)s)")
    run.add_argument("--rows", type=int, default=50_000, help="rows per task (default: %(default)s)")
    args = parser.parse_args(argv)
    if not (1 <= args.tasks <= 99 and args.epochs >= 1 and args.rows >= 1):
        parser.error("--tasks must be 1..99, --epochs and --rows at least 1")
    return demo(args.dir, args.epochs, args.tasks, args.rows)


if __name__ == "__main__":
    sys.exit(main())
