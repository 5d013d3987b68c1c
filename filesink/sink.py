"""``ExactlyOnceParquetSink``: the object a Spark user passes to ``foreachBatch``.

Per epoch (one micro-batch), under one lock shared with the idle-rollover timer:

1. replay check (a batch id equal to the last sealed epoch is a replay: its append is skipped; a lower one is
   an error);
2. append: one Spark job, each task writes one log segment (rows cross from the JVM to Python once);
3. seal: one transaction records the epoch and its segments;
4. plan rollover at the barrier, 5. pre-commit the planned files, 6. write them (one Spark task per file),
7. commit them and advance truncate points (one transaction), 8. collect log garbage.

At construction the sink takes the state directory's lock and runs recovery (:mod:`recovery.resolve`): it
takes a new writer term, which fences every file writer of earlier runs, and resolves files left pending:
a file that is visible is committed, one that is not is dropped and its data written again. The per-epoch path
(``_roll``) uses the log store, the ledger, the planner, the writer and the output, never :mod:`recovery`.

A sink unpickled from its description (:mod:`filesink.description`, under Spark Connect) opens at its first batch
through :func:`open_described`, which keeps one open sink per state directory and process; its ``flush()`` from
a Connect client runs a one-batch query on the server (:func:`flush_through_connect`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import pickle
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from logstore import (
    NOTHING,
    STATE_DB_NAME,
    VNODE_COLUMN,
    LogLocation,
    LogStore,
    SegmentDescriptor,
    append_segment,
    guards,
    requestcounts,
)
from logstore.conditional import probe_conditional_create, require_conditional_create
from logstore.failpoints import failpoint
from logstore.home import CLAIM_FILE
from logstore.storage import is_local
from recovery.resolve import RecoveryPlan, apply_recovery

from . import metrics as metrics_hooks
from . import taskrows
from .admission import REFUSED_COLUMN, Admission, Refusal, refusal_message
from .backlog import BacklogTracker
from .checkpoint import checkpoint_query_id
from .damage import check_planned, diagnose, given_up_line
from .description import SinkDescription, connect_client, pickled_for_foreach_batch
from .destination import TableFormat, open_destination
from .errors import (
    BatchRefusedError,
    CheckpointMismatchError,
    NotSharedError,
    OutputClaimedError,
    OutputHasRowsError,
    SchemaMismatchError,
    SinkFailedError,
    SinkLockedError,
    SinkOptionError,
    StateBehindError,
    StateLostError,
    TableFormatError,
)
from .ledger import Ledger, PlannedFile
from .lock import LOCK_FILE, StateLock
from .metrics import MetricsBook, SinkMetrics
from .metrics_http import serve
from .output import (
    CLAIM_NAME,
    OutputLocation,
    claim_output,
    forget_committed,
    list_objects,
    prepare_staging,
    release_staging,
    remove_failed_attempts,
    write_mark,
)
from .output.limits import key_limits
from .output.location import OUTPUT_STAGING, STATE_STAGING, filesystem
from .partitioning import SPARK_TYPES, unsupported_columns
from .planner import file_task, plan
from .preflight import make_local_dir
from .rollover import Rollover
from .s3options import remember
from .schema import (
    arrow_schema_of,
    arrow_zone,
    hashable_columns,
    repeated,
    unhashable_reason,
    unwritable_columns,
)
from .schema_versions import (
    NewVersion,
    Proposed,
    SchemaTaken,
    check_batch_schema,
    fill_missing_columns,
    filled_schema,
    propose,
)
from .shared import SharedDirs, on_cluster, probe, shared_dirs
from .shared import refusal_message as unshared_message
from .sizing import RESAMPLE_GROWTH, Sample, sample_ratio
from .writer import FileTask, WrittenObject, write_file

log = logging.getLogger(__name__)
START_NOTICE = "filesink_start_notice"
"""Set on the log records that say, once at start, what the open found (a rebuilt state, rows given up):
``filesink run`` prints the same in its own words and filters these out."""

GC_SWEEP_EVERY = 20
"""Epochs between full listings of the log store for unsealed garbage (released segments go every epoch)."""

LOCK_WAIT_SECONDS = 60.0
"""How long a sink opening from its description waits for the state directory's lock. When a Connect query
stops, the server ends its foreachBatch process (SIGTERM) without waiting for it; a restarted query (or a flush)
may start before the OS has released the old process's lock."""

SETTLE_TIMEOUT = 300.0
"""How long closing waits for a table's maintenance in the background (a Delta checkpoint: a fraction of a second
at 10,000 files on local disk); past it the close goes on and the checkpoint may be left unwritten, which only
makes reading the table slower."""

FLUSH_CHECKPOINTS = "connect-flush"
"""Directory under ``state_dir`` (on the server) for the checkpoints of the one-batch queries ``flush()`` runs
under Spark Connect; each flush removes those of earlier flushes."""


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


class ExactlyOnceParquetSink:
    """Writes every row of a streaming query exactly once into large Parquet files; see the module docstring."""

    def __init__(
        self,
        path: str,
        state_dir: str | os.PathLike[str],
        log_store: str | None = None,
        key_columns: Sequence[str] | None = None,
        vnodes: int = 256,
        parallelism: int | None = None,
        partition_by: Sequence[str] | None = None,
        rollover: Rollover | None = None,
        storage_options: Mapping[str, Any] | None = None,
        *,
        row_group_rows: int = 1_000_000,
        compression: str = "zstd",
        accept_state_loss: bool = False,
        checkpoint_location: str | None = None,
        single_driver: bool = False,
        accept_duplicates: bool = False,
        table_format: str = "directory",
        catalog: Mapping[str, Any] | None = None,
        table: str | None = None,
        fill_missing_columns: bool = False,
        metrics_port: int | None = None,
        metrics_address: str = "127.0.0.1",
    ) -> None:
        """The options are described in ``docs/configuration.md``. ``single_driver``: go on where the log store's
        location has no conditional create (an S3 server that ignores or refuses ``If-None-Match: *``), which
        otherwise stops the start with ``ConditionalCreateError``; the operator then promises that at most one
        driver or ``filesink recover apply`` runs on the sink at a time, since nothing fences a second one.
        ``metrics_port``: serve the sink's figures (:meth:`metrics`) for Prometheus at
        ``http://<metrics_address>:<metrics_port>/metrics`` from this process (0: a free port, see
        :attr:`metrics_url`; needs the ``metrics`` extra); a port in use stops the start before anything is opened
        (``MetricsPortError``)."""
        self._description = SinkDescription.checked(
            path,
            state_dir,
            log_store,
            key_columns,
            vnodes,
            parallelism,
            partition_by,
            rollover,
            storage_options,
            row_group_rows,
            compression,
            accept_state_loss,
            checkpoint_location,
            remote=connect_client(),
            accept_duplicates=accept_duplicates,
            single_driver=single_driver,
            table_format=table_format,
            catalog=catalog,
            table=table,
            fill_missing_columns=fill_missing_columns,
        )
        if connect_client():
            if metrics_port is not None:
                raise SinkOptionError(
                    f"metrics_port for the sink of {path}: under Spark Connect the sink opens on the server, and its "
                    "figures are there, not in this client. Leave metrics_port unset here (filesink run: without "
                    "--metrics-port when run with --remote)."
                )
            self._describe()  # opens on the Spark Connect server, at its first batch there
        else:
            self._open(None if metrics_port is None else (metrics_address, metrics_port))

    @classmethod
    def open_description(cls, description: SinkDescription) -> ExactlyOnceParquetSink:
        """Open the sink ``description`` describes, in this process (see :mod:`filesink.description`)."""
        sink = cls.__new__(cls)
        sink._description = description
        sink._open()
        return sink

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
        self._checkpoint_id: str | None = None
        self._spark: Any = None
        self.stats = SinkStats()
        """On a Spark Connect client this stays empty: the sink counts on the server."""

    def _open(self, serve_at: tuple[str, int] | None = None) -> None:
        """Take the state directory's lock, open the log store and the output, and run recovery; first, start
        serving metrics at ``serve_at`` (address, port), if given."""
        d = self._description
        self._describe()
        self._metrics = MetricsBook()  # before recovery: its requests and commits are this run's
        self._metrics_server = (
            None if serve_at is None else serve(self._metrics.snapshot, *serve_at, f"the sink of {d.path}")
        )
        try:
            self._open_state()
        except BaseException:
            if self._metrics_server is not None:
                self._metrics_server.close()
            raise

    def _open_state(self) -> None:
        """What :meth:`_open` does once the metrics are served: lock, log store, output, recovery."""
        d = self._description
        self._is_open = True
        path = d.path
        state = self.state_dir
        options = dict(d.storage_options)
        log_store = d.log_store
        vnodes = d.vnodes
        made = [(Path(path), "the output path")] if is_local(path) else []
        made.append((state, "state_dir"))
        local_log = LogLocation(log_store).canonical if log_store else str(state / "log")
        log_dir = [(Path(local_log), "the log store")] if log_store is None or is_local(log_store) else []
        for directory, what in made + log_dir:  # all checked before any is created
            make_local_dir(directory, what, create=False)
        new_state = None
        if not (state / STATE_DB_NAME).exists():  # a new state: refused starts leave nothing in it
            self._refuse_claimed_output(options)  # reads only, before anything is created
            staging = [Path(path) / OUTPUT_STAGING] if is_local(path) else []
            new_state = _NewState.before(state, [p for p, _ in made + log_dir] + staging, log_store, options)
        for directory, what in made:
            make_local_dir(directory, what)
        row_group_rows, compression, accept_state_loss = d.row_group_rows, d.compression, d.accept_state_loss
        self._row_group_rows = row_group_rows
        self._sample: Sample | None = None
        self._compression = compression
        self._accept_state_loss = bool(accept_state_loss)
        self._accept_duplicates = bool(d.accept_duplicates)
        self._take_over_from: str | None = None
        """The sink whose output this one takes over at its first batch (accept_state_loss; see _defer_take_over)."""
        self._created_claim = False
        """Whether this start created the output's claim (it had none)."""
        self._lock = threading.RLock()
        try:
            self._state_lock = StateLock(state)
        except OSError as e:
            raise SinkOptionError(
                f"state_dir {state} cannot be written ({e.strerror or e}): the sink keeps its lock and state database "
                "there. Make it writable by the user that runs the query (filesink recover status reads it as it is)."
            ) from e
        try:
            self._output = OutputLocation.of_sink(self.path, options, state).checked()  # before any state is made
            log_options = options if log_store and not is_local(log_store) else None
            # Before anything of the sink is written (the log store's records, the output's claim): a store that
            # cannot create only if absent stops the start here, unless single_driver.
            log_location = LogLocation(local_log if log_store is None else log_store, log_options or {})
            require_conditional_create(log_location.open(), single_driver=d.single_driver)
            self._store = LogStore.open(state, log_store, vnodes=vnodes, storage_options=log_options)
            if new_state is not None:
                new_state.log_opened()
            self._ledger = Ledger(self._store)
            self._destination = open_destination(
                d.table, output=self._output, sink_id=self._store.sink_id, partition_by=self.partition_by
            )
            self._destination.check(self._files_schema())  # a table this sink cannot commit to: refused first
            if d.table.format is TableFormat.DELTA and not self._output.is_local:
                _probe_delta_store(self._output, d.single_driver)

            def claim(defer: bool = True) -> None:
                where = f"state directory {state}"
                if defer and self._defer_take_over():
                    return
                claim_output(
                    self._output,
                    self._store.sink_id,
                    state=where,
                    take_over=self._accept_state_loss,
                    log_store=self._store.location.canonical,
                )
                if new_state is not None:
                    new_state.kept = True  # the output's claim names this sink now

            self._claim = claim
            self._ledger.check_config(
                self.path,
                self.key_columns,
                self.partition_by,
                table_format=d.table.format.value,
                table=d.table.table,
                before_record=claim,
            )
            claim()
            if new_state is not None:
                new_state.kept = True  # recovery writes the sink's first term, in the log store and the output
            self._epochs_since_sweep = 0
            self._term = 0
            self.recovered: RecoveryPlan | None = None
            """What start-up recovery carried out."""
            self._recover()
            self._shared: SharedDirs | None = shared_dirs(self._store, self._output, self._term)
            """What the executors' tasks of this run look for to tell they see the driver's local log store and
            output (:mod:`filesink.shared`); None when neither is local."""
            self._probed = False
            """Whether this run checked every executor (:meth:`_probe_executors`)."""
            self.stats = SinkStats(last_epoch=self._store.last_sealed_epoch)
            self._backlog = BacklogTracker(self._store)
            recovered: list[tuple[int, int]] = self.recovered.committed_files() if self.recovered else []
            metrics_hooks.opened(self._metrics, self._store, self._term, recovered, self._backlog)
            self._remember_s3_settings(options)
        except BaseException:
            store = getattr(self, "_store", None)
            if store is not None:
                if store.term is not None:  # this run took a term and stops: not a live owner
                    with contextlib.suppress(Exception):
                        store.home.close_term(store.term)
                store.close()
            if new_state is not None:
                new_state.remove_created()  # a refused start of a new state leaves it as it was
            self._state_lock.release()
            raise
        self._closed = False
        self._stop = threading.Event()
        self._timer: threading.Thread | None = None
        self._timer_error: BaseException | None = None

    def _remember_s3_settings(self, options: Mapping[str, Any]) -> None:
        """Record the S3 endpoint and region in the state directory, for ``filesink recover`` (a convenience: a
        failure is logged, never fatal)."""
        on_s3 = not is_local(self.path) or not is_local(self._description.log_store or "")
        try:
            remember(self.state_dir, options if on_s3 else {})
        except OSError as e:
            log.warning("could not record the S3 endpoint and region in %s: %s", self.state_dir, e)

    # -- foreachBatch ----------------------------------------------------------------------------------

    def __call__(self, df: Any, batch_id: int) -> None:
        """Process one micro-batch: ``query = df.writeStream.foreachBatch(sink).start()``."""
        if not self._is_open:  # unpickled on a Spark Connect server: open (once per process) at the first batch
            opened = open_described(self._description)
            self.stats = opened.stats
            opened(df, batch_id)
            return
        with self._lock, self._metrics.watching():
            batch_started = time.monotonic()
            self._check_usable()
            self.use_spark(df.sparkSession)
            self._probe_executors(
                f"Nothing of batch {batch_id} was appended or sealed, and Spark keeps it in the query's checkpoint"
            )
            last = self._check_batch(batch_id)
            if batch_id > last:
                if self._description.fill_missing_columns:
                    df = fill_missing_columns(df, self._ledger, (*(self.key_columns or ()), *self.partition_by))
                version = self._check_schema(df.schema, batch_id)
                started = time.monotonic()
                descriptors = self._append(df, batch_id, version)
                if version is not None:
                    self._record_version(version, descriptors)
                self._store.seal(batch_id, descriptors)
                self.stats.batches += 1
                self.stats.rows_in += sum(d.rows for d in descriptors)
                self.stats.last_epoch = batch_id
                self._metrics.appended(batch_id, sum(d.rows for d in descriptors), time.monotonic() - started)
            else:
                self.stats.replayed += 1
                self._metrics.replayed()
            self._roll(force=False)
            self._metrics.batch_done(batch_id, batch_id <= last, time.monotonic() - batch_started)
            self._start_timer()

    def use_spark(self, spark: Any) -> None:
        """Run this sink's Spark jobs with ``spark`` (the batch's session: classic, or a Connect session on the
        server), and take Spark's default parallelism if none was given."""
        with self._lock:
            self._spark = spark
            if self.parallelism is None:
                self.parallelism = default_parallelism(spark)

    def _check_batch(self, batch_id: int) -> int:
        """Refuse, before anything is written, a batch that is not this sink's to take; return the last sealed
        epoch. A batch id equal to it is a replay (Spark runs the last batch again after a crash)."""
        query_id = _query_id(self._spark) or self._checkpoint_query_id()
        recorded = self._ledger.query_id()
        if query_id and recorded and query_id != recorded:
            raise CheckpointMismatchError(
                f"batch {batch_id} comes from streaming query {query_id}, but this sink (state directory "
                f"{self.state_dir}) takes the batches of query {recorded}, the one it recorded at its first batch. A "
                "query's id is kept in its checkpoint: another id means the checkpoint was deleted or replaced, or "
                "another query writes through this sink. Nothing of this batch was written. Restore the original "
                "checkpoint (checkpointLocation), or give this query a new state directory, log store and output."
            )
        last = self._store.last_sealed_epoch
        if guards.on("gap.lost_state") and last == NOTHING and batch_id > 0 and not self._accept_state_loss:
            raise StateLostError(
                f"batch {batch_id} arrived, but this sink's state in {self.state_dir} is new and empty: the query's "
                "checkpoint is past batch 0, so the state this sink had was lost (deleted, or on a disk that did "
                "not outlive the driver's machine), and with it the rows it held and had not yet written. Nothing "
                f"of this batch was written; this sink's start made its new state in {self.state_dir} and recorded "
                f"itself as the owner of the output {self.path}, which holds no file of it (start again with this "
                "state directory, or remove both). Restore the state directory (and log store) the query used "
                "before; or, to accept "
                "that those rows are not in the output (or when this is a new sink for a query that ran before), "
                "create the sink with accept_state_loss=True (filesink run --accept-state-loss)."
            )
        if (
            guards.on("gap.restored_state") and last != NOTHING and batch_id > last + 1
        ):  # Spark never skips a batch id: the state is behind
            self._check_gap(batch_id, last)
        if last == NOTHING and batch_id == 0 and self._accept_state_loss and not self._accept_duplicates:
            self._refuse_output_with_rows()
        if guards.on("batch.behind_sealed") and batch_id < last:
            raise CheckpointMismatchError(
                f"batch {batch_id} arrived, but epoch {last} is already sealed in {self.state_dir}. This happens "
                "when the query's checkpoint was reset or deleted, or when a second query writes through this "
                "state directory. Restore the checkpoint, or give the query a new state directory and output."
            )
        if self._take_over_from is not None:  # deferred from the start (see _defer_take_over)
            self._claim(defer=False)
            self._take_over_from = None
        if query_id and recorded is None:
            self._ledger.record_query_id(query_id)
        return last

    def _check_gap(self, batch_id: int, last: int) -> None:
        """Refuse a batch id beyond the next one (unless accept_state_loss): the query's checkpoint is ahead of the
        sink's state, which most likely was restored from a backup."""
        first, end = last + 1, batch_id - 1
        missing = f"batch {first}" if first == end else f"batches {first} to {end}"
        where = f"state directory {self.state_dir}, log store {self._store.location.canonical}"
        if self._accept_state_loss:
            log.warning(
                "sink %s: batch %d arrived after epoch %d (%s): %s never reached this state; going on "
                "(accept_state_loss): their rows not in files are lost, and rows this state holds that were written "
                "to files after its backup are written again",
                self._store.sink_id,
                batch_id,
                last,
                where,
                missing,
            )
            return
        raise StateBehindError(
            f"batch {batch_id} arrived, but the last epoch this sink sealed is {last} ({where}). Spark numbers "
            f"batches without gaps, so the query's checkpoint is past {missing}, which this state never saw: the "
            "state is behind the checkpoint. Most likely the state directory or the log store was restored from a "
            "backup (or a disk snapshot) older than the checkpoint, or the checkpoint comes from another run of the "
            "query. Nothing was written. Restore the newest state directory and log store (the ones the query used "
            "last) and start again. Or, to go on from this state, create the sink with accept_state_loss=True "
            f"(filesink run --accept-state-loss), which accepts two things: the rows of {missing} that were not yet "
            "in committed files are lost (not in the output), and rows this state holds that the newer state had "
            "already written to files after the backup are written again (in the output twice)."
        )

    def _refuse_output_with_rows(self) -> None:
        """Batch 0 at a sink that replaces a lost one: the query's checkpoint is new too, so it reads its input
        again from the start. Refuse if the output holds files already (their rows would be written twice)."""
        files, rows, why = _output_rows(self._output)
        if not files:
            return
        held = f"{rows:,} rows in {files:,} Parquet files" if rows is not None else f"{files:,} Parquet files"
        if rows is None:
            held += f" (their row counts could not be read: {why})"
        owner = f" of sink {self._take_over_from}" if self._take_over_from else ""
        claim = ""
        if self._take_over_from:
            claim = f" and its claim {CLAIM_NAME} still names sink {self._take_over_from}"
        elif self._created_claim:
            claim = f" but for its claim {CLAIM_NAME}, which this start created (the output had none)"
        raise OutputHasRowsError(
            f"batch 0 arrived at a sink created with accept_state_loss=True to take over the output {self.path}"
            f"{owner}, which holds {held}. Batch 0 means the query's checkpoint is new too (lost with the state, "
            "or replaced; filesink run keeps it in the state directory unless --checkpoint is given), so the query "
            "reads its input again from the start, and the rows the output holds would be written a second time. "
            f"Nothing of this batch was written: the output is unchanged{claim}. Choose one: a new output (with a "
            "new state directory), which gets every input row once; or the query's old checkpoint, if it still "
            "exists (checkpointLocation; filesink run --checkpoint DIR), with which the query goes on from its next "
            "batch; or, to write those rows again knowingly (readers then see them twice), add "
            "accept_duplicates=True (filesink run --accept-duplicates). "
            f"{self._left_state()}"
        )

    def _left_state(self) -> str:
        """What a start of this sink left, for a refusal at its first batch."""
        names = sorted(n for n in _listdir(self.state_dir) if n in _STATE_NAMES or n == "log")
        text = f"This sink's state in {self.state_dir} ({', '.join(names)}) holds nothing sealed"
        location = self._store.location
        if not is_local(location.url) or Path(location.canonical).parent != self.state_dir:
            text += f", and its log store at {location.canonical} only its empty durable home"
        return (
            text + ": safe to delete once the sink is closed (the query stopped), or to keep, since a start with "
            "it goes on as one with a new state does."
        )

    def _defer_take_over(self) -> bool:
        """Whether the start of a sink that replaces a lost one (accept_state_loss) leaves the output's claim for
        its first batch: a new sink that holds nothing does, when another sink claimed the output. Only the batch id
        says whether the query's checkpoint is new too (batch 0), in which case the output keeps its claim
        (:meth:`_refuse_output_with_rows`). Records whether the output had a claim."""
        if not self._accept_state_loss:
            return False
        claimed, _ = _claim_of(self._output.url, self._output.storage_options, CLAIM_NAME)
        self._created_claim = self._created_claim or claimed is None  # claim() runs twice at a first start
        if claimed is None or claimed == self._store.sink_id:
            return False
        if self._store.rebuilt or self._store.last_sealed_epoch != NOTHING:
            return False  # a sink that holds rows takes the output over at its start: recovery may write files
        self._take_over_from = claimed
        return True

    def _refuse_claimed_output(self, options: Mapping[str, Any]) -> None:
        """Refuse, before anything is created, a new state (no state database yet) for an output another sink
        claimed, unless its log store is that sink's durable home (the sink is rebuilt from it) or
        accept_state_loss. Reads only; a store that cannot be read fails here, as the start would."""
        d = self._description
        if d.accept_state_loss:
            return
        location = d.log_store or str(self.state_dir / "log")
        # A store that cannot be read fails here as it would at the start's own read (nothing is created yet).
        claimed, where = _claim_of(d.path, options, CLAIM_NAME)
        if claimed is None:
            return
        home, _ = _claim_of(location, options, CLAIM_FILE)
        if home == claimed:
            return
        this = f"sink {home}, whose log store is {location}" if home else "sink"
        raise OutputClaimedError(
            f"the output {d.path} belongs to sink {claimed} (its {where}), not to this {this} "
            f"(state directory {self.state_dir}, which holds no state yet). Two sinks writing to one output would "
            "both write their rows there, and readers would see both. Nothing was written or deleted, and nothing "
            "was created in the state directory. Give this sink an output of its own, or start the sink that owns "
            "the output with its state directory or its log store (log_store=, filesink run --log-store: a sink "
            "whose log store outlived it rebuilds from there). If that sink's state is lost for good (its state "
            "directory held its log store), this sink can replace it with accept_state_loss=True (filesink run "
            "--accept-state-loss): the rows that state held and had not written yet are then not in the output. "
            "That needs the query's checkpoint to have survived: a query that starts again at batch 0 would write "
            "the rows the output holds a second time, and is refused (OutputHasRowsError)."
        )

    def check_schema(self, schema: Any) -> None:
        """Raise :class:`SchemaMismatchError` (or :class:`SinkOptionError`) if batches of the Spark ``schema`` would
        be refused; a new sink records it as its schema. Lets a job fail before it starts its query.

        On a Spark Connect client, where the sink's state is on the server, only what the options say is checked
        (columns named, partition types, the reserved column); the recorded schema is compared at the first batch.
        """
        if not self._is_open:
            self._check_columns(schema)
            return
        with self._lock:
            self._check_usable()
            if self._description.fill_missing_columns:
                schema = filled_schema(schema, self._ledger, (*(self.key_columns or ()), *self.partition_by))
            self._check_schema(schema)

    def propose_schema(self, schema: pa.Schema) -> Proposed | None:
        """How batches whose files' Arrow ``schema`` is the given one would change the sink's schema, or the
        problems that would refuse them (:func:`filesink.schema_versions.propose`): for a check of input files before
        Spark starts. None while no epoch is sealed. Records nothing. Under a Spark Connect client, where the sink's
        state is on the server, it raises :class:`SinkOptionError`."""
        sink = self._opened()
        with sink._lock:
            sink._check_usable()
            return propose(
                sink._ledger,
                sink._store.last_sealed_epoch,
                schema,
                fixed=(*(sink.key_columns or ()), *sink.partition_by),
                fill_missing=sink._description.fill_missing_columns,
                destination=sink._destination,
            )

    def flush(self) -> None:
        """Write everything the log store holds now (for example after an available-now run).

        Under Spark Connect, where the sink lives on the server, this runs a one-batch query there that opens the
        sink, writes what it holds and closes it (:func:`flush_through_connect`); the query that writes through the
        sink must be stopped."""
        if not self._is_open:
            opened = opened_here(self._description)
            if opened is not None:
                opened.flush()
                return
            from pyspark.sql import SparkSession

            spark = SparkSession.getActiveSession()
            if spark is None:
                raise SinkOptionError(
                    f"flush() of the sink for {self.path}: the sink opens on the Spark Connect server, and flush() "
                    "reaches it through the active Spark session, but there is none. Call flush() with the Connect "
                    "session that ran the query still open."
                )
            flush_through_connect(self._description, spark)
            return
        with self._lock, self._metrics.watching():
            self._check_usable()
            self._roll(force=True)

    def close(self) -> None:
        """Stop the idle-rollover timer and release the state directory. Data held stays in the log store.

        On a Spark Connect client this closes nothing: the sink lives in the server's foreachBatch process of its
        query, which ends (and with it the sink, as after a kill) when the query stops."""
        if not self._is_open:
            opened = opened_here(self._description)
            if opened is not None:
                opened.close()
            self._closed = True
            return
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._stop.set()
        if self._timer is not None and self._timer is not threading.current_thread():
            self._timer.join(timeout=60)
        self._destination.settle(timeout=SETTLE_TIMEOUT)  # a table's checkpoint in the background: ended first
        with self._lock:
            release_staging(self._output, self._term)
            try:  # no longer a live owner: `filesink recover apply` need not wait for this run
                self._store.home.close_term(self._term)
            except Exception as e:
                log.warning("could not record in the durable home that writer term %d stopped: %s", self._term, e)
            self._store.close()
            self._state_lock.release()
        if self._metrics_server is not None:
            self._metrics_server.close()
        forget(self)

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def description(self) -> SinkDescription:
        """The sink's options: what it is when pickled (:mod:`filesink.description`)."""
        return self._description

    def __enter__(self) -> ExactlyOnceParquetSink:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __reduce__(self) -> tuple[Any, ...]:
        if not pickled_for_foreach_batch():
            raise TypeError(
                f"the ExactlyOnceParquetSink for {self.path} cannot go into a Spark task (a UDF, mapInArrow or "
                "foreach function): it runs its own Spark jobs at each micro-batch. Pass the sink itself to "
                "df.writeStream.foreachBatch(sink), and do not use it inside functions that run on executors."
            )
        if self._is_open:
            raise TypeError(
                f"the ExactlyOnceParquetSink for {self.path} was opened in this process, as in classic PySpark, "
                "because no Spark Connect session existed when it was created; under Spark Connect it must open on "
                "the server. Close it, and create the sink after SparkSession.builder.remote(...).getOrCreate() "
                "(or with SPARK_REMOTE set)."
            )
        return (_described, (self._description,))

    # -- what tests and tools may look at --------------------------------------------------------------

    def metrics(self) -> SinkMetrics:
        """A snapshot of the sink's figures in this run (:class:`filesink.metrics.SinkMetrics`): read from memory,
        cheap enough for every batch (no listing, no query, no request)."""
        return self._opened()._metrics.snapshot()

    def listen(self, listener: Callable[[dict[str, Any]], None] | None) -> None:
        """Call ``listener`` with a record of each batch and of each roll that committed files
        (:func:`filesink.metrics.event_record`), in the thread that ran it; None stops it."""
        self._opened()._metrics.listener = listener

    @property
    def metrics_url(self) -> str | None:
        """Where the sink serves its metrics for Prometheus (``metrics_port``), or None."""
        server = self._opened()._metrics_server
        return server.url if server is not None else None

    @property
    def log_store(self) -> LogStore:
        """The sink's log store (the owner of its state database's connection)."""
        return self._opened()._store

    @property
    def ledger(self) -> Ledger:
        """The sink's commit ledger: pending files, writer terms, recorded configuration."""
        return self._opened()._ledger

    @property
    def output(self) -> OutputLocation:
        return self._opened()._output

    @property
    def term(self) -> int:
        """The writer term this sink object took at start-up."""
        return self._opened()._term

    def recorded_spark_schema(self) -> list[tuple[str, str]] | None:
        """The Spark schema the sink recorded with its first batch, as (column, type) pairs; None before it."""
        recorded = self._opened()._ledger.spark_schema()
        return None if recorded is None else [(name, kind) for name, kind in json.loads(recorded)]

    # -- steps -----------------------------------------------------------------------------------------

    def _opened(self) -> ExactlyOnceParquetSink:
        if self._is_open:
            return self
        opened = opened_here(self._description)
        if opened is None:
            raise SinkOptionError(
                f"the sink for {self.path} is not open in this process: created under a Spark Connect client, it "
                f"opens on the server at its first batch, and its state is there ({self.state_dir}; filesink recover "
                "status reads it on the server)."
            )
        return opened

    def _checkpoint_query_id(self) -> str | None:
        """The query id from ``checkpoint_location`` (read once), where Spark does not say it (Spark Connect)."""
        location = self._description.checkpoint_location
        if location is None:  # a classic sink outside a streaming query; under Connect the option is required
            return None
        if self._checkpoint_id is None:
            self._checkpoint_id = checkpoint_query_id(location, self._description.storage_options)
        return self._checkpoint_id

    def _check_usable(self) -> None:
        if self._closed:
            raise SinkOptionError(f"the sink for {self.path} is closed; create a new one to write again")
        if self._timer_error is not None:
            raise self._timer_error
        self._check_no_pending()

    def _check_no_pending(self) -> None:
        """Refuse to go on after a roll failed between pre-commit and commit: its files are pending, maybe partly
        visible, and planning again over their vnodes could write their rows twice. Recovery resolves them."""
        pending = self._ledger.pending_names()
        if pending:
            raise SinkFailedError(
                f"files {', '.join(pending)} of {self.path} were pre-committed by a write that failed in this run and "
                "are not resolved. Close this sink and create a new one (restart the query): recovery at start "
                "commits or rewrites them. Nothing is lost."
            )

    def _check_columns(self, schema: Any) -> None:
        """What the options say about a schema: the columns they name exist and can be used as named."""
        names = [f.name for f in schema.fields]
        if not names:
            raise SchemaMismatchError(
                "the batch has no columns, and a Parquet file needs at least one (Spark's own Parquet writer refuses "
                "an empty schema too). Nothing of this batch was written. Select at least one column in the query."
            )
        twice = repeated(names)
        if twice:
            raise SchemaMismatchError(
                f"the batch has more than one column named {', '.join(map(repr, twice))} (its columns: {names}); a "
                "Parquet file's columns need distinct names. Nothing of this batch was written. Rename or drop the "
                "repeated columns in the query (for example with alias after a join)."
            )
        alike = repeated(names, fold=str.lower)
        if alike and not self._case_sensitive():
            raise SchemaMismatchError(
                f"the batch has columns whose names differ only in case: {', '.join(map(repr, alike))}. The Spark "
                "session compares column names without case (spark.sql.caseSensitive is false), so Spark's own "
                "Parquet writer refuses them too (COLUMN_ALREADY_EXISTS), and Spark would not read them back apart. "
                "Nothing of this batch was written. Rename one of each pair in the query."
            )
        for option, columns in (("key_columns", self.key_columns or []), ("partition_by", self.partition_by)):
            missing = [c for c in columns if c not in names]
            if missing:
                raise SinkOptionError(f"{option} names columns the batch does not have: {missing} (it has {names})")
        unsupported = unsupported_columns(schema, self.partition_by)
        if unsupported:
            raise SinkOptionError(
                f"partition_by names {', '.join(unsupported)}: a partition column must have one of the types Spark "
                f"partitions by, which the sink names directories after as Spark does ({', '.join(SPARK_TYPES)}). "
                "Nothing was written. Partition by another column, or by a column of one of these types derived in "
                "the query (for example a date from a timestamp, or concat_ws over an array)."
            )
        if VNODE_COLUMN in names:
            raise SchemaMismatchError(f"the batch has a column named {VNODE_COLUMN!r}, which the sink reserves")
        if self.partition_by and len(self.partition_by) == len(names):
            raise SinkOptionError("partition_by names every column; the files would have no columns left")
        unhashable = [(c, unhashable_reason(schema[c].dataType)) for c in self.key_columns or []]
        named = "; ".join(f"{c} ({schema[c].dataType.simpleString()}): {why}" for c, why in unhashable if why)
        if named:
            raise SinkOptionError(
                f"key_columns names {named}, so rows cannot be spread over vnodes by it. Nothing was written. Give "
                f"key_columns without map or variant columns (of {hashable_columns(schema)}), or leave key_columns "
                "unset: the sink then hashes every column without a map or a variant."
            )
        unwritable = unwritable_columns(schema)
        if unwritable:
            raise SchemaMismatchError(
                f"the batch has columns the sink cannot write to Parquet files: {'; '.join(unwritable)}. Nothing of "
                "this batch was written. Change those columns in the query."
            )

    def _case_sensitive(self) -> bool:
        """Whether the Spark session tells column names apart by case (``spark.sql.caseSensitive``, false by
        default and when there is no session)."""
        spark = self._spark
        if spark is None:
            from pyspark.sql import SparkSession

            spark = SparkSession.getActiveSession()
        return spark is not None and str(spark.conf.get("spark.sql.caseSensitive", "false")).lower() == "true"

    def _files_schema(self) -> pa.Schema | None:
        """The Arrow schema the sink's files are written with (partition columns included), once recorded."""
        recorded = self._ledger.arrow_schema() if self._ledger.config() is not None else None
        return pa.ipc.read_schema(pa.py_buffer(recorded)) if recorded is not None else None

    def _record_version(self, version: NewVersion, descriptors: list[SegmentDescriptor]) -> None:
        """Record a batch's new schema before its epoch is sealed (its segments are deleted if that fails)."""
        try:
            self._ledger.add_schema_version(
                version.spark_schema,
                version.spark_type,
                version.arrow_schema,
                version.first_epoch,
                list(version.changes),
            )
        except BaseException:
            self._store.discard(version.first_epoch, descriptors)
            raise
        latest = self._ledger.schema_history()[-1].version
        self.stats.schema_changes.append(SchemaTaken(version.first_epoch, latest, version.taken))
        log.info(
            "the sink for %s takes a new schema from batch %d: %s",
            self.path,
            version.first_epoch,
            "; ".join(version.changes) or "the columns' order changed",
        )

    def _session_zone(self) -> str:
        """The zone Spark labels a batch's timestamps with (its session time zone), as pyarrow knows it."""
        zone = self._spark.conf.get("spark.sql.session.timeZone") if self._spark is not None else None
        return arrow_zone(str(zone)) if zone else "UTC"

    def _check_schema(self, schema: Any, epoch: int | None = None) -> NewVersion | None:
        self._check_columns(schema)
        arrow = arrow_schema_of(schema) if self._destination.options.is_table else None
        if arrow is not None:
            problem = self._destination.check_schema(arrow)
            if problem:
                raise TableFormatError(
                    f"the batch's {problem}. Nothing of this batch was written. Cast or drop the column before the "
                    f"sink, or write to table_format='directory'."
                )
        return check_batch_schema(
            self._ledger,
            self._store.last_sealed_epoch,
            schema,
            epoch,
            zone=self._session_zone(),
            fixed=(*(self.key_columns or ()), *self.partition_by),
            destination=self._destination,
        )

    def _append(self, df: Any, epoch: int, version: NewVersion | None = None) -> list[SegmentDescriptor]:
        """Append the batch: one Spark job, each task checks its rows (:mod:`filesink.admission`) and writes one
        segment. A refused batch leaves nothing in the log store and raises :class:`BatchRefusedError`."""
        from pyspark.sql import functions as F

        # The columns cross under positional names and get theirs back in the task: nothing is looked up by a
        # name Spark could parse ("a.b" as field b of a), or match twice (a and A when names are compared without
        # case); PySpark's own mapInArrow looks every column up by its name.
        names = [*df.columns, VNODE_COLUMN]
        positional = df.toDF(*[f"_{i}" for i in range(len(names) - 1)])
        keys = self._key_columns(df.schema, positional)
        vnode = F.pmod(F.hash(*keys), F.lit(self._store.vnodes)).cast("int")
        target = self._store.target
        term_prefix = self._store.writer_id("")
        limits = key_limits(self._output) if self.partition_by else None
        files_schema = version.arrow_schema if version is not None else self._ledger.arrow_schema()
        admission = Admission(epoch, files_schema, tuple(self.partition_by), limits)
        shared = self._shared

        def append_task(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
            from pyspark import TaskContext

            problem = shared.problem() if shared is not None else None
            if problem is not None:  # before a row is read: this executor does not see the driver's directories
                yield taskrows.unshared(problem)
                return
            ctx = TaskContext.get()
            writer = term_prefix + (f"p{ctx.partitionId()}-a{ctx.attemptNumber()}" if ctx else "driver")
            before = requestcounts.snapshot()
            try:
                rows = admission.admit(b.rename_columns(names) for b in batches)
            except Refusal as e:
                yield taskrows.refused(str(e))
                return
            descriptor = append_segment(target, epoch, rows, writer_id=writer)
            if descriptor is not None:
                counts = taskrows.task_counts(before, ctx.attemptNumber() if ctx else 0)
                yield taskrows.appended(pickle.dumps(descriptor), counts)

        rows = positional.withColumn(VNODE_COLUMN, vnode).mapInArrow(append_task, taskrows.APPEND_SCHEMA).collect()
        descriptors = [pickle.loads(r.descriptor) for r in rows if r.descriptor is not None]
        self._metrics.tasks(r[taskrows.COUNTS_COLUMN] for r in rows)
        unshared = [r[taskrows.UNSHARED_COLUMN] for r in rows if r[taskrows.UNSHARED_COLUMN] is not None]
        if unshared:
            self._store.discard(epoch, descriptors)
            raise NotSharedError(
                unshared_message(
                    unshared,
                    f"Nothing of batch {epoch} was sealed: the append tasks on that executor wrote nothing, and the "
                    "segments the others wrote were deleted. Spark keeps the batch in the query's checkpoint: fix "
                    "the cause and start the query again",
                )
            )
        refused = [r[REFUSED_COLUMN] for r in rows if r[REFUSED_COLUMN] is not None]
        if refused:
            self._store.discard(epoch, descriptors)
            raise BatchRefusedError(refusal_message(epoch, refused))
        return descriptors

    def _probe_executors(self, outcome: str) -> None:
        """Once per run, before its first append or file write on a cluster: check that every executor sees the
        driver's local log store and output (:func:`filesink.shared.probe`, one task per executor core), or raise
        :class:`NotSharedError` ending with ``outcome``. Under a ``local`` master there is nothing to check."""
        if self._probed or self._shared is None or self._spark is None:
            return
        if on_cluster(self._spark):
            problems = probe(self._spark, self._shared, fallback_tasks=self.parallelism or 2)
            if problems:
                raise NotSharedError(unshared_message(problems, f"{outcome}. Fix the cause and start the query again"))
        self._probed = True

    def _key_columns(self, schema: Any, positional: Any) -> list[Any]:
        """The columns the vnode hash is taken over, as columns of ``positional`` (the batch with its columns
        named ``_0``, ``_1``, ...): ``key_columns``, by default every column Spark can hash (every column without a
        map or a variant in its type; with none such, the JSON text of the whole row, under the columns' names)."""
        from pyspark.sql import functions as F

        names = [f.name for f in schema.fields]

        def column(name: str) -> Any:
            return positional[f"_{names.index(name)}"]

        if self.key_columns:
            return [column(c) for c in self.key_columns]
        keys = hashable_columns(schema)
        if keys:
            return [column(c) for c in keys]
        return [F.to_json(F.struct(*[column(n).alias(n) for n in names]))]

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

    def _write(self, files: list[PlannedFile]) -> dict[str, list[WrittenObject]]:
        """Write the planned files, one Spark task per file (in this process when there is no Spark yet)."""
        tasks = [self._file_task(f, self._term) for f in files]
        output = self._output
        if self._spark is None:
            return {t.name: write_file(output, t) for t in tasks}
        self._probe_executors(
            f"No file was written: the files {', '.join(t.name for t in tasks)} stay pending (pre-committed), and "
            "the next start resolves them"
        )
        shared = self._shared

        def write_task(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
            from pyspark import TaskContext

            problem = shared.problem() if shared is not None else None
            ctx = TaskContext.get()
            for batch in batches:
                for index in batch.column(0).to_pylist():
                    task = tasks[index]
                    if problem is not None:  # nothing of the file written: this executor's output is not the driver's
                        yield taskrows.not_written(task.name, problem)
                    else:
                        before = requestcounts.snapshot()
                        objects = pickle.dumps(write_file(output, task))
                        counts = taskrows.task_counts(before, ctx.attemptNumber() if ctx else 0)
                        yield taskrows.written(task.name, objects, counts)

        # A mapInArrow job like the append (task i writes file i), not an RDD job: Spark runs both on the same
        # pool of Python workers, which are running and have their modules imported already, instead of
        # starting a second pool of workers for the files.
        count = len(tasks)
        jobs = self._spark.range(0, count, 1, count).mapInArrow(write_task, taskrows.WRITTEN_SCHEMA)
        rows = jobs.collect()
        self._metrics.tasks(r[taskrows.COUNTS_COLUMN] for r in rows)
        unshared = [r[taskrows.UNSHARED_COLUMN] for r in rows if r[taskrows.UNSHARED_COLUMN] is not None]
        if unshared:
            refused = [r.name for r in rows if r[taskrows.UNSHARED_COLUMN] is not None]
            raise NotSharedError(
                unshared_message(
                    unshared,
                    f"The files {', '.join(refused)} were not written on that executor. The files of this roll stay "
                    "pending (pre-committed): the next start resolves each of them exactly once (one that another "
                    "executor published is in the driver's output, and is committed). Fix the cause, then start the "
                    "query again",
                )
            )
        return {r.name: pickle.loads(r.objects) for r in rows}

    def _plan(self, *, force: bool) -> tuple[list[PlannedFile], list[int]]:
        """Plan files with the best estimate of Parquet bytes per log byte: learned from the latest committed
        files or, before the first, measured on a sample of the held rows (:mod:`filesink.sizing`). A sample is
        encoded when the size rule would close a file with at least ``RESAMPLE_GROWTH`` times the rows of the last
        sample, up to one row group of them: the estimate improves as the backlog grows, and a new sink's first
        files reach the target.
        """
        now = time.time()
        while True:
            learned = self._ledger.bytes_per_log_byte()
            ratio = learned if learned is not None else (self._sample.ratio if self._sample else 1.0)
            files, idle = plan(
                self._store,
                self.rollover,
                self.parallelism or 1,
                now=now,
                bytes_per_log_byte=ratio,
                force=force,
                backlog=self._backlog,
            )
            if learned is not None:
                return files, idle
            sampled = self._sample.rows if self._sample else 0
            if sampled >= self._row_group_rows:
                return files, idle
            larger = [f for f in files if f.reason == "size" and f.rows >= max(1, RESAMPLE_GROWTH * sampled)]
            if not larger:
                return files, idle
            largest = max(larger, key=lambda f: f.rows)
            self._sample = sample_ratio(self._file_task(largest, self._term), self._row_group_rows)

    def _roll(self, *, force: bool) -> None:
        started = time.monotonic()
        self._roll_steps(force=force)
        self._metrics.rolled(time.monotonic() - started)

    def _roll_steps(self, *, force: bool) -> None:
        failpoint("filesink.plan.before")
        try:
            files, idle = self._plan(force=force)
        except Exception as e:  # the size sample reads held rows: a damaged segment stops it
            damage = diagnose(self._store, e, None, "plan files")
            if damage is None:
                raise
            self._store.check_term("plan files")  # segments a newer owner released are not damage
            raise damage from e
        metrics_hooks.planned(self._metrics, self._backlog)
        written: dict[str, list[WrittenObject]] = {}
        if files:
            check_planned(self._store, files)  # a missing segment stops the roll before its pre-commit
            failpoint("filesink.precommit.before")
            self._ledger.precommit(files, self._term)
            self._metrics.pending(len(files))
            failpoint("filesink.precommit.after")
            try:
                written = self._write(files)
            except Exception as e:
                damage = diagnose(self._store, e, files, f"write {len(files)} files")
                if damage is None:
                    raise
                self._store.check_term(f"write {len(files)} files")  # released by a newer owner: not damage
                raise damage from e
            failpoint("filesink.write.after")
        committing = time.monotonic()
        if files and self._destination.options.is_table:
            self._make_visible(files, written)
        sizes = {name: sum(o.size for o in objects) for name, objects in written.items()}
        if files:
            failpoint("filesink.commit.before")
        self._ledger.commit(files, sizes, idle, self._term)
        if files:
            metrics_hooks.committed(self._metrics, files, sizes, time.monotonic() - committing, self._backlog)
            failpoint("filesink.commit.after")
            write_mark(self._output, self._store.sink_id, self._store.truncate_points())
            self.stats.file_sizes.extend(sizes[f.name] for f in files)
            self.stats.objects += sum(len(written[f.name]) for f in files)
            forget_committed(self._store.storage, self._term, written)
            self._remove_failed_attempts(written)
            self._destination.maintain()
        self._epochs_since_sweep += 1
        sweep = self._epochs_since_sweep >= GC_SWEEP_EVERY
        if sweep:
            self._epochs_since_sweep = 0
        self._store.collect_garbage(sweep=sweep)

    def _make_visible(self, files: list[PlannedFile], written: dict[str, list[WrittenObject]]) -> None:
        """A table's commit of the roll's files (the directory's objects are visible once written): after a term
        check, so that a run a newer one fenced does not commit; the table refuses a commit that races another."""
        schema = self._files_schema()
        assert schema is not None, "files are planned only once a seal recorded the schema"
        self._store.check_term(f"commit {len(files)} files to the {self._destination.name}")
        failpoint("filesink.table.before")
        self._destination.check_written(written)  # another writer's clean-up may have deleted them since
        self._destination.make_visible(files, written, schema)
        failpoint("filesink.table.after")

    def _remove_failed_attempts(self, written: dict[str, list[WrittenObject]]) -> None:
        """Remove temp files and uploads of task attempts that died or stalled while writing these files (now
        committed; Spark ran their tasks again). Best effort: recovery removes what is left at the next start."""
        keys = [o.key for objects in written.values() for o in objects]
        try:
            removed = remove_failed_attempts(self._output, self._term, list(written), keys)
        except Exception as e:
            log.warning("could not remove what failed task attempts left of the files just committed: %s", e)
            return
        if removed:
            log.info("removed %d temp files or uploads left by failed task attempts", removed)

    def _recover(self) -> None:
        """Take a new writer term (fencing earlier writers), resolve files left pending by an earlier run,
        remove garbage, and prepare this term's staging directory."""
        done = apply_recovery(
            self._store,
            self._ledger,
            self._output,
            partitioned=bool(self.partition_by),
            file_task=self._file_task,
            single_driver=self._description.single_driver,
            accept_duplicates=self._description.accept_duplicates,
            probed=True,  # by _open, before anything was written
            destination=self._destination if self._destination.options.is_table else None,
        )
        assert done.term is not None
        self._term = done.term
        self.recovered = done
        self.given_up = self._store.given_up()
        """The damaged segments given up so far (``filesink recover apply --drop-damaged``), said once at start."""
        if self.given_up:
            log.warning("sink %s: %s", self._store.sink_id, given_up_line(self.given_up), extra={START_NOTICE: True})
        if self._store.rebuilt:
            held = self._store.held_totals()
            log.warning(
                "sink %s: the state directory %s was new, so its state was rebuilt from the durable home at %s: "
                "last sealed epoch %d, epochs held: %d (%d rows), %d pending files resolved",
                self._store.sink_id,
                self.state_dir,
                self._store.location.canonical,
                self._store.last_sealed_epoch,
                held.epochs,
                held.rows,
                len(done.from_home),
                extra={START_NOTICE: True},
            )
        prepare_staging(self._output, self._term)

    # -- idle rollover ---------------------------------------------------------------------------------

    def _start_timer(self) -> None:
        if self._timer is not None or self.rollover.max_age_seconds is None:
            return
        interval = max(0.1, min(5.0, self.rollover.max_age_seconds / 4))
        self._timer = threading.Thread(target=self._tick, args=(interval,), name="filesink-idle-rollover", daemon=True)
        self._timer.start()

    def _tick(self, interval: float) -> None:
        while not self._stop.wait(interval):
            try:
                with self._lock:
                    if self._closed:
                        return
                    self._check_no_pending()
                    self._roll(force=False)
            except BaseException as e:  # reported by the next batch, flush or close
                self._metrics.fenced_at(e)
                self._timer_error = e
                return


QUERY_ID_PROPERTY = "sql.streaming.queryId"
"""The Spark local property that holds the running streaming query's id (kept in its checkpoint) in foreachBatch."""


def _probe_delta_store(output: OutputLocation, single_driver: bool) -> None:
    """The sink (and delta-rs) writes each log entry of a Delta table on S3 with a conditional PUT
    (``If-None-Match: *``): a server that ignores it lets two drivers both write the same version, and one
    acknowledged commit is lost. Probed like the log store's location (:mod:`logstore.conditional`), under
    ``<table>/_filesink_probe/``."""
    storage = LogLocation(f"{output.url}/_filesink_probe", dict(output.storage_options)).open()
    probe = probe_conditional_create(storage)
    if probe.honoured:
        return
    if single_driver:
        log.warning(
            "the Delta table %s is on a server that does not support conditional create (%s): going on in "
            "single-driver operation (single_driver=True), never run two drivers of this sink at a time",
            output.url,
            probe.saw(),
        )
        return
    raise TableFormatError(
        f"the Delta table {output.url} is on a server that does not support conditional create, PUT with "
        f"If-None-Match: * ({probe.saw()}). Each log entry of the table is written that way: without it two "
        "drivers of this sink (a restart that overlaps the old driver) could both write the same table version, and "
        "a commit the sink recorded as done would be lost. Nothing was written. Use a server that honours it (AWS S3, "
        "MinIO, SeaweedFS), or promise single-driver operation with single_driver=True (filesink run "
        "--single-driver)."
    )


def _described(description: SinkDescription) -> ExactlyOnceParquetSink:
    """Unpickle a sink: its description, opened at its first batch in this process."""
    sink = ExactlyOnceParquetSink.__new__(ExactlyOnceParquetSink)
    sink._description = description
    sink._describe()
    return sink


# -- open sinks of this process --------------------------------------------------------------------------

_open: dict[str, ExactlyOnceParquetSink] = {}
_open_lock = threading.Lock()


def open_described(description: SinkDescription) -> ExactlyOnceParquetSink:
    """The sink ``description`` opened in this process: the one opened before for its state directory, or a new
    one (waiting up to :data:`LOCK_WAIT_SECONDS` for the state directory's lock). Opening takes the lock, runs
    recovery and (at its first batch) starts the idle timer, so it happens once per state directory and process.
    """
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
        raise SinkFailedError(
            f"flush() of the sink for {description.path} ran its one-batch query on the Spark Connect server, but "
            "the query ran no batch, so nothing was written. Nothing is lost: the rows stay in the log store. Call "
            "flush() again, or restart the query (files roll by the sink's rules)."
        )


def _claim_of(url: str, options: Mapping[str, Any], name: str) -> tuple[str | None, str]:
    """The sink the claim ``name`` at ``url`` names (an output's ``_filesink.json``, a log store's ``sink.json``;
    None if there is none), and the claim's full path. Reads only."""
    storage = LogLocation(url, dict(options) if not is_local(url) else {}).open()
    try:
        data = storage.read_all(name)
    except FileNotFoundError:
        return None, storage.display(name)
    try:
        return str(json.loads(data)["sink_id"]), storage.display(name)
    except (ValueError, KeyError, TypeError):
        return f"unreadable ({data[:80]!r})", storage.display(name)


def _output_rows(output: OutputLocation) -> tuple[int, int | None, str]:
    """How many Parquet files a reader of the output sees (none under a name that starts with ``_`` or ``.``), and
    their rows, from the files' footers (None, and why, if a footer cannot be read)."""
    keys = [k for k, _ in list_objects(output) if k.endswith(".parquet") and not _hidden(k)]
    if not keys:
        return 0, 0, ""
    try:
        if output.is_local:
            root = output.local_root()
            return len(keys), sum(pq.read_metadata(root / k).num_rows for k in keys), ""
        fs, prefix = filesystem(output)

        def rows(key: str) -> int:
            with fs.open(f"{prefix}/{key}", "rb") as f:
                return int(pq.ParquetFile(f).metadata.num_rows)

        with ThreadPoolExecutor(16) as pool:
            return len(keys), sum(pool.map(rows, keys)), ""
    except Exception as e:
        return len(keys), None, f"{type(e).__name__}: {e}"


def _hidden(key: str) -> bool:
    """Whether readers skip the object ``key`` (a name in its path starts with ``_`` or ``.``)."""
    return any(part.startswith(("_", ".")) for part in key.split("/"))


_STATE_NAMES = frozenset(
    [STATE_DB_NAME, LOCK_FILE, STATE_STAGING, *(f"{STATE_DB_NAME}-{x}" for x in ("wal", "shm", "journal"))]
)
"""What a sink's start creates in its state directory, but its log store (``log/`` by default)."""


def _listdir(directory: Path) -> list[str]:
    try:
        return os.listdir(directory)
    except OSError:
        return []


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


@dataclass
class _NewState:
    """A new state directory (no state database yet) as a start found it, before it created anything: a start
    refused before it wrote outside what it can remove (the output's claim, recovery's first term) removes what it
    created, so that the refusal's "nothing was written" holds, and a later start is new again."""

    state: Path
    entries: frozenset[str]
    """The names in the state directory before the start."""
    absent: list[Path]
    """Directories the start may create that did not exist (the state directory, a local output and its
    staging directory, a local log store, and their parents), deepest first: removed if empty."""
    log_dir: Path | None
    """A local log store that held no sink's claim (so nothing else writes there)."""
    log_entries: frozenset[str]
    """The names in ``log_dir`` before the start."""
    kept: bool = False
    """Set once the start wrote what it does not remove: then it removes nothing."""
    claims_log: bool = False
    """Whether opening the log store claims a new remote location (its ``sink.json``, which is not removed): the
    start keeps what it made once the log store is open (:meth:`log_opened`)."""

    def log_opened(self) -> None:
        if self.claims_log:
            self.kept = True

    @classmethod
    def before(
        cls, state: Path, directories: list[Path], log_store: str | None, options: Mapping[str, Any]
    ) -> _NewState:
        absent: set[Path] = set()
        for directory in directories:
            for place in (directory, *directory.parents):
                if place.exists():
                    break
                absent.add(place)
        location = log_store or str(state / "log")
        claims_log = False
        log_dir = None
        if is_local(location):
            log_dir = Path(LogLocation(location).canonical)
            if (log_dir / CLAIM_FILE).exists():
                log_dir = None  # a sink's log store (rebuilt from): the start does not add to it before it claims
        else:
            # the start claims a new log store's location (its sink.json), which is not removed
            claims_log = _claim_of(location, options, CLAIM_FILE)[0] is None
        return cls(
            state=state,
            entries=frozenset(_listdir(state)),
            absent=sorted(absent, key=lambda p: len(p.parts), reverse=True),
            log_dir=log_dir,
            log_entries=frozenset(_listdir(log_dir)) if log_dir is not None else frozenset(),
            claims_log=claims_log,
        )

    def remove_created(self) -> None:
        """Remove what the start created (under the state directory's lock), unless it wrote elsewhere too."""
        if self.kept:
            return
        for name in set(_listdir(self.state)) - self.entries:
            if name in _STATE_NAMES:
                _remove(self.state / name)
        if self.log_dir is not None:
            for name in set(_listdir(self.log_dir)) - self.log_entries:
                _remove(self.log_dir / name)
        for directory in self.absent:
            with contextlib.suppress(OSError):
                directory.rmdir()


def default_parallelism(spark: Any) -> int:
    """Spark's default parallelism: the SparkContext's (classic), or under Spark Connect, which has no
    SparkContext, the number of partitions Spark gives a range (its leaf-node default parallelism)."""
    try:
        return int(spark.sparkContext.defaultParallelism)
    except Exception:
        pass
    from pyspark.sql import functions as F

    # every split of a 65,536-row range holds rows, so its distinct partition ids are its splits
    return int(spark.range(0, 1 << 16).select(F.spark_partition_id().alias("p")).distinct().count())


def _query_id(spark: Any) -> str | None:
    """The id of the streaming query whose batch is being processed, or None (no Spark context, not streaming)."""
    try:
        value = spark.sparkContext.getLocalProperty(QUERY_ID_PROPERTY)
    except Exception:
        return None
    return str(value) if value else None
