"""What a batch's rows must pass before they enter the log store.

Everything a file writer could refuse later is refused here, in the append tasks, before the epoch is sealed: a
refusal after the seal would hold the epoch's rows, and every row after them on the same vnodes, back for good.

The driver makes one :class:`Admission` per batch (picklable) and ships it to the append tasks; each task runs
:meth:`Admission.admit` on its rows before it writes its segment. A task that refuses reports the refusal as a
row instead of failing, so the driver gets the message itself rather than a Spark traceback; the driver deletes the
segments the other tasks wrote for the batch and raises :class:`~filesink.errors.BatchRefusedError`. Nothing of
the batch is sealed, and Spark keeps the batch in its checkpoint until the query runs again.

Checks, in order:

1. **Schema** (:mod:`filesink.schema.conform`): the rows are conformed to the files' Arrow schema recorded with the
first
   batch (a timestamp's time zone label, nested nullability), or refused naming the column and both types.
2. **Parquet** (:func:`filesink.tasks.writer.parquet_problem`): a Parquet file can hold the columns the files get (every
   column but the partition columns), checked once per task by opening a writer on memory with the files' options,
   or the batch is refused naming the column and its type. The driver refuses the types it knows of earlier, from
   the Spark schema (:func:`filesink.schema.conform.unwritable_columns`); this check covers what the Arrow types hold.
3. **Partition paths** (:func:`filesink.schema.partitioning.check_paths`): every row's partition directories, and the
   whole key of its object, fit the output's limits (:mod:`filesink.output.limits`: 255 bytes a directory name,
   1,024 bytes an S3 key, ``PATH_MAX`` a local path), or the batch is refused naming the column, the value's start
   and the limit.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import pyarrow as pa

from logstore import VNODE_COLUMN
from logstore.diagnosis import told

from ..output.limits import KeyLimits
from ..schema.conform import SchemaConformError, conform, file_schema
from ..schema.partitioning import PartitionTypeError, check_paths
from .writer import parquet_problem

REFUSED_COLUMN = "refused"
"""The column in which an append task reports a refusal (the rest of its row is null)."""


@dataclass(frozen=True)
class Admission:
    """The checks of one batch, shipped to its append tasks (picklable)."""

    epoch: int
    file_schema: bytes | None = None
    """The files' Arrow schema (:func:`filesink.schema.conform.file_schema`), None before the first batch with rows."""
    partition_by: tuple[str, ...] = ()
    limits: KeyLimits | None = None
    """What the output's keys may be (:func:`filesink.output.limits.key_limits`); None checks no paths."""

    def admit(self, batches: Iterable[pa.RecordBatch]) -> list[pa.RecordBatch]:
        """The task's rows as they enter the log store, or :class:`Refusal` saying what is wrong and what to do."""
        schema = pa.ipc.read_schema(pa.py_buffer(self.file_schema)) if self.file_schema is not None else None
        admitted: list[pa.RecordBatch] = []
        for batch in batches:
            if not admitted:
                self._check_parquet(batch.schema)  # a task's batches share one schema (one Arrow stream)
            if schema is not None:
                where = f"rows of batch {self.epoch}"
                try:
                    batch = conform(batch, schema, where, keep=(VNODE_COLUMN,))
                except SchemaConformError as e:
                    raise Refusal(
                        f"{told(e)}. The sink writes one schema, recorded with its first batch: make the query "
                        "produce that type again (cast the column in the query), or write the changed schema to a "
                        "new sink (new state directory, log store and output)"
                    ) from e
            if self.partition_by and self.limits is not None:
                try:
                    problem = check_paths(batch, self.partition_by, self.limits)
                except PartitionTypeError as e:
                    problem = str(e)
                if problem is not None:
                    raise Refusal(f"rows of batch {self.epoch}: {problem}")
            admitted.append(batch)
        return admitted

    def _check_parquet(self, schema: pa.Schema) -> None:
        columns = [f for f in schema if f.name != VNODE_COLUMN and f.name not in self.partition_by]
        problem = parquet_problem(file_schema(pa.schema(columns)))
        if problem is not None:
            raise Refusal(
                f"rows of batch {self.epoch}: {problem}. Change that column in the query: cast it to a type a "
                "Parquet file holds, or drop it"
            )


class Refusal(Exception):
    """Raised in an append task by :meth:`Admission.admit`; reported to the driver as a row."""


def refusal_message(epoch: int, reasons: list[str]) -> str:
    """The driver's message for a refused batch: the first task's reason, and how many tasks refused."""
    more = f" ({len(reasons) - 1} more tasks refused rows of this batch too)" if len(reasons) > 1 else ""
    return (
        f"batch {epoch} was refused before it was sealed: {reasons[0]}{more}. Nothing of this batch is in the log "
        "store, and Spark keeps it in the query's checkpoint: fix the cause and start the query again."
    )
