"""The one owner of the output store: nothing else in the project touches the output's files or its S3 client.

| module | what it owns |
|---|---|
| :mod:`.location` | :class:`OutputLocation` (picklable), the output's fsspec filesystem (one per process) |
| :mod:`.naming` | object names: ``<partition dirs>/<file name>-<dir digest>.parquet``, file names from the plan |
| :mod:`.limits` | how long keys may be on each store (what partition directories are checked against) |
| :mod:`.objects` | the writer's interface: objects invisible until published (local temp file + rename, S3 multipart) |
| :mod:`.multipart` | the S3 multipart upload protocol, listing and aborting uploads |
| :mod:`.fencing` | writer terms, writers' records, per-term staging directories and a run's marker, fencing |
| :mod:`.visibility` | which objects of a file a reader sees (what recovery checks) |
| :mod:`.garbage` | what dead, stalled or fenced writers left: temp files, uploads, records |
| :mod:`.claim` | ``_filesink.json``: which sink writes to the output |
| :mod:`.mark` | ``_filesink_mark.json``: per vnode, the epoch its committed files reach (a state behind is refused) |
"""

from __future__ import annotations

from .claim import CLAIM_NAME, claim_output
from .fencing import (
    Fence,
    ObjectRecord,
    fence_writers,
    forget_committed,
    mark_staging,
    prepare_staging,
    records,
    release_staging,
)
from .garbage import OutputGarbage, find_output_garbage, remove_failed_attempts, remove_output_garbage
from .location import OutputLocation
from .mark import MARK_NAME, check_mark, write_mark
from .naming import SUFFIX, file_name, is_file_name, is_object_of, is_shared_name, object_key
from .objects import OutputObject, Target, open_target
from .probe import check_s3
from .visibility import list_objects, object_keys

__all__ = [
    "CLAIM_NAME",
    "MARK_NAME",
    "SUFFIX",
    "Fence",
    "ObjectRecord",
    "OutputGarbage",
    "OutputLocation",
    "OutputObject",
    "Target",
    "check_mark",
    "check_s3",
    "claim_output",
    "fence_writers",
    "file_name",
    "find_output_garbage",
    "forget_committed",
    "is_file_name",
    "is_object_of",
    "is_shared_name",
    "list_objects",
    "mark_staging",
    "object_key",
    "object_keys",
    "open_target",
    "prepare_staging",
    "records",
    "release_staging",
    "remove_failed_attempts",
    "remove_output_garbage",
    "write_mark",
]
