"""A local Spark session for the examples and tests: ``local[N]`` on the loopback interface, no UI."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import Any

UNIX_SOCKETS = "spark.python.unix.domain.socket.enabled"
"""Spark's setting (4.1 and later) for its Python workers on Unix domain sockets instead of TCP; off here, see
:func:`session_conf`."""


def session_conf(cores: int, conf: Mapping[str, str] | None = None) -> dict[str, str]:
    """The settings :func:`local_spark` gives its session: ``local[cores]`` on 127.0.0.1, no UI, UTC, with
    ``conf`` on top (it may override any of them).

    Spark's Python workers stay on TCP, Spark's default. Unix domain sockets (:data:`UNIX_SOCKETS`) make a Python
    job about 55 ms shorter, but with them Spark 4.3's Python daemon prints a ``BrokenPipeError`` traceback on stderr
    for every worker whose task fails on the JVM's side (a malformed input file, say), next to the run's own error
    message (``docs/benchmarks.md``, "Python workers over Unix sockets"). A caller who wants them passes the setting."""
    return {
        "spark.master": f"local[{cores}]",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": str(cores),
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.sql.session.timeZone": "UTC",
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
