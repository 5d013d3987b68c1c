"""Write one planned file from the log store as Parquet: deterministic bytes, visible only when complete.

A :class:`FileTask` names a file and the log store data it holds (a read plan). :func:`write_file` streams the
plan's batches, splits the rows by the Hive partition columns and writes one Parquet object per partition
value combination, ``<partition dirs>/<name>.parquet`` (or ``<name>.parquet`` without partitioning).

- **Bounded memory**: per partition, rows are buffered until ``row_group_rows`` of them are there, then
  written as row groups of exactly that many rows; nothing else of the file is held in memory (object store
  uploads also hold up to one upload part per open object, ``OutputLocation.part_size``).
- **Deterministic**: the objects' keys and bytes depend only on the task (plan, data and options) and on the
  pyarrow version, whose ``created_by`` string is in every file. Nothing time- or random-dependent is
  written, so re-running a task overwrites its objects with the same bytes.
- **Nothing partial is ever visible**: local objects are written to temp files in a staging directory
  (outside the output directory), fsynced, and renamed into place only once every object of the task is
  complete; S3 objects are multipart uploads (:mod:`filesink.upload`) that only ``CompleteMultipartUpload``
  makes visible, completed only once every object of the task is complete. On an error, temp files are
  removed and uploads aborted. Objects are published in sorted key order; a failure (or crash) during
  publishing can leave a prefix of them visible, which is why recovery checks visibility with
  :func:`object_keys` and a re-run rewrites the same bytes.
- **Fenced**: a task of writer term ``T > 0`` writes its temp files in the term's staging directory and
  records its uploads and object sizes in the log store, so that a restarted sink can stop it from
  publishing (:mod:`filesink.fencing`); it then fails with :class:`FencedError`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import threading
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Protocol

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from logstore import LogBatch, LogLocation, ReadItem, read_plan
from logstore.failpoints import failpoint
from logstore.storage import ensure_dir, fsync_dir, is_local, s3_client_options, storage_error

from .errors import FencedError, FileWriteError
from .fencing import Fence, ObjectRecord, term_dir
from .partitioning import partition_dir
from .upload import DEFAULT_PART_SIZE, MultipartObject

log = logging.getLogger(__name__)

SUFFIX = ".parquet"
STAGING_SUFFIX = ".filesink-staging"
"""The default staging directory of a local output ``<parent>/<dir>`` is ``<parent>/.<dir>.filesink-staging``."""
PARQUET_FORMAT_VERSION = "2.6"
MULTIPART_PROTOCOLS = frozenset({"s3", "s3a"})
"""fsspec protocols written with multipart uploads (nothing visible before ``CompleteMultipartUpload``)."""

_ROW_INDEX = "__filesink_row_index__"


@dataclass(frozen=True)
class OutputLocation:
    """Where the sink's Parquet files go. Picklable."""

    url: str
    """A local directory path (or ``file://`` URL), or an fsspec URL such as ``s3://bucket/table``."""
    storage_options: Mapping[str, Any] = field(default_factory=dict, hash=False, compare=False)
    staging_dir: str | None = None
    """Local output only: the directory for temp files (same file system as ``url``, outside it). Default:
    ``.<output dir name>.filesink-staging`` next to the output directory."""
    part_size: int = DEFAULT_PART_SIZE
    """S3 output only: the size of an upload part, which is also what each open object buffers."""

    @property
    def is_local(self) -> bool:
        return is_local(self.url)

    def local_root(self) -> Path:
        return Path(self.url.removeprefix("file://")).expanduser().absolute()

    def local_staging(self) -> Path:
        root = self.local_root()
        if self.staging_dir is not None:
            staging = Path(self.staging_dir.removeprefix("file://")).expanduser().absolute()
            if staging == root or staging.is_relative_to(root):
                raise ValueError(
                    f"staging directory {staging} is inside the output directory {root}; readers listing the "
                    "output would see temp files. Put it next to the output directory, on the same file system."
                )
            return staging
        if not root.name:
            raise ValueError(f"output directory {root} has no name; give a staging_dir")
        return root.parent / f".{root.name}{STAGING_SUFFIX}"


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
    """The writer term of the run that planned the file (:mod:`filesink.fencing`); 0 writes unfenced."""

    @property
    def fence(self) -> Fence | None:
        return Fence(self.log, self.term) if self.term else None


@dataclass(frozen=True)
class WrittenObject:
    key: str
    """Path relative to the output root, ``/``-separated: ``<partition dirs>/<name>.parquet`` or ``<name>.parquet``."""
    size: int
    rows: int


# -- filesystems ---------------------------------------------------------------------------------------------

_fs_lock = threading.Lock()
_fs_cache: dict[tuple[int, str, str], tuple[Any, str]] = {}


def output_filesystem(output: OutputLocation) -> tuple[Any, str]:
    """The fsspec filesystem and root path (no protocol, no trailing ``/``) of a non-local output.

    Cached per process and per (URL, storage options); the options are only used as a cache key in memory.
    S3 clients get botocore's retry configuration and timeouts by default (:func:`logstore.storage.s3_client_options`).
    """
    options = dict(output.storage_options)
    cache_key = (os.getpid(), output.url, json.dumps(options, sort_keys=True, default=repr))
    with _fs_lock:
        found = _fs_cache.get(cache_key)
        if found is None:
            import fsspec

            fs, root = fsspec.core.url_to_fs(output.url, **s3_client_options(output.url, options))
            found = _fs_cache[cache_key] = (fs, root.rstrip("/"))
        return found


def _protocols(fs: Any) -> set[str]:
    protocol = fs.protocol
    return set(protocol) if isinstance(protocol, tuple | list) else {protocol}


# -- objects being written -----------------------------------------------------------------------------------


class _Object(Protocol):
    """One object of a task: opened and written, then finished, then published; or aborted."""

    key: str

    def open(self) -> BinaryIO: ...

    def finish(self) -> int:
        """Make the written bytes complete and durable (not visible); return the object's size."""

    def record(self, name: str, index: int, fence: Fence, size: int) -> None:
        """Record the complete object for recovery (before it is published)."""

    def publish(self) -> None:
        """Make the object visible under its key."""

    def abort(self) -> None:
        """Remove what was written (never raises); a published object stays."""


def _staging_gone(where: str, staging: Path, term: int) -> FencedError:
    return FencedError(
        f"{where}: this writer belongs to writer term {term}, whose staging directory {staging} is gone: the sink "
        "has restarted since this writer started, so it must not publish. Recovery has resolved or will resolve "
        "this file."
    )


class _LocalObject:
    def __init__(self, root: Path, staging: Path, key: str, temp_name: str, term: int) -> None:
        self.key = key
        self.final = root / key
        self.temp = staging / temp_name
        self.term = term
        self.fenced = term > 0
        self._file: BinaryIO | None = None

    def _gone(self, action: str) -> FencedError:
        return _staging_gone(f"cannot {action} {self.key}", self.temp.parent, self.term)

    def open(self) -> BinaryIO:
        if not self.fenced:
            ensure_dir(self.temp.parent)
        try:
            self._file = open(self.temp, "xb")  # noqa: SIM115 - closed by finish() or abort()
        except FileNotFoundError:
            if self.fenced and not self.temp.parent.is_dir():
                raise self._gone("open a temp file for") from None
            raise
        return self._file

    def finish(self) -> int:
        assert self._file is not None
        f, self._file = self._file, None
        try:
            f.flush()
            os.fsync(f.fileno())
            return os.fstat(f.fileno()).st_size
        finally:
            f.close()

    def record(self, name: str, index: int, fence: Fence, size: int) -> None:
        fence.record(ObjectRecord(fence.term, name, index, self.key, None, size, fence.attempt))

    def publish(self) -> None:
        ensure_dir(self.final.parent)  # fsyncs the parents of the directories it creates
        try:
            os.replace(self.temp, self.final)  # atomic against recovery renaming the term's staging directory
        except FileNotFoundError:
            if self.fenced and not self.temp.parent.is_dir():
                raise self._gone("publish") from None
            raise

    def abort(self) -> None:
        if self._file is not None:
            with contextlib.suppress(OSError):
                self._file.close()
            self._file = None
        try:
            self.temp.unlink(missing_ok=True)
        except OSError as e:
            log.warning("could not remove temp file %s: %s", self.temp, e)


class _UploadObject:
    """An S3 object written as a multipart upload; with a fence, its upload id is recorded before any part."""

    def __init__(
        self, fs: Any, path: str, key: str, index: int, part_size: int, name: str, fence: Fence | None
    ) -> None:
        self.key = key
        self.index = index
        self.name = name
        self.fence = fence
        self.upload = MultipartObject(
            fs, path, part_size=part_size, on_create=self._created, on_gone=self._gone if fence else None
        )
        self._published = False

    def _created(self, upload_id: str) -> None:
        if self.fence is None:
            return
        self.fence.record(
            ObjectRecord(self.fence.term, self.name, self.index, self.key, upload_id, attempt=self.fence.attempt)
        )
        try:
            self.fence.check(f"file {self.name}, object {self.key}")
        except FencedError:
            self.upload.abort()  # write_file removes the records
            raise

    def open(self) -> BinaryIO:
        return self.upload  # type: ignore[return-value]

    def finish(self) -> int:
        self.upload.close()  # uploads the last part; nothing is visible until complete()
        return self.upload.size

    def record(self, name: str, index: int, fence: Fence, size: int) -> None:
        fence.record(ObjectRecord(fence.term, name, index, self.key, self.upload.upload_id, size, fence.attempt))

    def _gone(self) -> FencedError:
        term = self.fence.term if self.fence else 0
        return FencedError(
            f"file {self.name}: the upload of {self.key} was aborted: the sink has restarted since this writer of "
            f"writer term {term} started, or another attempt of this task has published and committed the file "
            "already; this writer must not publish. Recovery has resolved or will resolve this file."
        )

    def publish(self) -> None:
        if not self.upload.complete() and self.fence is not None:
            # Found completed already (an answer lost on the way, or an identical writer): a writer fenced
            # meanwhile must still stop, as the restarted sink owns the file.
            self.fence.check(f"file {self.name}, object {self.key}")
        self._published = True

    def abort(self) -> None:
        if not self._published:
            self.upload.abort()


class _Target(Protocol):
    def new_object(self, key: str, index: int) -> _Object: ...

    def check(self) -> None:
        """Fail early if the writer is fenced already."""

    def after_publish(self, objects: Sequence[_Object]) -> None: ...


class _LocalTarget:
    def __init__(self, output: OutputLocation, task: FileTask, attempt: str) -> None:
        self.root = output.local_root()
        self.term = task.term
        self.fenced = task.term > 0
        self.staging = output.local_staging() / term_dir(task.term) if self.fenced else output.local_staging()
        self.name = task.name
        self.run = attempt  # only temp names are random; they never become visible

    def new_object(self, key: str, index: int) -> _Object:
        return _LocalObject(self.root, self.staging, key, f".{self.name}.{index:05d}.{self.run}.tmp", self.term)

    def check(self) -> None:
        if self.fenced and not self.staging.is_dir():
            raise _staging_gone(f"file {self.name}", self.staging, self.term)

    def after_publish(self, objects: Sequence[_Object]) -> None:
        for directory in sorted({(self.root / o.key).parent for o in objects}):
            fsync_dir(directory)


class _UploadTarget:
    def __init__(self, output: OutputLocation, task: FileTask, fence: Fence | None) -> None:
        self.fs, self.root = output_filesystem(output)
        protocols = _protocols(self.fs)
        if not protocols & MULTIPART_PROTOCOLS:
            raise ValueError(
                f"output {output.url}: protocol {'/'.join(sorted(protocols))} is not supported; the writer needs "
                "files that stay invisible until committed (local directories and S3 are supported)"
            )
        self.part_size = output.part_size
        self.task = task
        self.fence = fence

    def new_object(self, key: str, index: int) -> _Object:
        path = f"{self.root}/{key}"
        return _UploadObject(self.fs, path, key, index, self.part_size, self.task.name, self.fence)

    def check(self) -> None:
        fence = self.task.fence
        if fence is not None:
            fence.check(f"file {self.task.name}")

    def after_publish(self, objects: Sequence[_Object]) -> None:
        return None


# -- one partition's Parquet file ----------------------------------------------------------------------------


class _PartitionWriter:
    """Buffers one partition's rows and writes them as row groups of ``row_group_rows`` rows."""

    def __init__(self, task: FileTask, schema: pa.Schema, obj: _Object) -> None:
        self.task = task
        self.schema = schema
        self.obj = obj
        self.key = obj.key
        self.rows = 0
        self.size = 0
        self._buffer: list[pa.RecordBatch] = []
        self._buffered = 0
        self._writer: pq.ParquetWriter | None = None

    @contextlib.contextmanager
    def _errors(self, action: str) -> Iterator[None]:
        try:
            yield
        except (FileWriteError, FencedError):
            raise
        except Exception as e:
            raise FileWriteError(f"file {self.task.name}: cannot {action} object {self.key}: {e}") from e

    def _open(self) -> pq.ParquetWriter:
        if self._writer is None:
            failpoint("filesink.write.open.before", self.key)
            with self._errors("open"):
                sink = self.obj.open()
            failpoint("filesink.write.open.after", self.key)
            with self._errors("open"):
                self._writer = pq.ParquetWriter(sink, self.schema, **parquet_options(self.task))
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
        writer = self._open()
        with self._errors("write"):
            writer.write_table(table, row_group_size=self.task.row_group_rows)

    def finish(self) -> None:
        """Write the buffered rows and the footer; the object is complete and durable, not yet visible."""
        if self._buffered:
            self._write(pa.Table.from_batches(self._buffer, self.schema))
        self._buffer, self._buffered = [], 0
        writer = self._open()  # a file without rows still gets its schema and footer
        with self._errors("finish"):
            writer.close()
            self.size = self.obj.finish()

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


def parquet_options(task: FileTask) -> dict[str, Any]:
    """How the task's Parquet objects are encoded (``pyarrow.parquet.ParquetWriter`` keyword arguments)."""
    return {
        "version": PARQUET_FORMAT_VERSION,
        "compression": task.compression,
        "use_dictionary": True,
        "write_statistics": True,
        "store_schema": True,
    }


def file_schemas(task: FileTask) -> tuple[pa.Schema, list[str], pa.Schema]:
    """The task's rows' schema (checked against the task), its data columns, and the schema of its objects."""
    schema = pa.ipc.read_schema(pa.py_buffer(task.schema_bytes))
    _check_task(task, schema)
    data_columns = [c for c in schema.names if c not in task.partition_by]
    return schema, data_columns, pa.schema([schema.field(c) for c in data_columns], metadata=schema.metadata)


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
    """``batch`` with exactly ``schema`` (field metadata and nullability from it), or FileWriteError."""
    if batch.schema.equals(schema, check_metadata=True):
        return batch
    where = f"file {task.name}: rows of vnode {item.vnode}, epoch {item.epoch}, segment {item.segment}"
    names = batch.schema.names
    for column in schema.names:
        if column not in names:
            raise FileWriteError(f"{where} lack column {column!r} of the sink schema")
    for column in names:
        if column not in schema.names:
            raise FileWriteError(f"{where} have column {column!r}, which the sink schema does not have")
    if names != schema.names:
        column = next(a for a, b in zip(names, schema.names, strict=True) if a != b)
        raise FileWriteError(f"{where} have column {column!r} out of place: {names}, expected {schema.names}")
    for got, expected in zip(batch.schema, schema, strict=True):
        if not got.type.equals(expected.type, check_metadata=True):
            raise FileWriteError(
                f"{where} have column {got.name!r} of type {got.type}, the sink schema says {expected.type}"
            )
        if not expected.nullable and batch.column(got.name).null_count:
            raise FileWriteError(f"{where} have nulls in column {got.name!r}, which the sink schema declares not null")
    return pa.RecordBatch.from_arrays(batch.columns, schema=schema)


def split_partitions(
    batch: pa.RecordBatch, partition_by: tuple[str, ...], data_columns: list[str]
) -> list[tuple[str, pa.RecordBatch]]:
    """The rows of ``batch`` per partition directory, in input order within each, without the partition columns."""
    data = batch.select(data_columns)
    if not partition_by:
        return [("", data)]
    keys = pa.Table.from_batches([batch.select(list(partition_by))])
    if batch.num_rows == 1:
        return [(partition_dir(partition_by, list(keys.to_pylist()[0].values())), data)]
    # Row indices 0..n-1 (indices of an all-true mask), listed per distinct key combination; without threads
    # the hash aggregation consumes rows in order, so each list is ascending.
    keys = keys.append_column(_ROW_INDEX, pc.indices_nonzero(pc.is_null(pa.nulls(batch.num_rows))))
    groups = keys.group_by(list(partition_by), use_threads=False).aggregate([(_ROW_INDEX, "list")])
    lists = groups.column(f"{_ROW_INDEX}_list")
    values = groups.select(list(partition_by)).to_pylist()
    if len(values) == 1:
        return [(partition_dir(partition_by, list(values[0].values())), data)]
    # Several key combinations can share a directory (null and "" both become the default partition): their
    # rows go to one file, so merge their index lists back into input order.
    per_dir: dict[str, list[pa.Array]] = {}
    for i, row in enumerate(values):
        per_dir.setdefault(partition_dir(partition_by, list(row.values())), []).append(lists[i].values)
    out = []
    for directory, parts in per_dir.items():
        if len(parts) == 1:
            indices = parts[0]
        else:
            merged = pa.concat_arrays(parts)
            indices = merged.take(pc.array_sort_indices(merged))
        out.append((directory, data.take(indices)))
    return out


def write_file(output: OutputLocation, task: FileTask) -> list[WrittenObject]:
    """Write the task's rows as Parquet objects under ``output``; return them sorted by key.

    Objects become visible only after all of them are complete, in sorted key order. Raises
    :class:`FileWriteError` for write failures (nothing new is visible unless publishing itself failed part
    way) and lets log store errors (:class:`logstore.SegmentError`) through unchanged.
    """
    schema, data_columns, file_schema = file_schemas(task)
    attempt = uuid.uuid4().hex[:12]  # this run of the task: names its temp files and its records
    fence = dataclasses.replace(task.fence, attempt=attempt) if task.fence is not None else None
    target: _Target = _LocalTarget(output, task, attempt) if output.is_local else _UploadTarget(output, task, fence)
    target.check()
    suffix = f"{task.name}{SUFFIX}"

    partitions: dict[str, _PartitionWriter] = {}

    def partition(directory: str) -> _PartitionWriter:
        writer = partitions.get(directory)
        if writer is None:
            key = f"{directory}/{suffix}" if directory else suffix
            obj = target.new_object(key, len(partitions))
            writer = partitions[directory] = _PartitionWriter(task, file_schema, obj)
        return writer

    try:
        for item in read_plan(task.log.open(), task.plan):
            batch = conform(item.batch, schema, task, item)
            if batch.num_rows == 0:
                continue
            try:
                pieces = split_partitions(batch, task.partition_by, data_columns)
            except (pa.ArrowException, ValueError) as e:
                raise FileWriteError(f"file {task.name}: cannot split rows by {list(task.partition_by)}: {e}") from e
            for directory, rows in pieces:
                partition(directory).add(rows)
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
    return [WrittenObject(w.key, w.size, w.rows) for w in ordered]


def _forget_records(fence: Fence, name: str, objects: int) -> None:
    """A fenced writer removes its records (recovery may have listed them already); best effort."""
    for index in range(objects):
        try:
            fence.forget(ObjectRecord(fence.term, name, index, "", attempt=fence.attempt))
        except Exception as e:
            log.debug("could not remove the record of object %d of %s: %s", index, name, e)


# -- object_keys ---------------------------------------------------------------------------------------------


def object_keys(output: OutputLocation, name: str) -> list[tuple[str, int]]:
    """Every visible ``<...>/<name>.parquet`` under the output, as (key relative to the root, size), sorted."""
    basename = f"{name}{SUFFIX}"
    found: list[tuple[str, int]] = []
    if output.is_local:
        root = output.local_root()
        for dirpath, _dirs, files in os.walk(root):
            if basename in files:
                path = Path(dirpath) / basename
                try:
                    size = path.stat().st_size
                except FileNotFoundError:
                    continue
                found.append((path.relative_to(root).as_posix(), size))
        return sorted(found)
    fs, prefix = output_filesystem(output)
    fs.invalidate_cache()
    try:
        listing = fs.find(prefix, detail=True)  # s3fs: an undelimited listing of the prefix
    except FileNotFoundError:
        return []
    except OSError as e:
        raise storage_error(f"file {name}: cannot list {output.url} for its objects", e) from e
    for path, info in listing.items():
        if info.get("type") == "directory" or not path.startswith(prefix + "/"):
            continue
        key = path[len(prefix) + 1 :]
        if key.rsplit("/", 1)[-1] == basename:
            found.append((key, int(info.get("size") or 0)))
    return sorted(found)


def staging_files(output: OutputLocation) -> list[Path]:
    """The temp files writers left in a local output's staging directory (names this module gives them)."""
    if not output.is_local:
        return []
    staging = output.local_staging()
    return sorted(staging.glob(".part-*.tmp")) if staging.is_dir() else []


def clear_staging(output: OutputLocation) -> int:
    """Delete :func:`staging_files`; return how many. Only while no writer of this sink can run."""
    found = staging_files(output)
    for path in found:
        path.unlink(missing_ok=True)
    return len(found)
