"""How the sink's objects are named: ``<partition dirs>/<file name>.parquet``, the file name a function of the plan.

A name only one plan can give (sink, epochs, vnode range, per-vnode starts), so re-running a plan writes the same
objects, and recovery and garbage collection can tell the sink's objects from anything else under the output.
"""

from __future__ import annotations

import json
import re
import zlib

SUFFIX = ".parquet"


def file_name(sink_id: str, writer: range, starts: dict[int, int], end_epoch: int) -> str:
    """A name that only this data can have: sink, first and last epoch, vnode range, per-vnode starts."""
    digest = zlib.crc32(json.dumps(sorted(starts.items())).encode())
    first = min(starts.values())
    return f"part-{sink_id[:8]}-{first:020d}-{end_epoch:020d}-{writer.start:05d}-{writer.stop - 1:05d}-{digest:08x}"


def is_file_name(sink_id: str, basename: str) -> bool:
    """Whether ``basename`` is a Parquet object name that :func:`file_name` gives files of this sink."""
    pattern = rf"part-{re.escape(sink_id[:8])}-\d{{20}}-\d{{20}}-\d{{5}}-\d{{5}}-[0-9a-f]{{8}}\.parquet"
    return re.fullmatch(pattern, basename) is not None


def object_key(partition_dir: str, name: str) -> str:
    """The key of a file's object in a partition directory (``""`` without partitioning), relative to the output."""
    return f"{partition_dir}/{name}{SUFFIX}" if partition_dir else f"{name}{SUFFIX}"
