"""Which objects of a file are visible in the output: what recovery checks before it commits or rewinds a file.

Visible means what a reader listing the output sees: on local disk, ``os.walk``; on S3, an undelimited listing
of the output prefix (s3fs's ``find``), with the filesystem's listing cache dropped first.
"""

from __future__ import annotations

import os
from pathlib import Path

from logstore.storage import storage_error

from .location import OutputLocation, filesystem
from .naming import is_object_of


def object_keys(output: OutputLocation, name: str) -> list[tuple[str, int]]:
    """Every visible object of the file ``name`` under the output (``<name>.parquet``, or
    ``<dirs>/<name>-<digest>.parquet``, or as earlier versions named them ``<dirs>/<name>.parquet``), as (key
    relative to the root, size), sorted."""
    return list_objects(output, f"file {name}", file=name)


def list_objects(output: OutputLocation, what: str = "the output", *, file: str | None = None) -> list[tuple[str, int]]:
    """Every visible object under the output (only the objects of the file ``file``, if given), as (key relative to
    the root, size), sorted. Never the staging directory, which is outside the output."""
    found: list[tuple[str, int]] = []
    if output.is_local:
        root = output.local_root()
        for dirpath, _dirs, files in os.walk(root):
            for base in files if file is None else [f for f in files if is_object_of(file, f)]:
                path = Path(dirpath) / base
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
        raise storage_error(f"{what}: cannot list {output.url} for its objects", e, writing=False) from e
    for path, info in listing.items():
        if info.get("type") == "directory" or not path.startswith(prefix + "/"):
            continue
        key = path[len(prefix) + 1 :]
        if file is None or is_object_of(file, key.rsplit("/", 1)[-1]):
            found.append((key, int(info.get("size") or 0)))
    return sorted(found)


def missing_objects(output: OutputLocation, sizes: dict[str, int]) -> list[str]:
    """Of the objects ``sizes`` (key relative to the root -> size written), the keys that are not in the output at
    that size, sorted: one ``stat`` (local) or uncached ``HEAD`` (S3) per object, no listing."""
    gone: list[str] = []
    if output.is_local:
        root = output.local_root()
        for key, size in sizes.items():
            try:
                if (root / key).stat().st_size != size:
                    gone.append(key)
            except FileNotFoundError:
                gone.append(key)
        return sorted(gone)
    fs, prefix = filesystem(output)
    for key, size in sizes.items():
        try:
            if int(fs.info(f"{prefix}/{key}", refresh=True)["size"]) != size:
                gone.append(key)
        except FileNotFoundError:
            gone.append(key)
    return sorted(gone)
