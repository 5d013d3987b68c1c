"""Spark SQL with the Delta and Iceberg connectors, in the pinned environment of ``engines_env.py`` (only the
standard library and pyspark there): one Spark start serves every request of a test.

``python spark_sql_job.py '<setup JSON>'`` starts a local Spark with the setup's ``jars`` (and, with ``s3``
``{"endpoint", "access_key", "secret_key", "region"}``, Hadoop's S3A for ``s3://`` and ``s3a://`` paths), prints
``ready``, then answers each line of its standard input (a request) with one line of JSON (the answer), until its
input ends. An answer's line starts with ``answer: ``: Delta's ``VACUUM`` prints lines of its own.

A request is ``{"catalog": {property: value} | null, "statements": [SQL, ...]}``: the statements run in a new
Spark session (sharing the one Spark context) whose Iceberg catalog is Iceberg's ``JdbcCatalog`` with the given
properties (``uri`` a JDBC URL, ``jdbc.user`` ...), named as the ``name`` property says (default ``filesink``): the
catalog name of the sink's pyiceberg catalog, which both keep in the catalog tables' ``catalog_name`` column. The
answer is a list, per statement, of ``{"columns": [...], "rows": [[...], ...]}`` or ``{"error": "<exception
class>: <message>"}``, with values made JSON-safe: dates and timestamps as ISO text (the session's time zone is
UTC), decimals as text, bytes as hex, structs as objects.
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
import sys
from typing import Any

from pyspark.sql import Row, SparkSession

CATALOG = "filesink"
ANSWER = "answer: "
"""Starts the line of an answer (Delta's VACUUM prints to standard output too)."""
DELTA_EXTENSION = "io.delta.sql.DeltaSparkSessionExtension"
ICEBERG_EXTENSION = "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions"


def start(setup: dict[str, Any]) -> SparkSession:
    builder = (
        SparkSession.builder.master("local[2]")
        .appName("filesink-engines")
        .config("spark.jars", ",".join(setup["jars"]))
        .config("spark.sql.extensions", f"{DELTA_EXTENSION},{ICEBERG_EXTENSION}")
        .config("spark.sql.catalog.spark_catalog", "org.apache.spark.sql.delta.catalog.DeltaCatalog")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.extraJavaOptions", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")
        .config("spark.databricks.delta.retentionDurationCheck.enabled", "false")
        .config("spark.databricks.delta.snapshotPartitions", "2")  # of 50: a Delta table's state is read by 2 tasks
    )
    s3 = setup.get("s3")
    if s3:
        for key, value in {
            "fs.s3.impl": "org.apache.hadoop.fs.s3a.S3AFileSystem",
            "fs.s3a.endpoint": s3["endpoint"],
            "fs.s3a.endpoint.region": s3.get("region") or "us-east-1",
            "fs.s3a.path.style.access": "true",
            "fs.s3a.connection.ssl.enabled": str(s3["endpoint"].startswith("https")).lower(),
            "fs.s3a.access.key": s3["access_key"],
            "fs.s3a.secret.key": s3["secret_key"],
            "fs.s3a.aws.credentials.provider": "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider",
        }.items():
            builder = builder.config(f"spark.hadoop.{key}", value)
    return builder.getOrCreate()


def session(spark: SparkSession, catalog: dict[str, str] | None) -> SparkSession:
    """A new session of the one Spark context, with the Iceberg catalog of ``catalog``'s properties, named by its
    ``name`` (default ``filesink``)."""
    new = spark.newSession()
    if catalog:
        catalog = dict(catalog)
        prefix = f"spark.sql.catalog.{catalog.pop('name', CATALOG)}"
        new.conf.set(prefix, "org.apache.iceberg.spark.SparkCatalog")
        new.conf.set(f"{prefix}.catalog-impl", "org.apache.iceberg.jdbc.JdbcCatalog")
        new.conf.set(f"{prefix}.io-impl", "org.apache.iceberg.hadoop.HadoopFileIO")
        for key, value in catalog.items():
            new.conf.set(f"{prefix}.{key}", value)
    return new


def jsonable(value: Any) -> Any:
    if isinstance(value, Row):
        return {k: jsonable(v) for k, v in value.asDict(recursive=False).items()}
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).hex()
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return str(value)


def execute(spark: SparkSession, statement: str) -> dict[str, Any]:
    try:
        frame = spark.sql(statement)
        rows = frame.collect()
    except Exception as e:  # the answer names what Spark refused; the job goes on with the next statement
        message = str(e).strip().splitlines()
        return {"error": f"{type(e).__name__}: {' '.join(message[:6])[:3000]}"}
    return {"columns": frame.columns, "rows": [[jsonable(v) for v in row] for row in rows]}


def main(argv: list[str]) -> None:
    spark = start(json.loads(argv[1]))
    spark.sparkContext.setLogLevel("ERROR")
    print("ready", flush=True)
    for line in sys.stdin:
        if not line.strip():
            continue
        request = json.loads(line)
        current = session(spark, request.get("catalog"))
        answers = [execute(current, s) for s in request["statements"]]
        print(ANSWER + json.dumps(answers), flush=True)
    spark.stop()


if __name__ == "__main__":
    main(sys.argv)
