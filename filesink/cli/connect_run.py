"""What differs in ``filesink run --remote sc://host:port`` (or with ``SPARK_REMOTE`` set), the job through a Spark
Connect server: the pieces the stages of :mod:`filesink.cli.run` call for it.

This process is a thin client. Every path it is given (input, output, state directory, checkpoint, log store) is
the server's: nothing is checked or created here, and the sink opens on the server at its first batch (see
:mod:`filesink.sink.description`). What differs from a run on local or classic Spark:

- JSON and CSV input need ``--schema`` (the schema the sink recorded is in its state, on the server); Parquet input
  without it is read with the files' schemas merged by Spark (``mergeSchema``: new columns and struct fields; a
  widened type needs ``--schema``), in Spark's column order, and the sink compares it with its own at the first
  batch, on the server;
- a new schema the sink takes is not said here (``filesink recover status`` on the server shows the history);
- progress shows the query's batches and rows, as the server reports them (:class:`QueryProgress`);
- a stop (Ctrl-C, SIGTERM) stops the query; the server ends its ``foreachBatch`` process, and with it any batch in
  progress (as after a kill, the next start's recovery finishes or repeats it; nothing is lost);
- after an ``--available-now`` run, the client's ``flush()`` writes what the log store holds, through a one-batch
  query on the server;
- what the log store still holds is told by ``filesink recover status`` on the server.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..errors import InputError, SinkOptionError
from ..words import plural
from .runconfig import RunConfig, input_reader
from .runquery import KILL_EXIT, spark_error_summary

STOPPING = "stopping: the query stops on the server (Ctrl-C again stops at once; nothing is lost)"
"""What the first Ctrl-C or SIGTERM says under Spark Connect."""


class QueryProgress:
    """A line per batch the server reports (the sink's own counts are on the server)."""

    def __init__(self, console: Any, query: Any) -> None:
        self.console = console
        self.query = query
        self.rows: dict[int, int] = {}

    def __enter__(self) -> QueryProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def update(self) -> None:
        try:
            recent = self.query.recentProgress
        except Exception:  # the server is gone: the query's own error says so
            return
        for progress in recent:
            batch, rows = int(progress.batchId), int(progress.numInputRows)
            if batch not in self.rows:
                self.rows[batch] = rows
                total = sum(self.rows.values())
                self.console.print(
                    f"batch {batch}: {rows:,} rows in ({total:,} in {plural(len(self.rows), 'batch')} this run)",
                    highlight=False,
                    soft_wrap=True,
                )


def check_options(config: RunConfig) -> None:
    """Refuse what a run through a Connect server cannot do: JSON or CSV without ``--schema``, and ``--master``."""
    if config.format != "parquet" and not config.schema:
        raise InputError(
            f"--format {config.format} under Spark Connect (--remote or SPARK_REMOTE) needs --schema: the schema "
            "the sink recorded is in its state directory, on the server, and inferring it again could read the "
            "files differently. Give it, for example --schema 'id bigint, name string'."
        )
    if config.master:
        raise SinkOptionError("--master and --remote (or SPARK_REMOTE) exclude each other: give one of them")


def connect_session(config: RunConfig) -> Any:
    """A session of the Connect server at ``config.remote``, with ``--conf`` set in it (:class:`SinkOptionError`
    for a setting the server takes only when it starts)."""
    from pyspark.sql import SparkSession

    assert config.remote is not None
    builder = SparkSession.builder.remote(config.remote).appName("filesink-run")
    spark = builder.getOrCreate()
    for key, value in config.spark_conf.items():
        try:
            spark.conf.set(key, value)
        except Exception as e:
            raise SinkOptionError(
                f"--conf {key}={value}: the Spark Connect server at {config.remote} does not take it in a session "
                f"({str(e).splitlines()[0]}). Settings of the server itself (memory, master, jars) are given when "
                "the server is started."
            ) from None
    return spark


def merged_schema(spark: Any, config: RunConfig) -> Any:
    """The Parquet input's schema as Spark merges the files' (``mergeSchema``), or :class:`InputError` saying to give
    ``--schema`` where Spark cannot merge them (a type widened between files)."""
    try:
        return input_reader(spark, config, streaming=False).option("mergeSchema", "true").load(str(config.input)).schema
    except Exception as e:
        if "CANNOT_MERGE" not in str(e):
            raise
        detail = "; ".join(spark_error_summary(e))
        raise InputError(
            f"the Parquet files in {config.input} have schemas Spark does not merge ({detail}). Under Spark Connect "
            "the files' schemas are merged by Spark, which takes new columns and struct fields but no wider type: "
            "give the input's schema with --schema, in its widest types (for example --schema 'id bigint, n "
            "bigint'); older files are read with it, their values widened."
        ) from None


def last_words(config: RunConfig) -> str:
    """What a second Ctrl-C or SIGTERM prints as the client ends at once."""
    return (
        f"stopped at once (exit {KILL_EXIT}): the query on the server {_server(config.remote)} may still be "
        f"running until its session ends; the sink's state is there, in {config.state_dir}, and `filesink "
        f"recover status --state-dir {config.state_dir}` run there says what its log store holds. The next "
        "run writes it. Nothing is lost."
    )


def report_end(
    config: RunConfig, progress: QueryProgress, stopped: bool, seconds: float, out: Callable[[str], None]
) -> None:
    """The run's summary: the rows and batches the server reported; after a stop, where the sink's state is."""
    verb = "stopped" if stopped else "done"
    rows = sum(progress.rows.values())
    out(
        f"{verb}: {rows:,} rows in {plural(len(progress.rows), 'batch')} through the Spark Connect server "
        f"{_server(config.remote)}; {seconds:,.1f} s"
    )
    if stopped:
        out(
            f"the sink's state is on the server, in {config.state_dir}: there, `filesink recover status "
            f"--state-dir {config.state_dir}` says what its log store holds; the next run writes it"
        )


def _server(url: str | None) -> str:
    """The URL without its token."""
    return (url or "").split(";")[0].rstrip("/")
