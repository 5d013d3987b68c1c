"""The sinks open in this process, and ``flush()`` under Spark Connect.

A sink unpickled from its description (:mod:`filesink.sink.description`) on a Spark Connect server opens at its first
batch through :func:`open_described`, which keeps one open sink per state directory and process, so that the lock,
recovery and the idle-rollover timer happen once per open sink. Its ``flush()`` from a Connect client runs a
one-batch query on the server (:func:`flush_through_connect`).

This module knows the sink only as what it opens and closes (:class:`OpenSink`): the sink's face
(:mod:`filesink.sink.face`) passes the way to open one (``ExactlyOnceParquetSink.open_description``).
"""

from __future__ import annotations

import shutil
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

from ..errors import SinkFailedError, SinkLockedError, SinkOptionError
from .description import SinkDescription

LOCK_WAIT_SECONDS = 60.0
"""How long a sink opening from its description waits for the state directory's lock. When a Connect query
stops, the server ends its foreachBatch process (SIGTERM) without waiting for it; a restarted query (or a flush)
may start before the OS has released the old process's lock."""

FLUSH_CHECKPOINTS = "connect-flush"
"""Directory under ``state_dir`` (on the server) for the checkpoints of the one-batch queries ``flush()`` runs
under Spark Connect; each flush removes those of earlier flushes."""


class OpenSink(Protocol):
    """What this module does with a sink: the face's :class:`filesink.sink.face.ExactlyOnceParquetSink`."""

    path: str
    state_dir: Path

    @property
    def closed(self) -> bool: ...

    @property
    def description(self) -> SinkDescription: ...

    def use_spark(self, spark: Any) -> None: ...

    def flush(self) -> None: ...

    def close(self) -> None: ...


S = TypeVar("S", bound=OpenSink)

_open: dict[str, Any] = {}
_open_lock = threading.Lock()


def open_described(description: SinkDescription, opener: Callable[[SinkDescription], S]) -> S:
    """The sink ``description`` opened in this process: the one opened before for its state directory, or a new
    one (``opener``, waiting up to :data:`LOCK_WAIT_SECONDS` for the state directory's lock). Opening takes the
    lock, runs recovery and (at its first batch) starts the idle timer, so it happens once per state directory and
    process.
    """
    with _open_lock:
        sink: S | None = _open.get(description.state_dir)
        if sink is not None and not sink.closed:
            if sink.description != description:
                raise SinkOptionError(
                    f"a sink with other options is open on state_dir {description.state_dir} in this process "
                    f"(for {sink.path}). One state directory holds one sink: give this one its own state_dir."
                )
            return sink
        deadline = time.monotonic() + LOCK_WAIT_SECONDS
        while True:
            try:
                sink = opener(description)
                break
            except SinkLockedError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
        _open[description.state_dir] = sink
        return sink


def opened_here(description: SinkDescription) -> Any:
    """The sink of ``description`` if it is open in this process (else None)."""
    with _open_lock:
        sink = _open.get(description.state_dir)
    return sink if sink is not None and not sink.closed and sink.description == description else None


def forget(sink: OpenSink) -> None:
    """Called by a sink's ``close()``: the next batch in this process opens the description again."""
    with _open_lock:
        if _open.get(str(sink.state_dir)) is sink:
            del _open[str(sink.state_dir)]


# -- flush under Spark Connect ---------------------------------------------------------------------------


@dataclass(frozen=True)
class FlushOnServer:
    """The ``foreachBatch`` function of the one-batch query that ``flush()`` runs under Spark Connect: on the
    server it opens the sink (recovery included), writes everything the log store holds, and closes it."""

    description: SinkDescription
    checkpoint: str
    done_view: str
    """A global temporary view made on the server once the flush is done: the client's proof that it ran (global
    temporary views are shared by the server's sessions; the batch runs in a session of its own)."""
    opener: Callable[[SinkDescription], OpenSink]
    """How the sink opens on the server (``ExactlyOnceParquetSink.open_description``, pickled by its name)."""

    def __call__(self, df: Any, batch_id: int) -> None:
        try:
            sink = open_described(self.description, self.opener)
        except SinkLockedError as e:
            raise SinkLockedError(
                f"flush() of the sink for {self.description.path} could not open it on the server: {e} Under Spark "
                "Connect the sink lives in the server process of its query; flush() is for a stopped query (after "
                "an available-now run, or query.stop()). While the query runs, files roll by the sink's rules, "
                "max_age_seconds among them."
            ) from None
        try:
            _remove_other_checkpoints(Path(self.checkpoint))  # under the lock: no other flush runs on this sink
            sink.use_spark(df.sparkSession)
            sink.flush()
        finally:
            sink.close()
        df.sparkSession.range(1).createOrReplaceGlobalTempView(self.done_view)


def _remove_other_checkpoints(checkpoint: Path) -> None:
    for old in checkpoint.parent.iterdir() if checkpoint.parent.is_dir() else []:
        if old != checkpoint:
            shutil.rmtree(old, ignore_errors=True)


def flush_through_connect(
    description: SinkDescription, spark: Any, opener: Callable[[SinkDescription], OpenSink]
) -> None:
    """Run :class:`FlushOnServer` as a one-batch query on the Connect server of ``spark``, and wait for it."""
    name = uuid.uuid4().hex
    checkpoint = str(Path(description.state_dir) / FLUSH_CHECKPOINTS / name)
    done_view = f"filesink_flush_{name}"
    query = (
        spark.readStream.format("rate-micro-batch")
        .option("rowsPerBatch", 1)
        .load()
        .writeStream.foreachBatch(FlushOnServer(description, checkpoint, done_view, opener))
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()  # raises the server's error (StreamingQueryException) if the flush failed
    if not spark.catalog.dropGlobalTempView(done_view):
        raise SinkFailedError(
            f"flush() of the sink for {description.path} ran its one-batch query on the Spark Connect server, but "
            "the query ran no batch, so nothing was written. Nothing is lost: the rows stay in the log store. Call "
            "flush() again, or restart the query (files roll by the sink's rules)."
        )
