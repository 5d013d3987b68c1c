"""A local Spark session for the examples and tests: ``local[N]`` on the loopback interface, no UI."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import Any


def local_spark(app_name: str, cores: int = 2, conf: Mapping[str, str] | None = None) -> Any:
    """Start (or get) a ``local[cores]`` SparkSession bound to 127.0.0.1, with UTC session time zone, and
    ``conf`` on top.

    Python workers run the interpreter running this (so they see the same installed packages), unless
    ``PYSPARK_PYTHON`` says otherwise."""
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

    builder = (
        SparkSession.builder.master(f"local[{cores}]")
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", str(cores))
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.sql.session.timeZone", "UTC")
    )
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    return session
