"""What the sink's start found, as ``filesink run`` says it: once, in full (:func:`report_recovery`), with the
sink's and the log store's own log records of it dropped while the sink opens (:func:`start_notices_said_here`)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from logstore import store as logstore_store
from logstore.store import REBUILD_NOTICE

from ..committer.damage import given_up_line
from ..sink.face import START_NOTICE, ExactlyOnceParquetSink
from ..words import plural


@contextmanager
def start_notices_said_here() -> Iterator[None]:
    """Drop the sink's and the log store's log records of what its start found (:data:`START_NOTICE`,
    :data:`logstore.store.REBUILD_NOTICE`): :func:`report_recovery` says it once, in full."""
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


def report_recovery(sink: ExactlyOnceParquetSink, out: Callable[[str], None]) -> None:
    """Say what the sink's start found: a state rebuilt from its durable home, rows given up, the files the last
    run left pending that recovery resolved."""
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
