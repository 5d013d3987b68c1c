"""How the sink's objects are named: ``<partition dirs>/<file name>-<dir digest>.parquet``, the file name a
function of the plan.

A name only one plan can give (sink, epochs, vnode range, per-vnode starts), so re-running a plan writes the same
objects, and recovery and garbage collection can tell the sink's objects from anything else under the output.

A partitioned file has one object per partition directory, and each object's name ends in a digest of its
directory, so no two objects of a file share a name: on a file system that ignores case (macOS's default, SMB)
or Unicode normalization, ``p=A`` and ``p=a`` are one directory, and objects with the same name would replace each
other. An unpartitioned file is one object, ``<file name>.parquet``. Versions before the digest gave every
object of a file the same name; :func:`is_object_of` and :func:`is_file_name` still find those.
"""

from __future__ import annotations

import hashlib
import json
import re
import zlib

SUFFIX = ".parquet"

_DIGEST = r"[0-9a-f]{16}"
_AFTER_SINK = r"-\d{20}-\d{20}-\d{5}-\d{5}-[0-9a-f]{8}"
"""What follows ``part-<sink id's first 8>`` in a file name (:func:`file_name`): epochs, vnodes, digest."""


def file_name(sink_id: str, writer: range, starts: dict[int, int], end_epoch: int) -> str:
    """A name that only this data can have: sink, first and last epoch, vnode range, per-vnode starts."""
    digest = zlib.crc32(json.dumps(sorted(starts.items())).encode())
    first = min(starts.values())
    return f"part-{sink_id[:8]}-{first:020d}-{end_epoch:020d}-{writer.start:05d}-{writer.stop - 1:05d}-{digest:08x}"


def is_file_name(sink_id: str, basename: str) -> bool:
    """Whether ``basename`` is a Parquet object name that this sink's files' objects have."""
    pattern = rf"part-{re.escape(sink_id[:8])}{_AFTER_SINK}(-{_DIGEST})?{re.escape(SUFFIX)}"
    return re.fullmatch(pattern, basename) is not None


def dir_digest(partition_dir: str) -> str:
    """16 hex digits that tell the objects of a file apart by their directory."""
    return hashlib.blake2b(partition_dir.encode("utf-8", "surrogatepass"), digest_size=8).hexdigest()


def object_key(partition_dir: str, name: str, *, shared_name: bool = False) -> str:
    """The key of a file's object in a partition directory (``""`` without partitioning), relative to the output.
    ``shared_name``: the name versions before the digest gave it (only to rewrite such a file the same way)."""
    if not partition_dir:
        return f"{name}{SUFFIX}"
    if shared_name:
        return f"{partition_dir}/{name}{SUFFIX}"
    return f"{partition_dir}/{name}-{dir_digest(partition_dir)}{SUFFIX}"


def is_object_of(name: str, basename: str) -> bool:
    """Whether ``basename`` is the name of an object of the file ``name`` (of this version or an earlier one)."""
    if basename == f"{name}{SUFFIX}":
        return True
    return re.fullmatch(rf"{re.escape(name)}-{_DIGEST}{re.escape(SUFFIX)}", basename) is not None


def file_of(basename: str) -> str | None:
    """The name of the file whose object ``basename`` is (None if it is not a sink's object name)."""
    m = re.fullmatch(rf"(part-[^-/]{{8}}{_AFTER_SINK})(-{_DIGEST})?{re.escape(SUFFIX)}", basename)
    return m.group(1) if m else None


def is_shared_name(key: str, name: str) -> bool:
    """Whether ``key`` is a partitioned object of ``name`` named as before the digest (every object one name)."""
    return "/" in key and key.rsplit("/", 1)[-1] == f"{name}{SUFFIX}"


OBJECT_NAME_BYTES = len(object_key("x", file_name("0" * 8, range(0, 2**15), {0: 0}, 0)).encode()) - len("x/")
"""The length of a partitioned object's name (file names have one length)."""
