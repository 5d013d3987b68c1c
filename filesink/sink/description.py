"""A sink as a description: its options, which open it in whatever process runs its batches.

In classic PySpark the ``foreachBatch`` function runs in the driver's Python process, the one that created the
sink, and the sink opens at once (lock, recovery, timer), so errors show when it is created. Under Spark Connect
the client pickles the ``foreachBatch`` function and the server runs it in a Python process of its own (one per
query start, see ``docs/configuration.md``). There the sink is its :class:`SinkDescription`: created on the
client it checks its options only; unpickled on the server it opens at its first batch, through
:func:`filesink.sink.connect.open_described`, which keeps one open sink per state directory and process, so that the
lock, recovery and the idle-rollover timer happen once per open sink even if the description is unpickled more than
once. The sink itself is in :mod:`filesink.sink.face`, the open sinks of a process and ``flush()`` through Connect in
:mod:`filesink.sink.connect`: this module imports nothing of either.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from logstore import VNODE_COLUMN
from logstore.storage import is_local

from ..destination import TableOptions, table_options
from ..errors import SinkOptionError
from ..rolling.rollover import Rollover


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
    fill_missing_columns: bool = False
    """A batch without some of the sink's columns gets them as nulls of their types (otherwise it is refused)."""
    table: TableOptions = field(default_factory=TableOptions)
    """What the output is: a directory (the default), a Delta table or an Iceberg table
    (:mod:`filesink.destination`)."""

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
        table_format: str = "directory",
        catalog: Mapping[str, Any] | None = None,
        table: str | None = None,
        fill_missing_columns: bool = False,
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
        table_opts = table_options(table_format, catalog, table, path=path)
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
            fill_missing_columns=bool(fill_missing_columns),
            table=table_opts,
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
