"""The one module that touches log store files: local disk through ``os``, anything else through fsspec.

Local writes are durable when they return: temp file, fsync, rename, fsync of the directory (and of every
directory created on the way). Object store writes are one PUT each, so an object is either whole or absent.
Errors from the storage client surface as Python built-ins: ``FileNotFoundError`` as raised, other
``OSError`` as ``OSError`` naming the file (object store clients retry first, see :func:`s3_client_options`).
Segments written to S3 are also kept on the writing host, for that host's reads (:mod:`logstore.segment_cache`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import threading
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from pathlib import Path
from typing import Any, BinaryIO, Protocol, cast

from . import requestcounts
from .diagnosis import CHECKSUMS_WHEN, Kind, diagnose, record, s3_answer
from .diagnosis import is_local as is_local
from .failpoints import failpoint
from .segment import SUFFIX as SEGMENT_SUFFIX
from .segment_cache import CachedReads, open_cache

log = logging.getLogger(__name__)

SEGMENT_CONTENT_TYPE = "application/vnd.filesink.segment"
"""The ``Content-Type`` of a segment on S3. Without one, some servers guess from the bytes, and SeaweedFS gzips what
looks compressible as it stores it (CPU on the server for bytes that are already compressed, or that the file
writers will read back at once)."""

TEMP_MARK = ".tmp-"
"""Local temp files are named ``.<final name>.tmp-<random>`` next to their final name."""


def is_temp_name(relpath: str) -> bool:
    """Whether ``relpath`` names a local temp file (one a crash may leave behind), never a record or segment."""
    base = relpath.rsplit("/", 1)[-1]
    return base.startswith(".") and TEMP_MARK in base


Bytes = bytes | bytearray | memoryview | Any  # pyarrow Buffers support the buffer protocol too


S3_RETRIES: Mapping[str, Any] = {"mode": "standard", "max_attempts": 3}
"""botocore's retry configuration for S3 clients: up to 3 retries (4 attempts) of a request; botocore's
``max_attempts`` counts retries. Standard mode retries 5xx answers, throttling, timeouts and dropped
connections, with exponential backoff and jitter (AWS's own SDKs default to 2 retries)."""
S3_CONNECT_TIMEOUT = 10.0
S3_READ_TIMEOUT = 15.0
"""Seconds to wait for a connection, and for the server's answer (per socket read). With :data:`S3_RETRIES`,
a server that accepts connections and never answers fails a call after about a minute (4 x 15 s and the
backoff between the attempts)."""
S3FS_RETRIES = 1
"""Attempts of s3fs's own retry loop around each call (its ``retries``, 5 by default). Each of its attempts is a
whole botocore call with botocore's retries, so s3fs's default multiplied the time a dead endpoint takes by 5;
botocore's retries are the only ones. Set ``retries`` in the storage options to change it."""
S3_CHECKSUMS = CHECKSUMS_WHEN
"""botocore's ``request_checksum_calculation`` and ``response_checksum_validation``: checksums only where an
operation requires one. botocore's default (``when_supported``) adds CRC32 trailers to uploads and checks the
checksum headers of answers, which S3-compatible servers get wrong: ``rclone serve s3`` sends the whole object's
checksum with a ranged read, which then fails. The log store checks its segments with checksums of its own,
requests over plain HTTP are signed with a SHA-256 of their body, and HTTPS protects the rest."""
LIMITS_HINT = (
    "The limits are storage options: config_kwargs read_timeout (default {read:g} s), connect_timeout (default "
    "{connect:g} s) and retries max_attempts (default {retries} retries)"
).format(read=S3_READ_TIMEOUT, connect=S3_CONNECT_TIMEOUT, retries=S3_RETRIES["max_attempts"])


def storage_error(what: str, e: BaseException, location: str = "s3://", *, writing: bool = True) -> OSError:
    """``e`` (what a storage client raised, after its retries) as an ``OSError`` saying ``what`` failed; the
    built-in subclass of its errno (``OSError(errno, ...)`` gives ``PermissionError``, ``TimeoutError``, ...).
    A timeout or a connection that failed is a ``TimeoutError`` that says what to check and which storage options
    set the limits; missing credentials say what to set, and a checksum the server got wrong which storage option
    turns the check off (:func:`logstore.diagnosis.diagnose`; ``location`` is the URL the call was about). The
    cause and its kind are recorded on the error (:func:`logstore.diagnosis.record`), for callers that wrap it.
    ``writing``: the call wrote or deleted (else it read, listed or checked), for the advice of a refusal."""
    errno = getattr(e, "errno", None)
    found = diagnose(e, location, kind=_client_kind(e), writing=writing)
    message = f"{what}: {found.cause}"
    made: OSError
    if found.kind is Kind.UNREACHABLE:
        found = replace(found, note=LIMITS_HINT)
        message += f". {found.advise(first=True)}"
        made = TimeoutError(errno, message) if errno is not None else TimeoutError(message)
    elif found.kind is Kind.CREDENTIALS:
        made = PermissionError(f"{message}. {found.advise(first=True)}")
    elif found.kind is Kind.CHECKSUM:
        made = OSError(f"{message}. {found.advise(first=True)}")
    elif found.kind in TOLD_WITH_ADVICE and errno is not None:  # a refusal, a missing bucket, a skewed clock, ...
        made = OSError(errno, f"{message}. {found.advise(first=True)}")
    elif found.kind in TOLD_WITH_ADVICE:
        made = OSError(f"{message}. {found.advise(first=True)}")
    else:
        made = OSError(errno, message) if errno is not None else OSError(message)
    return record(made, found.cause, kind=found.kind, note=found.note, what=what)


WRITING_REQUESTS = ("put", "delete")
"""The request kinds (:mod:`logstore.requestcounts`) that change the store; the others read it."""
TOLD_WITH_ADVICE = (Kind.PERMISSION, Kind.CLOCK, Kind.NO_BUCKET, Kind.SERVER)
"""The kinds of S3 answers whose error says what to do (the keys, the clock, the bucket, the server): a caller
that wraps it tells the cause alone (:func:`logstore.diagnosis.told`) and its own advice."""


def _client_kind(e: BaseException) -> Kind | None:
    """The kind of the storage client's own errors, which only this module (their owner) tells."""
    if is_unreachable(e):
        return Kind.UNREACHABLE
    if type(e).__name__ == "NoCredentialsError":
        return Kind.CREDENTIALS
    if type(e).__name__ == "FlexibleChecksumError":
        return Kind.CHECKSUM
    return None


def is_unreachable(e: BaseException) -> bool:
    """Whether ``e`` is botocore's error for an endpoint that did not answer in time or could not be reached."""
    import botocore.exceptions as be

    kinds = (be.ReadTimeoutError, be.ConnectTimeoutError, be.EndpointConnectionError, be.ConnectionClosedError)
    return isinstance(e, (*kinds, TimeoutError))


def is_storage_error(e: BaseException) -> bool:
    """Whether ``e`` is a failed storage call: an ``OSError``, or botocore's own error for a connection, a checksum
    or missing credentials (s3fs passes those on untranslated)."""
    named = type(e).__name__ in ("FlexibleChecksumError", "NoCredentialsError")
    return isinstance(e, OSError) or is_unreachable(e) or named


def is_s3(url: str) -> bool:
    return url.split("://", 1)[0] in ("s3", "s3a")


def s3_client_options(url: str, storage_options: Mapping[str, Any]) -> dict[str, Any]:
    """The fsspec options of ``url``; for ``s3://`` and ``s3a://`` with botocore's ``retries``,
    ``connect_timeout``, ``read_timeout`` and the checksum settings (:data:`S3_CHECKSUMS`) added to
    ``config_kwargs`` where the options leave them unset, and without ``retries`` (s3fs's own retry loop,
    which is not an option of its constructor: :func:`open_filesystem` sets it).

    Every S3 client of the sink is made from options that went through here; retries are botocore's
    (see ``docs/filesink.md``), the sink's code has no retry loop of its own.
    """
    options = dict(storage_options)
    if not is_s3(url):
        return options
    options.pop("retries", None)
    config = dict(options.get("config_kwargs") or {})
    config.setdefault("retries", dict(S3_RETRIES))
    config.setdefault("connect_timeout", S3_CONNECT_TIMEOUT)
    config.setdefault("read_timeout", S3_READ_TIMEOUT)
    config.setdefault("request_checksum_calculation", S3_CHECKSUMS)
    config.setdefault("response_checksum_validation", S3_CHECKSUMS)
    options["config_kwargs"] = config
    return options


def open_filesystem(url: str, storage_options: Mapping[str, Any]) -> tuple[Any, str]:
    """The fsspec filesystem and root path of ``url``, made with :func:`s3_client_options`; an S3 one makes
    ``retries`` attempts in s3fs's own loop (default :data:`S3FS_RETRIES`)."""
    import fsspec

    options = s3_client_options(url, storage_options)
    if not is_s3(url):
        fs, root = fsspec.core.url_to_fs(url, **options)
        return fs, root
    attempts = storage_options.get("retries", S3FS_RETRIES)
    if not isinstance(attempts, int) or isinstance(attempts, bool) or attempts < 1:
        raise ValueError(f"storage option retries (s3fs's attempts per call) must be an integer >= 1, not {attempts!r}")
    if attempts != S3FS_RETRIES:
        options["skip_instance_cache"] = True  # fsspec's shared instances keep the default
    fs, root = fsspec.core.url_to_fs(url, **options)
    fs.retries = attempts
    _no_expect_continue(fs)
    return fs, root


def _no_expect_continue(fs: Any) -> None:
    """Make ``fs``'s S3 client send an upload's body without asking the server first (``Expect: 100-continue``,
    which botocore adds to every upload of a file-like body). aiohttp waits for the server's ``100 Continue``
    with no time limit: an S3 server that accepts connections and never answers would hold an upload, and the
    sink, for ever, where with the body sent the read timeout (:data:`S3_READ_TIMEOUT`) ends it. The client is made
    here, once per file system instance (fsspec shares instances), and nothing is sent."""
    from botocore.handlers import add_expect_header

    if getattr(fs, "_filesink_no_expect", False):
        return
    fs.connect()
    fs.s3.meta.events.unregister("before-call.s3", add_expect_header)
    fs._filesink_no_expect = True


@dataclass(frozen=True)
class LogLocation:
    """Where a log store keeps its segment files: a local directory or an fsspec URL, with its options.

    Picklable, so Spark tasks can receive it.
    """

    url: str
    storage_options: Mapping[str, Any] = field(default_factory=dict, hash=False, compare=False)

    @property
    def canonical(self) -> str:
        """The location as recorded in the state database (absolute path for local directories)."""
        if is_local(self.url):
            return str(Path(self.url.removeprefix("file://")).expanduser().absolute())
        return self.url.rstrip("/")

    def open(self) -> Storage:
        if is_local(self.url):
            return LocalStorage(Path(self.canonical))
        return FsspecStorage(self.url, dict(self.storage_options))


class PutAnswer(StrEnum):
    """How a store answered one conditional create (:meth:`Storage.conditional_put`)."""

    CREATED = "created"
    """The object was written (where it existed already, the store ignored the condition and replaced it)."""
    EXISTS = "exists"
    """The condition held the write back: the object exists and was left as it was."""
    REFUSED = "refused"
    """The store does not support the condition (S3: 501 NotImplemented and the like); nothing was written."""


@dataclass(frozen=True)
class ConditionalPut:
    """The answer to one :meth:`Storage.conditional_put`, and what the store said (for messages)."""

    answer: PutAnswer
    seen: str
    """The store's answer as a person reads it: ``HTTP 412 PreconditionFailed``, ``HTTP 200``, ..."""


ReadRange = Callable[[str, int, int], bytes]
"""``read(relpath, offset, length)``: up to ``length`` bytes at ``offset`` (:meth:`Storage.reading`)."""

OPEN_FOR_READS = 128
"""Files a local :meth:`Storage.reading` keeps open at most."""


class Storage(Protocol):
    """Operations the log store needs, on paths relative to the log store root (always ``/``-separated)."""

    def display(self, relpath: str) -> str:
        """The full path or URL of ``relpath``, for messages."""

    def write(self, relpath: str, parts: Iterable[Bytes]) -> int:
        """Write the concatenated parts as one file, durably and atomically; return its size.

        ``parts`` may be a generator that computes the parts as they are consumed (append sorts and encodes
        rows that way): it is consumed once, in order, and an error it raises fails the write.
        """

    def read_range(self, relpath: str, offset: int, length: int) -> bytes:
        """Read up to ``length`` bytes at ``offset`` (fewer if the file is shorter)."""

    def reading(self) -> contextlib.AbstractContextManager[ReadRange]:
        """:meth:`read_range` for many reads: on local disk the first ``OPEN_FOR_READS`` files read stay open
        until the block ends, so that reading a plan's blocks, vnode after vnode across the same segments, opens
        each segment once (a plan of more segments opens the others at each read, as :meth:`read_range` does)."""

    def read_all(self, relpath: str) -> bytes:
        """Read a whole file."""

    def list_files(self, prefix: str = "") -> Iterator[tuple[str, int]]:
        """Every file under ``prefix`` (recursively) as ``(relpath, size)``, straight from storage."""

    def delete(self, relpath: str) -> bool:
        """Delete one file; False if it was already gone."""

    def delete_many(self, relpaths: Sequence[str]) -> None:
        """Delete files (a file already gone is no error): on S3 one request per 1,000 keys."""

    def remove_empty_dirs(self, up_to_epoch: int | None) -> None:
        """Remove empty epoch directories, of epochs up to ``up_to_epoch`` or all (object stores have none)."""

    def prune_dirs(self, prefix: str) -> None:
        """Remove empty directories below ``prefix`` (object stores have none)."""

    def put(self, relpath: str, data: bytes) -> None:
        """Write a small record (the durable home's, writers' records) whole, durably and atomically, replacing
        the file if it exists. Unlike :meth:`write`, it passes no failpoint of the segment writes."""

    def create(self, relpath: str, data: bytes) -> bool:
        """Write ``data`` as a new file, durably, unless the file exists; False if it existed (nothing written).

        Atomic where the store has a conditional create (local disk: a hard link; S3: ``If-None-Match: *``);
        elsewhere, and on S3 servers that refuse the condition, a check then a write."""

    def conditional_put(self, relpath: str, data: bytes) -> ConditionalPut:
        """Only the conditional create of ``data`` at ``relpath`` (local disk: a hard link; S3: one PUT with
        ``If-None-Match: *``), without the check before it or a plain write after a refusal: how the store
        answered. :func:`logstore.conditional.probe_conditional_create` tells with it whether the store honours
        the condition; an answer that is not one of :class:`PutAnswer` raises ``OSError`` naming the file."""


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def ensure_dir(path: Path) -> None:
    """Create ``path`` and missing parents, fsyncing each parent so the new entries survive a crash."""
    if path.is_dir():
        return
    ensure_dir(path.parent)
    try:
        path.mkdir()
    except FileExistsError:
        if not path.is_dir():
            raise
        return
    fsync_dir(path.parent)


WRITE_QUEUE_CHUNKS = 4
"""Chunks of parts waiting for the writer thread of :func:`write_durable` at most (bounds its memory)."""
WRITE_CHUNK_BYTES = 2 * 2**20
"""Parts are handed to the writer thread in chunks of at least this many bytes (or the last parts)."""
SYNC_EVERY_BYTES = 8 * 2**20
"""The writer thread flushes written data to the disk (``fdatasync``) each time this many more bytes are written,
so the disk works while the next parts are computed instead of all at the final ``fsync``."""

_fdatasync = getattr(os, "fdatasync", os.fsync)  # fdatasync is not on every platform (macOS)
_END = object()


class _Writer:
    """A thread that writes chunks of parts to an open file, ``fdatasync``-ing it every ``SYNC_EVERY_BYTES``.

    Chunks come through a bounded queue. The first error the thread meets is kept in :attr:`error`; from then
    on (and once :meth:`abort` is called) it drops what it receives, so the producer never blocks on it.
    """

    def __init__(self, f: BinaryIO) -> None:
        self.f = f
        self.size = 0
        self.error: BaseException | None = None
        self._aborted = False
        self._queue: queue.Queue[object] = queue.Queue(maxsize=WRITE_QUEUE_CHUNKS)
        self._thread = threading.Thread(target=self._run, name="logstore-writer", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        synced = 0
        while True:
            chunk = self._queue.get()
            if chunk is _END:
                return
            if self.error is not None or self._aborted:
                continue
            try:
                failpoint("logstore.storage.write", getattr(self.f, "name", ""))
                for part in cast(list[Bytes], chunk):
                    self.size += self.f.write(part)
                if self.size - synced >= SYNC_EVERY_BYTES:
                    self.f.flush()
                    _fdatasync(self.f.fileno())
                    synced = self.size
            except BaseException as e:  # kept for the caller's thread, which raises it
                self.error = e
            del chunk  # free the written parts now, not after waiting for the next chunk

    def put(self, chunk: list[Bytes]) -> None:
        self._queue.put(chunk)

    def abort(self) -> None:
        """Drop whatever is still queued instead of writing it."""
        self._aborted = True

    def close(self) -> None:
        """Let the thread finish what is queued (or drop it, after :meth:`abort`) and wait for it to end."""
        self._queue.put(_END)
        self._thread.join()


def _write_parts(f: BinaryIO, parts: Iterable[Bytes]) -> int:
    """Write the parts to ``f`` with a writer thread while this thread produces them; return the size written.

    Producing a part (here, sorting and serializing rows) and writing one (``write``, ``fdatasync``) both
    release the GIL, so they overlap. An error on either side stops both and is raised here (the writer's
    error as it was raised in the writer thread); the thread has ended when this returns or raises.
    """
    writer = _Writer(f)
    try:
        chunk: list[Bytes] = []
        chunk_bytes = 0
        for part in parts:
            if writer.error is not None:
                break
            chunk.append(part)
            chunk_bytes += memoryview(part).nbytes
            if chunk_bytes >= WRITE_CHUNK_BYTES:
                writer.put(chunk)
                chunk, chunk_bytes = [], 0
        else:
            if chunk:
                writer.put(chunk)
    except BaseException:
        writer.abort()
        raise
    finally:
        writer.close()
        close = getattr(parts, "close", None)
        if close is not None:  # a generator stopped early: run its cleanup now, not whenever it is collected
            close()
    if writer.error is not None:
        raise writer.error
    return writer.size


def write_durable(path: Path, parts: Iterable[Bytes]) -> int:
    """Write a local file through a temp name: write, fsync, rename, fsync the directory.

    The parts are consumed in this thread and written by a writer thread (see :func:`_write_parts`), which
    also calls ``fdatasync`` every ``SYNC_EVERY_BYTES`` so that the final ``fsync`` finds little left to do.
    If anything fails, the temp file is removed and the error raised; no thread is left running.
    """
    ensure_dir(path.parent)
    tmp = path.with_name(f".{path.name}{TEMP_MARK}{uuid.uuid4().hex[:12]}")
    try:
        with open(tmp, "xb") as f:
            size = _write_parts(f, parts)
            f.flush()
            failpoint("logstore.storage.fsync", str(path))
            os.fsync(f.fileno())
        failpoint("logstore.storage.before_rename")
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)
    return size


class LocalStorage:
    def __init__(self, root: Path) -> None:
        self.root = root

    def display(self, relpath: str) -> str:
        return str(self.root / relpath)

    def write(self, relpath: str, parts: Iterable[Bytes]) -> int:
        return write_durable(self.root / relpath, parts)

    def _temp_record(self, final: Path, data: bytes) -> Path:
        ensure_dir(final.parent)
        temp = final.with_name(f".{final.name}{TEMP_MARK}{uuid.uuid4().hex[:8]}")
        try:
            with open(temp, "xb") as f:  # a small record, not a segment: no failpoints of the segment writes
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
        except BaseException:  # a full disk, say: leave no half-written temp record behind
            temp.unlink(missing_ok=True)
            raise
        return temp

    def put(self, relpath: str, data: bytes) -> None:
        final = self.root / relpath
        temp = self._temp_record(final, data)
        try:
            os.replace(temp, final)
        except BaseException:
            temp.unlink(missing_ok=True)
            raise
        fsync_dir(final.parent)

    def create(self, relpath: str, data: bytes) -> bool:
        if (self.root / relpath).exists():
            return False
        return self.conditional_put(relpath, data).answer is PutAnswer.CREATED

    def conditional_put(self, relpath: str, data: bytes) -> ConditionalPut:
        final = self.root / relpath
        temp = self._temp_record(final, data)
        try:
            os.link(temp, final)  # fails if the name exists: an atomic create
        except FileExistsError:
            return ConditionalPut(PutAnswer.EXISTS, "the hard link failed: the name exists (EEXIST)")
        finally:
            temp.unlink(missing_ok=True)
        fsync_dir(final.parent)
        return ConditionalPut(PutAnswer.CREATED, "the hard link was made")

    def read_range(self, relpath: str, offset: int, length: int) -> bytes:
        with open(self.root / relpath, "rb") as f:
            return os.pread(f.fileno(), length, offset)

    @contextlib.contextmanager
    def reading(self) -> Iterator[ReadRange]:
        open_files: dict[str, int] = {}  # relpath -> descriptor, of the first OPEN_FOR_READS files read

        def read(relpath: str, offset: int, length: int) -> bytes:
            fd = open_files.get(relpath)
            if fd is not None:
                return os.pread(fd, length, offset)
            fd = os.open(self.root / relpath, os.O_RDONLY | os.O_CLOEXEC)
            if len(open_files) < OPEN_FOR_READS:
                open_files[relpath] = fd
                return os.pread(fd, length, offset)
            try:  # the first files read stay open; beyond them, a read opens its file (a plan cycles through them)
                return os.pread(fd, length, offset)
            finally:
                os.close(fd)

        try:
            yield read
        finally:
            for fd in open_files.values():
                os.close(fd)

    def read_all(self, relpath: str) -> bytes:
        return (self.root / relpath).read_bytes()

    def list_files(self, prefix: str = "") -> Iterator[tuple[str, int]]:
        base = self.root / prefix if prefix else self.root
        for dirpath, _dirs, files in os.walk(base):
            for name in files:
                full = Path(dirpath) / name
                try:
                    size = full.stat().st_size
                except FileNotFoundError:
                    continue
                yield full.relative_to(self.root).as_posix(), size

    def delete(self, relpath: str) -> bool:
        try:
            (self.root / relpath).unlink()
        except FileNotFoundError:
            return False
        return True

    def delete_many(self, relpaths: Sequence[str]) -> None:
        for relpath in relpaths:
            self.delete(relpath)

    def remove_empty_dirs(self, up_to_epoch: int | None) -> None:
        if not self.root.is_dir():
            return
        for child in self.root.iterdir():
            name = child.name
            if len(name) != 20 or not name.isdigit() or (up_to_epoch is not None and int(name) > up_to_epoch):
                continue
            with contextlib.suppress(OSError):  # not empty, or already gone
                child.rmdir()

    def prune_dirs(self, prefix: str) -> None:
        base = self.root / prefix
        for dirpath, _dirs, _files in os.walk(base, topdown=False):
            if Path(dirpath) != base:
                with contextlib.suppress(OSError):  # not empty, or already gone
                    os.rmdir(dirpath)


DELETE_BATCH = 1000
"""Keys in one S3 DeleteObjects request at most (the API's limit)."""


class FsspecStorage:
    coalesced_reads = True
    """Read plans are fetched in few large ranged reads, several at once (:func:`logstore.reader.read_plan`), not
    block by block: each request to an object store costs a round trip. Local storage reads block by block."""

    def __init__(self, url: str, storage_options: dict[str, Any]) -> None:
        self.fs, root = open_filesystem(url, storage_options)
        self.root = root.rstrip("/")
        protocol = self.fs.protocol
        self._is_s3 = bool({"s3", "s3a"} & set(protocol if isinstance(protocol, tuple) else (protocol,)))
        self.cache = open_cache(url, storage_options) if self._is_s3 else None
        """The local copies of the segments this host wrote (:mod:`logstore.segment_cache`); None when off."""

    def _full(self, relpath: str) -> str:
        return f"{self.root}/{relpath}"

    def display(self, relpath: str) -> str:
        return str(self.fs.unstrip_protocol(self._full(relpath)))

    @contextlib.contextmanager
    def _naming(self, action: str, relpath: str, kind: str, n: int = 1) -> Iterator[None]:
        """One request (or ``n``) of ``kind``, counted (:mod:`logstore.requestcounts`). Storage errors name the file
        (what the client raises after its retries says only what failed); ``FileNotFoundError`` passes unchanged,
        callers act on it."""
        store = requestcounts.store_of(relpath)
        requestcounts.count(store, kind, n=n)
        try:
            yield
        except FileNotFoundError:
            raise
        except Exception as e:
            if not is_storage_error(e):
                raise
            requestcounts.count(store, kind, "errors")
            where = self.display(relpath)
            raise storage_error(f"cannot {action} {where}", e, where, writing=kind in WRITING_REQUESTS) from e

    def write(self, relpath: str, parts: Iterable[Bytes]) -> int:
        data = b"".join(parts)
        # One PUT: s3fs switches to a multipart upload above ``chunksize``; keep it out of reach (5 GiB is
        # the single-PUT limit of S3).
        kwargs: dict[str, Any] = {"chunksize": 5 * 2**30} if self._is_s3 else {}
        if self._is_s3 and relpath.endswith(SEGMENT_SUFFIX):
            kwargs["ContentType"] = SEGMENT_CONTENT_TYPE
        if self.cache is not None:
            self.cache.drop(relpath)  # a name written again (damage tests do): its old copy must not outlive it
        with self._naming("write", relpath, "put"):
            answer = self.fs.pipe_file(self._full(relpath), data, **kwargs)
        requestcounts.count(requestcounts.store_of(relpath), "put", "retries", requestcounts.retries_in(answer))
        if self.cache is not None:  # only once S3 holds the segment: the copy serves reads, S3 stays the truth
            self.cache.put(relpath, data, answer.get("ETag") if isinstance(answer, dict) else None)
        return len(data)

    def put(self, relpath: str, data: bytes) -> None:
        self.write(relpath, [data])

    def create(self, relpath: str, data: bytes) -> bool:
        if not self._is_s3:
            with self._naming("check", relpath, "head"):
                if self.fs.exists(self._full(relpath)):
                    return False
            self.write(relpath, [data])
            return True
        bucket, key, _ = self.fs.split_path(self._full(relpath))
        # A check first (one HEAD): some servers (rclone's) ignore If-None-Match and replace the object. Where the
        # server honours the condition, it closes the race between the check and the write.
        with self._naming("check", relpath, "head"):
            try:
                self.fs.call_s3("head_object", Bucket=bucket, Key=key)
                return False
            except FileNotFoundError:
                pass
        put = self.conditional_put(relpath, data)
        if put.answer is not PutAnswer.REFUSED:
            return put.answer is PutAnswer.CREATED  # EXISTS: or another conditional write of it is under way
        log.info("%s: the S3 server refused If-None-Match (%s); writing after the check", self.root, put.seen)
        self.write(relpath, [data])
        return True

    def conditional_put(self, relpath: str, data: bytes) -> ConditionalPut:
        if not self._is_s3:
            return ConditionalPut(
                PutAnswer.REFUSED, f"no conditional create over {self.fs.protocol!r}: the sink checks, then writes"
            )
        bucket, key, _ = self.fs.split_path(self._full(relpath))
        store = requestcounts.store_of(relpath)
        requestcounts.count(store, "put")
        try:
            answer = self.fs.call_s3("put_object", Bucket=bucket, Key=key, Body=data, IfNoneMatch="*")
        except Exception as e:
            if not is_storage_error(e):
                raise
            code, status = s3_error_code(e)
            seen = " ".join(str(part) for part in (f"HTTP {status}" if status else None, code) if part) or str(e)
            if isinstance(e, FileExistsError) or code in CONDITION_FAILED or status in (409, 412):
                return ConditionalPut(PutAnswer.EXISTS, seen)
            if code in CONDITION_REFUSED or status == 501:
                return ConditionalPut(PutAnswer.REFUSED, seen)
            requestcounts.count(store, "put", "errors")
            raise storage_error(f"cannot create {self.display(relpath)}", e, self.display(relpath)) from e
        requestcounts.count(store, "put", "retries", requestcounts.retries_in(answer))
        status = answer.get("ResponseMetadata", {}).get("HTTPStatusCode") if isinstance(answer, dict) else None
        return ConditionalPut(PutAnswer.CREATED, f"HTTP {status}" if status else "success")

    def read_range(self, relpath: str, offset: int, length: int) -> bytes:
        if length == 0:
            return b""
        if self.cache is None:
            return self._fetch(relpath, offset, length)
        with self.reading() as read:
            return read(relpath, offset, length)

    def _fetch(self, relpath: str, offset: int, length: int) -> bytes:
        """One ranged GET."""
        if length == 0:
            return b""
        with self._naming(f"read {length} bytes at {offset} of", relpath, "get"):
            data: bytes = self.fs.cat_file(self._full(relpath), start=offset, end=offset + length)
        return data

    def _head(self, relpath: str) -> tuple[int, str]:
        """The size and ETag of the object at ``relpath`` (one HEAD); ``FileNotFoundError`` if there is none."""
        bucket, key, _ = self.fs.split_path(self._full(relpath))
        with self._naming("check", relpath, "head"):
            answer = self.fs.call_s3("head_object", Bucket=bucket, Key=key)
        return int(answer.get("ContentLength", -1)), str(answer.get("ETag") or "")

    @contextlib.contextmanager
    def reading(self) -> Iterator[ReadRange]:
        """One GET per read (object stores have no open files: read_plan joins reads instead); with the segment
        cache, the segments this host wrote are read from their copies, each checked once against S3 by a HEAD
        (:class:`logstore.segment_cache.CachedReads`, whose ``again`` reads a range from S3 when a block of a
        copy fails the reader's checks)."""
        if self.cache is None:
            yield self._fetch
            return
        reads = CachedReads(self.cache, self._head, self._fetch)
        try:
            yield reads
        finally:
            reads.close()

    def read_all(self, relpath: str) -> bytes:
        # start=0: one GET (without a range, s3fs asks for the object's size first: a HEAD per read).
        with self._naming("read", relpath, "get"):
            data: bytes = self.fs.cat_file(self._full(relpath), start=0)
        return data

    def list_files(self, prefix: str = "") -> Iterator[tuple[str, int]]:
        base = self._full(prefix) if prefix else self.root
        self.fs.invalidate_cache(self.root)
        try:
            with self._naming("list", prefix, "list"):
                found = self._list_s3(base) if self._is_s3 else self.fs.find(base, detail=True)
        except FileNotFoundError:
            return
        for path, info in found.items():
            if info.get("type") == "directory":
                continue
            rel = path[len(self.root) + 1 :] if path.startswith(self.root + "/") else path
            yield rel, int(info.get("size") or 0)

    def _list_s3(self, base: str) -> dict[str, dict[str, Any]]:
        """Every object under ``base``: one ListObjectsV2 without a delimiter (and its further pages). s3fs's
        ``find`` asks again with a HEAD and a second listing when a prefix holds nothing, which is most of the
        home's listings at start (three requests where one answers)."""
        from fsspec.asyn import sync

        found = sync(self.fs.loop, self.fs._lsdir, base, refresh=True, delimiter="")
        return {str(info["name"]): info for info in found}

    def delete(self, relpath: str) -> bool:
        if self.cache is not None:
            self.cache.drop(relpath)
        try:
            with self._naming("delete", relpath, "delete"):
                self.fs.rm_file(self._full(relpath))
        except FileNotFoundError:
            return False
        return True

    def delete_many(self, relpaths: Sequence[str]) -> None:
        if self.cache is not None:
            for relpath in relpaths:
                self.cache.drop(relpath)
        if not self._is_s3 or len(relpaths) < 2:
            for relpath in relpaths:
                self.delete(relpath)
            return
        from fsspec.asyn import sync

        bucket, _, prefix = self.root.partition("/")
        for first in range(0, len(relpaths), DELETE_BATCH):
            chunk = relpaths[first : first + DELETE_BATCH]
            keys = [{"Key": f"{prefix}/{relpath}" if prefix else relpath} for relpath in chunk]
            with self._naming(f"delete {len(chunk)} files, the first", chunk[0], "delete"):
                answer = sync(
                    self.fs.loop,
                    self.fs._call_s3,
                    "delete_objects",
                    Bucket=bucket,
                    Delete={"Objects": keys, "Quiet": True},
                )
            failed = answer.get("Errors") or []
            if failed:  # DeleteObjects answers 200 and lists what it could not delete
                error = failed[0]
                raise OSError(
                    f"cannot delete {self.display(str(error.get('Key', '')).removeprefix(prefix + '/'))} and "
                    f"{len(failed) - 1} more of {len(chunk)} files: {error.get('Code')}: {error.get('Message')}"
                )

    def remove_empty_dirs(self, up_to_epoch: int | None) -> None:
        return None

    def prune_dirs(self, prefix: str) -> None:
        return None


CONDITION_FAILED = ("PreconditionFailed", "ConditionalRequestConflict")
"""S3 error codes of a conditional write whose condition did not hold."""
CONDITION_REFUSED = ("NotImplemented", "InvalidArgument", "InvalidRequest")
"""S3 error codes of a server that does not support the condition (``If-None-Match: *``)."""


def s3_error_code(e: BaseException) -> tuple[str | None, int | None]:
    """The S3 error code and HTTP status behind an exception s3fs raised (its cause is botocore's error)."""
    return s3_answer(e)
