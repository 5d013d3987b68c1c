"""Which objects of a file are visible in the output: what recovery checks before it commits or rewinds a file.

Visible means what a reader listing the output sees: on local disk, ``os.walk``; on S3, an undelimited listing
of the output prefix (s3fs's ``find``), with the filesystem's listing cache dropped first.
"""

from __future__ import annotations

import os
from pathlib import Path

from logstore.storage import storage_error

from .location import OutputLocation, filesystem
from .naming import SUFFIX


def object_keys(output: OutputLocation, name: str) -> list[tuple[str, int]]:
    """Every visible ``<...>/<name>.parquet`` under the output, as (key relative to the root, size), sorted."""
    return list_objects(output, f"file {name}", basename=f"{name}{SUFFIX}")


def list_objects(
    output: OutputLocation, what: str = "the output", *, basename: str | None = None
) -> list[tuple[str, int]]:
    """Every visible object under the output (only those named ``basename``, if given), as (key relative to the
    root, size), sorted. Never the staging directory, which is outside the output."""
    found: list[tuple[str, int]] = []
    if output.is_local:
        root = output.local_root()
        for dirpath, _dirs, files in os.walk(root):
            for file in files if basename is None else [basename] if basename in files else []:
                path = Path(dirpath) / file
                try:
                    size = path.stat().st_size
                except FileNotFoundError:
                    continue
                found.append((path.relative_to(root).as_posix(), size))
        return sorted(f for f in found if not output.staged(f[0]))  # temp files are not objects
    fs, prefix = filesystem(output)
    fs.invalidate_cache()
    try:
        listing = fs.find(prefix, detail=True)  # s3fs: an undelimited listing of the prefix
    except FileNotFoundError:
        return []
    except OSError as e:
        raise storage_error(f"{what}: cannot list {output.url} for its objects", e) from e
    for path, info in listing.items():
        if info.get("type") == "directory" or not path.startswith(prefix + "/"):
            continue
        key = path[len(prefix) + 1 :]
        if basename is None or key.rsplit("/", 1)[-1] == basename:
            found.append((key, int(info.get("size") or 0)))
    return sorted(found)
