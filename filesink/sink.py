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
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from logstore import NOTHING, VNODE_COLUMN, LogLocation, LogStore, SegmentDescriptor, append_segment
from logstore.failpoints import failpoint
from logstore.storage import is_local
from recovery.resolve import RecoveryPlan, apply_recovery

from .admission import REFUSED_COLUMN, Admission, Refusal, refusal_message
from .backlog import BacklogTracker
from .checkpoint import checkpoint_query_id
from .damage import check_planned, diagnose, given_up_line
from .description import (
    SinkDescription,
    connect_client,
    flush_through_connect,
    forget,
    open_described,
    opened_here,
    pickled_for_foreach_batch,
)
from .errors import (
    BatchRefusedError,
    CheckpointMismatchError,
    SchemaMismatchError,
    SinkFailedError,
    SinkOptionError,
    StateLostError,
)
from .ledger import Ledger, PlannedFile
from .lock import StateLock
from .output import (
    OutputLocation,
    claim_output,
    forget_committed,
    prepare_staging,
    release_staging,
    remove_failed_attempts,
)
from .output.limits import key_limits
from .partitioning import SPARK_TYPES, unsupported_columns
from .planner import file_task, plan
from .preflight import make_local_dir
from .rollover import Rollover
from .schema import (
    hashable_columns,
    repeated,
    schema_problems,
    spark_schema_json,
    unhashable_reason,
    unwritable_columns,
)
from .sizing import Sample, sample_ratio
from .writer import FileTask, WrittenObject, write_file

log = logging.getLogger(__name__)

GC_SWEEP_EVERY = 20
"""Epochs between full listings of the log store for unsealed garbage (released segments go every epoch)."""


@dataclass
class SinkStats:
    """What a sink object did since it was created (for progress displays; not persisted)."""

    batches: int = 0
    """Micro-batches appended to the log store (replays not counted)."""
    rows_in: int = 0
    """Rows appended to the log store."""
    last_epoch: int = -1
    """The last epoch sealed (also from earlier runs)."""
    file_sizes: list[int] = field(default_factory=list)
    """Sizes in bytes of the files committed, in commit order."""

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
    ) -> None:
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
        )
        if connect_client():
            self._describe()  # opens on the Spark Connect server, at its first batch there
        else:
            self._open()

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

    def _open(self) -> None:
        """Take the state directory's lock, open the log store and the output, and run recovery."""
        d = self._description
        self._describe()
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
        for directory, what in made:
            make_local_dir(directory, what)
        row_group_rows, compression, accept_state_loss = d.row_group_rows, d.compression, d.accept_state_loss
        self._row_group_rows = row_group_rows
        self._sample: Sample | None = None
        self._compression = compression
        self._accept_state_loss = bool(accept_state_loss)
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
            self._store = LogStore.open(state, log_store, vnodes=vnodes, storage_options=log_options)
            self._ledger = Ledger(self._store)

            def claim() -> None:
                where = f"state directory {state}"
                claim_output(self._output, self._store.sink_id, state=where, take_over=self._accept_state_loss)

            self._ledger.check_config(self.path, self.key_columns, self.partition_by, before_record=claim)
            claim()
            self._epochs_since_sweep = 0
            self._term = 0
            self.recovered: RecoveryPlan | None = None
            """What start-up recovery carried out."""
            self._recover()
            self.stats = SinkStats(last_epoch=self._store.last_sealed_epoch)
            self._backlog = BacklogTracker(self._store)
        except BaseException:
            store = getattr(self, "_store", None)
            if store is not None:
                store.close()
            self._state_lock.release()
            raise
        self._closed = False
        self._stop = threading.Event()
        self._timer: threading.Thread | None = None
        self._timer_error: BaseException | None = None

    # -- foreachBatch ----------------------------------------------------------------------------------

    def __call__(self, df: Any, batch_id: int) -> None:
        """Process one micro-batch: ``query = df.writeStream.foreachBatch(sink).start()``."""
        if not self._is_open:  # unpickled on a Spark Connect server: open (once per process) at the first batch
            opened = open_described(self._description)
            self.stats = opened.stats
            opened(df, batch_id)
            return
        with self._lock:
            self._check_usable()
            self.use_spark(df.sparkSession)
            last = self._check_batch(batch_id)
            if batch_id > last:
                self._check_schema(df.schema)
                descriptors = self._append(df, batch_id)
                self._store.seal(batch_id, descriptors)
                self.stats.batches += 1
                self.stats.rows_in += sum(d.rows for d in descriptors)
                self.stats.last_epoch = batch_id
            self._roll(force=False)
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
        if last == NOTHING and batch_id > 0 and not self._accept_state_loss:
            raise StateLostError(
                f"batch {batch_id} arrived, but this sink's state in {self.state_dir} is new and empty: the query's "
                "checkpoint is past batch 0, so the state this sink had was lost (deleted, or on a disk that did "
                "not outlive the driver's machine), and with it the rows it held and had not yet written. Nothing "
                "was written. Restore the state directory (and log store) the query used before; or, to accept "
                "that those rows are not in the output (or when this is a new sink for a query that ran before), "
                "create the sink with accept_state_loss=True (filesink run --accept-state-loss)."
            )
        if batch_id < last:
            raise CheckpointMismatchError(
                f"batch {batch_id} arrived, but epoch {last} is already sealed in {self.state_dir}. This happens "
                "when the query's checkpoint was reset or deleted, or when a second query writes through this "
                "state directory. Restore the checkpoint, or give the query a new state directory and output."
            )
        if query_id and recorded is None:
            self._ledger.record_query_id(query_id)
        return last

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
            self._check_schema(schema)

    def flush(self) -> None:
        """Write everything the log store holds now (for example after an available-now run).

        Under Spark Connect, where the sink lives on the server, this runs a one-batch query there that opens the
        sink, writes what it holds and closes it (:func:`filesink.description.flush_through_connect`); the query
        that writes through the sink must be stopped."""
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
        with self._lock:
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
        with self._lock:
            release_staging(self._output, self._term)
            self._store.close()
            self._state_lock.release()
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

    def _check_schema(self, schema: Any) -> None:
        self._check_columns(schema)
        current = spark_schema_json(schema)
        recorded = self._ledger.spark_schema()
        if recorded is None or (recorded != current and self._store.last_sealed_epoch == NOTHING):
            self._ledger.record_schema(current, None)  # nothing sealed yet: the schema may still change
            return
        problems = schema_problems(recorded, current)
        if problems:
            raise SchemaMismatchError(
                f"the batch's schema differs from the one this sink was created with: {'; '.join(problems)}. "
                "Nothing of this batch was written. A sink keeps one schema; write a changed schema to a new sink."
            )

    def _append(self, df: Any, epoch: int) -> list[SegmentDescriptor]:
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
        admission = Admission(epoch, self._ledger.arrow_schema(), tuple(self.partition_by), limits)

        def append_task(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
            from pyspark import TaskContext

            ctx = TaskContext.get()
            writer = term_prefix + (f"p{ctx.partitionId()}-a{ctx.attemptNumber()}" if ctx else "driver")
            try:
                rows = admission.admit(b.rename_columns(names) for b in batches)
            except Refusal as e:
                yield pa.record_batch([pa.nulls(1, pa.binary()), pa.array([str(e)])], names=_APPEND_COLUMNS)
                return
            descriptor = append_segment(target, epoch, rows, writer_id=writer)
            if descriptor is not None:
                yield pa.record_batch(
                    [pa.array([pickle.dumps(descriptor)], pa.binary()), pa.nulls(1, pa.string())],
                    names=_APPEND_COLUMNS,
                )

        rows = positional.withColumn(VNODE_COLUMN, vnode).mapInArrow(append_task, _APPEND_SCHEMA).collect()
        descriptors = [pickle.loads(r.descriptor) for r in rows if r.descriptor is not None]
        refused = [r[REFUSED_COLUMN] for r in rows if r[REFUSED_COLUMN] is not None]
        if refused:
            self._store.discard(epoch, descriptors)
            raise BatchRefusedError(refusal_message(epoch, refused))
        return descriptors

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
        )

    def _write(self, files: list[PlannedFile]) -> dict[str, list[WrittenObject]]:
        """Write the planned files, one Spark task per file (in this process when there is no Spark yet)."""
        tasks = [self._file_task(f, self._term) for f in files]
        output = self._output
        if self._spark is None:
            return {t.name: write_file(output, t) for t in tasks}

        def write_task(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
            for batch in batches:
                for index in batch.column(0).to_pylist():
                    task = tasks[index]
                    objects = pickle.dumps(write_file(output, task))
                    yield pa.record_batch(
                        [pa.array([task.name]), pa.array([objects], pa.binary())], names=["name", "objects"]
                    )

        # A mapInArrow job like the append (task i writes file i), not an RDD job: Spark runs both on the same
        # pool of Python workers, which are running and have their modules imported already, instead of
        # starting a second pool of workers for the files.
        count = len(tasks)
        jobs = self._spark.range(0, count, 1, count).mapInArrow(write_task, "name string, objects binary")
        return {r.name: pickle.loads(r.objects) for r in jobs.collect()}

    def _plan(self, *, force: bool) -> tuple[list[PlannedFile], list[int]]:
        """Plan files with the best estimate of Parquet bytes per log byte: learned from the latest committed
        files or, before the first, measured on a sample of the held rows (:mod:`filesink.sizing`). A sample is
        encoded when the size rule would close a file with more rows than the last sample had, up to one row
        group of them: the estimate improves as the backlog grows, and a new sink's first files reach the target.
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
            larger = [f for f in files if f.reason == "size" and f.rows > sampled]
            if not larger:
                return files, idle
            largest = max(larger, key=lambda f: f.rows)
            self._sample = sample_ratio(self._file_task(largest, self._term), self._row_group_rows)

    def _roll(self, *, force: bool) -> None:
        failpoint("filesink.plan.before")
        try:
            files, idle = self._plan(force=force)
        except Exception as e:  # the size sample reads held rows: a damaged segment stops it
            damage = diagnose(self._store, e, None, "plan files")
            if damage is None:
                raise
            raise damage from e
        written: dict[str, list[WrittenObject]] = {}
        if files:
            check_planned(self._store, files)  # a missing segment stops the roll before its pre-commit
            failpoint("filesink.precommit.before")
            self._ledger.precommit(files, self._term)
            failpoint("filesink.precommit.after")
            try:
                written = self._write(files)
            except Exception as e:
                damage = diagnose(self._store, e, files, f"write {len(files)} files")
                if damage is None:
                    raise
                raise damage from e
            failpoint("filesink.write.after")
        sizes = {name: sum(o.size for o in objects) for name, objects in written.items()}
        if files:
            failpoint("filesink.commit.before")
        self._ledger.commit(files, sizes, idle, self._term)
        if files:
            failpoint("filesink.commit.after")
            self.stats.file_sizes.extend(sizes[f.name] for f in files)
            forget_committed(self._store.storage, self._term, written)
            self._remove_failed_attempts(written)
        self._epochs_since_sweep += 1
        sweep = self._epochs_since_sweep >= GC_SWEEP_EVERY
        if sweep:
            self._epochs_since_sweep = 0
        self._store.collect_garbage(sweep=sweep)

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
            self._store, self._ledger, self._output, partitioned=bool(self.partition_by), file_task=self._file_task
        )
        assert done.term is not None
        self._term = done.term
        self.recovered = done
        self.given_up = self._store.given_up()
        """The damaged segments given up so far (``filesink recover apply --drop-damaged``), said once at start."""
        if self.given_up:
            log.warning("sink %s: %s", self._store.sink_id, given_up_line(self.given_up))
        if self._store.rebuilt:
            held = self._store.held_totals()
            log.warning(
                "sink %s: the state directory %s was new, so its state was rebuilt from the durable home at %s: "
                "last sealed epoch %d, %d epochs held (%d rows), %d pending files resolved",
                self._store.sink_id,
                self.state_dir,
                self._store.location.canonical,
                self._store.last_sealed_epoch,
                held.epochs,
                held.rows,
                len(done.from_home),
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
                self._timer_error = e
                return


_APPEND_COLUMNS = ["descriptor", REFUSED_COLUMN]
_APPEND_SCHEMA = f"descriptor binary, {REFUSED_COLUMN} string"
"""What each append task returns: its segment's pickled descriptor, or the reason it refused its rows."""

QUERY_ID_PROPERTY = "sql.streaming.queryId"
"""The Spark local property that holds the running streaming query's id (kept in its checkpoint) in foreachBatch."""


def _described(description: SinkDescription) -> ExactlyOnceParquetSink:
    """Unpickle a sink: its description, opened at its first batch in this process."""
    sink = ExactlyOnceParquetSink.__new__(ExactlyOnceParquetSink)
    sink._description = description
    sink._describe()
    return sink


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
