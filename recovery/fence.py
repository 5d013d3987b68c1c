"""Recovery's side of fencing (see :mod:`filesink.fencing`), and the output's garbage.

- :func:`fence_writers` stops every writer of an older term from publishing: it renames the older terms'
  local staging directories away, and aborts every S3 multipart upload those writers recorded.
- :func:`find_output_garbage` / :func:`remove_output_garbage`: temp files and fenced staging directories of
  a local output, multipart uploads of this sink's files left in progress under an S3 output, and the
  records of older terms. Every key is checked to be under the output prefix and to be named like one of the
  sink's files before anything is deleted or aborted.
- :func:`remove_failed_attempts`: while the sink runs, what failed task attempts left of files that are
  published now (another attempt of the same task wrote them).

Only run the others while no writer of the current term can run (the caller holds the state directory's
lock, before the sink starts writing).
"""

from __future__ import annotations

import logging
import shutil
import uuid
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path

from filesink.fencing import PREFIX, ObjectRecord, delete_records, parse_term_dir, records, term_dir
from filesink.planner import is_file_name
from filesink.upload import abort_upload, list_uploads
from filesink.writer import OutputLocation, output_filesystem
from logstore.storage import Storage, ensure_dir, fsync_dir

log = logging.getLogger(__name__)

FENCED_PREFIX = "fenced-"
"""A fenced term's staging directory is renamed to ``fenced-<term dir>-<random>`` before it is deleted."""


@dataclass
class OutputGarbage:
    staging_temp_files: list[Path] = field(default_factory=list)
    """Temp files in the staging directory (of older terms, or of writers before terms existed)."""
    staging_dirs: list[Path] = field(default_factory=list)
    """Fenced staging directories, emptied and removed."""
    uploads: list[tuple[str, str]] = field(default_factory=list)
    """S3 multipart uploads of this sink's files still in progress, as (key under the output, upload id)."""
    records: list[ObjectRecord] = field(default_factory=list)
    """Writer records of older terms in the log store."""


def _temp_file(path: Path) -> bool:
    return path.is_file() and path.name.startswith(".part-") and path.name.endswith(".tmp")


def _staging(output: OutputLocation) -> Path | None:
    if not output.is_local:
        return None
    staging = output.local_staging()
    return staging if staging.is_dir() else None


def fence_writers(output: OutputLocation, storage: Storage, term: int) -> int:
    """Stop writers of terms below ``term`` from publishing (after ``term`` was published); return how many
    staging directories and uploads were fenced."""
    fenced = 0
    staging = _staging(output)
    if staging is not None:
        for child in sorted(staging.iterdir()):
            found = parse_term_dir(child.name)
            if found is None or found >= term or not child.is_dir():
                continue
            # Atomic: a writer's open() or rename() of a temp file in it now fails.
            child.rename(staging / f"{FENCED_PREFIX}{child.name}-{uuid.uuid4().hex[:8]}")
            fenced += 1
        if fenced:
            fsync_dir(staging)
    if not output.is_local:
        fs, root = output_filesystem(output)
        for record in records(storage, below=term):
            if record.upload_id and _is_ours(record.key, record.file):
                bucket, key, _ = fs.split_path(f"{root}/{record.key}")
                fenced += abort_upload(fs, bucket, key, record.upload_id)
    return fenced


def _is_ours(key: str, file: str) -> bool:
    return key.rsplit("/", 1)[-1] == f"{file}.parquet" and ".." not in key.split("/") and not key.startswith("/")


def prepare_staging(output: OutputLocation, term: int) -> None:
    """Create the staging directory of ``term`` (local output), where its writers put their temp files."""
    if output.is_local:
        ensure_dir(output.local_staging() / term_dir(term))


def release_staging(output: OutputLocation, term: int) -> None:
    """Remove the (empty) staging directory of ``term`` once its writers are done."""
    if output.is_local:
        try:
            (output.local_staging() / term_dir(term)).rmdir()
        except FileNotFoundError:
            pass
        except OSError as e:
            log.warning("could not remove the staging directory of writer term %d: %s", term, e)


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
        staging = output.local_staging() / term_dir(term)
        for name in names:
            for path in staging.glob(f".{name}.*.tmp"):
                path.unlink(missing_ok=True)
                removed += 1
        return removed
    wanted = set(keys)
    fs, root = output_filesystem(output)
    bucket, prefix, _ = fs.split_path(root + "/")
    prefix = prefix.rstrip("/") + "/"
    for key, upload_id in list_uploads(fs, bucket, prefix):
        if key.startswith(prefix) and key[len(prefix) :] in wanted:
            removed += abort_upload(fs, bucket, key, upload_id)
    return removed


def find_output_garbage(output: OutputLocation, storage: Storage, sink_id: str, term: int) -> OutputGarbage:
    """What :func:`remove_output_garbage` would remove: nothing a writer of ``term`` could be using."""
    garbage = OutputGarbage(records=list(records(storage, below=term)))
    staging = _staging(output)
    if staging is not None:
        for child in sorted(staging.iterdir()):
            found = parse_term_dir(child.name)
            if _temp_file(child):
                garbage.staging_temp_files.append(child)
            elif child.is_dir() and (child.name.startswith(FENCED_PREFIX) or (found is not None and found < term)):
                garbage.staging_dirs.append(child)
                garbage.staging_temp_files += sorted(p for p in child.iterdir() if _temp_file(p))
    if not output.is_local:
        fs, root = output_filesystem(output)
        bucket, prefix, _ = fs.split_path(root + "/")
        prefix = prefix.rstrip("/") + "/"
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
        fs, root = output_filesystem(output)
        for key, upload_id in garbage.uploads:
            bucket, full_key, _ = fs.split_path(f"{root}/{key}")
            abort_upload(fs, bucket, full_key, upload_id)
    delete_records(storage, garbage.records)
    if garbage.records:
        storage.prune_dirs(PREFIX)
