"""``filesink run``: stream a landing directory of Parquet, JSON or CSV files, or Kafka topics (``--format kafka``),
through the exactly-once sink, on local Spark, a ``--master`` cluster or a Spark Connect server (``--remote``).

:func:`run` is the job, one sequence of stages for every way of running it; each stage hands the next what it
needs, and where the ways differ, the difference is inside a stage:

1. :func:`check` the input and the locations, in seconds and before anything is opened (Parquet: the files'
   schemas merged by the sink's rules, :mod:`filesink.cli.inputschema`); for Kafka, Spark with its Kafka source
   and the stream, so that nothing is sealed if Kafka cannot be read; under Spark Connect, the server's session;
2. :func:`open_sink`: take the state directory's lock and run recovery, say what the start found, and compare the
   files' merged schema with the sink's (under Spark Connect, a description the server opens);
3. :func:`start_spark`: local Spark or a ``--master`` cluster (or the session the check started);
4. :func:`start_query`: the input's stream, in the schema the sink recorded (JSON and CSV), the merged one
   (Parquet), ``--schema`` or Kafka's columns; Ctrl-C and SIGTERM handled from here; the query started;
5. :func:`watch`: progress, and each new schema the sink takes, until the input is drained (``--available-now``:
   then what the log store holds is written) or a stop is asked for; a Kafka query that Spark 4.1 fails after
   replaying a batch (SPARK-55271) started again, a bounded number of times (:mod:`filesink.cli.kafka_restart`);
6. :func:`report`: the failure, or the run's summary, and what the log store still holds.

Stopping (Ctrl-C or SIGTERM) waits for the batch in progress, stops the query, and says what the log store
still holds; the next run writes it. A second Ctrl-C ends the process at once, which is safe too: recovery at
the next start resolves whatever it interrupted.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from typing import Any

from logstore import LogStore
from logstore.storage import is_local

from ..errors import EXIT_OK, InputError
from ..localdirs import make_local_dir
from ..sink import face as sink_module
from ..sink.face import ExactlyOnceParquetSink
from . import connect_run, kafka_gaps, kafka_restart, kafka_source, runquery
from .inputschema import MergedInput, check_against_sink, in_sink_order, spark_schema
from .preflight import InputFiles, check_input, check_master, check_named_columns, check_s3, ddl_columns
from .progress import Progress, committed_line, recovered_commits, rows_line
from .runconfig import RunConfig, input_reader, make_sink, stream_writer
from .runquery import STOPPING, Batches, report_failure, report_held, stop_signals, stopped_at_once
from .sourcelog import Replay, check_replay
from .sparkstart import spark_session
from .startnotices import report_recovery, start_notices_said_here
from .warmup import start_python_workers

Out = Callable[[str], None]
"""Where the run's lines go: printed, or with ``--log-format json`` JSON notices (:mod:`filesink.cli.jsonlog`)."""


@dataclass(frozen=True)
class Checked:
    """What :func:`check` found: the input's files (a landing directory), the batch the checkpoint runs again,
    the log store's location, the storage options; for Kafka, Spark and the stream it started; under Spark
    Connect, the server's session."""

    found: InputFiles | None
    replay: Replay | None
    log_store: str | None
    options: dict[str, Any]
    spark: Any = None
    stream: Any = None


@dataclass(frozen=True)
class OpenedSink:
    """The sink :func:`open_sink` opened (under Spark Connect, its description), and the files' merged schema it
    was compared with (Parquet files, no ``--schema``)."""

    sink: ExactlyOnceParquetSink
    merged: MergedInput | None


@dataclass(frozen=True)
class Spark:
    """The session of the run. ``jvm_here``: local or classic Spark, whose JVM this process started; it stops
    while Ctrl-C and SIGTERM are still handled (a second one ends the run at once, quietly). Under Spark Connect
    (``jvm_here`` false) this process is the server's client."""

    session: Any
    jvm_here: bool
    stopped: threading.Event = field(default_factory=threading.Event)

    def stop(self) -> None:
        if not self.stopped.is_set():
            self.session.stop()
            self.stopped.set()


@dataclass(frozen=True)
class Query:
    """The started query and what watches it: the writer that started it (:func:`watch` may start it again), the
    ``foreachBatch`` function (local or classic Spark), the progress display, Kafka's gaps (records skipped at the
    source), the stop asked for, whether the run's summary was said, and ``handlers``: Ctrl-C and SIGTERM (and, on
    local or classic Spark, the end of the sink and Spark), left by :func:`report`."""

    query: Any
    writer: Any
    batches: Batches | None
    progress: Any
    gaps: kafka_gaps.GapWatch | None
    stop: threading.Event
    summary_said: threading.Event
    handlers: ExitStack


@dataclass(frozen=True)
class Outcome:
    """How the query ended: its error, if it failed (else it drained, and what the log store held was written,
    or a stop was asked for: :attr:`Query.stop`)."""

    failure: BaseException | None


def run(config: RunConfig, console: Any, out: Out = print) -> int:
    """Run the job; returns the exit status. Errors of the sink and of the input are raised as
    :class:`FileSinkError`; a failed streaming query is reported and returns ``EXIT_FAILED``."""
    started = time.monotonic()
    checked = check(config, out)
    opened = open_sink(config, checked, out)
    spark: Spark | None = None
    try:
        spark = start_spark(config, checked, opened)
        query = start_query(config, checked, opened, spark, console)
        outcome = watch(config, query, opened, out)
        return report(config, opened, spark, query, outcome, started, out)
    finally:
        _end(opened, spark)


def check(config: RunConfig, out: Out) -> Checked:
    """Check the input and the locations before anything is opened: the landing directory's files (Parquet: their
    schemas merged by the sink's rules, unless ``--schema``), the state and checkpoint directories, the batch the
    checkpoint runs again (:mod:`filesink.cli.sourcelog`), the columns named by ``--key`` and ``--partition-by``,
    S3 locations, the ``--master``. For Kafka, start Spark with its Kafka source and open the stream: a Spark without
    the source jar, or options it refuses, stop the run before anything is sealed. Under Spark Connect, where every
    path is the server's, refuse what the run cannot do there and open the server's session (first: a sink made in
    a Connect client is a description, opened by the server)."""
    if config.remote:
        connect_run.check_options(config)
        options = config.storage_options()
        return Checked(None, None, config.log_store, options, spark=connect_run.connect_session(config))
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
    log_store = config.log_store or LogStore.recorded_location(config.state_dir)
    options = config.storage_options()
    if not is_local(config.output):
        check_s3(config.output, options, "output")
    if log_store and not is_local(log_store):
        check_s3(log_store, options, "log store")
    if config.master:
        check_master(config.master)
    if config.kafka is None:
        return Checked(found, replay, log_store, options)
    spark, stream = kafka_stream(config, out)
    return Checked(found, replay, log_store, options, spark=spark, stream=stream)


def open_sink(config: RunConfig, checked: Checked, out: Out) -> OpenedSink:
    """Open the sink (it takes the state directory's lock and runs recovery) and say what its start found: recovery,
    where its metrics are served, the batch the checkpoint runs again; with ``--log-format json``, its events go
    out as JSON lines. The files' merged schema is compared with the sink's, before Spark starts. Under Spark
    Connect the sink is a description, opened by the server at its first batch. If the sink cannot be opened, the
    Spark that :func:`check` started stops."""
    try:
        if config.remote:
            sink = make_sink(config, checked.options)
        else:
            with start_notices_said_here():
                sink = make_sink(replace(config, log_store=checked.log_store), checked.options)
    except BaseException:
        if checked.spark is not None:
            checked.spark.stop()
        raise
    if config.remote:
        return OpenedSink(sink, None)
    try:
        report_recovery(sink, out)
        _start_reporting(sink, config, out)
        merged = None
        if checked.found is not None and checked.replay is not None:
            for notice in checked.replay.notices:
                out(notice)
            merged = checked.found.merged and check_against_sink(checked.found.merged, sink, config.input)
    except BaseException:
        sink.close()
        if checked.spark is not None:
            checked.spark.stop()
        raise
    return OpenedSink(sink, merged)


def start_spark(config: RunConfig, checked: Checked, opened: OpenedSink) -> Spark:
    """The run's Spark: the session :func:`check` started (Kafka, Spark Connect), else local Spark or the
    ``--master`` cluster's, its log quiet (failures are reported by the run, without Spark's stack traces)."""
    if checked.spark is not None:
        return Spark(checked.spark, jvm_here=not config.remote)
    session = spark_session(config.master, config.parallelism, config.spark_conf)
    try:
        session.sparkContext.setLogLevel("FATAL")  # failures are reported below, without Spark's stack traces
    except BaseException:
        opened.sink.close()  # the sink first, as at every end of the run
        session.stop()
        raise
    return Spark(session, jvm_here=True)


def start_query(config: RunConfig, checked: Checked, opened: OpenedSink, spark: Spark, console: Any) -> Query:
    """Start the query: the input's stream (Kafka's, from :func:`check`; a landing directory's, read with
    :func:`input_schema`), in the sink's column order, checked against the sink's schema; its writer, through
    :class:`Batches` on local or classic Spark (the sink itself under Spark Connect); then, with Ctrl-C and SIGTERM
    handled (the first asks for a stop, the second ends the process at once), Spark's Python workers started and
    the query with them, and what shows its progress."""
    sink = opened.sink
    stream = checked.stream
    if stream is None:
        have_files = checked.found is not None and bool(checked.found.files)
        schema = input_schema(spark.session, config, sink, have_files, opened.merged)
        stream = input_reader(spark.session, config, streaming=True).schema(schema).load(str(config.input))
    if spark.jvm_here:
        stream = in_sink_order(stream, [name for name, _ in sink.recorded_spark_schema() or []])
    sink.check_schema(stream.schema)
    batches = Batches(sink) if spark.jvm_here else None
    writer = stream_writer(stream, batches or sink, config)
    stop, summary_said = threading.Event(), threading.Event()
    stopping = STOPPING if spark.jvm_here else connect_run.STOPPING

    def ask_stop() -> None:
        stop.set()
        console.print(stopping, highlight=False, soft_wrap=True)

    def last_words() -> str:
        if not spark.jvm_here:
            return connect_run.last_words(config)
        return stopped_at_once(config.state_dir, summary_said.is_set())

    handlers = ExitStack()
    handlers.enter_context(stop_signals(ask_stop, last_words))
    try:
        if spark.jvm_here:  # still under the handlers: a second Ctrl-C while Spark stops ends the run at once, quietly
            handlers.callback(_end, opened, spark)
            start_python_workers(spark.session, sink_module.default_parallelism(spark.session))
        query = writer.start()
        if spark.jvm_here:
            recovered = recovered_commits(sink.recovered)
            progress: Any = Progress(console, sink.stats, config.state_dir, "filesink run", recovered=recovered)
            gaps = kafka_gaps.GapWatch(progress, query) if kafka_source.skips_lost(config.kafka) else None
        else:
            progress, gaps = connect_run.QueryProgress(console, query), None
    except BaseException:
        handlers.close()
        raise
    return Query(query, writer, batches, progress, gaps, stop, summary_said, handlers)


def watch(config: RunConfig, query: Query, opened: OpenedSink, out: Out) -> Outcome:
    """Show progress until the query ends or a stop is asked for; drained (``--available-now``), write what the
    log store holds (under Spark Connect, through a one-batch query on the server). A Kafka query that Spark 4.1
    fails after replaying a batch (SPARK-55271) is started again, at most
    :data:`filesink.cli.kafka_restart.MAX_RESTARTS` times, with a note each (:mod:`filesink.cli.kafka_restart`).
    The handlers of Ctrl-C and SIGTERM stay for :func:`report`, unless this fails."""
    try:
        restart = kafka_restart.restarts_for(config.kafka, query.writer, query.batches, query.gaps, out)
        failure = runquery.watch(query.query, query.batches, query.stop, query.gaps or query.progress, restart)
        if failure is None and not query.stop.is_set():  # drained (--available-now): write what the log store holds
            opened.sink.flush()
        return Outcome(failure)
    except BaseException:
        query.handlers.close()
        raise


def report(
    config: RunConfig, opened: OpenedSink, spark: Spark, query: Query, outcome: Outcome, started: float, out: Out
) -> int:
    """Say how the run ended and return its exit status: a failed query's error and what to do
    (:func:`filesink.cli.runquery.report_failure`); else the summary line, stopped or done, with the query's
    restarts (:func:`filesink.cli.kafka_restart.restarts_line`) and Kafka's records skipped at the source. On local
    or classic Spark the sink closes and Spark stops before the handlers of Ctrl-C and SIGTERM go, and then the run
    says what the log store still holds; under Spark Connect the summary comes after the handlers go
    (:func:`filesink.cli.connect_run.report_end`)."""
    with query.handlers:
        if outcome.failure is not None:
            return report_failure(outcome.failure, query.batches, config, out)
        if not spark.jvm_here:
            query.handlers.close()
            connect_run.report_end(config, query.progress, query.stop.is_set(), time.monotonic() - started, out)
            return EXIT_OK
        stats = opened.sink.stats
        verb = "stopped" if query.stop.is_set() else "done"
        recovered = recovered_commits(opened.sink.recovered)
        restarts = kafka_restart.restarts_line(opened.sink.metrics().query_restarts)
        out(
            f"{verb}: {rows_line(stats)}; files committed "
            f"{committed_line(stats.file_sizes, stats.objects, recovered)}; {restarts}"
            f"{time.monotonic() - started:,.1f} s"
        )
        query.summary_said.set()
        if query.gaps is not None and query.gaps.summary():
            out(str(query.gaps.summary()))
    report_held(config.state_dir, out)
    return EXIT_OK


def _end(opened: OpenedSink, spark: Spark | None) -> None:
    """Close the sink (under Spark Connect it closes nothing: the sink is the server's) and stop Spark, once."""
    opened.sink.close()
    if spark is not None:
        spark.stop()


def kafka_stream(config: RunConfig, out: Out) -> tuple[Any, Any]:
    """Spark, with its Kafka source (:func:`filesink.cli.kafka_source.spark_conf`), and the stream of ``config.kafka``:
    started before the sink's state is opened, so that a Spark without the Kafka source jar, or options it refuses,
    stop the run before anything is sealed (:class:`KafkaSourceError`)."""
    import pyspark

    assert config.kafka is not None
    version = pyspark.__version__
    conf = kafka_source.spark_conf(config.spark_conf, version, say=out)
    try:
        spark = spark_session(config.master, config.parallelism, conf)
    except Exception as e:
        if "spark.jars.packages" not in config.spark_conf:
            raise
        raise kafka_source.packages_failed(version, "; ".join(runquery.spark_error_summary(e))[:400]) from None
    try:
        spark.sparkContext.setLogLevel("FATAL")
        stream = kafka_source.open_stream(spark, config.kafka)
    except BaseException:
        spark.stop()
        raise
    if not config.kafka.fails_on_data_loss:
        out(kafka_source.DATA_LOSS_NOTICE)
    return spark, stream


def input_schema(
    spark: Any, config: RunConfig, sink: ExactlyOnceParquetSink, have_files: bool, merged: MergedInput | None = None
) -> Any:
    """The schema to read the input with: ``--schema``; under Spark Connect, the Parquet files' schemas as Spark
    merges them (:func:`filesink.cli.connect_run.merged_schema`); else, for JSON and CSV, the one the sink recorded
    (so that a restart reads the files the same way); else, for Parquet, the files' schemas merged by the sink's
    rules (:mod:`filesink.cli.inputschema`), each column as Spark reads it from the newest file that has it."""
    if config.schema:
        return config.schema
    if config.remote:
        return connect_run.merged_schema(spark, config)
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


def _start_reporting(sink: ExactlyOnceParquetSink, config: RunConfig, out: Callable[[str], None]) -> None:
    """Say where the metrics are served; with ``--log-format json``, write the sink's events as JSON lines."""
    if sink.metrics_url is not None:
        out(f"metrics: serving at {sink.metrics_url}")
    if config.log_format == "json":
        from . import jsonlog

        sink.listen(jsonlog.write)
