"""How long an object's key may be in each kind of output: what the admission check measures partition
directories against (:func:`filesink.schema.partitioning.check_paths`).

- **Local directory**: each path component at most ``NAME_MAX`` bytes and the whole path at most ``PATH_MAX - 1``
  bytes, as the output directory's file system says (``pathconf``; 255 and 4,096 on Linux's usual file systems).
  The whole path is the output directory's absolute path, the partition directories and the object's name. Temp
  files are named after the file, not its partition values, so they are never the longer path.
- **S3**: the key at most 1,024 bytes (S3's limit), from the output's key prefix on; and each ``/``-separated part
  at most 255 bytes: MinIO and the S3 servers that keep objects as files (rclone's, for one) refuse longer parts,
  AWS does not, and the sink refuses them everywhere so that an output works on any store it is moved to.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from .location import OutputLocation
from .naming import OBJECT_NAME_BYTES

S3_KEY_BYTES = 1024
"""S3's longest object key, in UTF-8 bytes."""
S3_PART_BYTES = 255
"""The longest ``/``-separated part of a key the sink writes to S3 (MinIO's and file-backed servers' limit)."""


@dataclass(frozen=True)
class KeyLimits:
    """What the keys of one output may be (picklable; shipped to the append tasks)."""

    prefix_bytes: int
    """Bytes of the key before the first partition directory (the output's path or key prefix, and a ``/``)."""
    component_bytes: int
    """The longest directory name (path component)."""
    key_bytes: int
    """The longest whole key or path, from where ``prefix_bytes`` starts."""
    component_rule: str
    """Where ``component_bytes`` comes from, for messages: "a path component may have on ..."."""
    key_rule: str
    name_bytes: int = OBJECT_NAME_BYTES
    """The longest object name (the last component)."""


def key_limits(output: OutputLocation) -> KeyLimits:
    """The limits of ``output``'s keys; for a local output, its directory must exist."""
    if output.is_local:
        root = output.local_root()
        name_max = _pathconf(root, "PC_NAME_MAX", 255)
        path_max = _pathconf(root, "PC_PATH_MAX", 4096)
        return KeyLimits(
            prefix_bytes=len(os.fsencode(root)) + 1,
            component_bytes=name_max,
            key_bytes=path_max - 1,
            component_rule=f"a path component may have on the file system of the output directory {root}",
            key_rule=f"a path may have on the file system of the output directory {root}",
        )
    _, _, path = output.url.partition("://")
    _bucket, _, prefix = path.partition("/")
    prefix = prefix.strip("/")
    return KeyLimits(
        prefix_bytes=len(prefix.encode()) + 1 if prefix else 0,
        component_bytes=S3_PART_BYTES,
        key_bytes=S3_KEY_BYTES,
        component_rule=(
            f"the sink allows a part of an S3 key to have (output {output.url}; MinIO and file-backed S3 servers "
            "refuse longer parts)"
        ),
        key_rule=f"an S3 key may have (output {output.url})",
    )


def _pathconf(path: os.PathLike[str] | str, name: str, default: int) -> int:
    try:
        value = os.pathconf(path, name)
    except (OSError, ValueError):
        return default
    return value if value > 0 else default
