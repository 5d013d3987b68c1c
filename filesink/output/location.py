"""Where the sink's Parquet files go, and the one filesystem client of the output.

:class:`OutputLocation` is picklable and shipped to Spark tasks. :func:`filesystem` gives the fsspec filesystem of
an object store output, cached per process; every S3 request on the output goes through it (with botocore's
retries and timeouts, :func:`logstore.storage.s3_client_options`), and S3 errors arrive as built-in exceptions
(``FileNotFoundError``, ``PermissionError``, ``OSError``).
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from logstore.storage import is_local, open_filesystem

from .multipart import DEFAULT_PART_SIZE

STAGING_SUFFIX = ".filesink-staging"
"""The default staging directory of a local output ``<parent>/<dir>`` is ``<parent>/.<dir>.filesink-staging``."""
STATE_STAGING = "staging"
"""A local output on the state directory's file system stages in ``<state dir>/staging``."""
MULTIPART_PROTOCOLS = frozenset({"s3", "s3a"})
"""fsspec protocols written with multipart uploads (nothing visible before ``CompleteMultipartUpload``)."""


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

    @classmethod
    def of_sink(cls, url: str, storage_options: Mapping[str, Any], state_dir: Path) -> OutputLocation:
        """The output of a sink whose state directory is ``state_dir``: a local output on the state directory's
        file system stages in ``<state_dir>/staging`` (no directory is created next to the output)."""
        if not is_local(url):
            return cls(url, dict(storage_options))
        root = Path(url.removeprefix("file://")).expanduser().absolute()
        staging = None
        if root.exists() and state_dir.exists() and os.stat(state_dir).st_dev == os.stat(root).st_dev:
            staging = str(state_dir / STATE_STAGING)
        return cls(url, {}, staging_dir=staging)

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
