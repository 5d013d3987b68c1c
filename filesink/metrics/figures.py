"""A running sink's figures: :class:`SinkMetrics` (what ``sink.metrics()`` returns) and the book the sink keeps
them in (:class:`MetricsBook`), in the driver's memory.

The sink updates the book at the steps that change a figure (the append and seal, the roll, the table commit,
recovery at start, a refusal, a fencing); reading it copies a few numbers, with no listing, no query and no
request. The requests of Spark tasks (the append's log store writes, the file writes' uploads) come back to the
driver in the tasks' result rows (:mod:`filesink.tasks.taskrows`) and are added here; the driver's own are read from
:mod:`logstore.requestcounts`.

What the counters count (per run: every counter starts at 0 when the sink starts, and never goes back):

- rows and files committed are those whose commit this run made, recovery's at start included: a file an earlier
  run wrote but did not commit (killed between its write and its commit) is committed, and counted, by the run whose
  recovery finds it visible. So over the runs of one sink (each run's last figures), rows committed add up to the
  rows of the output's files, each file counted by exactly one run. A file recovery writes again (its objects were
  partly visible) counts once, in that run, with the bytes it has now.
- rows appended are rows this run appended to the log store: a batch Spark runs again after a crash, whose epoch
  the log store sealed already, is a replay and adds nothing.
- query restarts are those ``filesink run`` made of its streaming query in this process since the sink started
  (:func:`query_restarted`: past SPARK-55271, :mod:`filesink.cli.kafka_restart`); a sink fed by a program's own
  query counts none.

This module imports no part of ``prometheus_client`` (:mod:`filesink.metrics.prometheus` does, when asked to serve).
"""

from __future__ import annotations

import bisect
import contextlib
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from logstore import requestcounts
from logstore.errors import FencedError
from logstore.requestcounts import Key

from ..errors import (
    BatchRefusedError,
    CheckpointMismatchError,
    NotSharedError,
    OutputHasRowsError,
    SchemaMismatchError,
    SinkOptionError,
    StateBehindError,
    StateLostError,
    TableFormatError,
)

if TYPE_CHECKING:
    from logstore import LogStore

    from ..committer.ledger import PlannedFile
    from ..rolling.backlog import BacklogTracker

_restarts_lock = threading.Lock()
_query_restarts = 0
"""Streaming queries restarted in this process (:func:`query_restarted`); each book counts from its start."""


def query_restarted() -> None:
    """Count a restart of the streaming query that feeds the sink open in this process (``filesink run``, past
    SPARK-55271): every sink open in this process counts it, in ``query_restarts``."""
    global _query_restarts
    with _restarts_lock:
        _query_restarts += 1


def _restarts_now() -> int:
    with _restarts_lock:
        return _query_restarts


BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
"""Upper bounds in seconds of the duration histograms' buckets (Prometheus adds ``+Inf``)."""

REFUSALS: tuple[tuple[type[Exception], str], ...] = (
    (StateLostError, "state_lost"),
    (StateBehindError, "state_behind"),
    (CheckpointMismatchError, "checkpoint_mismatch"),
    (OutputHasRowsError, "output_has_rows"),
    (BatchRefusedError, "rows_refused"),
    (SchemaMismatchError, "schema_mismatch"),
    (TableFormatError, "table_format"),
    (NotSharedError, "not_shared"),
    (SinkOptionError, "option"),
)
"""The errors that refuse a batch before anything of it is written, and the ``reason`` each is counted under
(the first class that matches, so subclasses come first)."""


@dataclass(frozen=True)
class Timing:
    """How long a step took, over a run: a histogram of its durations."""

    count: int
    """How many times the step ran."""
    total_seconds: float
    """Their durations added up."""
    buckets: tuple[int, ...]
    """How many took at most each bound of :data:`BUCKETS` (cumulative, one per bound; ``count`` is the
    ``+Inf`` bucket)."""


@dataclass(frozen=True)
class SinkMetrics:
    """A snapshot of one sink's figures in this run (``sink.metrics()``), for a progress display or an exporter.

    Counters (``*_committed``, ``rows_appended``, the requests, retries, refusals, fencings, query restarts, the
    timings' counts) start at 0 when the sink starts and never go back; gauges (``*_held``, ``pending_files``,
    ``writer_term``) say the state now, read from the recovered state at start and kept up to date by each step.
    """

    sink: str
    """The sink's id (the ``sink`` label of every Prometheus metric)."""
    writer_term: int
    """The writer term this run took at start (newer than every earlier run's, which it fences)."""
    rows_appended: int
    """Rows this run appended to the log store (a replayed batch appends nothing)."""
    batches: int
    """Micro-batches this run appended (replays not counted)."""
    replayed: int
    """Micro-batches Spark ran again after a crash whose rows the log store already held."""
    last_epoch: int
    """The last epoch sealed (also by earlier runs; -1 when none)."""
    rows_committed: int
    """Rows of the files this run committed, recovery's commits at start included (see the module docstring)."""
    files_committed: int
    """Files this run committed, recovery's commits at start included."""
    bytes_committed: int
    """Bytes of the files this run committed (all of a file's objects), as written."""
    rows_held: int
    """Rows the log store holds that no committed file holds yet (sealed, above the truncate points)."""
    log_bytes_held: int
    """The log store's bytes of those rows."""
    epochs_held: int
    """Epochs of which some rows are held."""
    oldest_held_epoch_age_seconds: float
    """Seconds since the oldest held epoch was sealed, at the snapshot: how long the oldest row appended but not
    yet visible in the output has waited (0 when nothing is held)."""
    pending_files: int
    """Files pre-committed and not yet committed: during a roll's write, or left by a roll that failed (recovery
    at the next start resolves them)."""
    append: Timing
    """The append of a batch: its Spark job (every task writes one segment) and the seal."""
    roll: Timing
    """A roll (at each batch, flush and idle tick): plan, pre-commit, write, commit, clean-up; one that finds
    nothing to write is short but counted."""
    table_commit: Timing
    """The commit of a roll's files: the table's commit (Delta, Iceberg) and the ledger's commit transaction
    that advances the truncate points (the only part for a directory)."""
    storage_requests: Mapping[tuple[str, str], int]
    """``(store, kind) -> requests`` to object stores by this run, its Spark tasks included: store ``log``,
    ``home`` or ``output`` (the file writes' uploads); kind ``put``, ``get``, ``head``, ``list`` or ``delete``
    (:mod:`logstore.requestcounts`). A local directory makes none. In the driver process the count is the
    process's: two sinks open in one process count each other's."""
    storage_errors: Mapping[tuple[str, str], int]
    """Of those, the requests that failed after the storage client's own retries."""
    retries: int
    """Retries: botocore's retries of the counted requests (where an answer says them), and Spark's attempts of
    the sink's append and file-writing tasks beyond the first (of tasks that then succeeded)."""
    refusals: Mapping[str, int]
    """``reason -> batches refused`` before anything of them was written (:data:`REFUSALS`)."""
    fenced: int
    """Times a step of this run found a newer run owns the sink (``FencedError``): this run writes nothing more."""
    query_restarts: int
    """Times ``filesink run`` restarted the streaming query that feeds the sink, in this process since the sink
    started: past SPARK-55271, the failure of Spark 4.1's Kafka source after a replayed batch
    (:mod:`filesink.cli.kafka_restart`). A sink fed by a program's own query counts none."""


class _Histogram:
    def __init__(self) -> None:
        self.counts = [0] * len(BUCKETS)
        self.count = 0
        self.total = 0.0

    def observe(self, seconds: float) -> None:
        self.count += 1
        self.total += seconds
        index = bisect.bisect_left(BUCKETS, seconds)
        if index < len(BUCKETS):
            self.counts[index] += 1

    def timing(self) -> Timing:
        cumulative, running = [], 0
        for n in self.counts:
            running += n
            cumulative.append(running)
        return Timing(self.count, self.total, tuple(cumulative))


class MetricsBook:
    """The figures of one open sink, updated by its steps (under a lock of its own: a scrape reads them from
    another thread)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._baseline = requestcounts.snapshot()  # the driver's requests count from this run's start
        self._restarts_baseline = _restarts_now()  # and the query's restarts
        self._tasks: dict[Key, int] = {}
        self.sink = ""
        self.term = 0
        self._rows_appended = self._batches = self._replayed = 0
        self._last_epoch = -1
        self._rows_committed = self._files_committed = self._bytes_committed = 0
        self._held: tuple[int, int, int, float | None] = (0, 0, 0, None)
        self._pending = 0
        self._append, self._roll, self._table_commit = _Histogram(), _Histogram(), _Histogram()
        self._refusals: dict[str, int] = {}
        self._fenced = 0
        self._last_fenced: BaseException | None = None
        self._roll_files: list[tuple[int, int]] = []  # (rows, bytes) of the files the roll under way committed
        self.listener: Callable[[dict[str, Any]], None] | None = None
        """Called with an event's record (:func:`event_record`) after each batch and each roll that committed
        files, in the thread that ran it (``filesink run --log-format json``)."""

    def started(self, sink: str, term: int, last_epoch: int) -> None:
        with self._lock:
            self.sink, self.term, self._last_epoch = sink, term, last_epoch

    def appended(self, epoch: int, rows: int, seconds: float) -> None:
        with self._lock:
            self._rows_appended += rows
            self._batches += 1
            self._last_epoch = epoch
            self._append.observe(seconds)

    def replayed(self) -> None:
        with self._lock:
            self._replayed += 1

    def tasks(self, reported: Iterable[str | None]) -> None:
        """Add what Spark tasks reported in their result rows (:func:`filesink.tasks.taskrows.task_counts`)."""
        with self._lock:
            for text in reported:
                for key, n in requestcounts.decode(text).items():
                    self._tasks[key] = self._tasks.get(key, 0) + n

    def held(self, summary: tuple[int, int, int, float | None]) -> None:
        """What the log store holds now (:meth:`filesink.rolling.backlog.BacklogTracker.summary`)."""
        with self._lock:
            self._held = summary

    def pending(self, files: int) -> None:
        with self._lock:
            self._pending = files

    def committed(self, files: Iterable[tuple[int, int]]) -> None:
        """Files committed by this run, as (rows, bytes)."""
        with self._lock:
            for rows, size in files:
                self._files_committed += 1
                self._rows_committed += rows
                self._bytes_committed += size
                self._roll_files.append((rows, size))

    def rolled(self, seconds: float) -> None:
        with self._lock:
            self._roll.observe(seconds)
            files, self._roll_files = self._roll_files, []
        if files and self.listener is not None:
            detail = {"files": len(files), "rows": sum(r for r, _ in files), "bytes": sum(b for _, b in files)}
            self.listener(event_record("roll", self.snapshot(), seconds, detail))

    def batch_done(self, batch_id: int, replay: bool, seconds: float) -> None:
        """A batch went through the sink (appended and sealed, or a replay), its roll included."""
        if self.listener is not None:
            record = event_record("batch", self.snapshot(), seconds, {"batch_id": batch_id, "replay": replay})
            self.listener(record)

    def table_committed(self, seconds: float) -> None:
        with self._lock:
            self._table_commit.observe(seconds)

    @contextlib.contextmanager
    def watching(self) -> Iterator[None]:
        """Count a refusal (:data:`REFUSALS`) or a fencing raised by the steps inside."""
        try:
            yield
        except FencedError as e:
            self.fenced_at(e)
            raise
        except Exception as e:
            reason = next((name for kind, name in REFUSALS if isinstance(e, kind)), None)
            if reason is not None:
                with self._lock:
                    self._refusals[reason] = self._refusals.get(reason, 0) + 1
            raise

    def fenced_at(self, error: BaseException) -> None:
        """Count a fencing (the idle timer's roll calls this too): once per error, which the timer's next batch or
        flush raises again."""
        if isinstance(error, FencedError):
            with self._lock:
                if error is not self._last_fenced:
                    self._fenced += 1
                    self._last_fenced = error

    def snapshot(self, now: float | None = None) -> SinkMetrics:
        driver = requestcounts.since(self._baseline)
        with self._lock:
            counts = dict(self._tasks)
            rows, size, epochs, oldest = self._held
            age = max(0.0, (time.time() if now is None else now) - oldest) if oldest is not None and rows else 0.0
            for key, n in driver.items():
                counts[key] = counts.get(key, 0) + n
            return SinkMetrics(
                sink=self.sink,
                writer_term=self.term,
                rows_appended=self._rows_appended,
                batches=self._batches,
                replayed=self._replayed,
                last_epoch=self._last_epoch,
                rows_committed=self._rows_committed,
                files_committed=self._files_committed,
                bytes_committed=self._bytes_committed,
                rows_held=rows,
                log_bytes_held=size,
                epochs_held=epochs,
                oldest_held_epoch_age_seconds=age,
                pending_files=self._pending,
                append=self._append.timing(),
                roll=self._roll.timing(),
                table_commit=self._table_commit.timing(),
                storage_requests=_figure(counts, "requests"),
                storage_errors=_figure(counts, "errors"),
                retries=sum(_figure(counts, "retries").values()),
                refusals=dict(self._refusals),
                fenced=self._fenced,
                query_restarts=_restarts_now() - self._restarts_baseline,
            )


# -- the sink's hooks (small functions, so that the sink's steps stay short) ------------------------------


def held_now(book: MetricsBook, backlog: BacklogTracker) -> None:
    """What the log store holds, after a step that changed it: the backlog kept in memory, brought up to date
    (at start, and after a commit moved truncate points)."""
    backlog.refresh()
    book.held(backlog.summary())


def planned(book: MetricsBook, backlog: BacklogTracker) -> None:
    """What the log store holds as a roll's plan found it (the plan brought the backlog up to date: the epochs
    sealed since, a seal's included)."""
    book.held(backlog.summary())


def opened(
    book: MetricsBook, store: LogStore, term: int, recovered: Iterable[tuple[int, int]], backlog: BacklogTracker
) -> None:
    """The figures at start: the term, the files recovery committed (rows, bytes), what the recovered state
    holds."""
    book.started(store.sink_id, term, store.last_sealed_epoch)
    book.committed(recovered)
    held_now(book, backlog)


def committed(
    book: MetricsBook, files: Sequence[PlannedFile], sizes: Mapping[str, int], seconds: float, backlog: BacklogTracker
) -> None:
    """A roll's files committed, after ``seconds`` of table and ledger commit."""
    book.table_committed(seconds)
    book.committed((f.rows, sizes.get(f.name, 0)) for f in files)
    book.pending(0)
    held_now(book, backlog)


def event_record(kind: str, m: SinkMetrics, seconds: float, detail: Mapping[str, Any]) -> dict[str, Any]:
    """One event as a JSON-ready record: ``event`` (``batch`` or ``roll``), the sink, the last sealed epoch, the
    event's ``duration_seconds`` and ``detail``, then the figures of ``m`` under the Prometheus metrics' names
    (without ``filesink_``; the request counts keyed ``store/kind``)."""
    return {
        "event": kind,
        "sink": m.sink,
        "epoch": m.last_epoch,
        "duration_seconds": round(seconds, 6),
        **detail,
        "rows_appended_total": m.rows_appended,
        "rows_committed_total": m.rows_committed,
        "files_committed_total": m.files_committed,
        "bytes_committed_total": m.bytes_committed,
        "rows_held": m.rows_held,
        "log_bytes_held": m.log_bytes_held,
        "epochs_held": m.epochs_held,
        "oldest_held_epoch_age_seconds": round(m.oldest_held_epoch_age_seconds, 3),
        "pending_files": m.pending_files,
        "writer_term": m.writer_term,
        "storage_requests_total": {f"{store}/{kind}": n for (store, kind), n in sorted(m.storage_requests.items())},
        "storage_errors_total": {f"{store}/{kind}": n for (store, kind), n in sorted(m.storage_errors.items())},
        "retries_total": m.retries,
        "refusals_total": dict(sorted(m.refusals.items())),
        "fenced_total": m.fenced,
        "query_restarts_total": m.query_restarts,
    }


def _figure(counts: Mapping[Key, int], figure: str) -> dict[tuple[str, str], int]:
    return {(store, kind): n for (f, store, kind), n in counts.items() if f == figure}
