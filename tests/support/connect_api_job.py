"""A Spark Connect client for the sink's API tests: ``connect_api_job.py SCENARIO URL WORKDIR``.

A process that made a Connect session stays in Connect mode, so the tests run each client in a process of its
own. Each scenario prints ``RESULT <json>`` as its last line; the test asserts on it and on the output.
Input: the Parquet files in ``WORKDIR/in``; output ``WORKDIR/out``; state ``WORKDIR/state``.
"""

from __future__ import annotations

import json
import pickle
import sys
import time
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
from pyspark.sql import SparkSession

from filesink import ExactlyOnceParquetSink, Rollover
from filesink.errors import FileSinkError

BIG = Rollover(target_file_size=None, max_rows=10**9, max_age_seconds=3600)
"""No file rolls during the query: every file of a test comes from flush()."""


def _sink(work: Path, checkpoint: Path, **options: Any) -> ExactlyOnceParquetSink:
    options.setdefault("rollover", BIG)
    return ExactlyOnceParquetSink(
        str(work / "out"),
        work / "state",
        key_columns=["user_id"],
        vnodes=8,
        parallelism=2,
        checkpoint_location=str(checkpoint),
        **options,
    )


def _query(spark: Any, work: Path, sink: Any, checkpoint: Path, *, available_now: bool = True) -> Any:
    schema = spark.read.parquet(str(work / "in")).schema
    writer = (
        spark.readStream.schema(schema)
        .option("maxFilesPerTrigger", 1)
        .parquet(str(work / "in"))
        .writeStream.foreachBatch(sink)
        .option("checkpointLocation", str(checkpoint))
    )
    if available_now:
        return writer.trigger(availableNow=True).start()
    return writer.trigger(processingTime="1 second").start()


def run_and_flush(spark: Any, work: Path) -> dict[str, Any]:
    checkpoint = work / "checkpoint"
    sink = _sink(work, checkpoint)
    state_before = (work / "state").exists()
    query = _query(spark, work, sink, checkpoint)
    query.awaitTermination(600)
    batches = len(query.recentProgress)
    files_before_flush = sorted(p.name for p in (work / "out").rglob("*.parquet"))
    sink.flush()
    try:
        sink.log_store  # noqa: B018 - the state is the server's
        client_state = "readable"
    except FileSinkError as e:
        client_state = str(e)
    return {
        "state_before_query": state_before,
        "batches": batches,
        "files_before_flush": files_before_flush,
        "client_state": client_state,
    }


def stop_and_restart(spark: Any, work: Path) -> dict[str, Any]:
    """A processing-time query stopped after two batches (the server ends its foreachBatch process), then the
    same query started again by another sink object: it takes the state directory's lock once the old process
    is gone, and finishes."""
    checkpoint = work / "checkpoint"
    query = _query(spark, work, _sink(work, checkpoint), checkpoint, available_now=False)
    deadline = time.monotonic() + 300
    while len(query.recentProgress) < 2 and time.monotonic() < deadline:
        if query.exception() is not None:
            raise RuntimeError(str(query.exception()))
        time.sleep(0.5)
    query.stop()
    sink = _sink(work, checkpoint)
    again = _query(spark, work, sink, checkpoint)
    again.awaitTermination(600)
    sink.flush()
    return {"first_batches": len(query.recentProgress), "second_batches": len(again.recentProgress)}


def refusals(spark: Any, work: Path) -> dict[str, Any]:
    """What the sink refuses under Spark Connect, before anything runs on the server."""
    out: dict[str, Any] = {}
    sink = _sink(work, work / "checkpoint")
    try:
        pickle.dumps(sink)
        out["pickle"] = "pickled"
    except TypeError as e:
        out["pickle"] = str(e)
    try:
        spark.range(2).mapInArrow(lambda batches: (b for b in batches if sink is not None), "id long").collect()
        out["udf"] = "ran"
    except Exception as e:
        out["udf"] = str(e)
    try:
        ExactlyOnceParquetSink("relative/out", work / "state2")
        out["relative"] = "made"
    except FileSinkError as e:
        out["relative"] = str(e)
    try:
        ExactlyOnceParquetSink(str(work / "out"), work / "state3", key_columns=["user_id"])
        out["no_checkpoint"] = "made"
    except FileSinkError as e:
        out["no_checkpoint"] = str(e)
    from pyspark.sql import types as T

    user_id = T.StructField("user_id", T.LongType())
    schemas = {
        "case": T.StructType([user_id, T.StructField("a", T.LongType()), T.StructField("A", T.LongType())]),
        "interval": T.StructType([user_id, T.StructField("iv", T.CalendarIntervalType())]),
    }
    for case, schema in schemas.items():  # the schema check on the client, where the sink is not open
        try:
            sink.check_schema(schema)
            out[case] = "accepted"
        except FileSinkError as e:
            out[case] = str(e)
    out["state_exists"] = (work / "state").exists() or (work / "state3").exists()
    return out


def other_checkpoint(spark: Any, work: Path) -> dict[str, Any]:
    """Query A seals epoch 0; query B, with a checkpoint of its own, sends its batch 0 to the same sink. Without
    the query id that batch would look like a replay of epoch 0 and be skipped: it must be refused."""
    first = work / "checkpoint-a"
    sink = _sink(work, first)
    _query(spark, work, sink, first).awaitTermination(600)
    sink.flush()
    second = work / "checkpoint-b"
    query = _query(spark, work, _sink(work, second), second)
    try:
        query.awaitTermination(600)
        return {"second": "ran"}
    except Exception as e:
        return {"second": str(e)}


def idle_timer(spark: Any, work: Path) -> dict[str, Any]:
    """A running query whose input stops: the sink's idle timer, in the server's foreachBatch process, closes the
    file by age between batches (no flush)."""
    checkpoint = work / "checkpoint"
    sink = _sink(work, checkpoint, rollover=Rollover(target_file_size=None, max_age_seconds=3))
    query = _query(spark, work, sink, checkpoint, available_now=False)
    wanted = sum(pq.ParquetFile(p).metadata.num_rows for p in (work / "in").glob("*.parquet"))
    deadline = time.monotonic() + 300
    files: list[str] = []
    written = 0
    while written < wanted and time.monotonic() < deadline:  # every row in files, with no flush
        if query.exception() is not None:
            raise RuntimeError(str(query.exception()))
        time.sleep(1)
        files = sorted(str(p) for p in (work / "out").rglob("*.parquet"))
        written = sum(pq.ParquetFile(p).metadata.num_rows for p in files)
    batches = len(query.recentProgress)
    query.stop()
    return {"files": files, "written": written, "wanted": wanted, "batches": batches}


SCENARIOS = {f.__name__: f for f in (run_and_flush, stop_and_restart, refusals, other_checkpoint, idle_timer)}


def main() -> None:
    scenario, url, workdir = sys.argv[1:4]
    spark = SparkSession.builder.remote(url).getOrCreate()
    result = SCENARIOS[scenario](spark, Path(workdir))
    print("RESULT " + json.dumps(result), flush=True)
    spark.stop()


if __name__ == "__main__":
    main()
