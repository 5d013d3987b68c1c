"""``filesink run --format kafka``: the query restarted past SPARK-55271, in the watch stage of :mod:`filesink.cli.run`.

After a run is killed in the middle of a micro-batch, the next run's query runs that batch again from Spark's offset
log, and Spark 4.1's Kafka source then fails the query in its progress report, after the batch was written and
committed (SPARK-55271, :data:`filesink.cli.kafka_source.REPLAY_PROGRESS_BUG`). Nothing is lost or doubled, and a
new start of the same query goes on with the next batch: so the run starts its query again by itself, in the same
Spark session, with the same sink, stream, ``foreachBatch`` function and checkpoint (the writer's ``start()`` once
more), at most :data:`MAX_RESTARTS` times in one run, each time with a note, counted in the sink's figures
(``query_restarts``: :func:`filesink.metrics.figures.query_restarted`). Past the bound, or for any other failure, the
failure is reported as before (exit 1). A stop asked for (Ctrl-C, SIGTERM) is never followed by a restart
(:func:`filesink.cli.runquery.watch`). See ``docs/kafka.md``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..metrics import figures
from .kafka_source import replay_progress_bug
from .runquery import Batches, spark_error_summary

MAX_RESTARTS = 3
"""Restarts of the query in one run. The failure comes once per restart that replays a batch (a new start of the
query plans its batches afresh), so one restart is expected; a query that fails this way more often than that fails
for another reason, which a person should look at."""

NOTE = (
    "note: Spark 4.1's Kafka source failed the progress report of the batch it replayed (SPARK-55271; nothing lost "
    "or doubled): restarting the query ({done} of {limit})"
)
GIVING_UP = (
    "note: Spark 4.1's Kafka source failed the progress report of a replayed batch (SPARK-55271) again, after "
    "{limit} restarts of the query in this run: not restarting it again"
)


class Restarts:
    """The ``restart`` of :func:`filesink.cli.runquery.watch` for a Kafka query on local or classic Spark: given the
    query's error, a new start of the query if the error is SPARK-55271 and the bound is not reached, else None.
    ``on_start`` is given each new query (Kafka's gap watch reads its progress)."""

    def __init__(
        self,
        writer: Any,
        batches: Batches,
        out: Callable[[str], None],
        on_start: Callable[[Any], None] = lambda query: None,
        limit: int = MAX_RESTARTS,
    ) -> None:
        self.writer = writer
        self.batches = batches
        self.out = out
        self.on_start = on_start
        self.limit = limit
        self.done = 0

    def __call__(self, failure: BaseException) -> Any | None:
        if not is_replay_progress_bug(failure, self.batches):
            return None
        if self.done >= self.limit:
            self.out(GIVING_UP.format(limit=self.limit))
            return None
        self.done += 1
        figures.query_restarted()
        self.out(NOTE.format(done=self.done, limit=self.limit))
        try:
            query = self.writer.start()
        except Exception as e:  # Spark refused the new start: the failure is reported, as without a restart
            self.out(f"note: the query could not be started again: {spark_error_summary(e)[0]}")
            return None
        self.on_start(query)
        return query


def is_replay_progress_bug(failure: BaseException, batches: Batches) -> bool:
    """Whether the query failed of SPARK-55271 alone: no batch of the sink failed (its error would be the cause),
    and Spark's error has the bug's words, read as :func:`filesink.cli.runquery.report_failure` reads them."""
    return batches.error is None and replay_progress_bug(spark_error_summary(failure))


def restarts_for(
    kafka: Any, writer: Any, batches: Batches | None, gaps: Any, out: Callable[[str], None]
) -> Restarts | None:
    """The :class:`Restarts` of a run reading Kafka (``kafka``: its options) on local or classic Spark (``batches``),
    else None: a landing directory's query, and a query under Spark Connect, are never restarted."""
    if kafka is None or batches is None:
        return None

    def on_start(query: Any) -> None:
        if gaps is not None:
            gaps.query = query

    return Restarts(writer, batches, out, on_start)


def restarts_line(restarts: int) -> str:
    """The part of the run's summary that says the query's restarts (``sink.metrics().query_restarts``), ending in
    ``"; "``; none: nothing."""
    if not restarts:
        return ""
    return f"{restarts} restart{'s' if restarts > 1 else ''} of the query past SPARK-55271; "
