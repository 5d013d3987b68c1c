"""A local copy of the segments a host wrote to an S3 log store, so that reads of them on that host skip S3.

With the log store on S3, every segment an append task PUTs is read back by the file writers, and in part by the
size rule's sample: the log's bytes cross the S3 server twice. Once an append's PUT has succeeded,
:meth:`SegmentCache.put` keeps the same bytes in a local file (written under a temp name, then renamed), and the
reads of a read plan on this host (:class:`CachedReads`, what ``FsspecStorage.reading`` gives the reader) take
the ranges of that segment from the file.

**S3 stays the truth.** A copy is read only while S3 holds the very object it copies: the first read of a
segment in a plan asks S3 for the object's size and ETag (one HEAD, no body) and uses the copy only if both are
those of the PUT that made it. A segment deleted, truncated or replaced on S3 behind the sink's back therefore
fails (or reads) as it would without the cache: ``SegmentMissingError`` for a missing object, S3's bytes
otherwise. That check is what keeps the reads in agreement with the damage checks and recovery, which look at
S3 (``LogStore.damaged``, ``filesink recover``): a cache that served a lost segment would hide the loss on one
host until the copy is evicted, then fail there, or on another executor, later. The cheaper choice, trusting a
copy because the reader checks every block's CRC-32 anyway, would give the right rows but break that agreement.

Copies are trusted no further than S3's bytes: the reader checks every block's length and CRC-32 against the
sealed descriptor, and a block from a copy that fails is read again from S3 (:meth:`CachedReads.again`) and the
copy dropped. A copy shorter or longer than its header says, or made for another name, is not used. Segment
names are unique (a random suffix) and written once; a write of a name that is cached (tests damage segments
that way) drops the old copy before its PUT.

**Bounded**: the copies of every log store on the host share :data:`DEFAULT_BYTES` (``FILESINK_SEGMENT_CACHE_BYTES``,
``0`` turns the cache off), and never more than half the space the cache's file system has free (counting the
copies). Each put evicts the oldest copies (by the time they were written) past the limit. The garbage
collection's deletes (on the driver) drop the copies of that host; copies elsewhere wait for eviction.

**Never hurts**: a failure of the cache (a full disk, a permission, a copy that vanished) is logged at debug and
ignored, and the append's PUT, which makes the segment durable, completes before anything is cached.

**Where it helps**: a copy serves only the host that wrote it. In ``local[N]`` mode every read of the log is a
hit; on a cluster a file writer hits for the segments appended on its own host (with N executor hosts, about
1/N of them), and the size rule's sample, on the driver, only for segments appended on the driver's host. A
miss costs nothing more than before (no copy, no HEAD).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import shutil
import stat
import struct
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

BYTES_VAR = "FILESINK_SEGMENT_CACHE_BYTES"
"""Bytes the cache may hold on a host, over every log store (``0``: no cache). Read when a storage is opened."""
DIR_VAR = "FILESINK_SEGMENT_CACHE_DIR"
"""Where the cache lives: default ``filesink-segment-cache-<uid>`` in the system temp directory."""
DEFAULT_BYTES = 2 * 2**30
"""The limit when :data:`BYTES_VAR` is unset: about 150 segments of a busy sink, several rolls of its log."""
DISK_SHARE = 2
"""The copies take at most 1/DISK_SHARE of the space free to them (free space plus the copies' own)."""
TEMP_GRACE_SECONDS = 600.0
"""A temp file older than this was left by a process that died while writing it: eviction removes it."""

SEGMENT_NAME = re.compile(r"^(\d{20})/([A-Za-z0-9_-]{1,64}-[0-9a-f]{32}\.seg)$")
"""The names append gives segments (``logstore.append``): only these are cached, never the home's records."""
MAGIC = b"FSSEGC01"
_HEADER = struct.Struct("<8sI")
"""A copy starts with MAGIC and the length of a JSON header (name, size, ETag); the segment's bytes follow."""
_HEADER_MAX = 4096
_TEMP_MARK = ".tmp-"


def configured_limit() -> int:
    """The byte limit from :data:`BYTES_VAR`; a value that is not a whole number turns the cache off (warned)."""
    value = os.environ.get(BYTES_VAR, "").strip()
    if not value:
        return DEFAULT_BYTES
    try:
        limit = int(value)
    except ValueError:
        limit = -1
    if limit < 0:
        _warn_once(f"{BYTES_VAR}={value!r} is not a number of bytes (0 turns the cache off): the segment cache is off")
        return 0
    return limit


_warned: set[str] = set()


def _warn_once(message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        log.warning(message)


def cache_root() -> Path:
    configured = os.environ.get(DIR_VAR, "").strip()
    if configured:
        return Path(configured).expanduser()
    return Path(tempfile.gettempdir()) / f"filesink-segment-cache-{os.getuid()}"


def open_cache(url: str, storage_options: Mapping[str, Any]) -> SegmentCache | None:
    """The cache of the log store at ``url`` on this host, or None when it is off."""
    limit = configured_limit()
    if limit <= 0:
        return None
    client = storage_options.get("client_kwargs") or {}
    endpoint = client.get("endpoint_url") or storage_options.get("endpoint_url") or ""
    key = hashlib.sha256(f"{endpoint}\n{url.rstrip('/')}".encode()).hexdigest()[:16]
    root = cache_root()
    return SegmentCache(root, root / key, limit)


@dataclass(frozen=True)
class Copy:
    """An open copy of one segment: where its bytes start in the file, their size, and the ETag of its PUT."""

    fd: int
    start: int
    size: int
    etag: str


class SegmentCache:
    """The copies of one log store's segments on this host (``directory``, inside the shared ``root``)."""

    def __init__(self, root: Path, directory: Path, limit: int) -> None:
        self.root = root
        self.directory = directory
        self.limit = limit

    def file(self, relpath: str) -> Path | None:
        """The copy's path of segment ``relpath``, or None if ``relpath`` is not a segment's name."""
        match = SEGMENT_NAME.match(relpath)
        return self.directory / f"{match[1]}.{match[2]}" if match else None

    def put(self, relpath: str, data: bytes, etag: str | None) -> None:
        """Keep ``data``, the bytes of segment ``relpath`` that S3 has stored with ``etag``; never raises."""
        final = self.file(relpath)
        if final is None or not etag or len(data) > self.limit:
            return
        try:
            self._make_directory()
            meta = json.dumps({"name": relpath, "size": len(data), "etag": etag}).encode()
            temp = final.with_name(f".{final.name}{_TEMP_MARK}{uuid.uuid4().hex[:12]}")
            try:
                with open(temp, "xb") as f:  # no fsync: a copy torn by a crash fails its checks and is not used
                    f.write(_HEADER.pack(MAGIC, len(meta)) + meta)
                    f.write(data)
                os.replace(temp, final)
            except BaseException:
                temp.unlink(missing_ok=True)
                raise
            self.evict()
        except Exception as e:
            log.debug("segment cache: cannot keep a copy of %s in %s: %s", relpath, self.directory, e)

    def drop(self, relpath: str) -> None:
        """Forget the copy of ``relpath`` (deleted, rewritten or found bad); never raises."""
        path = self.file(relpath)
        if path is None:
            return
        try:
            path.unlink(missing_ok=True)
        except OSError as e:
            log.debug("segment cache: cannot remove %s: %s", path, e)

    def open_copy(self, relpath: str) -> Copy | None:
        """The copy of ``relpath``, open, if there is a whole one made for that name; None otherwise."""
        path = self.file(relpath)
        if path is None or not self._root_is_ours():
            return None
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return None  # no copy (the usual miss), or one this process cannot open
        try:
            head = os.pread(fd, _HEADER_MAX, 0)
            magic, length = _HEADER.unpack_from(head)
            meta = json.loads(head[_HEADER.size : _HEADER.size + length])
            start = _HEADER.size + length
            whole = os.fstat(fd).st_size == start + meta["size"]
            if magic != MAGIC or meta["name"] != relpath or not whole or start > len(head):
                raise ValueError("not a whole copy of this segment")
            return Copy(fd, start, int(meta["size"]), str(meta["etag"]))
        except Exception as e:
            os.close(fd)
            log.debug("segment cache: %s is not used: %s", path, e)
            self.drop(relpath)
            return None

    def read(self, copy: Copy, offset: int, length: int) -> bytes | None:
        """Up to ``length`` bytes of the segment at ``offset``, as a ranged GET gives them; None if reading fails."""
        try:
            return os.pread(copy.fd, max(0, min(length, copy.size - offset)), copy.start + offset)
        except OSError as e:
            log.debug("segment cache: cannot read a copy: %s", e)
            return None

    def evict(self) -> None:
        """Remove the oldest copies, of every log store, until they fit the limit; and dead writers' temp files."""
        now = time.time()
        copies: list[tuple[float, int, str]] = []
        with os.scandir(self.root) as stores:
            directories = [entry.path for entry in stores if entry.is_dir(follow_symlinks=False)]
        for directory in directories:
            with contextlib.suppress(OSError), os.scandir(directory) as entries:
                for entry in entries:
                    with contextlib.suppress(OSError):  # gone meanwhile (another process's eviction)
                        info = entry.stat(follow_symlinks=False)
                        if _TEMP_MARK in entry.name:
                            if now - info.st_mtime > TEMP_GRACE_SECONDS:
                                os.unlink(entry.path)
                            continue
                        copies.append((info.st_mtime, info.st_size, entry.path))
        held = sum(size for _, size, _ in copies)
        limit = min(self.limit, (shutil.disk_usage(self.root).free + held) // DISK_SHARE)
        if held <= limit:
            return
        for _, size, path in sorted(copies):
            if held <= limit:
                break
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            held -= size

    def _make_directory(self) -> None:
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        if not self._root_is_ours():
            raise PermissionError(f"{self.root} is not a directory of this user's alone; set {DIR_VAR}")
        self.directory.mkdir(mode=0o700, exist_ok=True)

    def _root_is_ours(self) -> bool:
        """Whether the root is a real directory that only this user may write (another could plant copies)."""
        try:
            info = os.lstat(self.root)
        except OSError:
            return False
        return stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid() and not info.st_mode & 0o022


Head = Callable[[str], tuple[int, str]]
"""``head(relpath)``: the size and ETag of the object S3 holds (``FileNotFoundError`` if none)."""
Fetch = Callable[[str, int, int], bytes]
"""``fetch(relpath, offset, length)``: a ranged read from S3."""


class CachedReads:
    """The reads of one read plan: a segment with a copy here is checked once against S3 (``head``: size and
    ETag), then read from the copy; every other segment, and a copy that does not match, from S3 (``fetch``).

    Called from the reader's threads at once. Close it when the plan is read (its copies stay open until then).
    """

    def __init__(self, cache: SegmentCache, head: Head, fetch: Fetch) -> None:
        self.cache = cache
        self._head = head
        self._fetch = fetch
        self._copies: dict[str, Copy | None] = {}
        self._opened: list[Copy] = []
        self._served: set[str] = set()
        self._locks: dict[str, threading.Lock] = {}
        self._lock = threading.Lock()

    def __call__(self, relpath: str, offset: int, length: int) -> bytes:
        copy = self._copy(relpath)
        if copy is not None:
            data = self.cache.read(copy, offset, length)
            if data is not None:
                self._served.add(relpath)
                return data
        return self._fetch(relpath, offset, length)

    def again(self, relpath: str, offset: int, length: int) -> bytes | None:
        """The range read from S3 if this plan has read ``relpath`` from a copy (which is then dropped: a block
        of it failed its checks); None if it has not, and S3's bytes are what failed."""
        if relpath not in self._served:
            return None
        with self._lock:
            self._copies[relpath] = None  # its descriptor stays open until close: another thread may be reading
        log.debug("segment cache: a block of the copy of %s failed its checks; reading S3", relpath)
        self.cache.drop(relpath)
        return self._fetch(relpath, offset, length)

    def _copy(self, relpath: str) -> Copy | None:
        with self._lock:
            if relpath in self._copies:
                return self._copies[relpath]
            lock = self._locks.setdefault(relpath, threading.Lock())
        with lock:  # one check per segment, while the other segments' reads go on
            if relpath in self._copies:
                return self._copies[relpath]
            copy = self.cache.open_copy(relpath)
            if copy is not None:
                with self._lock:
                    self._opened.append(copy)
                size, etag = self._head(relpath)  # raises as S3 does: a missing segment is missing, cache or not
                if (size, etag) != (copy.size, copy.etag):
                    log.debug("segment cache: S3's %s is not the copy's (%s %s): dropped", relpath, size, etag)
                    self.cache.drop(relpath)
                    copy = None
            with self._lock:
                self._copies[relpath] = copy
            return copy

    def close(self) -> None:
        with self._lock:
            opened, self._opened = self._opened, []
        for copy in opened:
            with contextlib.suppress(OSError):
                os.close(copy.fd)
