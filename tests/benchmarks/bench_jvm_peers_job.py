"""One streaming job of ``bench_jvm_peers.py``, run in its own process by the pinned Spark with the Delta and
Iceberg connectors (``tests/support/engines_env.py``; the sink from the checkout on ``PYTHONPATH``).

Usage: ``python bench_jvm_peers_job.py SPEC.json``. The spec's ``kind`` is ``spark`` (Spark's Parquet file sink),
``delta`` (``writeStream.format("delta")``, then ``OPTIMIZE`` with ``spark.databricks.delta.optimize.maxFileSize``
at ``target_file_size``), ``iceberg`` (Iceberg's streaming sink into a Hadoop catalog table, then
``CALL <catalog>.system.rewrite_data_files`` with ``target-file-size-bytes``) or ``ours`` (our sink, its
``table_format`` from the spec). The job writes ``SPEC.result.json``: when the query started, when it ended, when
the end state (compacted or flushed) was reached, and Spark's progress of every batch.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from bench_sinks_data import spark_schema
from bench_sinks_jobs import OurSinkBatches, _progress, spark_session

DELTA_EXTENSION = "io.delta.sql.DeltaSparkSessionExtension"
ICEBERG_EXTENSION = "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions"
CATALOG = "peer"
"""The Iceberg peer's Hadoop catalog (its warehouse is the run's output directory)."""
TABLE = "bench.events"


def connector_conf(spec: dict[str, Any]) -> dict[str, str]:
    """The connectors' jars and settings: the same in every job, so that every sink runs in the same Spark."""
    return {
        "spark.jars": ",".join(spec["jars"]),
        "spark.sql.extensions": f"{DELTA_EXTENSION},{ICEBERG_EXTENSION}",
        "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
        f"spark.sql.catalog.{CATALOG}": "org.apache.iceberg.spark.SparkCatalog",
        f"spark.sql.catalog.{CATALOG}.type": "hadoop",
        f"spark.sql.catalog.{CATALOG}.warehouse": "file://" + spec["output"],
        "spark.sql.session.timeZone": "UTC",
        "spark.ui.enabled": "false",
        # of 50: a Delta table's state is read by 2 tasks, as a tuned user on 2 cores would set it
        "spark.databricks.delta.snapshotPartitions": "2",
    }


def kafka_stream(spark: Any, kafka: dict[str, Any], schema: str) -> Any:
    """The input's rows from a Kafka topic (``--source kafka``): each value the JSON of one row, a timestamp as its
    microseconds since the epoch (exact, where a JSON timestamp's text would be parsed); read by Spark's Kafka source
    from the earliest offsets, ``maxOffsetsPerTrigger`` records per batch; the columns of ``schema``, in its order."""
    from pyspark.sql import functions as F

    fields = [f.strip().split(" ", 1) for f in schema.split(",")]
    as_json = ", ".join(f"{n} {'long' if t == 'timestamp' else t}" for n, t in fields)
    raw = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", kafka["bootstrap"])
        .option("subscribe", kafka["topic"])
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", str(kafka["max_offsets_per_trigger"]))
        .load()
    )
    rows = raw.select(F.from_json(F.col("value").cast("string"), as_json, {"mode": "FAILFAST"}).alias("v"))
    return rows.select(
        *[F.timestamp_micros(F.col(f"v.{n}")).alias(n) if t == "timestamp" else F.col(f"v.{n}") for n, t in fields]
    )


def run(spec: dict[str, Any]) -> dict[str, Any]:
    spark = spark_session(spec["name"], {**connector_conf(spec), **spec.get("spark_conf", {})}, spec["parallelism"])
    schema = spark_schema(Path(spec["input"]))
    if spec.get("kafka"):
        stream = kafka_stream(spark, spec["kafka"], schema)
    else:
        stream = spark.readStream.schema(schema).option("maxFilesPerTrigger", spec["max_files_per_trigger"])
        stream = stream.parquet(spec["input"])
    target = int(spec["target_file_size"])
    handler: OurSinkBatches | None = None
    kind = spec["kind"]
    if kind == "spark":
        writer = stream.writeStream.format("parquet").option("path", spec["output"])
    elif kind == "delta":
        writer = stream.writeStream.format("delta").option("path", spec["output"])
    elif kind == "iceberg":
        spark.sql(
            f"CREATE TABLE {CATALOG}.{TABLE} ({schema}) USING iceberg "
            f"TBLPROPERTIES ('write.target-file-size-bytes'='{target}')"
        )
        writer = stream.writeStream.format("iceberg").outputMode("append")
    elif kind == "ours":
        handler = OurSinkBatches(spec, [])
        writer = stream.writeStream.foreachBatch(handler)
    else:
        raise SystemExit(f"unknown sink kind {kind!r}")
    writer = writer.option("checkpointLocation", spec["checkpoint"]).trigger(availableNow=True)
    t_start = time.time()
    query = writer.toTable(f"{CATALOG}.{TABLE}") if kind == "iceberg" else writer.start()
    query.awaitTermination()
    if query.exception() is not None:
        raise SystemExit(f"query failed: {query.exception()}")
    t_query_end = time.time()
    result: dict[str, Any] = {"progress": _progress(query)}
    if kind == "delta":  # the peer's end state: its small files compacted to our target size
        spark.conf.set("spark.databricks.delta.optimize.maxFileSize", str(target))
        rows = spark.sql(f"OPTIMIZE delta.`{spec['output']}`").collect()
        result["compact"] = [str(r.asDict(recursive=True).get("metrics")) for r in rows]
    elif kind == "iceberg":
        rows = spark.sql(
            f"CALL {CATALOG}.system.rewrite_data_files(table => '{TABLE}', "
            f"options => map('target-file-size-bytes', '{target}'))"
        ).collect()
        result["compact"] = [str(r.asDict()) for r in rows]
    elif handler is not None:
        handler.sink.flush()  # what the log store still holds: written now, counted in the time to the end state
        handler.sink.close()
    result.update(t_start=t_start, t_query_end=t_query_end, t_end=time.time())
    spark.stop()
    return result


def main() -> None:
    spec_path = Path(sys.argv[1])
    spec = json.loads(spec_path.read_text())
    result = run(spec)
    spec_path.with_suffix(".result.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main()
