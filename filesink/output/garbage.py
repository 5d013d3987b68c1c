"""The output's garbage: what writers that died, stalled or were fenced left behind.

- :func:`find_output_garbage` / :func:`remove_output_garbage`: temp files and fenced staging directories of a
  local output (in every staging directory it had: earlier versions staged next to the output directory, whose
  empty staging directory then goes too; and a staging probe's file a crash left in the output), multipart
  uploads of this sink's files left in progress under an S3 output, and the writer records of older terms.
  Every key is checked to be under the output prefix and to be named like one of the sink's files before
  anything is deleted or aborted. Only while no writer of the current term can run (the caller holds the state
  directory's lock, before the sink starts writing).
- :func:`remove_failed_attempts`: while the sink runs, what failed task attempts left of files that are
  published and committed now (another attempt of the same task wrote them).
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path

from logstore.storage import Storage

from .fencing import FENCED_PREFIX, PREFIX, ObjectRecord, delete_records, parse_term_dir, records, staging, term_dir
from .location import (
    OUTPUT_STAGING,
    PROBE_PREFIX,
    SHARED_PREFIX,
    OutputLocation,
    filesystem,
    remove_if_empty,
    upload_prefix,
)
from .multipart import abort_upload, list_uploads
from .naming import is_file_name

log = logging.getLogger(__name__)


@dataclass
class OutputGarbage:
    staging_temp_files: list[Path] = field(default_factory=list)
    """Temp files in the staging directory (of older terms, or of writers before terms existed), and the markers of
    older terms' runs (:data:`~filesink.output.location.SHARED_PREFIX`)."""
    staging_dirs: list[Path] = field(default_factory=list)
    """Fenced staging directories, emptied and removed."""
    uploads: list[tuple[str, str]] = field(default_factory=list)
    """S3 multipart uploads of this sink's files still in progress, as (key under the output, upload id)."""
    records: list[ObjectRecord] = field(default_factory=list)
    """Writer records of older terms in the log store."""

    @property
    def empty(self) -> bool:
        return not (self.staging_temp_files or self.staging_dirs or self.uploads or self.records)


def _temp_file(path: Path) -> bool:
    named = path.name.startswith((".part-", PROBE_PREFIX, SHARED_PREFIX)) and path.name.endswith(".tmp")
    return named and path.is_file()


def remove_failed_attempts(output: OutputLocation, term: int, names: Collection[str], keys: Collection[str]) -> int:
    """Remove what failed attempts at writing the files ``names`` of writer term ``term`` left; return how many.

    On a cluster a task attempt can die in the middle of a file (its executor is lost) or stall, and Spark
    runs the task again. Call this once the files are published and committed: all their objects (``keys``,
    relative to the output) are visible, so temp files of these files in the term's staging directory
    (local) and multipart uploads of these keys still in progress (S3) belong to other attempts and can never
    be needed. An attempt still running then fails when it publishes; its file is already there, same bytes.
    """
    removed = 0
    if output.is_local:
        directory = output.local_staging() / term_dir(term)
        for name in names:
            for path in directory.glob(f".{name}.*.tmp"):
                path.unlink(missing_ok=True)
                removed += 1
        return removed
    wanted = set(keys)
    fs, root = filesystem(output)
    bucket, prefix = upload_prefix(fs, root)
    for key, upload_id in list_uploads(fs, bucket, prefix):
        if key.startswith(prefix) and key[len(prefix) :] in wanted:
            removed += abort_upload(fs, bucket, key, upload_id)
    return removed


def find_output_garbage(output: OutputLocation, storage: Storage, sink_id: str, term: int) -> OutputGarbage:
    """What :func:`remove_output_garbage` would remove: nothing a writer of ``term`` could be using."""
    garbage = OutputGarbage(records=list(records(storage, below=term)))
    if output.is_local and output.local_root().is_dir():  # a staging probe's file, left by a crash
        probes = output.local_root().glob(f"{PROBE_PREFIX}*.tmp")
        garbage.staging_temp_files += sorted(p for p in probes if _temp_file(p))
    for found_staging in staging(output, storage):
        for child in sorted(found_staging.iterdir()):
            found = parse_term_dir(child.name)
            if _temp_file(child):
                garbage.staging_temp_files.append(child)
            elif child.is_dir() and (child.name.startswith(FENCED_PREFIX) or (found is not None and found < term)):
                garbage.staging_dirs.append(child)
                garbage.staging_temp_files += sorted(p for p in child.iterdir() if _temp_file(p))
    if not output.is_local:
        fs, root = filesystem(output)
        bucket, prefix = upload_prefix(fs, root)
        for key, upload_id in list_uploads(fs, bucket, prefix):
            if key.startswith(prefix) and is_file_name(sink_id, key.rsplit("/", 1)[-1]):
                garbage.uploads.append((key[len(prefix) :], upload_id))
    return garbage


def remove_output_garbage(output: OutputLocation, storage: Storage, garbage: OutputGarbage) -> None:
    for path in garbage.staging_temp_files:
        path.unlink(missing_ok=True)
    for directory in garbage.staging_dirs:
        leftovers = [p.name for p in directory.iterdir()] if directory.is_dir() else []
        if leftovers:  # not written by us: leave it, and say so
            log.warning("staging directory %s holds unexpected files %s; not removing it", directory, leftovers)
            continue
        shutil.rmtree(directory, ignore_errors=True)
    if garbage.uploads:
        fs, root = filesystem(output)
        for key, upload_id in garbage.uploads:
            bucket, full_key, _ = fs.split_path(f"{root}/{key}")
            abort_upload(fs, bucket, full_key, upload_id)
    if output.is_local:  # staging directories of earlier versions go once empty
        for place in output.staging_places():
            if place not in (output.local_staging(), output.local_root() / OUTPUT_STAGING):
                remove_if_empty(place)
    delete_records(storage, garbage.records)
    if garbage.records:
        storage.prune_dirs(PREFIX)
