"""Where the sink's Parquet files go, and the one filesystem client of the output.

:class:`OutputLocation` is picklable and shipped to Spark tasks. :func:`filesystem` gives the fsspec filesystem of
an object store output, cached per process; every S3 request on the output goes through it (with botocore's
retries and timeouts, :func:`logstore.storage.s3_client_options`), and S3 errors arrive as built-in exceptions
(``FileNotFoundError``, ``PermissionError``, ``OSError``).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import threading
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from logstore.diagnosis import diagnose
from logstore.storage import is_local, open_filesystem

from ..errors import SinkOptionError
from .multipart import DEFAULT_PART_SIZE

OUTPUT_STAGING = "_filesink_staging"
"""The default staging directory of a local output: ``<output>/_filesink_staging``, on the output's own file
system even when the output is a mount point. Readers skip it (Spark, pyarrow, DuckDB, Trino skip names starting
with ``_`` or ``.``; the temp files in it are named ``.<file>.<n>.<attempt>.tmp``, never ``*.parquet``)."""
STATE_STAGING = "staging"
"""A local output on the state directory's file system (and mount) stages in ``<state dir>/staging``."""
STAGING_SUFFIX = ".filesink-staging"
"""Where earlier versions staged by default: ``<parent>/.<dir>.filesink-staging`` next to the output directory
(on the parent's file system, which is not the output's when the output is a mount point). Only cleaned now."""
PROBE_PREFIX = ".filesink-probe-"
"""The staging probe's temp file, ``.filesink-probe-<random>.tmp``, renamed from the staging directory into the
output's root and removed at once (one a crash left behind is garbage)."""
SHARED_PREFIX = ".filesink-shared-"
"""The marker a run's driver creates in its term's staging directory, ``.filesink-shared-<random>.tmp``, for the file
writers on the executors to find (:mod:`filesink.tasks.shared`); removed with the directory (one a crash left is
garbage)."""
MULTIPART_PROTOCOLS = frozenset({"s3", "s3a"})
"""fsspec protocols written with multipart uploads (nothing visible before ``CompleteMultipartUpload``)."""


@dataclass(frozen=True)
class OutputLocation:
    """Where the sink's Parquet files go. Picklable."""

    url: str
    """A local directory path (or ``file://`` URL), or an fsspec URL such as ``s3://bucket/table``."""
    storage_options: Mapping[str, Any] = field(default_factory=dict, hash=False, compare=False)
    staging_dir: str | None = None
    """Local output only: the directory for temp files (on the same file system and mount as ``url``; outside
    it, or exactly ``<url>/_filesink_staging``). Default: ``<url>/_filesink_staging``."""
    part_size: int = DEFAULT_PART_SIZE
    """S3 output only: the size of an upload part, which is also what each open object buffers."""

    @classmethod
    def of_sink(cls, url: str, storage_options: Mapping[str, Any], state_dir: Path) -> OutputLocation:
        """The output of a sink whose state directory is ``state_dir``: a local output on the state directory's
        file system stages in ``<state_dir>/staging``, any other in ``<output>/_filesink_staging`` (also when that
        exists already: :meth:`checked` stages there when renames from the state directory fail)."""
        if not is_local(url):
            return cls(url, dict(storage_options))
        root = Path(url.removeprefix("file://")).expanduser().absolute()
        staging = None
        if (
            not (root / OUTPUT_STAGING).is_dir()
            and root.is_dir()
            and state_dir.is_dir()
            and os.stat(state_dir).st_dev == os.stat(root).st_dev
        ):
            staging = str(state_dir / STATE_STAGING)
        return cls(url, {}, staging_dir=staging)

    def checked(self) -> OutputLocation:
        """Check that a temp file in the staging directory can be renamed into the output (a local output's files
        are published that way); return the location to write with. Creates the staging directory.

        Renames fail across file systems, and across mounts of one file system (bind mounts: same device, still
        ``EXDEV``): when the staging directory is the state directory's, the output stages in
        ``<output>/_filesink_staging`` instead (kept from then on, see :meth:`of_sink`). Raises
        :class:`SinkOptionError` naming the directories if no staging directory works (a read-only output, ...),
        before anything is written."""
        if not self.is_local:
            return self
        root = self.local_root()
        staging = self.local_staging()
        error = _probe_rename(staging, root)
        if error is None:
            return self
        inside = root / OUTPUT_STAGING
        if error.errno == errno.EXDEV and staging != inside:
            moved = OutputLocation(self.url, {}, staging_dir=str(inside), part_size=self.part_size)
            if _probe_rename(inside, root) is None:
                remove_if_empty(staging)
                return moved
            remove_if_empty(inside)
        found = diagnose(error, str(error.filename or root))
        raise SinkOptionError(
            f"the output directory {root}: a temp file in the staging directory {staging} cannot be renamed into it "
            f"({found.cause}), and the sink publishes every local file that way. Nothing was written. "
            + (
                f"The output must be writable: {found.advise('start again')}"
                if error.errno != errno.EXDEV
                else f"The staging directory must be on the output's own file system and mount; {staging} is not "
                "(is something mounted there?)."
            )
        )

    @property
    def is_local(self) -> bool:
        return is_local(self.url)

    def local_root(self) -> Path:
        return Path(self.url.removeprefix("file://")).expanduser().absolute()

    def local_staging(self) -> Path:
        root = self.local_root()
        if self.staging_dir is not None:
            staging = Path(self.staging_dir.removeprefix("file://")).expanduser().absolute()
            if staging != root / OUTPUT_STAGING and (staging == root or staging.is_relative_to(root)):
                raise ValueError(
                    f"staging directory {staging} is inside the output directory {root}; readers listing the "
                    f"output would see temp files. Put it next to the output directory, on the same file system, "
                    f"or leave it out (the default, {root / OUTPUT_STAGING}, is skipped by readers)."
                )
            return staging
        return root / OUTPUT_STAGING

    def staged(self, key: str) -> bool:
        """Whether ``key`` (relative to a local output's root) is in its ``_filesink_staging/``: a temp file."""
        return self.is_local and key.startswith(f"{OUTPUT_STAGING}/")

    def staging_places(self) -> list[Path]:
        """Every staging directory of a local output that exists: the one its writers use now, and those of
        earlier runs or versions (``<output>/_filesink_staging``, ``.<dir>.filesink-staging`` next to it), which
        recovery fences and cleans too."""
        if not self.is_local:
            return []
        root = self.local_root()
        candidates = [self.local_staging(), root / OUTPUT_STAGING]
        if root.name:
            candidates.append(root.parent / f".{root.name}{STAGING_SUFFIX}")
        found: list[Path] = []
        for path in candidates:
            if path not in found and path.is_dir():
                found.append(path)
        return found


def _probe_rename(staging: Path, root: Path) -> OSError | None:
    """Rename an empty temp file from ``staging`` into ``root`` and remove it; the error if that fails."""
    name = f"{PROBE_PREFIX}{uuid.uuid4().hex[:12]}.tmp"
    try:
        staging.mkdir(parents=True, exist_ok=True)  # prepare_staging makes its term's directory durable
        (staging / name).touch(exist_ok=False)
    except OSError as e:
        return e
    try:
        os.rename(staging / name, root / name)
    except OSError as e:
        (staging / name).unlink(missing_ok=True)
        return e
    (root / name).unlink(missing_ok=True)
    return None


def remove_if_empty(directory: Path) -> None:
    """Remove ``directory`` if it is empty (quietly leave it otherwise)."""
    with contextlib.suppress(OSError):
        directory.rmdir()


_fs_lock = threading.Lock()
_fs_cache: dict[tuple[int, str, str], tuple[Any, str]] = {}


def filesystem(output: OutputLocation) -> tuple[Any, str]:
    """The fsspec filesystem and root path (no protocol, no trailing ``/``) of a non-local output.

    Cached per process and per (URL, storage options); the options are only used as a cache key in memory.
    """
    options = dict(output.storage_options)
    cache_key = (os.getpid(), output.url, json.dumps(options, sort_keys=True, default=repr))
    with _fs_lock:
        found = _fs_cache.get(cache_key)
        if found is None:
            fs, root = open_filesystem(output.url, options)
            found = _fs_cache[cache_key] = (fs, root.rstrip("/"))
        return found


def protocols(fs: Any) -> set[str]:
    protocol = fs.protocol
    return set(protocol) if isinstance(protocol, tuple | list) else {protocol}


def upload_prefix(fs: Any, root: str) -> tuple[str, str]:
    """The bucket of an S3 output and the key prefix of its objects (``""`` at the bucket's root, else ending
    in ``/``), for listing its multipart uploads."""
    bucket, prefix, _ = fs.split_path(root + "/")
    prefix = prefix.strip("/")
    return bucket, f"{prefix}/" if prefix else ""
