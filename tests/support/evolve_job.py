"""A job whose schema evolves, run in the test process or as a subprocess by the kill tests.

Usage: python evolve_job.py STATE OUTPUT [TABLE_FORMAT]

Batches 0 and 1 have schema version 1 (``id bigint, n int, p struct<x:int>``); after batch 0 the sink writes what
it holds (a file of version 1). Batches 2 and 3 have version 2: ``n`` widened to ``bigint`` (with values beyond an
``int``), ``p`` gains a field ``y``, and a new column ``extra``; batch 1's rows are still held when batch 2 comes,
and are written under version 2. Prints ``batch N`` after each batch and ``done`` at the end; started again, it
goes on after the last sealed batch, as a Spark query does from its checkpoint.
"""

from __future__ import annotations

import sys
from collections import Counter
from typing import Any

from filesink import ExactlyOnceParquetSink, Rollover
from filesink.cli.localspark import local_spark

HOLD = Rollover(target_file_size=None, max_age_seconds=None, max_epochs=1000)
ROWS = 40
EPOCHS = 4
FIRST_V2 = 2
ICEBERG_TABLE = "evolve.events"


def widens(table_format: str | None) -> bool:
    """Whether version 2 widens ``n`` (not into a Delta table: its type widening is a feature the sink refuses)."""
    return table_format != "delta"


def batch_sql(epoch: int, table_format: str | None = None) -> str:
    lo, hi = epoch * ROWS, (epoch + 1) * ROWS
    if epoch < FIRST_V2:
        return f"SELECT id, CAST(id AS INT) AS n, named_struct('x', CAST(id AS INT)) AS p FROM range({lo}, {hi})"
    n = "id * 3000000000" if widens(table_format) else "CAST(id AS INT)"
    return (
        f"SELECT id, {n} AS n, named_struct('x', CAST(id AS INT), 'y', concat('y', id)) AS p, "
        f"concat('e', id) AS extra FROM range({lo}, {hi})"
    )


def expected(epochs: int = EPOCHS, table_format: str | None = None) -> Counter:
    """The rows as (id, n, p.x, p.y, extra), as every reader must return them under the newest schema."""
    rows: Counter = Counter()
    for epoch in range(epochs):
        for i in range(epoch * ROWS, (epoch + 1) * ROWS):
            if epoch < FIRST_V2:
                rows[(i, i, i, None, None)] += 1
            else:
                rows[(i, i * 3000000000 if widens(table_format) else i, i, f"y{i}", f"e{i}")] += 1
    return rows


def open_sink(state: str, output: str, table_format: str | None = None) -> ExactlyOnceParquetSink:
    options: dict[str, Any] = {}
    if table_format:
        options["table_format"] = table_format
        if table_format == "iceberg":
            options["table"] = ICEBERG_TABLE
    return ExactlyOnceParquetSink(output, state, vnodes=8, parallelism=2, rollover=HOLD, **options)


def run(spark: Any, state: str, output: str, table_format: str | None = None) -> None:
    sink = open_sink(state, output, table_format)
    print("started", flush=True)
    for epoch in range(sink.log_store.last_sealed_epoch + 1, EPOCHS):
        sink(spark.sql(batch_sql(epoch, table_format)), epoch)
        if epoch == 0:
            sink.flush()
        print(f"batch {epoch}", flush=True)
    sink.flush()
    sink.close()
    print("done", flush=True)


def main() -> None:
    state, output = sys.argv[1:3]
    table_format = sys.argv[3] if len(sys.argv) > 3 else None
    spark = local_spark("filesink-evolve-test", conf={"spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1"})
    run(spark, state, output, table_format)
    spark.stop()


if __name__ == "__main__":
    main()
