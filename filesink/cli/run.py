"""``filesink run``: stream a landing directory of Parquet, JSON or CSV files through the exactly-once sink.

The order of work: check the input directory (Parquet: the files' schemas merged by the sink's rules,
:mod:`filesink.cli.inputschema`) and any S3 location (seconds, before Spark starts); open the sink (takes the state
directory's lock and runs recovery) and compare the files' merged schema with the sink's; start Spark and learn the
input schema (the one the sink recorded, for JSON and CSV; the merged one, for Parquet) and compare it with the
sink's; start the query; show progress, and each new schema the sink takes, until the input is drained
(``--available-now``) or a stop is asked for.

Stopping (Ctrl-C or SIGTERM) waits for the batch in progress, stops the query, and says what the log store
still holds; the next run writes it. A second Ctrl-C ends the process at once, which is safe too: recovery at
the next start resolves whatever it interrupted.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from logstore import LogStore
from logstore import store as logstore_store
from logstore.storage import is_local
from logstore.store import REBUILD_NOTICE

from ..committer.damage import given_up_line
from ..errors import EXIT_OK, InputError
from ..localdirs import make_local_dir
from ..sink import face as sink_module
from ..sink.face import START_NOTICE, ExactlyOnceParquetSink
from ..words import plural
from . import kafka_gaps, kafka_source
from .inputschema import MergedInput, check_against_sink, in_sink_order, spark_schema
from .preflight import check_input, check_master, check_named_columns, check_s3, ddl_columns
from .progress import Progress, committed_line, held, recovered_commits, rows_line
from .runconfig import RunConfig, input_reader, make_sink, stream_writer
from .runquery import KILL_EXIT, Batches, report_failure, stop_signals, watch
from .sourcelog import check_replay
from .warmup import start_python_workers


@contextmanager
def _start_notices_said_here() -> Iterator[None]:
    """Drop the sink's and the log store's log records of what its start found (:data:`START_NOTICE`,
    :data:`logstore.store.REBUILD_NOTICE`): :func:`_report_recovery` says it once, in full."""
    loggers = [
        logging.getLogger("filesink.sink"),
        logging.getLogger(logstore_store.__name__),
    ]  # every role of the sink logs as filesink.sink

    def said_here(record: logging.LogRecord) -> bool:
        return not getattr(record, START_NOTICE, False) and not getattr(record, REBUILD_NOTICE, False)

    for logger in loggers:
        logger.addFilter(said_here)
    try:
        yield
    finally:
        for logger in loggers:
            logger.removeFilter(said_here)


def spark_session(config: RunConfig) -> Any:
    from pyspark.sql import SparkSession

    from .localspark import local_spark

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # workers run this Python, with this package
    quiet_spark_start(local=config.master is None)
    if config.master is None:
        return local_spark("filesink-run", cores=config.parallelism or os.cpu_count() or 2, conf=config.spark_conf)
    builder = (
        SparkSession.builder.master(config.master)
        .appName("filesink-run")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.session.timeZone", "UTC")
    )
    for key, value in config.spark_conf.items():
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


def input_schema(
    spark: Any, config: RunConfig, sink: ExactlyOnceParquetSink, have_files: bool, merged: MergedInput | None = None
) -> Any:
    """The schema to read the input with: ``--schema``; else, for JSON and CSV, the one the sink recorded (so
    that a restart reads the files the same way); else, for Parquet, the files' schemas merged by the sink's rules
    (:mod:`filesink.cli.inputschema`), each column as Spark reads it from the newest file that has it."""
    if config.schema:
        return config.schema
    recorded = sink.recorded_spark_schema()
    if recorded and config.format != "parquet":
        return ", ".join(f"`{name}` {kind}" for name, kind in recorded)
    if not have_files:
        raise InputError(
            f"the input directory {config.input} has no files yet to learn the schema from: add one, or give the "
            "schema with --schema (for example --schema 'id bigint, name string')"
        )
    if merged is not None:
        return spark_schema(merged, lambda path: input_reader(spark, config, streaming=False).load(path))
    return input_reader(spark, config, streaming=False).load(str(config.input)).schema


def run(config: RunConfig, console: Any, out: Callable[[str], None] = print) -> int:
    """Run the job; returns the exit status. Errors of the sink and of the input are raised as
    :class:`FileSinkError`; a failed streaming query is reported and returns ``EXIT_FAILED``."""
    if config.remote:
        from .connect_run import run_remote

        return run_remote(config, console, out)
    started = time.monotonic()
    found, replay = None, None
    if config.kafka is None:
        found = check_input(
            config.input,
            config.format,
            merge=not config.schema,  # a schema given is what the files are read with
            fill_missing=config.fill_missing_columns,
            keep=(*config.keys, *config.partition_by),
        )
    make_local_dir(config.state_dir, "the state directory (--state-dir)", create=False)
    make_local_dir(config.checkpoint_dir, "the checkpoint directory (--checkpoint)", create=False)
    if found is not None:
        replay = check_replay(config.checkpoint_dir, found.files, config.drop_missing_input)
    if config.kafka is not None:
        check_named_columns(kafka_source.columns(config.kafka), config.keys, config.partition_by, "the Kafka input")
    elif config.schema:
        check_named_columns(ddl_columns(config.schema), config.keys, config.partition_by, "--schema")
    elif found is not None and found.merged is not None:
        names = found.merged.schema.names
        check_named_columns(names, config.keys, config.partition_by, "the Parquet files' footers")
    config.log_store = config.log_store or LogStore.recorded_location(config.state_dir)
    options = config.storage_options()
    if not is_local(config.output):
        check_s3(config.output, options, "output")
    if config.log_store and not is_local(config.log_store):
        check_s3(config.log_store, options, "log store")
    if config.master:
        check_master(config.master)
    spark: Any = None
    stream: Any = None
    if config.kafka is not None:
        spark, stream = kafka_stream(config, out)  # before the sink opens: nothing is sealed if Kafka cannot be read
    try:
        with _start_notices_said_here():
            sink = make_sink(config, options)
    except BaseException:
        if spark is not None:
            spark.stop()
        raise
    try:
        _report_recovery(sink, out)
        _start_reporting(sink, config, out)
        if found is not None and replay is not None:
            for notice in replay.notices:
                out(notice)
            merged = found.merged and check_against_sink(found.merged, sink, config.input)  # before Spark starts
            spark = spark_session(config)
            spark.sparkContext.setLogLevel("FATAL")  # failures are reported below, without Spark's stack traces
            schema = input_schema(spark, config, sink, bool(found.files), merged)
            stream = input_reader(spark, config, streaming=True).schema(schema).load(str(config.input))
        stream = in_sink_order(stream, [name for name, _ in sink.recorded_spark_schema() or []])
        sink.check_schema(stream.schema)
        batches = Batches(sink)
        writer = stream_writer(stream, batches, config)
        stop = threading.Event()

        def ask_stop() -> None:
            stop.set()
            console.print(STOPPING, highlight=False, soft_wrap=True)

        summary_said = threading.Event()
        with stop_signals(ask_stop, lambda: stopped_at_once(config.state_dir, summary_said.is_set())):
            try:
                start_python_workers(spark, sink_module.default_parallelism(spark))
                query = writer.start()
                recovered = recovered_commits(sink.recovered)
                progress = Progress(console, sink.stats, config.state_dir, "filesink run", recovered=recovered)
                gaps = kafka_gaps.GapWatch(progress, query) if kafka_source.skips_lost(config.kafka) else None
                failure = watch(query, batches, stop, gaps or progress)
                if failure is not None:
                    return report_failure(failure, batches, config, out)
                if not stop.is_set():  # drained (--available-now): write what the log store holds
                    sink.flush()
                stats = sink.stats
                verb = "stopped" if stop.is_set() else "done"
                out(
                    f"{verb}: {rows_line(stats)}; files committed "
                    f"{committed_line(stats.file_sizes, stats.objects, recovered)}; "
                    f"{time.monotonic() - started:,.1f} s"
                )
                summary_said.set()
                if gaps is not None and gaps.summary():
                    out(str(gaps.summary()))
            finally:  # still under the handler: a second Ctrl-C while Spark stops ends the run at once, quietly
                sink.close()
                spark.stop()
                spark = None
            _report_held(config.state_dir, out)
            return EXIT_OK
    finally:
        sink.close()
        if spark is not None:
            spark.stop()


def _start_reporting(sink: ExactlyOnceParquetSink, config: RunConfig, out: Callable[[str], None]) -> None:
    """Say where the metrics are served; with ``--log-format json``, write the sink's events as JSON lines."""
    if sink.metrics_url is not None:
        out(f"metrics: serving at {sink.metrics_url}")
    if config.log_format == "json":
        from . import jsonlog

        sink.listen(jsonlog.write)


def kafka_stream(config: RunConfig, out: Callable[[str], None]) -> tuple[Any, Any]:
    """Spark, with its Kafka source (:func:`filesink.cli.kafka_source.spark_conf`), and the stream of ``config.kafka``:
    started before the sink's state is opened, so that a Spark without the Kafka source jar, or options it refuses,
    stop the run before anything is sealed (:class:`KafkaSourceError`)."""
    import pyspark

    assert config.kafka is not None
    version = pyspark.__version__
    config.spark_conf = kafka_source.spark_conf(config.spark_conf, version)
    try:
        spark = spark_session(config)
    except Exception as e:
        if "spark.jars.packages" not in config.spark_conf:
            raise
        from .runquery import spark_error_summary

        raise kafka_source.missing_jar(version, "; ".join(spark_error_summary(e))[:400]) from None
    try:
        spark.sparkContext.setLogLevel("FATAL")
        stream = kafka_source.open_stream(spark, config.kafka)
    except BaseException:
        spark.stop()
        raise
    if not config.kafka.fails_on_data_loss:
        out(kafka_source.DATA_LOSS_NOTICE)
    return spark, stream


def _report_held(state_dir: Path, out: Callable[[str], None]) -> None:
    h = held(state_dir)
    if h.rows:
        out(f"the log store holds {h.describe()} not yet in files; the next run writes them")
    else:
        out("the log store holds nothing that is not in committed files")


STOPPING = "stopping: waiting for the batch in progress (Ctrl-C again stops at once; nothing is lost either way)"


def stopped_at_once(state_dir: Path, summary_said: bool = False) -> str:
    """What a second Ctrl-C or SIGTERM prints as the process ends at once: what it left and what comes next. After
    the run's summary line (``summary_said``: the query had stopped, and Spark was shutting down), a line that
    does not say "stopped" a second time."""
    try:
        left = f"the log store holds {held(state_dir).describe()} not yet in files"
    except Exception as e:  # the process ends now whatever this says: never let the message stop it
        left = f"what the log store holds could not be read ({type(e).__name__})"
    if summary_said:
        return (
            f"ended at once (exit {KILL_EXIT}) while Spark shut down, after the run had stopped as said above; "
            f"{left}; the next run writes them. Nothing is lost."
        )
    return (
        f"stopped at once (exit {KILL_EXIT}): the batch in progress, if any, was not committed, and Spark runs it "
        f"again at the next start; {left}; the next run writes them, and its recovery at start resolves any file "
        "this stop interrupted. Nothing is lost."
    )


def _report_recovery(sink: ExactlyOnceParquetSink, out: Callable[[str], None]) -> None:
    done = sink.recovered
    store = sink.log_store
    if store.rebuilt and done is not None:
        held = store.held_totals()
        out(
            f"the state directory was new: rebuilt the state of sink {store.sink_id} from its durable home at "
            f"{store.location.canonical} (last sealed epoch {store.last_sealed_epoch}, "
            f"{plural(held.epochs, 'epoch')} held, {held.rows:,} rows, {len(done.from_home)} pending files)"
        )
    if sink.given_up:
        out(given_up_line(sink.given_up))
    if done is None or not done.files:
        return
    actions: dict[str, int] = {}
    for r in done.files:
        actions[r.action.value] = actions.get(r.action.value, 0) + 1
    what = ", ".join(f"{n} {a}" for a, n in sorted(actions.items()))
    out(f"recovery at start: {len(done.files)} files left pending by the last run resolved ({what})")
