"""``filesink run --format kafka`` restarts its query past SPARK-55271 (``filesink/cli/kafka_restart.py``), watched
by ``runquery.watch``: only that failure, at most ``MAX_RESTARTS`` times, with a note each, counted in the sink's
figures, never after a stop was asked for. Queries and the writer are stand-ins; the end-to-end run against a
broker and Spark is ``tests/e2e/test_kafka.py::test_kafka_exactly_once_through_a_kill``."""

from __future__ import annotations

import threading
from typing import Any

from pyspark.errors import StreamingQueryException

from filesink.cli.kafka_restart import MAX_RESTARTS, Restarts, restarts_for, restarts_line
from filesink.cli.runquery import Batches, watch
from filesink.metrics.figures import MetricsBook

BUG = (
    "[STREAM_FAILED] Query [id = 1, runId = 2] terminated with exception: Cannot invoke "
    '"scala.collection.IterableOps.map(scala.Function1)" because the return value of "scala.Option.get()" is null '
    "SQLSTATE: XXKST"
)
OTHER = "[STREAM_FAILED] Query [id = 1, runId = 2] terminated with exception: Failed to construct kafka consumer"


class FakeQuery:
    """A query that fails with ``error`` at its first wait, or, without one, runs ``waits`` waits and ends."""

    def __init__(self, error: str | None = None, waits: int = 2, on_wait: Any = None) -> None:
        self.error, self.waits, self.on_wait = error, waits, on_wait
        self.stopped = False

    def awaitTermination(self, timeout: float) -> bool:
        if self.on_wait is not None:
            self.on_wait()
        if self.error is not None:
            raise StreamingQueryException(message=self.error)
        self.waits -= 1
        return self.waits <= 0 or self.stopped

    def stop(self) -> None:
        self.stopped = True


class FakeWriter:
    def __init__(self, *queries: FakeQuery) -> None:
        self.queries = list(queries)
        self.started: list[FakeQuery] = []

    def start(self) -> FakeQuery:
        query = self.queries.pop(0)
        self.started.append(query)
        return query


class Shown:
    def __init__(self) -> None:
        self.updates = 0

    def __enter__(self) -> Shown:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def update(self) -> None:
        self.updates += 1


def _batches() -> Batches:
    return Batches(sink=None)  # type: ignore[arg-type]  # the sink is never called here


def test_a_replayed_batch_failed_by_spark_is_restarted_once_with_a_note_and_counted() -> None:
    book = MetricsBook()
    lines: list[str] = []
    writer = FakeWriter(FakeQuery())
    started: list[Any] = []
    restart = Restarts(writer, _batches(), lines.append, on_start=started.append)
    failure = watch(FakeQuery(BUG), restart.batches, threading.Event(), Shown(), restart)
    assert failure is None, "the restarted query drained"
    assert started == writer.started and len(started) == 1
    assert lines == [
        "note: Spark 4.1's Kafka source failed the progress report of the batch it replayed (SPARK-55271; nothing "
        "lost or doubled): restarting the query (1 of 3)"
    ]
    assert book.snapshot().query_restarts == 1
    assert MetricsBook().snapshot().query_restarts == 0, "a book counts from its sink's start"


def test_past_the_bound_the_failure_is_returned_after_a_last_note() -> None:
    lines: list[str] = []
    writer = FakeWriter(*(FakeQuery(BUG) for _ in range(MAX_RESTARTS)))
    restart = Restarts(writer, _batches(), lines.append)
    failure = watch(FakeQuery(BUG), restart.batches, threading.Event(), Shown(), restart)
    assert isinstance(failure, StreamingQueryException) and "scala.Option.get()" in str(failure)
    assert len(writer.started) == MAX_RESTARTS == 3
    assert [line.rsplit("(", 1)[-1] for line in lines[:-1]] == ["1 of 3)", "2 of 3)", "3 of 3)"]
    assert lines[-1].startswith("note: Spark 4.1's Kafka source failed the progress report of a replayed batch")
    assert "after 3 restarts of the query in this run: not restarting it again" in lines[-1]


def test_other_failures_and_a_failed_batch_are_not_restarted() -> None:
    lines: list[str] = []
    writer = FakeWriter(FakeQuery())
    restart = Restarts(writer, _batches(), lines.append)
    failure = watch(FakeQuery(OTHER), restart.batches, threading.Event(), Shown(), restart)
    assert isinstance(failure, StreamingQueryException)
    batches = _batches()
    batches.error = RuntimeError("the sink's batch failed")
    assert Restarts(writer, batches, lines.append)(StreamingQueryException(message=BUG)) is None
    assert not writer.started and not lines


def test_no_restart_once_a_stop_is_asked_for() -> None:
    """A failure after a stop was asked for ends the watch (the stop's own); a stop asked for while the query
    starts again stops the new query."""
    stop = threading.Event()
    writer = FakeWriter(FakeQuery(waits=1000))
    restart = Restarts(writer, _batches(), [].append)
    assert watch(FakeQuery(BUG, on_wait=stop.set), restart.batches, stop, Shown(), restart) is None
    assert not writer.started

    stop = threading.Event()
    again = FakeQuery(waits=1000)
    writer = FakeWriter(again)
    restart = Restarts(writer, _batches(), [].append, on_start=lambda query: stop.set())
    assert watch(FakeQuery(BUG), restart.batches, stop, Shown(), restart) is None
    assert writer.started == [again] and again.stopped and restart.batches.stopping


def test_a_new_start_spark_refuses_leaves_the_failure_to_report() -> None:
    class Refusing:
        def start(self) -> Any:
            raise RuntimeError("IllegalStateException: the session was stopped")

    lines: list[str] = []
    restart = Restarts(Refusing(), _batches(), lines.append)
    failure = watch(FakeQuery(BUG), restart.batches, threading.Event(), Shown(), restart)
    assert isinstance(failure, StreamingQueryException)
    assert lines[-1] == "note: the query could not be started again: IllegalStateException: the session was stopped"


def test_only_a_kafka_query_on_local_or_classic_spark_is_restarted_and_the_summary_says_so() -> None:
    class Gaps:
        query: Any = None

    gaps = Gaps()
    assert restarts_for(None, FakeWriter(), _batches(), gaps, print) is None, "a landing directory"
    assert restarts_for(object(), FakeWriter(), None, gaps, print) is None, "Spark Connect"
    new = FakeQuery()
    restart = restarts_for(object(), FakeWriter(new), _batches(), gaps, [].append)
    assert restart is not None and restart(StreamingQueryException(message=BUG)) is new and gaps.query is new
    assert restarts_line(0) == ""
    assert restarts_line(1) == "1 restart of the query past SPARK-55271; "
    assert restarts_line(2) == "2 restarts of the query past SPARK-55271; "
