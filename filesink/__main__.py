"""``python -m filesink demo``: a small exactly-once streaming job on local Spark and local directories."""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from . import ExactlyOnceParquetSink, Rollover
from .localspark import local_spark

SCHEMA = "event_id long, user_id long, event_date string, amount double"


def _write_input(directory: Path, files: int, rows: int) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for f in range(files):
        target = directory / f"events-{f:04d}.parquet"
        if target.exists():
            continue
        rng = random.Random(f)
        first = f * rows
        pq.write_table(
            pa.table(
                {
                    "event_id": pa.array(range(first, first + rows), pa.int64()),
                    "user_id": pa.array([rng.randrange(100_000) for _ in range(rows)], pa.int64()),
                    "event_date": pa.array([f"2026-11-{1 + rng.randrange(3):02d}" for _ in range(rows)]),
                    "amount": pa.array([round(rng.random() * 100, 2) for _ in range(rows)], pa.float64()),
                }
            ),
            target,
        )


def _rows(table: pa.Table, columns: list[str]) -> Counter[tuple[object, ...]]:
    return Counter(zip(*(table[c].to_pylist() for c in columns), strict=True))


def demo(directory: Path, files: int, rows: int) -> int:
    directory = directory.absolute()
    source, output, state = directory / "input", directory / "output", directory / "state"
    _write_input(source, files, rows)
    print(f"exactly-once Parquet sink example: {files} input files x {rows:,} rows, one file per micro-batch")
    print(f"  input:      {source}")
    spark = local_spark("filesink-demo")
    started = time.perf_counter()
    sink = ExactlyOnceParquetSink(
        str(output),
        state,
        key_columns=["user_id"],
        partition_by=["event_date"],
        rollover=Rollover(target_file_size=16 * 2**20, max_age_seconds=60),
    )
    try:
        stream = spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).parquet(str(source))
        query = (
            stream.writeStream.foreachBatch(sink)
            .option("checkpointLocation", str(directory / "checkpoint"))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
        sink.flush()
    finally:
        sink.close()
        spark.stop()
    elapsed = time.perf_counter() - started
    columns = ["event_id", "user_id", "event_date", "amount"]
    hive = ds.partitioning(pa.schema([("event_date", pa.string())]), flavor="hive")
    got = _rows(ds.dataset(output, format="parquet", partitioning=hive).to_table(columns=columns), columns)
    expected = _rows(ds.dataset(source, format="parquet").to_table(columns=columns), columns)
    written = sorted(p.relative_to(output) for p in output.rglob("*.parquet"))
    print(f"  output:     {output} ({len(written)} Parquet files in {len({p.parent for p in written})} partitions)")
    print(f"  state:      {state}")
    print(f"  checkpoint: {directory / 'checkpoint'}")
    print(f"  took {elapsed:.1f} s")
    if got != expected:
        lost, extra = expected - got, got - expected
        print(f"error: {sum(lost.values())} input rows missing, {sum(extra.values())} extra rows", file=sys.stderr)
        return 1
    print(f"ok: every one of the {sum(expected.values()):,} input rows is in the output exactly once")
    print("    run the command again: the query resumes from its checkpoint and adds nothing twice")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m filesink", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("demo", help="stream a few generated Parquet files through the sink on local Spark")
    run.add_argument("--dir", type=Path, default=Path("demo-output"), help="working directory (default: %(default)s)")
    run.add_argument("--files", type=int, default=6, help="input files, one per micro-batch (default: %(default)s)")
    run.add_argument("--rows", type=int, default=100_000, help="rows per input file (default: %(default)s)")
    args = parser.parse_args(argv)
    if args.files < 1 or args.rows < 1:
        parser.error("--files and --rows must be at least 1")
    return demo(args.dir, args.files, args.rows)


if __name__ == "__main__":
    sys.exit(main())
