"""The append: one Spark job per batch, each task checks its rows (:mod:`filesink.tasks.admission`) and writes one log
segment; the driver gathers the segments' descriptors for the seal, or discards them when a task refused its rows or
did not see the driver's directories.

The task's closure captures small values only (the log store's target, the writer's prefix, the admission, the
run's shared-directory check), never the sink.
"""

from __future__ import annotations

import pickle
from collections.abc import Iterator
from typing import Any

import pyarrow as pa

from logstore import VNODE_COLUMN, SegmentDescriptor, append_segment, requestcounts

from ..errors import BatchRefusedError, NotSharedError
from ..output.limits import key_limits
from ..schema.conform import hashable_columns
from ..tasks import taskrows
from ..tasks.admission import REFUSED_COLUMN, Admission, Refusal, refusal_message
from ..tasks.shared import refusal_message as unshared_message
from .core import SinkCore
from .schema_versions import NewVersion


class Append(SinkCore):
    """A batch's rows into the log store."""

    def _append(self, df: Any, epoch: int, version: NewVersion | None = None) -> list[SegmentDescriptor]:
        """Append the batch: one Spark job, each task checks its rows (:mod:`filesink.tasks.admission`) and writes one
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
