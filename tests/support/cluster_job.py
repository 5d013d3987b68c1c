"""The streaming job of ``sink_job.py`` as the driver of an application on a Spark standalone cluster.

Usage: python cluster_job.py MASTER INPUT OUTPUT STATE CHECKPOINT PARALLELISM LOG_STORE

OUTPUT and LOG_STORE may be s3:// URLs; their storage options come from SINK_JOB_S3 (JSON). SINK_JOB_EXECUTOR_ENV
(JSON object) is set in the executors' environment (``spark.executorEnv.*``), e.g. failpoints. The driver runs
in this process (client mode) on 127.0.0.1; executors run Python with this interpreter.
"""

from __future__ import annotations

import json
import os
import sys

from sink_job import run

EXECUTOR_MEMORY = "512m"
TASK_MAX_FAILURES = 4
"""Attempts of a task before its job fails; a task on a lost executor is retried on another one."""


def cluster_spark(master: str, app_name: str, executor_env: dict[str, str]):
    from pyspark.sql import SparkSession

    # What Python workers run is the driver's PYSPARK_PYTHON, shipped with every Python function (the
    # spark.pyspark.python setting is read by spark-submit only, not by a session started from Python).
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"  # the driver's JVM binds nothing on other interfaces
    builder = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.executor.cores", "1")
        .config("spark.executor.memory", EXECUTOR_MEMORY)
        .config("spark.task.maxFailures", str(TASK_MAX_FAILURES))
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
    )
    for name, value in executor_env.items():
        builder = builder.config(f"spark.executorEnv.{name}", value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("WARN")  # lost executors and tasks show in the driver's stderr
    return session


def main() -> None:
    master, source, output, state, checkpoint, parallelism, log_store = sys.argv[1:8]
    executor_env = json.loads(os.environ.get("SINK_JOB_EXECUTOR_ENV", "{}"))
    spark = cluster_spark(master, "filesink-cluster-test", executor_env)
    run(spark, source, output, state, checkpoint, int(parallelism), log_store=log_store)


if __name__ == "__main__":
    main()
