"""The one module that touches log store files: local disk through ``os``, anything else through fsspec.

Local writes are durable when they return: temp file, fsync, rename, fsync of the directory (and of every
directory created on the way). Object store writes are one PUT each, so an object is either whole or absent.
Errors from the storage client surface as Python built-ins (``FileNotFoundError``, ``PermissionError``, ...).
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from .failpoints import failpoint

TEMP_MARK = ".tmp-"
"""Local temp files are named ``.<final name>.tmp-<random>`` next to their final name."""

Bytes = bytes | bytearray | memoryview | Any  # pyarrow Buffers support the buffer protocol too


def _is_local(url: str) -> bool:
    return "://" not in url or url.startswith("file://")


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
        if _is_local(self.url):
            return str(Path(self.url.removeprefix("file://")).expanduser().absolute())
        return self.url.rstrip("/")

    def open(self) -> Storage:
        if _is_local(self.url):
            return LocalStorage(Path(self.canonical))
        return FsspecStorage(self.url, dict(self.storage_options))


class Storage(Protocol):
    """Operations the log store needs, on paths relative to the log store root (always ``/``-separated)."""

    def display(self, relpath: str) -> str:
        """The full path or URL of ``relpath``, for messages."""

    def write(self, relpath: str, parts: Iterable[Bytes]) -> int:
        """Write the concatenated parts as one file, durably and atomically; return its size."""

    def read_range(self, relpath: str, offset: int, length: int) -> bytes:
        """Read up to ``length`` bytes at ``offset`` (fewer if the file is shorter)."""

    def read_all(self, relpath: str) -> bytes:
        """Read a whole file."""

    def list_files(self, prefix: str = "") -> Iterator[tuple[str, int]]:
        """Every file under ``prefix`` (recursively) as ``(relpath, size)``, straight from storage."""

    def delete(self, relpath: str) -> bool:
        """Delete one file; False if it was already gone."""

    def remove_empty_dirs(self, up_to_epoch: int | None) -> None:
        """Remove empty epoch directories, of epochs up to ``up_to_epoch`` or all (object stores have none)."""


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


def write_durable(path: Path, parts: Iterable[Bytes]) -> int:
    """Write a local file through a temp name: write, fsync, rename, fsync the directory."""
    ensure_dir(path.parent)
    tmp = path.with_name(f".{path.name}{TEMP_MARK}{uuid.uuid4().hex[:12]}")
    size = 0
    try:
        with open(tmp, "xb") as f:
            for part in parts:
                size += f.write(part)
            f.flush()
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

    def read_range(self, relpath: str, offset: int, length: int) -> bytes:
        with open(self.root / relpath, "rb") as f:
            return os.pread(f.fileno(), length, offset)

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

    def remove_empty_dirs(self, up_to_epoch: int | None) -> None:
        if not self.root.is_dir():
            return
        for child in self.root.iterdir():
            name = child.name
            if len(name) != 20 or not name.isdigit() or (up_to_epoch is not None and int(name) > up_to_epoch):
                continue
            with contextlib.suppress(OSError):  # not empty, or already gone
                child.rmdir()


class FsspecStorage:
    def __init__(self, url: str, storage_options: dict[str, Any]) -> None:
        import fsspec

        self.fs, root = fsspec.core.url_to_fs(url, **storage_options)
        self.root = root.rstrip("/")
        protocol = self.fs.protocol
        self._is_s3 = bool({"s3", "s3a"} & set(protocol if isinstance(protocol, tuple) else (protocol,)))

    def _full(self, relpath: str) -> str:
        return f"{self.root}/{relpath}"

    def display(self, relpath: str) -> str:
        return str(self.fs.unstrip_protocol(self._full(relpath)))

    def write(self, relpath: str, parts: Iterable[Bytes]) -> int:
        data = b"".join(parts)
        # One PUT: s3fs switches to a multipart upload above ``chunksize``; keep it out of reach (5 GiB is
        # the single-PUT limit of S3).
        kwargs = {"chunksize": 5 * 2**30} if self._is_s3 else {}
        self.fs.pipe_file(self._full(relpath), data, **kwargs)
        return len(data)

    def read_range(self, relpath: str, offset: int, length: int) -> bytes:
        if length == 0:
            return b""
        data: bytes = self.fs.cat_file(self._full(relpath), start=offset, end=offset + length)
        return data

    def read_all(self, relpath: str) -> bytes:
        data: bytes = self.fs.cat_file(self._full(relpath))
        return data

    def list_files(self, prefix: str = "") -> Iterator[tuple[str, int]]:
        base = self._full(prefix) if prefix else self.root
        self.fs.invalidate_cache(self.root)
        try:
            found = self.fs.find(base, detail=True)
        except FileNotFoundError:
            return
        for path, info in found.items():
            if info.get("type") == "directory":
                continue
            rel = path[len(self.root) + 1 :] if path.startswith(self.root + "/") else path
            yield rel, int(info.get("size") or 0)

    def delete(self, relpath: str) -> bool:
        try:
            self.fs.rm_file(self._full(relpath))
        except FileNotFoundError:
            return False
        return True

    def remove_empty_dirs(self, up_to_epoch: int | None) -> None:
        return None
