"""A run's streaming query once it is started, on local or classic Spark and through a Spark Connect server (the
stages of :mod:`filesink.cli.run`): Ctrl-C and SIGTERM (the first asks for a stop, the second ends the process at
once, and what each says on local or classic Spark), watching the query until it ends, the report of a query that
failed, and what the log store still holds after a run; and, on local or classic Spark, the ``foreachBatch``
function that refuses batches once a stop is asked for.
"""

from __future__ import annotations

import os
import re
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from logstore import LogStoreError

from ..errors import EXIT_FAILED, EXIT_INTERRUPTED, FileSinkError
from ..sink.face import ExactlyOnceParquetSink
from .progress import held
from .runconfig import RunConfig
from .sourcelog import local_path

KILL_EXIT = EXIT_INTERRUPTED
"""Exit status after a second Ctrl-C or SIGTERM: the process ends without waiting for the batch."""


class StopRequested(FileSinkError):
    """A batch was refused because the job is stopping; it runs again at the next start."""


class Batches:
    """The ``foreachBatch`` function on local or classic Spark: passes batches to the sink until a stop is asked
    for, then refuses them (raising, so that Spark does not record the batch as done: it is replayed at the next
    start). Under Spark Connect the sink itself is the function, and the batch in progress is the server's."""

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
def stop_signals(on_first: Callable[[], None], last_words: Callable[[], str]) -> Iterator[None]:
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


def watch(
    query: Any,
    batches: Batches | None,
    stop: threading.Event,
    progress: Any,
    restart: Callable[[BaseException], Any] | None = None,
) -> BaseException | None:
    """Show progress until the query ends or a stop is asked for; returns the query's error, if it failed.
    ``restart``, given the error of a query that failed while no stop was asked for, returns a new start of the
    query to watch in its place, or None (:mod:`filesink.cli.kafka_restart`); a stop asked for while it starts
    stops the new query."""
    from pyspark.errors import StreamingQueryException

    with progress:
        while True:
            try:
                if query.awaitTermination(0.5):
                    break
            except StreamingQueryException as e:
                if stop.is_set():  # the batch in progress failed of the stop (a Ctrl-C reaches Spark's Python
                    break  # workers too): nothing of it was committed, and the next run repeats it
                again = restart(e) if restart is not None else None
                if again is None:
                    return e
                query = again
            progress.update()
            if stop.is_set():
                if batches is not None:  # under Spark Connect the batch in progress is the server's
                    batches.stop()
                query.stop()
                break
        progress.update()
    return None


def report_failure(error: BaseException, batches: Batches | None, config: RunConfig, out: Callable[[str], None]) -> int:
    cause = batches.error if batches is not None else None
    if isinstance(cause, (FileSinkError, LogStoreError)):  # its own message says what to do (e.g. fenced: stop)
        raise cause
    summary = spark_error_summary(cause if cause is not None else error)
    detail = "\n  ".join(summary)
    lead = "Nothing of the failed batch was committed. "
    if any(mark in line for line in summary for mark in CONCURRENT_QUERY):
        fix = (
            f"Another streaming query uses the same checkpoint ({config.checkpoint_dir}): two runs of this command "
            "overlap, as during a rolling update. Let one of them run (the newer one owns the sink; the older is "
            "fenced at its next step), and start this command again only once the other run has stopped: it resumes "
            "with that batch."
        )
    elif config.kafka is not None:
        from .kafka_source import kafka_fix, replay_progress_bug

        fix = kafka_fix(summary)
        if replay_progress_bug(summary):  # Spark failed after the batch was committed
            lead = ""
    else:
        fix = _fix_input(summary, config)
    out(f"error: the streaming query failed:\n  {detail}\n{lead}{fix}")
    return EXIT_FAILED


def _fix_input(summary: list[str], config: RunConfig) -> str:
    """What to do after a failed batch: fix the file in place, since Spark runs the batch again with the files it
    listed, by name, and never reads a name twice (:mod:`filesink.cli.sourcelog`)."""
    found = next(
        (m.group(1) for line in summary if (m := re.search(r"while reading file (\S+?)\.?(\s|$)", line))), None
    )
    path = str(local_path(found) or found) if found else None
    what = f"the file {path}" if path else f"the file in {config.input} that failed"
    missing = (
        "Spark would run it without a missing file and never read that name again"
        if config.remote
        else "the next start refuses while one of them is missing, and gives its rows up only if you say so with "
        "--drop-missing-input FILE"
    )
    return (
        f"Fix the cause (for example replace {what} with a corrected copy under the same name) and run the same "
        "command again: it resumes with that batch. Keep the name: the batch runs again with the files it listed, "
        f"by name ({missing}), and a file landed again under a name already read is never read."
    )


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


STOPPING = "stopping: waiting for the batch in progress (Ctrl-C again stops at once; nothing is lost either way)"
"""What the first Ctrl-C or SIGTERM says on local or classic Spark."""


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


def report_held(state_dir: Path, out: Callable[[str], None]) -> None:
    """Say what the log store still holds, not yet in files (the next run writes it)."""
    h = held(state_dir)
    if h.rows:
        out(f"the log store holds {h.describe()} not yet in files; the next run writes them")
    else:
        out("the log store holds nothing that is not in committed files")
