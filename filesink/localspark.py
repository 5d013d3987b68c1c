"""A local Spark session for the examples and tests: ``local[N]`` on the loopback interface, no UI."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import Any

UNIX_SOCKETS = "spark.python.unix.domain.socket.enabled"
"""Spark (4.1 and later) talks to its Python workers over Unix domain sockets instead of TCP on loopback. Over
TCP, each Python task's first input reached the task about 40 ms after its function started; over a Unix
socket, 1 ms: a ``mapInArrow`` job of 2 rows took 73 against 130 ms (``docs/benchmarks.md``). The sink runs at
least one such job per batch. Spark 4.0 does not know the setting and ignores it."""


def session_conf(cores: int, conf: Mapping[str, str] | None = None) -> dict[str, str]:
    """The settings :func:`local_spark` gives its session: ``local[cores]`` on 127.0.0.1, no UI, UTC, Python
    workers over Unix sockets (:data:`UNIX_SOCKETS`), with ``conf`` on top (it may override any of them)."""
    return {
        "spark.master": f"local[{cores}]",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": str(cores),
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.sql.session.timeZone": "UTC",
        UNIX_SOCKETS: "true",
        **(conf or {}),
    }


def local_spark(app_name: str, cores: int = 2, conf: Mapping[str, str] | None = None) -> Any:
    """Start (or get) a ``local[cores]`` SparkSession with :func:`session_conf`'s settings.

    Python workers run the interpreter running this (so they see the same installed packages), unless
    ``PYSPARK_PYTHON`` says otherwise."""
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

    builder = SparkSession.builder.appName(app_name)
    for key, value in session_conf(cores, conf).items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    return session
