"""The writer's interface to the output: objects that stay invisible until published, one kind per store.

A file writer (:func:`filesink.tasks.writer.write_file`) asks :func:`open_target` for a :class:`Target`, then for one
:class:`OutputObject` per partition of the file. Each object is opened and written, finished (complete and
durable, not visible), recorded for recovery, then published; or aborted.

- **Local directories**: a temp file in the writer term's staging directory (on the output's file system and
  mount: ``<output>/_filesink_staging``, or the state directory's ``staging``; checked at the sink's start by
  :meth:`~filesink.output.location.OutputLocation.checked`), fsynced, then renamed into place, and the
  directories fsynced.
- **S3**: a multipart upload (:mod:`filesink.output.multipart`) that only ``CompleteMultipartUpload`` makes
  visible; with a fence, its upload id is recorded before any part is sent.

Both are fenced (:mod:`filesink.output.fencing`): a writer of an older term cannot publish.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, BinaryIO, Protocol

from logstore.storage import ensure_dir, fsync_dir

from ..errors import FencedError
from .fencing import Fence, ObjectRecord, term_dir
from .location import MULTIPART_PROTOCOLS, OutputLocation, filesystem, protocols
from .multipart import MultipartObject

log = logging.getLogger(__name__)


class OutputObject(Protocol):
    """One object of a file: opened and written, then finished, then published; or aborted."""

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


class Target(Protocol):
    """Where one run of a file's writer creates its objects."""

    def new_object(self, key: str, index: int) -> OutputObject: ...

    def check(self) -> None:
        """Raise :class:`FencedError` if the writer is fenced already (at its start, and right before it
        publishes: a term record above its own, or its staging directory renamed away)."""

    def after_publish(self, objects: Sequence[OutputObject]) -> None: ...


def open_target(output: OutputLocation, name: str, term: int, attempt: str, fence: Fence | None) -> Target:
    """The target of one run (``attempt``) of the writer of file ``name`` in writer term ``term`` (0: unfenced)."""
    if output.is_local:
        return LocalTarget(output, name, term, attempt, fence)
    return UploadTarget(output, name, fence)


def _staging_gone(where: str, staging: Path, term: int) -> FencedError:
    return FencedError(
        f"{where}: this writer belongs to writer term {term}, whose staging directory {staging} is gone: the sink "
        "has restarted since this writer started, so it must not publish. Recovery has resolved or will resolve "
        "this file."
    )


# -- local directories ---------------------------------------------------------------------------------------


class LocalObject:
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


class LocalTarget:
    def __init__(self, output: OutputLocation, name: str, term: int, attempt: str, fence: Fence | None) -> None:
        self.root = output.local_root()
        self.term = term
        self.fence = fence
        self.fenced = term > 0
        self.staging = output.local_staging() / term_dir(term) if self.fenced else output.local_staging()
        self.name = name
        self.run = attempt  # only temp names are random; they never become visible

    def new_object(self, key: str, index: int) -> OutputObject:
        return LocalObject(self.root, self.staging, key, f".{self.name}.{index:05d}.{self.run}.tmp", self.term)

    def check(self) -> None:
        if self.fenced and not self.staging.is_dir():
            raise _staging_gone(f"file {self.name}", self.staging, self.term)
        if self.fence is not None:
            self.fence.check(f"file {self.name}")

    def after_publish(self, objects: Sequence[OutputObject]) -> None:
        for directory in sorted({(self.root / o.key).parent for o in objects}):
            fsync_dir(directory)


# -- S3 ------------------------------------------------------------------------------------------------------


class UploadObject:
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


class UploadTarget:
    def __init__(self, output: OutputLocation, name: str, fence: Fence | None) -> None:
        self.fs, self.root = filesystem(output)
        found = protocols(self.fs)
        if not found & MULTIPART_PROTOCOLS:
            raise ValueError(
                f"output {output.url}: protocol {'/'.join(sorted(found))} is not supported; the writer needs "
                "files that stay invisible until committed (local directories and S3 are supported)"
            )
        self.part_size = output.part_size
        self.name = name
        self.fence = fence

    def new_object(self, key: str, index: int) -> OutputObject:
        path = f"{self.root}/{key}"
        return UploadObject(self.fs, path, key, index, self.part_size, self.name, self.fence)

    def check(self) -> None:
        if self.fence is not None:
            self.fence.check(f"file {self.name}")

    def after_publish(self, objects: Sequence[OutputObject]) -> None:
        return None
