"""The log store's location in memory: the ``Storage`` protocol of :mod:`logstore.storage`, with its semantics.

``create`` is a conditional create (atomic: written only if absent), ``put`` and ``write`` replace a file whole,
``list_files`` sees every write that returned, ``delete`` says whether the file was there. With
``conditional=False`` the store ignores the condition as ``rclone serve s3`` does: ``create`` always writes
and answers that it created. Every call is a scheduling point: it takes effect when the scheduler lets the
caller go on, atomically.
"""

from __future__ import annotations

import bisect
import contextlib
import itertools
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from logstore.storage import LogLocation, ReadRange

from .scheduler import Scheduler

ROOT = "mem://simulated-log-store"


class MemStorage:
    def __init__(self, scheduler: Scheduler, *, conditional: bool = True, root: str = ROOT) -> None:
        self.scheduler = scheduler
        self.conditional = conditional
        self.root = root
        self.files: dict[str, bytes] = {}
        self._names: list[str] = []
        """The names of :attr:`files`, sorted (a listing is a range of it)."""

    def snapshot(self) -> dict[str, bytes]:
        """A copy of every file as it is now (a backup of the log store's directory; not a scheduling point)."""
        return dict(self.files)

    def restore(self, files: dict[str, bytes]) -> None:
        """Put the files of a :meth:`snapshot` back, and only those (a restore of the log store's directory)."""
        self.files = dict(files)
        self._names = sorted(self.files)

    def _point(self, op: str, relpath: str) -> None:
        self.scheduler.point(f"{op} {relpath}" if self.root == ROOT else f"{op} {self.root}/{relpath}")

    def display(self, relpath: str) -> str:
        return f"{self.root}/{relpath}"

    def _store(self, relpath: str, data: bytes) -> None:
        if relpath not in self.files:
            bisect.insort(self._names, relpath)
        self.files[relpath] = bytes(data)

    def write(self, relpath: str, parts: Iterable[Any]) -> int:
        data = b"".join(bytes(memoryview(p)) for p in parts)  # encoded before the write takes effect
        self._point("write", relpath)
        self._store(relpath, data)
        return len(data)

    def put(self, relpath: str, data: bytes) -> None:
        self._point("put", relpath)
        self._store(relpath, data)

    def create(self, relpath: str, data: bytes) -> bool:
        self._point("create" if self.conditional else "create(ignored condition)", relpath)
        if self.conditional and relpath in self.files:
            return False
        self._store(relpath, data)
        return True

    def conditional_put(self, relpath: str, data: bytes) -> Any:
        """The store's answer to one conditional create (what a probe of the store sees)."""
        from logstore.storage import ConditionalPut, PutAnswer  # type: ignore[attr-defined,unused-ignore]

        self._point("conditional put" if self.conditional else "conditional put(ignored)", relpath)
        if self.conditional and relpath in self.files:
            return ConditionalPut(PutAnswer.EXISTS, "HTTP 412 PreconditionFailed")
        self._store(relpath, data)
        return ConditionalPut(PutAnswer.CREATED, "HTTP 200")

    def read_all(self, relpath: str) -> bytes:
        self._point("read", relpath)
        try:
            return self.files[relpath]
        except KeyError:
            raise FileNotFoundError(relpath) from None

    def read_range(self, relpath: str, offset: int, length: int) -> bytes:
        self._point("read range", relpath)
        try:
            return self.files[relpath][offset : offset + length]
        except KeyError:
            raise FileNotFoundError(relpath) from None

    @contextlib.contextmanager
    def reading(self) -> Iterator[ReadRange]:
        yield self.read_range

    def list_files(self, prefix: str = "") -> Iterator[tuple[str, int]]:
        self._point("list", prefix or "/")
        start = prefix.rstrip("/") + "/" if prefix else ""
        names = self._names[bisect.bisect_left(self._names, start) :]
        found = list(itertools.takewhile(lambda name: name.startswith(start), names))
        return iter([(name, len(self.files[name])) for name in found])

    def delete(self, relpath: str) -> bool:
        self._point("delete", relpath)
        if self.files.pop(relpath, None) is None:
            return False
        del self._names[bisect.bisect_left(self._names, relpath)]
        return True

    def delete_many(self, relpaths: list[str]) -> None:
        for relpath in relpaths:  # one request on S3, but not atomic: each key's delete takes effect on its own
            self.delete(relpath)

    def remove_empty_dirs(self, up_to_epoch: int | None) -> None:
        return None  # no directories, as on an object store

    def prune_dirs(self, prefix: str) -> None:
        return None


@dataclass(frozen=True)
class SimLocation(LogLocation):
    """A log store location whose storage is a :class:`MemStorage` (what appends, readers and writers open)."""

    storage: MemStorage | None = field(default=None, compare=False, hash=False, repr=False)

    def open(self) -> Any:
        assert self.storage is not None
        return self.storage
