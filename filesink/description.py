"""A sink as a description: its options, which open it in whatever process runs its batches.

In classic PySpark the ``foreachBatch`` function runs in the driver's Python process, the one that created the
sink, and the sink opens at once (lock, recovery, timer), so errors show when it is created. Under Spark Connect
the client pickles the ``foreachBatch`` function and the server runs it in a Python process of its own (one per
query start, see ``docs/configuration.md``). There the sink is its :class:`SinkDescription`: created on the
client it checks its options only; unpickled on the server it opens at its first batch, through
:func:`open_described`, which keeps one open sink per state directory and process, so that the lock, recovery
and the idle-rollover timer happen once per open sink even if the description is unpickled more than once.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from logstore import VNODE_COLUMN
from logstore.storage import is_local

from .errors import SinkLockedError, SinkOptionError
from .rollover import Rollover

if TYPE_CHECKING:
    from .sink import ExactlyOnceParquetSink

LOCK_WAIT_SECONDS = 60.0
"""How long a sink opening from its description waits for the state directory's lock. When a Connect query
stops, the server ends its foreachBatch process (SIGTERM) without waiting for it; a restarted query (or a flush)
may start before the OS has released the old process's lock."""

FLUSH_CHECKPOINTS = "connect-flush"
"""Directory under ``state_dir`` (on the server) for the checkpoints of the one-batch queries ``flush()`` runs
under Spark Connect; each flush removes those of earlier flushes."""


def _columns(value: Sequence[str] | None, name: str) -> tuple[str, ...] | None:
    if value is None:
        return None
    if isinstance(value, str) or not all(isinstance(c, str) and c for c in value):
        raise SinkOptionError(f"{name} must be a list of column names, not {value!r}")
    if len(set(value)) != len(value):
        raise SinkOptionError(f"{name} lists a column twice: {list(value)!r}")
    if VNODE_COLUMN in value:
        raise SinkOptionError(f"{name}: the column name {VNODE_COLUMN!r} is reserved by the sink")
    return tuple(value)


def _absolute(value: str, what: str, *, remote: bool) -> Path:
    path = Path(value.removeprefix("file://"))
    if remote and not path.is_absolute():
        raise SinkOptionError(
            f"{what} {value!r} is relative, but this sink is created under a Spark Connect client and opens on the "
            "server, which would resolve it against its own working directory. Give the absolute path the server "
            "uses."
        )
    return path.expanduser().absolute()


@dataclass(frozen=True)
class SinkDescription:
    """What a sink is, without any open state: what a pickled sink carries. Made by :meth:`checked`."""

    path: str
    state_dir: str
    log_store: str | None
    key_columns: tuple[str, ...] | None
    vnodes: int
    parallelism: int | None
    partition_by: tuple[str, ...]
    rollover: Rollover
    storage_options: dict[str, Any] = field(hash=False)
    row_group_rows: int
    compression: str
    accept_state_loss: bool
    checkpoint_location: str | None = None
    single_driver: bool = False
    """Go on where the log store's location has no conditional create (:mod:`logstore.conditional`): the
    operator promises that at most one driver or recover command runs at a time."""
    accept_duplicates: bool = False
    """With ``accept_state_loss``: batch 0 (a new checkpoint) may write to an output that holds rows already."""

    @classmethod
    def checked(
        cls,
        path: str,
        state_dir: str | os.PathLike[str],
        log_store: str | None,
        key_columns: Sequence[str] | None,
        vnodes: int,
        parallelism: int | None,
        partition_by: Sequence[str] | None,
        rollover: Rollover | None,
        storage_options: Mapping[str, Any] | None,
        row_group_rows: int,
        compression: str,
        accept_state_loss: bool,
        checkpoint_location: str | None = None,
        *,
        remote: bool,
        single_driver: bool = False,
        accept_duplicates: bool = False,
    ) -> SinkDescription:
        """Check the options (nothing here touches a file system); ``remote``: made on a Spark Connect client,
        where relative local paths are refused (they would mean the server's working directory)."""
        if not isinstance(path, str) or not path:
            raise SinkOptionError(
                f"path must be a local directory or an fsspec URL such as s3://bucket/table, not {path!r}"
            )
        if not isinstance(vnodes, int) or isinstance(vnodes, bool) or not 1 <= vnodes <= 2**15:
            raise SinkOptionError(f"vnodes must be an integer from 1 to 32768, not {vnodes!r}")
        if parallelism is not None and (
            not isinstance(parallelism, int) or isinstance(parallelism, bool) or parallelism < 1
        ):
            raise SinkOptionError(
                f"parallelism must be a positive integer or None (Spark's default), not {parallelism!r}"
            )
        if rollover is not None and not isinstance(rollover, Rollover):
            raise SinkOptionError(f"rollover must be a filesink.Rollover, not {type(rollover).__name__}")
        if not isinstance(row_group_rows, int) or row_group_rows < 1:
            raise SinkOptionError(f"row_group_rows must be a positive integer, not {row_group_rows!r}")
        if accept_duplicates and not accept_state_loss:
            raise SinkOptionError(
                "accept_duplicates=True (filesink run --accept-duplicates) is for a sink that replaces one whose state "
                "was lost: it lets batch 0 of a new checkpoint write to an output that holds rows already. Give it "
                "with accept_state_loss=True (--accept-state-loss), or leave it out. Nothing was created."
            )
        keys = _columns(key_columns, "key_columns")
        partitions = _columns(partition_by, "partition_by") or ()
        state = _absolute(os.fspath(state_dir), "state_dir", remote=remote)
        if is_local(path):
            local = _absolute(path, "the output path", remote=remote)
            if state == local or local in state.parents or state in local.parents:
                raise SinkOptionError(f"state_dir {state} and the output path {local} must not contain each other")
            path = str(local)
        if log_store and is_local(log_store):
            _absolute(log_store, "log_store", remote=remote)
        if checkpoint_location is None and remote:
            raise SinkOptionError(
                f"the sink for {path} is created under a Spark Connect client, where Spark does not tell foreachBatch "
                "which streaming query a batch belongs to: give checkpoint_location= the query's checkpointLocation "
                "(the same path as writeStream.option('checkpointLocation', ...)). Without it, another query's batch "
                "0 would look like a replay of this sink's batch 0 and be skipped. Nothing was created."
            )
        if checkpoint_location is not None:
            if not isinstance(checkpoint_location, str) or not checkpoint_location:
                raise SinkOptionError(
                    f"checkpoint_location must be the query's checkpointLocation (a path or URL), not "
                    f"{checkpoint_location!r}"
                )
            if is_local(checkpoint_location):
                checkpoint_location = str(_absolute(checkpoint_location, "checkpoint_location", remote=remote))
        return cls(
            path=path.rstrip("/"),
            state_dir=str(state),
            log_store=log_store,
            key_columns=keys,
            vnodes=vnodes,
            parallelism=parallelism,
            partition_by=partitions,
            rollover=rollover or Rollover(),
            storage_options=dict(storage_options or {}),
            row_group_rows=row_group_rows,
            compression=compression,
            accept_state_loss=bool(accept_state_loss),
            checkpoint_location=checkpoint_location,
            single_driver=bool(single_driver),
            accept_duplicates=bool(accept_duplicates),
        )


# -- where the sink runs ---------------------------------------------------------------------------------


def connect_client() -> bool:
    """Whether this process is a Spark Connect client (a Connect session exists, or ``SPARK_REMOTE`` says one
    will): a sink created here is a description, opened on the server. pyspark sets
    ``SPARK_CONNECT_MODE_ENABLED`` when it creates a Connect session (also in the server's foreachBatch
    process, where sinks arrive pickled and never pass through this check)."""
    return "SPARK_CONNECT_MODE_ENABLED" in os.environ or bool(os.environ.get("SPARK_REMOTE"))


_FOREACH_BATCH_MODULES = ("pyspark.sql.connect.streaming.readwriter",)


def pickled_for_foreach_batch() -> bool:
    """Whether the pickling going on is a Spark Connect client's ``foreachBatch`` shipping its function to the
    server (``DataStreamWriter.foreachBatch`` of pyspark's Connect client is on the stack). Any other pickling
    of a sink is for a Spark task (a UDF, ``mapInArrow`` or ``foreach`` closure) and is refused."""
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "foreachBatch" and frame.f_globals.get("__name__") in _FOREACH_BATCH_MODULES:
            return True
        frame = frame.f_back  # type: ignore[assignment]
    return False


# -- open sinks of this process --------------------------------------------------------------------------

_open: dict[str, ExactlyOnceParquetSink] = {}
_open_lock = threading.Lock()


def open_described(description: SinkDescription) -> ExactlyOnceParquetSink:
    """The sink ``description`` opened in this process: the one opened before for its state directory, or a new
    one (waiting up to :data:`LOCK_WAIT_SECONDS` for the state directory's lock). Opening takes the lock, runs
    recovery and (at its first batch) starts the idle timer, so it happens once per state directory and process.
    """
    from .sink import ExactlyOnceParquetSink

    with _open_lock:
        sink = _open.get(description.state_dir)
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
                sink = ExactlyOnceParquetSink.open_description(description)
                break
            except SinkLockedError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
        _open[description.state_dir] = sink
        return sink


def opened_here(description: SinkDescription) -> ExactlyOnceParquetSink | None:
    """The sink of ``description`` if it is open in this process."""
    with _open_lock:
        sink = _open.get(description.state_dir)
    return sink if sink is not None and not sink.closed and sink.description == description else None


def forget(sink: ExactlyOnceParquetSink) -> None:
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

    def __call__(self, df: Any, batch_id: int) -> None:
        try:
            sink = open_described(self.description)
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
    import shutil

    for old in checkpoint.parent.iterdir() if checkpoint.parent.is_dir() else []:
        if old != checkpoint:
            shutil.rmtree(old, ignore_errors=True)


def flush_through_connect(description: SinkDescription, spark: Any) -> None:
    """Run :class:`FlushOnServer` as a one-batch query on the Connect server of ``spark``, and wait for it."""
    name = uuid.uuid4().hex
    checkpoint = str(Path(description.state_dir) / FLUSH_CHECKPOINTS / name)
    done_view = f"filesink_flush_{name}"
    query = (
        spark.readStream.format("rate-micro-batch")
        .option("rowsPerBatch", 1)
        .load()
        .writeStream.foreachBatch(FlushOnServer(description, checkpoint, done_view))
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()  # raises the server's error (StreamingQueryException) if the flush failed
    if not spark.catalog.dropGlobalTempView(done_view):
        from .errors import SinkFailedError

        raise SinkFailedError(
            f"flush() of the sink for {description.path} ran its one-batch query on the Spark Connect server, but "
            "the query ran no batch, so nothing was written. Nothing is lost: the rows stay in the log store. Call "
            "flush() again, or restart the query (files roll by the sink's rules)."
        )
