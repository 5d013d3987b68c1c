"""``ExactlyOnceParquetSink``: the object a Spark user passes to ``foreachBatch``, the sink's face.

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

The sink's roles are in modules named for them, and the sink inherits their steps (:mod:`filesink.sink.core` holds
the state they share): the start (:mod:`filesink.sink.start`: lock, claims, refusals, owner lease, recovery), a batch's
admission on the driver (:mod:`filesink.sink.batch`), the append (:mod:`filesink.sink.append`), the roll and the idle
timer (:mod:`filesink.sink.roll`). A sink unpickled from its description (:mod:`filesink.sink.description`, under Spark
Connect) opens at its first batch through :func:`filesink.sink.connect.open_described`, which keeps one open sink per
state directory and process; its ``flush()`` from a Connect client runs a one-batch query on the server
(:func:`filesink.sink.connect.flush_through_connect`).
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

import pyarrow as pa

from logstore import LogStore

from ..committer.ledger import Ledger
from ..errors import SinkOptionError
from ..metrics.figures import SinkMetrics
from ..output import OutputLocation, release_staging
from ..rolling.rollover import Rollover
from .append import Append
from .batch import BatchAdmission
from .connect import flush_through_connect, open_described, opened_here
from .connect import forget as forget
from .core import START_NOTICE as START_NOTICE
from .core import SinkStats as SinkStats
from .core import log
from .description import SinkDescription, connect_client, pickled_for_foreach_batch
from .roll import Roll
from .schema_versions import Proposed, fill_missing_columns, filled_schema, propose
from .start import SinkStart

SETTLE_TIMEOUT = 300.0
"""How long closing waits for a table's maintenance in the background (a Delta checkpoint: a fraction of a second
at 10,000 files on local disk); past it the close goes on and the checkpoint may be left unwritten, which only
makes reading the table slower."""


class ExactlyOnceParquetSink(SinkStart, BatchAdmission, Append, Roll):
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
        """Open the sink ``description`` describes, in this process (see :mod:`filesink.sink.description`)."""
        sink = cls.__new__(cls)
        sink._description = description
        sink._open()
        return sink

    # -- foreachBatch ----------------------------------------------------------------------------------

    def __call__(self, df: Any, batch_id: int) -> None:
        """Process one micro-batch: ``query = df.writeStream.foreachBatch(sink).start()``."""
        if not self._is_open:  # unpickled on a Spark Connect server: open (once per process) at the first batch
            opened = open_described(self._description, ExactlyOnceParquetSink.open_description)
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
        problems that would refuse them (:func:`filesink.sink.schema_versions.propose`): for a check of input files
        before Spark starts. None while no epoch is sealed. Records nothing. Under a Spark Connect client, where the
        sink's state is on the server, it raises :class:`SinkOptionError`."""
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
            opened = _opened_here(self._description)
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
            flush_through_connect(self._description, spark, ExactlyOnceParquetSink.open_description)
            return
        with self._lock, self._metrics.watching():
            self._check_usable()
            self._roll(force=True)

    def close(self) -> None:
        """Stop the idle-rollover timer and release the state directory. Data held stays in the log store.

        On a Spark Connect client this closes nothing: the sink lives in the server's foreachBatch process of its
        query, which ends (and with it the sink, as after a kill) when the query stops."""
        if not self._is_open:
            opened = _opened_here(self._description)
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
        """The sink's options: what it is when pickled (:mod:`filesink.sink.description`)."""
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
        """A snapshot of the sink's figures in this run (:class:`filesink.metrics.figures.SinkMetrics`): read from
        memory, cheap enough for every batch (no listing, no query, no request)."""
        return self._opened()._metrics.snapshot()

    def listen(self, listener: Callable[[dict[str, Any]], None] | None) -> None:
        """Call ``listener`` with a record of each batch and of each roll that committed files
        (:func:`filesink.metrics.figures.event_record`), in the thread that ran it; None stops it."""
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
        opened = _opened_here(self._description)
        if opened is None:
            raise SinkOptionError(
                f"the sink for {self.path} is not open in this process: created under a Spark Connect client, it "
                f"opens on the server at its first batch, and its state is there ({self.state_dir}; filesink recover "
                "status reads it on the server)."
            )
        return opened

    def _check_usable(self) -> None:
        if self._closed:
            raise SinkOptionError(f"the sink for {self.path} is closed; create a new one to write again")
        if self._timer_error is not None:
            raise self._timer_error
        self._check_no_pending()


def _described(description: SinkDescription) -> ExactlyOnceParquetSink:
    """Unpickle a sink: its description, opened at its first batch in this process."""
    sink = ExactlyOnceParquetSink.__new__(ExactlyOnceParquetSink)
    sink._description = description
    sink._describe()
    return sink


def _opened_here(description: SinkDescription) -> ExactlyOnceParquetSink | None:
    """The sink of ``description`` if it is open in this process (:func:`filesink.sink.connect.opened_here`)."""
    return cast("ExactlyOnceParquetSink | None", opened_here(description))


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
