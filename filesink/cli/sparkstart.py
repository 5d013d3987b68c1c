"""The Spark that ``filesink run`` starts in this process: local Spark, or a session of a ``--master`` cluster, with
the lines of Spark's start a user cannot act on left out (:data:`LOG4J2`)."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .localspark import local_spark


def spark_session(master: str | None, parallelism: int | None, conf: Mapping[str, str]) -> Any:
    """Local Spark (``local[parallelism]``, default: the CPU count), or a session of the cluster at ``master``;
    with the Spark settings ``conf``."""
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # workers run this Python, with this package
    quiet_spark_start(local=master is None)
    if master is None:
        return local_spark("filesink-run", cores=parallelism or os.cpu_count() or 2, conf=conf)
    builder = (
        SparkSession.builder.master(master)
        .appName("filesink-run")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.session.timeZone", "UTC")
    )
    for key, value in conf.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


LOG4J2 = Path(__file__).with_name("log4j2.properties")
"""The driver's log4j 2 configuration: Spark's defaults without the start's lines a user cannot act on."""


def quiet_spark_start(local: bool) -> None:
    """Keep the lines a user cannot act on out of Spark's start: "Setting default log level", Hadoop's native
    library, and (local Spark, which binds to 127.0.0.1 anyway) that the host name resolves to a loopback address.
    A log4j configuration of the user's (``-Dlog4j2.configurationFile`` in ``SPARK_SUBMIT_OPTS``, or
    ``log4j2.properties`` in ``SPARK_CONF_DIR``) is left alone."""
    opts = os.environ.get("SPARK_SUBMIT_OPTS", "")
    conf_dir = os.environ.get("SPARK_CONF_DIR")
    own = "log4j2.configurationFile" in opts or (conf_dir and Path(conf_dir, "log4j2.properties").exists())
    if not own:
        os.environ["SPARK_SUBMIT_OPTS"] = f"{opts} -Dlog4j2.configurationFile={LOG4J2.as_uri()}".strip()
    if local:
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
