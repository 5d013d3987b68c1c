"""A batch's admission on the driver, before anything of it is written: whose batch it is (the query's id, the
batch id against the last sealed epoch: a replay, a gap, a state behind the checkpoint, batch 0 at an output that
holds rows), what its columns may be, and its schema against the sink's history (a new version recorded before the
seal). What each row must pass is checked in the append tasks (:mod:`filesink.tasks.admission`); the schema history is
:mod:`filesink.sink.schema_versions`'s.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from logstore import NOTHING, VNODE_COLUMN, SegmentDescriptor, guards
from logstore.storage import is_local

from ..errors import (
    CheckpointMismatchError,
    OutputHasRowsError,
    SchemaMismatchError,
    SinkOptionError,
    StateBehindError,
    StateLostError,
    TableFormatError,
)
from ..output import CLAIM_NAME, OutputLocation, list_objects
from ..output.location import filesystem
from ..schema.conform import (
    arrow_schema_of,
    arrow_zone,
    hashable_columns,
    repeated,
    unhashable_reason,
    unwritable_columns,
)
from ..schema.partitioning import SPARK_TYPES, unsupported_columns
from .checkpoint import checkpoint_query_id
from .core import STATE_NAMES, SinkCore, listdir, log
from .schema_versions import NewVersion, SchemaTaken, check_batch_schema


class BatchAdmission(SinkCore):
    """The driver's checks of a batch, and the schema version it records."""

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
        names = sorted(n for n in listdir(self.state_dir) if n in STATE_NAMES or n == "log")
        text = f"This sink's state in {self.state_dir} ({', '.join(names)}) holds nothing sealed"
        location = self._store.location
        if not is_local(location.url) or Path(location.canonical).parent != self.state_dir:
            text += f", and its log store at {location.canonical} only its empty durable home"
        return (
            text + ": safe to delete once the sink is closed (the query stopped), or to keep, since a start with "
            "it goes on as one with a new state does."
        )

    def _checkpoint_query_id(self) -> str | None:
        """The query id from ``checkpoint_location`` (read once), where Spark does not say it (Spark Connect)."""
        location = self._description.checkpoint_location
        if location is None:  # a classic sink outside a streaming query; under Connect the option is required
            return None
        if self._checkpoint_id is None:
            self._checkpoint_id = checkpoint_query_id(location, self._description.storage_options)
        return self._checkpoint_id

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


QUERY_ID_PROPERTY = "sql.streaming.queryId"
"""The Spark local property that holds the running streaming query's id (kept in its checkpoint) in foreachBatch."""


def _query_id(spark: Any) -> str | None:
    """The id of the streaming query whose batch is being processed, or None (no Spark context, not streaming)."""
    try:
        value = spark.sparkContext.getLocalProperty(QUERY_ID_PROPERTY)
    except Exception:
        return None
    return str(value) if value else None


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
