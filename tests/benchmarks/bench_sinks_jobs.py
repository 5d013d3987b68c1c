"""One streaming job of the sink benchmark, run in its own process (so that its JVM and Python workers are its own).

Usage: ``python bench_sinks_jobs.py SPEC.json``. The spec names the sink (``spark``, ``delta`` or ``ours``; for
``delta``, ``compact_to`` bytes compacts the table with delta-rs ``optimize.compact`` once the query ended),
the workload of the input (``bench_sinks_data.WORKLOADS``, ``events`` if absent: our sink's key columns; the
Spark schema is read from the input files), the input, output, checkpoint, trigger and the partition columns
(``partition_by``, none if absent); the job writes ``SPEC.result.json``: the time the query started and ended,
the end time of every batch, Spark's progress of every batch and, for our sink, the reason each file was rolled.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from bench_sinks_data import WORKLOADS, Workload, spark_schema
from bench_sinks_monitor import status

DELTA_APP_ID = "bench-sinks"


def workload(spec: dict[str, Any]) -> Workload:
    return WORKLOADS[spec.get("workload") or "events"]


def spark_session(name: str, conf: dict[str, str], cores: int = 2) -> Any:
    from filesink.cli.localspark import local_spark

    base = {"spark.sql.streaming.numRecentProgressUpdates": "100000", "spark.driver.memory": "4g"}
    return local_spark(f"bench-{name}", cores=cores, conf={**base, **conf})


def _progress(query: Any) -> list[dict[str, Any]]:
    return [
        {
            "batch": p.batchId,
            "timestamp": p.timestamp,
            "rows": p.numInputRows,
            "durations_ms": dict(p.durationMs),
        }
        for p in query.recentProgress
    ]


def _rows_done(query: Any) -> int:
    return sum(p.numInputRows for p in query.recentProgress)


class OurSinkBatches:
    """foreachBatch: our sink, recording when each batch ended and why each file was rolled."""

    def __init__(self, spec: dict[str, Any], ends: list[dict[str, Any]]) -> None:
        import filesink.sink.roll as roll_module
        from filesink import ExactlyOnceParquetSink, Rollover

        self.reasons: dict[str, str] = {}
        original_plan = roll_module.plan  # type: ignore[attr-defined]

        def recording_plan(*args: Any, **kwargs: Any) -> Any:  # the benchmark's own hook: notes each file's reason
            files, idle = original_plan(*args, **kwargs)
            for f in files:
                self.reasons[f.name] = f.reason
            return files, idle

        roll_module.plan = recording_plan  # type: ignore[attr-defined]
        self.sink = ExactlyOnceParquetSink(
            spec["output"],
            spec["state"],
            key_columns=list(workload(spec).key_columns),
            partition_by=spec.get("partition_by") or None,
            parallelism=spec["parallelism"],
            rollover=Rollover(**spec["rollover"]),
            storage_options=spec.get("storage_options") or None,
            table_format=spec.get("table_format") or "directory",
            table=spec.get("table"),
        )
        self.ends = ends

    def __call__(self, df: Any, batch_id: int) -> None:
        self.sink(df, batch_id)
        self.ends.append({"batch": batch_id, "end": time.time()})


class DeltaBatches:
    """foreachBatch: ``write_deltalake`` with the batch id as application transaction (replays are skipped)."""

    def __init__(self, spec: dict[str, Any], ends: list[dict[str, Any]]) -> None:
        self.path = spec["output"]
        self.ends = ends

    def __call__(self, df: Any, batch_id: int) -> None:
        from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake

        if DeltaTable.is_deltatable(self.path):
            done = DeltaTable(self.path).transaction_version(DELTA_APP_ID)
            if done is not None and done >= batch_id:
                self.ends.append({"batch": batch_id, "end": time.time(), "skipped": True})
                return
        data = df.toArrow()
        write_deltalake(
            self.path,
            data,
            mode="append",
            commit_properties=CommitProperties(app_transactions=[Transaction(DELTA_APP_ID, batch_id)]),
        )
        self.ends.append({"batch": batch_id, "end": time.time()})


def run(spec: dict[str, Any]) -> dict[str, Any]:
    spark = spark_session(spec["name"], spec.get("spark_conf", {}), spec["parallelism"])
    stream = (
        spark.readStream.schema(spark_schema(Path(spec["input"])))
        .option("maxFilesPerTrigger", spec["max_files_per_trigger"])
        .parquet(spec["input"])
    )
    ends: list[dict[str, Any]] = []
    handler: OurSinkBatches | DeltaBatches | None = None
    if spec["kind"] == "spark":
        writer = stream.writeStream.format("parquet").option("path", spec["output"])
        if spec.get("partition_by"):
            writer = writer.partitionBy(*spec["partition_by"])
    elif spec["kind"] == "delta":
        handler = DeltaBatches(spec, ends)
        writer = stream.writeStream.foreachBatch(handler)
    elif spec["kind"] == "ours":
        handler = OurSinkBatches(spec, ends)
        writer = stream.writeStream.foreachBatch(handler)
    else:
        raise SystemExit(f"unknown sink kind {spec['kind']!r}")
    writer = writer.option("checkpointLocation", spec["checkpoint"])
    trigger = spec["trigger_seconds"]
    if trigger is None:
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime=f"{trigger} seconds")

    t_start = time.time()
    query = writer.start()
    if trigger is None:
        query.awaitTermination()
    else:  # a processing-time trigger runs until stopped: stop once every input row went through
        while _rows_done(query) < spec["rows"]:
            if query.awaitTermination(0.2):
                break
        query.stop()
    if query.exception() is not None:
        raise SystemExit(f"query failed: {query.exception()}")
    t_query_end = time.time()
    result: dict[str, Any] = {"progress": _progress(query), "ends": ends}
    if isinstance(handler, DeltaBatches) and spec.get("compact_to"):
        # the peer's end state: its small files compacted to our target size, counted in the run's time
        from deltalake import DeltaTable

        result["compact"] = DeltaTable(spec["output"]).optimize.compact(target_size=int(spec["compact_to"]))
    if isinstance(handler, OurSinkBatches):
        handler.sink.flush()  # what the log store still holds: written now, counted in the run's time
        result["reasons"] = handler.reasons
        result["file_sizes"] = handler.sink.stats.file_sizes
        handler.sink.close()
    t_end = time.time()
    spark.stop()
    result.update(
        t_start=t_start,
        t_query_end=t_query_end,
        t_end=t_end,
        # VmHWM, not ru_maxrss: Linux keeps ru_maxrss across exec, so it would count the parent's RSS at the fork
        # (the benchmark's own process, which grows with the inputs it generated).
        driver_python_maxrss=status(os.getpid()).get("VmHWM", 0),
    )
    return result


def main() -> None:
    spec_path = Path(sys.argv[1])
    spec = json.loads(spec_path.read_text())
    result = run(spec)
    spec_path.with_suffix(".result.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main()
