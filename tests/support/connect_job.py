"""A Spark Connect client job run as a subprocess by the Connect kill tests: file source -> ExactlyOnceParquetSink
through ``foreachBatch(sink)`` on a Connect server.

Usage: python connect_job.py URL INPUT OUTPUT STATE CHECKPOINT PARALLELISM

Connects to the Connect server at URL, streams the Parquet files of INPUT one per micro-batch (available-now)
through the sink (which opens on the server, in the query's foreachBatch process), prints ``started`` once the
query runs, ``batch N`` as the server reports batch N done (the query's progress, polled from the client), then
``flush()`` and ``done``. Killed at any moment (or its server killed), it is simply started again. A process that
made a Connect session stays in Connect mode, so this always runs in a process of its own.
"""

from __future__ import annotations

import sys
import time
from typing import Any

from pyspark.sql import SparkSession

from filesink import ExactlyOnceParquetSink, Rollover

SCHEMA = "id long, user_id long, event_date string, amount double"
POLL_SECONDS = 0.25
QUERY_TIMEOUT = 900.0
"""The query's deadline; the tests kill the job long before (every wait of theirs has its own deadline)."""


def _report_progress(query: Any, seen: set[int]) -> None:
    for progress in query.recentProgress:
        if progress.batchId not in seen:
            seen.add(progress.batchId)
            print(f"batch {progress.batchId}", flush=True)


def main() -> None:
    url, source, output, state, checkpoint, parallelism = sys.argv[1:7]
    spark = SparkSession.builder.remote(url).getOrCreate()
    sink = ExactlyOnceParquetSink(
        output,
        state,
        key_columns=["user_id"],
        vnodes=32,
        parallelism=int(parallelism),
        rollover=Rollover(target_file_size=None, max_epochs=2, max_age_seconds=None),
        checkpoint_location=checkpoint,
    )
    query = (
        spark.readStream.schema(SCHEMA)
        .option("maxFilesPerTrigger", 1)
        .parquet(source)
        .writeStream.foreachBatch(sink)
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    print("started", flush=True)
    seen: set[int] = set()
    deadline = time.monotonic() + QUERY_TIMEOUT
    while query.isActive:
        if time.monotonic() > deadline:
            query.stop()
            raise TimeoutError(f"the query on {output} did not end within {QUERY_TIMEOUT:.0f} s")
        _report_progress(query, seen)
        time.sleep(POLL_SECONDS)
    query.awaitTermination()  # raises the server's error if the query failed
    _report_progress(query, seen)
    sink.flush()
    spark.stop()
    print("done", flush=True)


if __name__ == "__main__":
    main()
