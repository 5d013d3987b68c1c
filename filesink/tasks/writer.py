"""Write one planned file from the log store as Parquet: deterministic bytes, visible only when complete.

A :class:`FileTask` names a file and the log store data it holds (a read plan). :func:`write_file` streams the
plan's batches, splits the rows by the Hive partition columns and writes one Parquet object per partition
value combination, ``<partition dirs>/<name>-<dir digest>.parquet`` (or ``<name>.parquet`` without partitioning;
:mod:`filesink.output.naming`), the directories named as Spark names them (:mod:`filesink.schema.partitioning`).

- **Bounded memory**: per partition, rows are buffered until ``row_group_rows`` of them are there, then
  written as row groups of exactly that many rows; nothing else of the file is held in memory (object store
  uploads also hold up to one upload part per open object, ``OutputLocation.part_size``).
- **Deterministic**: the objects' keys and bytes depend only on the task (plan, data and options) and on the
  pyarrow version, whose ``created_by`` string is in every file. Nothing time- or random-dependent is
  written, so re-running a task overwrites its objects with the same bytes.
- **Nothing partial is ever visible**: objects come from the output's writer interface
  (:mod:`filesink.output.objects`: local temp file + rename, S3 multipart upload) and are published only once
  every object of the task is complete. On an error, temp files are removed and uploads aborted. Objects are
  published in sorted key order; a failure (or crash) during publishing can leave a prefix of them visible,
  which is why recovery checks visibility (:mod:`filesink.output.visibility`) and a re-run rewrites the same
  bytes.
- **Fenced**: a task of writer term ``T > 0`` records its objects in the log store before publishing, so that a
  restarted sink can stop it (:mod:`filesink.output.fencing`); it then fails with :class:`FencedError`.

This module runs in Spark tasks: it imports neither the state database's side nor the sink.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from logstore import LogBatch, LogLocation, ReadItem, read_plan
from logstore.failpoints import failpoint

from ..arrowvalues import int64_scalar
from ..errors import FencedError, FileWriteError
from ..output import Fence, ObjectRecord, OutputLocation, OutputObject, object_key, open_target
from ..schema.conform import SchemaConformError, utc_labelled
from ..schema.conform import conform as conform_to
from ..schema.evolution import upgrade
from ..schema.partitioning import legacy_partition_dir, partition_dirs
from .dictionary import dictionary_columns

log = logging.getLogger(__name__)

PARQUET_FORMAT_VERSION = "2.6"

_SAME_WIDTH_INT = {16: pa.int16(), 32: pa.int32(), 64: pa.int64()}
"""The integer type a float's bits are read as, by width, to tell floats apart by their bits."""


@dataclass(frozen=True)
class FileTask:
    """One planned file, shipped to a Spark task (picklable)."""

    name: str
    """Base name without extension, e.g.
    ``part-0a1b2c3d-00000000000000000004-00000000000000000009-00000-00064-5f3e2a1c``."""
    log: LogLocation
    plan: tuple[ReadItem, ...]
    """From :meth:`logstore.LogStore.plan_read`."""
    schema_bytes: bytes
    """The sink's Arrow schema (``pa.Schema.serialize().to_pybytes()``), without the vnode column."""
    partition_by: tuple[str, ...] = ()
    row_group_rows: int = 1_000_000
    """Rows per Parquet row group (a row group is written when a partition's buffer reaches it)."""
    compression: str = "zstd"
    term: int = 0
    """The writer term of the run that planned the file (:mod:`filesink.output.fencing`); 0 writes unfenced."""
    utc_timestamps: bool = False
    """Write every timestamp with a zone labelled UTC (the same instants): a table format's files (Iceberg readers
    refuse other zones; Delta has none)."""
    legacy_names: bool = False
    """Name partitioned objects as versions before unique object names and Spark's directory text did (every
    object ``<dir>/<name>.parquet``): only recovery sets it, to rewrite a file such a version left pending."""

    @property
    def fence(self) -> Fence | None:
        return Fence(self.log, self.term) if self.term else None


@dataclass(frozen=True)
class WrittenObject:
    key: str
    """Path relative to the output root, ``/``-separated: ``<partition dirs>/<name>-<dir digest>.parquet`` or
    ``<name>.parquet``."""
    size: int
    rows: int
    footer: pq.FileMetaData | None = dataclass_field(default=None, compare=False, repr=False)
    """The object's Parquet footer (row groups, statistics), for a table's commit: a table records each file's
    statistics beside it (:mod:`filesink.destination`)."""


# -- one partition's Parquet file ----------------------------------------------------------------------------


class _PartitionWriter:
    """Buffers one partition's rows and writes them as row groups of ``row_group_rows`` rows."""

    def __init__(self, task: FileTask, schema: pa.Schema, obj: OutputObject) -> None:
        self.task = task
        self.schema = schema
        self.obj = obj
        self.key = obj.key
        self.rows = 0
        self.size = 0
        self._buffer: list[pa.RecordBatch] = []
        self._buffered = 0
        self._writer: pq.ParquetWriter | None = None
        self._footers: list[pq.FileMetaData] = []

    @contextlib.contextmanager
    def _errors(self, action: str) -> Iterator[None]:
        try:
            yield
        except (FileWriteError, FencedError):
            raise
        except Exception as e:
            raise FileWriteError(f"file {self.task.name}: cannot {action} object {self.key}: {e}") from e

    def _open(self, first: pa.Table) -> pq.ParquetWriter:
        if self._writer is None:
            failpoint("filesink.write.open.before", self.key)
            with self._errors("open"):
                sink = self.obj.open()
            failpoint("filesink.write.open.after", self.key)
            with self._errors("open"):
                self._writer = pq.ParquetWriter(
                    sink, self.schema, metadata_collector=self._footers, **parquet_options(self.task, first)
                )
        return self._writer

    def add(self, batch: pa.RecordBatch) -> None:
        self._buffer.append(batch)
        self._buffered += batch.num_rows
        self.rows += batch.num_rows
        group = self.task.row_group_rows
        if self._buffered >= group:
            table = pa.Table.from_batches(self._buffer, self.schema)
            full = self._buffered - self._buffered % group
            self._write(table.slice(0, full))
            rest = table.slice(full)
            self._buffer = [b for b in rest.to_batches() if b.num_rows]
            self._buffered = rest.num_rows

    def _write(self, table: pa.Table) -> None:
        writer = self._open(table)
        with self._errors("write"):
            writer.write_table(table, row_group_size=self.task.row_group_rows)

    def finish(self) -> None:
        """Write the buffered rows and the footer; the object is complete and durable, not yet visible."""
        if self._buffered:
            self._write(pa.Table.from_batches(self._buffer, self.schema))
        self._buffer, self._buffered = [], 0
        # a file without rows still gets its schema and footer (not ``Schema.empty_table()``: filesink.arrowvalues)
        writer = self._open(pa.Table.from_batches([], self.schema))
        with self._errors("finish"):
            writer.close()
            self.size = self.obj.finish()

    @property
    def footer(self) -> pq.FileMetaData | None:
        return self._footers[-1] if self._footers else None

    def publish(self) -> None:
        failpoint("filesink.write.publish.before", self.key)
        with self._errors("publish"):
            self.obj.publish()

    def abort(self) -> None:
        self._buffer = []
        writer, self._writer = self._writer, None
        if writer is not None and writer.is_open:
            try:
                writer.close()  # while its file is still open, so that no footer is written later from __del__
            except Exception as e:
                log.debug("closing the Parquet writer of %s during abort: %s", self.key, e)
            writer.is_open = False
        self.obj.abort()


# -- write_file ----------------------------------------------------------------------------------------------


_SCHEMA_OPTIONS: dict[str, Any] = {"version": PARQUET_FORMAT_VERSION, "store_schema": True}
"""The options that decide how a file's schema is written: shared by the files and the admission's check."""


def parquet_options(task: FileTask, first: pa.Table) -> dict[str, Any]:
    """How the task's Parquet objects are encoded (``pyarrow.parquet.ParquetWriter`` keyword arguments), for an
    object whose first rows written are ``first`` (they choose the dictionary columns: :mod:`.dictionary`)."""
    return {
        **_SCHEMA_OPTIONS,
        "compression": task.compression,
        "use_dictionary": dictionary_columns(first, task.row_group_rows),
        "write_statistics": True,
    }


def parquet_problem(schema: pa.Schema) -> str | None:
    """Why this module's Parquet files could not hold columns of ``schema``, naming the first such column, its
    type and pyarrow's reason; None when they can. It opens a writer on memory with the files' options, as the
    first step of writing a file does, so the append can refuse such rows before their epoch is sealed."""
    try:
        _open_on_memory(schema)
        return None
    except Exception as e:  # pyarrow raises ArrowNotImplementedError, ArrowInvalid, ArrowTypeError
        whole = e
    for field in schema:
        try:
            _open_on_memory(pa.schema([field]))
        except Exception as e:
            return f"column {field.name!r} of type {field.type}: a Parquet file cannot hold it ({e})"
    return f"a Parquet file cannot hold these columns together ({whole})"


def _open_on_memory(schema: pa.Schema) -> None:
    pq.ParquetWriter(pa.BufferOutputStream(), schema, **_SCHEMA_OPTIONS).close()


def file_schemas(task: FileTask) -> tuple[pa.Schema, list[str], pa.Schema]:
    """The task's rows' schema (checked against the task), its data columns, and the schema of its objects."""
    schema = pa.ipc.read_schema(pa.py_buffer(task.schema_bytes))
    _check_task(task, schema)
    data_columns = [c for c in schema.names if c not in task.partition_by]
    objects = pa.schema([schema.field(c) for c in data_columns], metadata=schema.metadata)
    return schema, data_columns, utc_labelled(objects) if task.utc_timestamps else objects


def _check_task(task: FileTask, schema: pa.Schema) -> None:
    name = task.name
    if not name or name in {".", ".."} or "/" in name or "\\" in name or "\x00" in name:
        raise ValueError(f"invalid file name {name!r}: it must be one path component")
    if isinstance(task.row_group_rows, bool) or not isinstance(task.row_group_rows, int) or task.row_group_rows < 1:
        raise ValueError(f"file {name}: row_group_rows must be a positive integer, not {task.row_group_rows!r}")
    columns = schema.names
    unknown = [c for c in task.partition_by if c not in columns]
    if unknown:
        raise ValueError(f"file {name}: partition columns {unknown} are not in the schema {columns}")
    if len(set(task.partition_by)) != len(task.partition_by):
        raise ValueError(f"file {name}: partition columns {list(task.partition_by)} are repeated")
    if len(set(columns)) != len(columns):
        raise ValueError(f"file {name}: the schema has repeated column names {columns}")
    if set(columns) <= set(task.partition_by):
        raise ValueError(f"file {name}: every column is a partition column; the files would have no columns")


def conform(batch: pa.RecordBatch, schema: pa.Schema, task: FileTask, item: LogBatch) -> pa.RecordBatch:
    """``batch`` with exactly ``schema`` (a timestamp's zone label and nested nullability conformed, as at
    admission: :mod:`filesink.schema.conform`), or FileWriteError."""
    if batch.schema.equals(schema, check_metadata=True):
        return batch
    where = f"file {task.name}: rows of vnode {item.vnode}, epoch {item.epoch}, segment {item.segment}"
    try:
        return conform_to(batch, schema, where)
    except SchemaConformError as e:
        upgraded = upgrade(batch, schema)  # rows sealed under an older schema version (filesink.schema.evolution)
        if upgraded is None:
            raise FileWriteError(str(e)) from e
        return upgraded


def split_partitions(
    batch: pa.RecordBatch, partition_by: tuple[str, ...], data_columns: list[str], *, legacy: bool = False
) -> list[tuple[str, pa.RecordBatch]]:
    """The rows of ``batch`` per partition directory (:mod:`filesink.schema.partitioning`), in input order within each,
    without the partition columns. ``legacy``: directories as versions before Spark's text named them."""
    data = batch.select(data_columns)
    if not partition_by:
        return [("", data)]
    key_columns = batch.select(list(partition_by))
    keys = pa.Table.from_batches([key_columns])

    def directories(distinct: pa.Table) -> list[str]:
        if legacy:
            return [legacy_partition_dir(partition_by, list(row.values())) for row in distinct.to_pylist()]
        return partition_dirs(distinct, partition_by)

    if batch.num_rows <= 1:
        return [(directories(keys)[0], data)] if batch.num_rows else []
    firsts, lists = key_groups(key_columns)
    dirs = directories(keys.take(firsts))
    if len(dirs) == 1:
        return [(dirs[0], data)]
    # Several key combinations can share a directory (null and "" both become the default partition, NaNs of
    # other bits, binary values with the same UTF-8 text): their rows go to one object, so merge their index lists
    # back into input order.
    per_dir: dict[str, list[pa.Array]] = {}
    for i, directory in enumerate(dirs):
        per_dir.setdefault(directory, []).append(lists[i])
    out = []
    for directory, parts in per_dir.items():
        if len(parts) == 1:
            indices = parts[0]
        else:
            merged = pa.concat_arrays(parts)
            indices = merged.take(pc.array_sort_indices(merged))
        out.append((directory, data.take(indices)))
    return out


def key_groups(keys: pa.RecordBatch) -> tuple[pa.Array, list[pa.Array]]:
    """The distinct value combinations of ``keys``' columns, in the order they first occur: for each, the index of
    the row where it first occurs, and the indices of all its rows, ascending.

    Values are told apart by their bytes (a float by its bits: each NaN, -0.0 and 0.0 a combination of its own),
    so a combination never holds rows that name two directories. Not Acero's ``group_by``: importing it imports
    ``pyarrow.dataset``, which imports pandas in every file writer (:mod:`filesink.arrowvalues`)."""
    code: pa.Array | None = None
    for column in keys.columns:
        if pa.types.is_floating(column.type):
            column = column.view(_SAME_WIDTH_INT[column.type.bit_width])
        encoded = pc.dictionary_encode(column, null_encoding="encode")
        ids = encoded.indices.cast(pa.int64())
        if code is None:
            code = ids
        else:  # both below the row count, so the product fits; encoded again to stay below it
            code = pc.dictionary_encode(pc.add(pc.multiply(code, int64_scalar(len(encoded.dictionary))), ids)).indices
    assert code is not None, "a split has at least one partition column"
    order = pc.sort_indices(code)  # stable: each combination's rows stay ascending
    ordered = code.take(order)
    starts = [0]
    if len(ordered) > 1:
        changes = pc.indices_nonzero(pc.not_equal(ordered.slice(1), ordered.slice(0, len(ordered) - 1)))
        starts += [i + 1 for i in changes.to_pylist()]
    ends = [*starts[1:], len(ordered)]
    lists = [order.slice(start, end - start) for start, end in zip(starts, ends, strict=True)]
    return pa.concat_arrays([rows.slice(0, 1) for rows in lists]), lists


def write_file(output: OutputLocation, task: FileTask) -> list[WrittenObject]:
    """Write the task's rows as Parquet objects under ``output``; return them sorted by key.

    Objects become visible only after all of them are complete, in sorted key order. Raises
    :class:`FileWriteError` for write failures (nothing new is visible unless publishing itself failed part
    way) and lets log store errors (:class:`logstore.SegmentError`) through unchanged.
    """
    schema, data_columns, file_schema = file_schemas(task)
    attempt = uuid.uuid4().hex[:12]  # this run of the task: names its temp files and its records
    fence = dataclasses.replace(task.fence, attempt=attempt) if task.fence is not None else None
    target = open_target(output, task.name, task.term, attempt, fence)
    target.check()

    partitions: dict[str, _PartitionWriter] = {}

    def partition(directory: str) -> _PartitionWriter:
        writer = partitions.get(directory)
        if writer is None:
            key = object_key(directory, task.name, shared_name=task.legacy_names)
            obj = target.new_object(key, len(partitions))
            writer = partitions[directory] = _PartitionWriter(task, file_schema, obj)
        return writer

    try:
        # On an object store the log is read ahead by threads (logstore.reader): closing the read stops them as soon
        # as this loop fails, before the objects are aborted.
        with contextlib.closing(read_plan(task.log.open(), task.plan)) as batches:
            for item in batches:
                batch = conform(item.batch, schema, task, item)
                if batch.num_rows == 0:
                    continue
                try:
                    pieces = split_partitions(batch, task.partition_by, data_columns, legacy=task.legacy_names)
                except (pa.ArrowException, ValueError, TypeError) as e:
                    raise FileWriteError(
                        f"file {task.name}: cannot split rows by {list(task.partition_by)}: {e}"
                    ) from e
                for directory, rows in pieces:
                    partition(directory).add(rows.cast(file_schema) if task.utc_timestamps else rows)
        if not task.partition_by and not partitions:
            partition("")  # exactly one object, even without rows
        ordered = [partitions[d] for d in sorted(partitions, key=lambda d: partitions[d].key)]
        for writer in ordered:
            writer.finish()
        if fence is not None:
            for index, writer in enumerate(partitions.values()):
                try:
                    writer.obj.record(task.name, index, fence, writer.size)
                except OSError as e:
                    raise FileWriteError(
                        f"file {task.name}: cannot record object {writer.key} in the log store: {e}"
                    ) from e
        target.check()  # fenced since it started? (a newer run's term record, or its staging renamed away)
        for writer in ordered:
            writer.publish()
        try:
            target.after_publish([w.obj for w in ordered])
        except OSError as e:
            raise FileWriteError(f"file {task.name}: cannot sync the directories of {ordered[0].key}: {e}") from e
    except BaseException as e:
        for writer in partitions.values():
            writer.abort()
        if isinstance(e, FencedError) and fence is not None:
            _forget_records(fence, task.name, len(partitions))
        raise
    return [WrittenObject(w.key, w.size, w.rows, w.footer) for w in ordered]


def _forget_records(fence: Fence, name: str, objects: int) -> None:
    """A fenced writer removes its records (recovery may have listed them already); best effort."""
    for index in range(objects):
        try:
            fence.forget(ObjectRecord(fence.term, name, index, "", attempt=fence.attempt))
        except Exception as e:
            log.debug("could not remove the record of object %d of %s: %s", index, name, e)
