"""What every role of the sink reads and writes: the state a sink object holds, in one place.

The sink (:class:`filesink.sink.face.ExactlyOnceParquetSink`, the face users construct) is made of its roles, each in a
module named for it, in the manner of a Flink Sink V2's writer, committer and face: its start
(:mod:`filesink.sink.start`: claims, refusals, the owner lease, recovery), a batch's admission on the driver
(:mod:`filesink.sink.batch`), the append (:mod:`filesink.sink.append`), the roll and the idle timer
(:mod:`filesink.sink.roll`), and the sinks open in a process under Spark Connect (:mod:`filesink.sink.connect`). Each
role is a class of methods over the state declared here (:class:`SinkCore`); the face inherits them all, so a sink is
one object, pickled as its description as before.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from logstore import STATE_DB_NAME, LogStore

from ..committer.ledger import Ledger, PlannedFile
from ..destination import Destination
from ..errors import NotSharedError
from ..lock import LOCK_FILE, StateLock
from ..metrics.figures import MetricsBook
from ..metrics.prometheus import MetricsServer
from ..output import OutputLocation
from ..output.location import STATE_STAGING
from ..rolling.backlog import BacklogTracker
from ..rolling.planner import file_task
from ..rolling.rollover import Rollover
from ..rolling.sizing import Sample
from ..tasks.shared import SharedDirs, on_cluster, probe
from ..tasks.shared import refusal_message as unshared_message
from ..tasks.writer import FileTask
from .description import SinkDescription
from .schema_versions import SchemaTaken

log = logging.getLogger("filesink.sink")
"""Every role logs as the sink: one logger's name, whichever module writes the record (``filesink run`` filters the
start's notices by it)."""

START_NOTICE = "filesink_start_notice"
"""Set on the log records that say, once at start, what the open found (a rebuilt state, rows given up):
``filesink run`` prints the same in its own words and filters these out."""


@dataclass
class SinkStats:
    """What a sink object did since it was created (for progress displays; not persisted)."""

    batches: int = 0
    """Micro-batches appended to the log store (replays not counted)."""
    rows_in: int = 0
    """Rows appended to the log store."""
    last_epoch: int = -1
    """The last epoch sealed (also from earlier runs)."""
    replayed: int = 0
    """Micro-batches Spark ran again after a crash whose rows the log store already held (not appended again)."""
    file_sizes: list[int] = field(default_factory=list)
    """Sizes in bytes of the files committed, in commit order (a file's size is that of all its objects)."""
    objects: int = 0
    """Parquet objects of the files committed: a file of a partitioned output is one object per partition
    directory it has rows for, else one object."""
    schema_changes: list[SchemaTaken] = field(default_factory=list)
    """The new schema versions recorded, in order: the batch that brought each and what it changed."""

    @property
    def files_committed(self) -> int:
        return len(self.file_sizes)


STATE_NAMES = frozenset(
    [STATE_DB_NAME, LOCK_FILE, STATE_STAGING, *(f"{STATE_DB_NAME}-{x}" for x in ("wal", "shm", "journal"))]
)
"""What a sink's start creates in its state directory, but its log store (``log/`` by default)."""


def listdir(directory: Path) -> list[str]:
    """The names in ``directory`` (none if it cannot be listed)."""
    try:
        return os.listdir(directory)
    except OSError:
        return []


class SinkCore:
    """The state a sink object holds, set by its start (:mod:`filesink.sink.start`) and read by its roles; and the few
    steps more than one role takes."""

    # What the description says, set even where the sink is not open (a Spark Connect client): _describe.
    _description: SinkDescription
    _is_open: bool
    _closed: bool
    path: str
    state_dir: Path
    key_columns: list[str] | None
    partition_by: list[str]
    rollover: Rollover
    parallelism: int | None
    vnodes: int
    stats: SinkStats
    _checkpoint_id: str | None
    _spark: Any
    # Set by the start (filesink.sink.start), in the process the sink opens in.
    _metrics: MetricsBook
    _metrics_server: MetricsServer | None
    _row_group_rows: int
    _sample: Sample | None
    _compression: str
    _accept_state_loss: bool
    _accept_duplicates: bool
    _take_over_from: str | None
    _created_claim: bool
    _lock: threading.RLock
    _state_lock: StateLock
    _output: OutputLocation
    _store: LogStore
    _ledger: Ledger
    _destination: Destination
    _claim: Callable[..., None]
    _epochs_since_sweep: int
    _term: int
    _shared: SharedDirs | None
    _probed: bool
    _backlog: BacklogTracker
    # The idle-rollover timer (filesink.sink.roll).
    _stop: threading.Event
    _timer: threading.Thread | None
    _timer_error: BaseException | None

    def _describe(self) -> None:
        """Be the description only: nothing is opened in this process until a batch arrives."""
        d = self._description
        self._is_open = False
        self._closed = False
        self.path = d.path
        self.state_dir = Path(d.state_dir)
        self.key_columns = list(d.key_columns) if d.key_columns is not None else None
        self.partition_by = list(d.partition_by)
        self.rollover = d.rollover
        self.parallelism = d.parallelism
        self.vnodes = d.vnodes
        self._checkpoint_id = None
        self._spark = None
        self.stats = SinkStats()
        """On a Spark Connect client this stays empty: the sink counts on the server."""

    def _file_task(self, f: PlannedFile, term: int) -> FileTask:
        return file_task(
            self._store,
            self._ledger,
            f,
            self.partition_by,
            term=term,
            row_group_rows=self._row_group_rows,
            compression=self._compression,
            utc_timestamps=self._destination.options.is_table,
        )

    def _files_schema(self) -> pa.Schema | None:
        """The Arrow schema the sink's files are written with (partition columns included), once recorded."""
        recorded = self._ledger.arrow_schema() if self._ledger.config() is not None else None
        return pa.ipc.read_schema(pa.py_buffer(recorded)) if recorded is not None else None

    def _probe_executors(self, outcome: str) -> None:
        """Once per run, before its first append or file write on a cluster: check that every executor sees the
        driver's local log store and output (:func:`filesink.tasks.shared.probe`, one task per executor core), or raise
        :class:`NotSharedError` ending with ``outcome``. Under a ``local`` master there is nothing to check."""
        if self._probed or self._shared is None or self._spark is None:
            return
        if on_cluster(self._spark):
            problems = probe(self._spark, self._shared, fallback_tasks=self.parallelism or 2)
            if problems:
                raise NotSharedError(unshared_message(problems, f"{outcome}. Fix the cause and start the query again"))
        self._probed = True
