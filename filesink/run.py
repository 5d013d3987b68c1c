"""``filesink run``: stream a landing directory of Parquet, JSON or CSV files through the exactly-once sink.

The order of work: check the input directory and any S3 location (seconds, before Spark starts); open the
sink (takes the state directory's lock and runs recovery); start Spark and learn the input schema (the one
the sink recorded, for JSON and CSV; the files' own, for Parquet) and compare it with the sink's; start the
query; show progress until the input is drained (``--available-now``) or a stop is asked for.

Stopping (Ctrl-C or SIGTERM) waits for the batch in progress, stops the query, and says what the log store
still holds; the next run writes it. A second Ctrl-C ends the process at once, which is safe too: recovery at
the next start resolves whatever it interrupted.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from logstore import LogStore, LogStoreError
from logstore import store as logstore_store
from logstore.storage import is_local
from logstore.store import REBUILD_NOTICE

from . import s3options
from . import sink as sink_module
from .damage import given_up_line
from .errors import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, FileSinkError, InputError
from .preflight import check_input, check_master, check_s3, make_local_dir
from .progress import Progress, files_line, held, plural, rows_line
from .rollover import Rollover
from .sink import START_NOTICE, ExactlyOnceParquetSink

KILL_EXIT = EXIT_INTERRUPTED
"""Exit status after a second Ctrl-C or SIGTERM: the process ends without waiting for the batch."""


@dataclass
class RunConfig:
    """The options of ``filesink run`` (see ``docs/cli.md``)."""

    input: Path
    format: str
    output: str
    state_dir: Path
    keys: list[str] = field(default_factory=list)
    partition_by: list[str] = field(default_factory=list)
    trigger_seconds: float = 5.0
    parallelism: int | None = None
    target_file_size: int | None = 128 * 2**20
    max_file_age: float | None = 300.0
    available_now: bool = False
    s3_endpoint: str | None = None
    region: str | None = None
    extra_storage_options: dict[str, Any] = field(default_factory=dict)
    """Storage options from ``--storage-options`` and ``--storage-option`` (:mod:`filesink.s3options`)."""
    master: str | None = None
    checkpoint: Path | None = None
    schema: str | None = None
    max_files_per_trigger: int | None = None
    spark_conf: dict[str, str] = field(default_factory=dict)
    log_store: str | None = None
    accept_state_loss: bool = False
    accept_duplicates: bool = False
    """``--accept-duplicates``: with ``--accept-state-loss``, batch 0 may write to an output that holds rows."""
    single_driver: bool = False
    """``--single-driver``: go on where the log store's location has no conditional create (``docs/recovery.md``)."""
    remote: str | None = None
    """A Spark Connect URL (``--remote``, or ``SPARK_REMOTE``): the job runs through that server, where every
    path is the server's (:mod:`filesink.connect_run`)."""

    @property
    def checkpoint_dir(self) -> Path:
        return self.checkpoint or self.state_dir / "checkpoint"

    def storage_options(self) -> dict[str, Any]:
        """s3fs options: ``--s3-endpoint``, ``--region``, ``--storage-option(s)``; credentials from the AWS
        variables or profile. Credentials set in this process's environment are passed on explicitly, so that
        executors on other machines (``--master``), which append to and read from the log store, use the same
        ones."""
        return s3options.build(endpoint=self.s3_endpoint, region=self.region, json_options=self.extra_storage_options)


class StopRequested(FileSinkError):
    """A batch was refused because the job is stopping; it runs again at the next start."""


class _Batches:
    """The ``foreachBatch`` function: passes batches to the sink until a stop is asked for, then refuses
    them (raising, so that Spark does not record the batch as done: it is replayed at the next start)."""

    def __init__(self, sink: ExactlyOnceParquetSink) -> None:
        self.sink = sink
        self._lock = threading.Lock()
        self._active = 0
        self.stopping = False
        self.error: BaseException | None = None

    def __call__(self, df: Any, batch_id: int) -> None:
        with self._lock:
            if self.stopping:
                raise StopRequested(f"batch {batch_id} was not started: the job is stopping")
            self._active += 1
        try:
            self.sink(df, batch_id)
        except BaseException as e:
            self.error = e
            raise
        finally:
            with self._lock:
                self._active -= 1

    def stop(self) -> None:
        """Refuse new batches and wait for the one in progress."""
        with self._lock:
            self.stopping = True
        while True:
            with self._lock:
                if not self._active:
                    return
            time.sleep(0.05)


@contextmanager
def _signals(on_first: Callable[[], None], last_words: Callable[[], str]) -> Iterator[None]:
    """SIGINT and SIGTERM: the first calls ``on_first``; the second writes ``last_words()`` to stderr and ends
    the process at once (written straight to the descriptor: a live progress panel or a buffer could hold it)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    count = 0

    def handler(signum: int, frame: object) -> None:
        nonlocal count
        count += 1
        if count > 1:
            try:
                words = last_words()
                stderr = os.dup(2)
                _quiet_stderr()  # threads of pyspark's print tracebacks once the JVM is gone: not after a stop
                _end_local_jvm()  # so Spark's own shutdown traces do not come after ours
                os.write(stderr, ("\n" + words + "\n").encode())
            finally:
                os._exit(KILL_EXIT)
        on_first()

    before = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, h in before.items():
            signal.signal(s, h)


def _quiet_stderr() -> None:
    """Point this process's stderr at /dev/null (the process ends right after)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 2)
    except OSError:
        return


def _end_local_jvm(deadline: float = 3.0) -> None:
    """SIGKILL the local Spark JVM this process started, if any, and wait for it (at most ``deadline`` seconds).
    Left alone, it notices its parent is gone only after this process exited, and prints stack traces of its
    own shutdown after the last words of a stop at once. Under Spark Connect there is no local JVM."""
    try:
        from pyspark import SparkContext

        proc = getattr(SparkContext._gateway, "proc", None)
        if proc is None or proc.poll() is not None:
            return
        proc.kill()
        proc.wait(timeout=deadline)
    except Exception:  # the process ends now whatever happens here
        return


@contextmanager
def _start_notices_said_here() -> Iterator[None]:
    """Drop the sink's and the log store's log records of what its start found (:data:`START_NOTICE`,
    :data:`logstore.store.REBUILD_NOTICE`): :func:`_report_recovery` says it once, in full."""
    loggers = [logging.getLogger(sink_module.__name__), logging.getLogger(logstore_store.__name__)]

    def said_here(record: logging.LogRecord) -> bool:
        return not getattr(record, START_NOTICE, False) and not getattr(record, REBUILD_NOTICE, False)

    for logger in loggers:
        logger.addFilter(said_here)
    try:
        yield
    finally:
        for logger in loggers:
            logger.removeFilter(said_here)


def make_sink(config: RunConfig, options: dict[str, Any]) -> ExactlyOnceParquetSink:
    """The sink ``config`` describes (opened here, or under Spark Connect a description opened by the server)."""
    return ExactlyOnceParquetSink(
        config.output,
        config.state_dir,
        log_store=config.log_store,
        accept_state_loss=config.accept_state_loss,
        accept_duplicates=config.accept_duplicates,
        single_driver=config.single_driver,
        key_columns=config.keys or None,
        partition_by=config.partition_by or None,
        parallelism=config.parallelism,
        rollover=Rollover(target_file_size=config.target_file_size, max_age_seconds=config.max_file_age),
        storage_options=options,
        checkpoint_location=str(config.checkpoint_dir),
    )


def spark_session(config: RunConfig) -> Any:
    from pyspark.sql import SparkSession

    from .localspark import local_spark

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # workers run this Python, with this package
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


def _reader(spark: Any, config: RunConfig, streaming: bool) -> Any:
    reader = (spark.readStream if streaming else spark.read).format(config.format)
    if config.format != "parquet":  # a malformed line fails its batch, instead of becoming a row of nulls
        reader = reader.option("mode", "FAILFAST")
    if config.format == "csv":
        reader = reader.option("header", "true")
        if not streaming:
            reader = reader.option("inferSchema", "true")
    if streaming and config.max_files_per_trigger:
        reader = reader.option("maxFilesPerTrigger", config.max_files_per_trigger)
    return reader


def stream_writer(stream: Any, function: Any, config: RunConfig) -> Any:
    """``stream`` written by ``foreachBatch(function)``, with the checkpoint and trigger of ``config``."""
    writer = stream.writeStream.foreachBatch(function).option("checkpointLocation", str(config.checkpoint_dir))
    if config.available_now:
        return writer.trigger(availableNow=True)
    return writer.trigger(processingTime=f"{config.trigger_seconds} seconds")


def input_schema(spark: Any, config: RunConfig, sink: ExactlyOnceParquetSink, have_files: bool) -> Any:
    """The schema to read the input with: ``--schema``; else, for JSON and CSV, the one the sink recorded (so
    that a restart reads the files the same way); else the one Spark infers from the files there now."""
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
    return _reader(spark, config, streaming=False).load(str(config.input)).schema


def run(config: RunConfig, console: Any, out: Callable[[str], None] = print) -> int:
    """Run the job; returns the exit status. Errors of the sink and of the input are raised as
    :class:`FileSinkError`; a failed streaming query is reported and returns ``EXIT_FAILED``."""
    if config.remote:
        from .connect_run import run_remote

        return run_remote(config, console, out)
    started = time.monotonic()
    files = check_input(config.input, config.format)
    make_local_dir(config.state_dir, "the state directory (--state-dir)", create=False)
    make_local_dir(config.checkpoint_dir, "the checkpoint directory (--checkpoint)", create=False)
    config.log_store = config.log_store or LogStore.recorded_location(config.state_dir)
    options = config.storage_options()
    if not is_local(config.output):
        check_s3(config.output, options, "output")
    if config.log_store and not is_local(config.log_store):
        check_s3(config.log_store, options, "log store")
    if config.master:
        check_master(config.master)
    with _start_notices_said_here():
        sink = make_sink(config, options)
    spark = None
    try:
        _report_recovery(sink, out)
        spark = spark_session(config)
        spark.sparkContext.setLogLevel("FATAL")  # failures are reported below, without Spark's stack traces
        schema = input_schema(spark, config, sink, bool(files))
        stream = _reader(spark, config, streaming=True).schema(schema).load(str(config.input))
        sink.check_schema(stream.schema)
        batches = _Batches(sink)
        writer = stream_writer(stream, batches, config)
        stop = threading.Event()

        def ask_stop() -> None:
            stop.set()
            console.print(STOPPING, highlight=False, soft_wrap=True)

        with _signals(ask_stop, lambda: stopped_at_once(config.state_dir)):
            try:
                query = writer.start()
                progress = Progress(console, sink.stats, config.state_dir, "filesink run")
                failure = _watch(query, batches, stop, progress)
                if failure is not None:
                    return _report_failure(failure, batches, config, out)
                if not stop.is_set():  # drained (--available-now): write what the log store holds
                    sink.flush()
                stats = sink.stats
                verb = "stopped" if stop.is_set() else "done"
                out(
                    f"{verb}: {rows_line(stats)}; files committed {files_line(stats.file_sizes, stats.objects)}; "
                    f"{time.monotonic() - started:,.1f} s"
                )
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


def _report_held(state_dir: Path, out: Callable[[str], None]) -> None:
    h = held(state_dir)
    if h.rows:
        out(f"the log store holds {h.describe()} not yet in files; the next run writes them")
    else:
        out("the log store holds nothing that is not in committed files")


STOPPING = "stopping: waiting for the batch in progress (Ctrl-C again stops at once; nothing is lost either way)"


def stopped_at_once(state_dir: Path) -> str:
    """What a second Ctrl-C or SIGTERM prints as the process ends at once: what it left and what comes next."""
    try:
        left = f"the log store holds {held(state_dir).describe()} not yet in files"
    except Exception as e:  # the process ends now whatever this says: never let the message stop it
        left = f"what the log store holds could not be read ({type(e).__name__})"
    return (
        f"stopped at once (exit {KILL_EXIT}): the batch in progress, if any, was not committed, and Spark runs it "
        f"again at the next start; {left}; the next run writes them, and its recovery at start resolves any file "
        "this stop interrupted. Nothing is lost."
    )


def _watch(query: Any, batches: _Batches | None, stop: threading.Event, progress: Any) -> BaseException | None:
    """Show progress until the query ends or a stop is asked for; returns the query's error, if it failed."""
    from pyspark.errors import StreamingQueryException

    with progress:
        while True:
            try:
                if query.awaitTermination(0.5):
                    break
            except StreamingQueryException as e:
                if stop.is_set():  # the batch in progress failed of the stop (a Ctrl-C reaches Spark's Python
                    break  # workers too): nothing of it was committed, and the next run repeats it
                return e
            progress.update()
            if stop.is_set():
                if batches is not None:  # under Spark Connect the batch in progress is the server's
                    batches.stop()
                query.stop()
                break
        progress.update()
    return None


def _report_failure(
    error: BaseException, batches: _Batches | None, config: RunConfig, out: Callable[[str], None]
) -> int:
    cause = batches.error if batches is not None else None
    if isinstance(cause, (FileSinkError, LogStoreError)):  # its own message says what to do (e.g. fenced: stop)
        raise cause
    summary = spark_error_summary(cause if cause is not None else error)
    detail = "\n  ".join(summary)
    if any(mark in line for line in summary for mark in CONCURRENT_QUERY):
        fix = (
            f"Another streaming query uses the same checkpoint ({config.checkpoint_dir}): two runs of this command "
            "overlap, as during a rolling update. Let one of them run (the newer one owns the sink; the older is "
            "fenced at its next step), and start this command again only once the other run has stopped"
        )
    else:
        fix = (
            f"Fix the cause (for example replace a malformed file in {config.input} with a corrected copy of the "
            "same name) and run the same command again"
        )
    out(
        f"error: the streaming query failed:\n  {detail}\nNothing of the failed batch was committed. {fix}: it "
        "resumes with that batch."
    )
    return EXIT_FAILED


CONCURRENT_QUERY = ("Multiple streaming queries are concurrently using", "Multiple streaming jobs detected")
"""What Spark says when two queries run on one checkpoint (Spark 4, and earlier versions)."""


WRAPPERS = ("STREAM_FAILED", "FOREACH_BATCH_USER_FUNCTION_ERROR")


def spark_error_summary(error: BaseException, limit: int = 4) -> list[str]:
    """The lines of a Spark error that say what went wrong (error classes such as ``[FAILED_READ_FILE...]`` with
    the file, and the ``Caused by:`` chain), without stack frames, Python tracebacks or query wrappers."""
    picked: list[str] = []
    for raw in str(error).splitlines():
        line = raw.strip().removeprefix("Caused by: ").removeprefix(": ")
        m = re.search(r"\[[A-Z][A-Z_.]+\] .*", line)
        if m:
            line = m.group(0)
        elif not re.match(r"[\w.$]+(Exception|Error): ", line):
            continue
        line = re.sub(r"^(org\.apache\.spark\.)?SparkException: ", "", line)
        if any(f"[{w}" in line for w in WRAPPERS) or line in picked:
            continue
        picked.append(line)
    return picked[:limit] or [str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__]


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
