"""A streaming job run as a subprocess by the kill tests: file source -> ExactlyOnceParquetSink.

Usage: python sink_job.py INPUT OUTPUT STATE CHECKPOINT PARALLELISM

OUTPUT may be an s3:// URL; its storage options then come from the SINK_JOB_S3 variable (JSON). The log
store is at the location the SINK_JOB_LOG_STORE variable names (a directory or an s3:// URL, with the same
storage options); without it, under STATE.

Reads the Parquet files of INPUT one per micro-batch (available-now), writes them through the sink, flushes
and prints ``done``. Killed at any moment, it is simply started again.

With the SINK_JOB_GATE variable (a path), it starts Spark, prints ``ready`` and waits until that path exists
before it creates the sink (which takes ownership: recovery, a new writer term): a test starts the next driver
while the current one still runs, and lets it take over at a moment of its choosing.

With the SINK_JOB_TABLE variable (``delta`` or ``iceberg``), OUTPUT is a table of that format, partitioned by the
columns SINK_JOB_PARTITION_BY names (comma-separated; default none). An Iceberg table is the one SINK_JOB_ICEBERG_TABLE
names (default ``kill.events``) in the catalog whose properties SINK_JOB_CATALOG holds (JSON); without it, in the
embedded SQLite catalog beside a local table. A table on S3 needs a catalog that outlives the driver: a test names a
SQLite file of its own, outside the state directory, which a lost state does not take with it.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

from filesink import ExactlyOnceParquetSink, Rollover
from filesink.cli.localspark import local_spark

SCHEMA = "id long, user_id long, event_date string, amount double"
FAST_START = {"spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"}
"""A short-lived test job starts much faster without the JVM's optimizing compiler and parallel GC."""
ROLL_EPOCHS = 2
"""A roll every second micro-batch (the job's rollover: epochs in a file)."""
GATE_TIMEOUT = 900.0
"""Seconds a gated job waits for its gate before it gives up (the test that started it is gone)."""
ICEBERG_TABLE = "kill.events"
"""The Iceberg table of a job with SINK_JOB_TABLE=iceberg, unless SINK_JOB_ICEBERG_TABLE names another."""


def table_options() -> dict[str, Any]:
    """The sink's table options from SINK_JOB_TABLE, SINK_JOB_ICEBERG_TABLE, SINK_JOB_CATALOG and
    SINK_JOB_PARTITION_BY; none without them (a directory)."""
    options: dict[str, Any] = {}
    table_format = os.environ.get("SINK_JOB_TABLE")
    if table_format:
        options["table_format"] = table_format
        if table_format == "iceberg":
            options["table"] = os.environ.get("SINK_JOB_ICEBERG_TABLE") or ICEBERG_TABLE
            catalog = os.environ.get("SINK_JOB_CATALOG")
            if catalog:
                options["catalog"] = json.loads(catalog)
    partition_by = [c for c in os.environ.get("SINK_JOB_PARTITION_BY", "").split(",") if c]
    if partition_by:
        options["partition_by"] = partition_by
    return options


def main() -> None:
    source, output, state, checkpoint, parallelism = sys.argv[1:6]
    log_store = os.environ.get("SINK_JOB_LOG_STORE") or None
    spark = local_spark("filesink-kill-test", conf=FAST_START)
    gate = os.environ.get("SINK_JOB_GATE")
    if gate:
        print("ready", flush=True)
        wait_for(gate)
    run(spark, source, output, state, checkpoint, int(parallelism), log_store)


def wait_for(gate: str) -> None:
    """Wait until the path ``gate`` exists; exit with an error after GATE_TIMEOUT seconds."""
    deadline = time.monotonic() + GATE_TIMEOUT
    while not os.path.exists(gate):
        if time.monotonic() > deadline:
            sys.exit(f"the gate {gate} did not open within {GATE_TIMEOUT:g} s")
        time.sleep(0.02)


def run(
    spark: Any,
    source: str,
    output: str,
    state: str,
    checkpoint: str,
    parallelism: int,
    log_store: str | None = None,
) -> None:
    """The job on ``spark``; the log store at ``log_store`` (default: under ``state``)."""
    sink = ExactlyOnceParquetSink(
        output,
        state,
        log_store=log_store,
        key_columns=["user_id"],
        vnodes=32,
        parallelism=parallelism,
        rollover=Rollover(target_file_size=None, max_epochs=ROLL_EPOCHS, max_age_seconds=None),
        storage_options=json.loads(os.environ.get("SINK_JOB_S3", "{}")),
        **table_options(),
    )
    print("started", flush=True)

    def batch(df: Any, batch_id: int) -> None:  # the sink, and a progress line the kill test waits for
        sink(df, batch_id)
        print(f"batch {batch_id}", flush=True)

    stream = spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).parquet(source)
    query = (
        stream.writeStream.foreachBatch(batch)
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    sink.flush()
    sink.close()
    spark.stop()
    print("done", flush=True)


if __name__ == "__main__":
    main()
