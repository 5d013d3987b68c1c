"""Writer terms: how a file writer from before a restart is kept from making a file visible afterwards.

Both sides are here: the writer's (:class:`Fence`, :class:`ObjectRecord`) and the driver's and recovery's
(:func:`fence_writers`, the per-term staging directories, the records' clean-up).

Every sink start (and every ``filesink recover apply``) takes a new **writer term**: it creates the term's
record in the durable home, only if absent (:meth:`logstore.home.DurableHome.take_term`), in the log store's
location, which every file writer can read (writers have no access to the state database). A writer holds the
term of the run that started it, in its :class:`~filesink.tasks.writer.FileTask`, and is **fenced** once a newer
term exists (it checks for a term record above its own right before it publishes):

- **Local output**: a writer's temp files live in its term's staging directory ``<staging>/term-<T>``, which
  only the driver creates. Recovery renames the directories of older terms away (in every staging directory
  the output had, :meth:`~filesink.output.location.OutputLocation.staging_places`) before it looks at any file:
  a writer that had not opened its temp file yet finds no directory, and one that had finds that its rename
  into the output fails. Both are atomic on one file system, so a writer either published before recovery
  looked, or never does.
- **S3 output**: a writer records each multipart upload id under ``writers/term-<T>/`` in the log store
  before it sends the first part, then checks for a newer term and gives up if there is one. Recovery
  takes the new term first, then aborts every recorded upload of older terms; S3 refuses to complete an
  aborted upload. A writer that recorded its upload before recovery listed the records is aborted; one that
  recorded it later reads the new term and stops. Uploads a writer created but never recorded (it died in
  between) are found by listing the output's multipart uploads and aborted as garbage.

Each run of a file's writer (a Spark task attempt) records under names of its own,
``writers/term-<T>/<file>/<object index>-<attempt>.json``: on a cluster Spark runs a task again when its
executor is lost, and a retry must not overwrite the upload id of an attempt that may still be running
(a stalled executor), or recovery would not abort that upload.

Writers also record each object's size before publishing it, so recovery can check that a visible object
is the one the file's writer wrote (size as recorded).
"""

from __future__ import annotations

import json
import logging
import re
import uuid
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from pathlib import Path

from logstore import LogLocation, guards
from logstore.home import DurableHome
from logstore.storage import Storage, ensure_dir, fsync_dir

from ..errors import FencedError
from .location import SHARED_PREFIX, OutputLocation, filesystem
from .multipart import abort_upload
from .naming import is_object_of

log = logging.getLogger(__name__)

PREFIX = "writers"
"""Log store subdirectory of the writers' records (the log store's garbage collection leaves it alone)."""
FENCED_PREFIX = "fenced-"
"""A fenced term's staging directory is renamed to ``fenced-<term dir>-<random>`` before it is deleted."""
_TERM_DIR = re.compile(r"^term-(\d{10})$")


def term_dir(term: int) -> str:
    return f"term-{term:010d}"


def parse_term_dir(name: str) -> int | None:
    """The term of a ``term-<T>`` directory name, or None for any other name."""
    m = _TERM_DIR.match(name)
    return int(m.group(1)) if m else None


@dataclass(frozen=True)
class ObjectRecord:
    """What a writer recorded about one object of a file, before making it visible."""

    term: int
    file: str
    index: int
    key: str
    upload_id: str | None = None
    """The multipart upload that makes the object visible (S3); None on local disk."""
    size: int | None = None
    """The object's size, recorded once it is complete and before it is published."""
    attempt: str = ""
    """The run of the writer that recorded it (:attr:`Fence.attempt`)."""

    @property
    def relpath(self) -> str:
        return record_path(self.term, self.file, self.index, self.attempt)

    def to_json(self) -> bytes:
        fields = {"key": self.key, "upload_id": self.upload_id, "size": self.size}
        return json.dumps(fields, sort_keys=True).encode()


def record_path(term: int, file: str, index: int, attempt: str = "") -> str:
    return f"{PREFIX}/{term_dir(term)}/{file}/{index:05d}{'-' + attempt if attempt else ''}.json"


@dataclass(frozen=True)
class Fence:
    """A writer's side of fencing: its term, and where the records and the term records are. Picklable."""

    log: LogLocation
    term: int
    attempt: str = ""
    """Set by each run of a writer (:func:`filesink.tasks.writer.write_file`), which names its records after it."""

    def record(self, record: ObjectRecord) -> None:
        """Write ``record`` durably to the log store (one atomic write)."""
        storage = self.log.open()
        try:
            storage.write(record.relpath, [record.to_json()])
        except OSError as e:
            raise OSError(e.errno, f"{storage.display(record.relpath)}: {e.strerror or e}") from e

    def forget(self, record: ObjectRecord) -> None:
        """Delete ``record`` (a fenced writer cleaning up after itself)."""
        self.log.open().delete(record.relpath)

    def check(self, where: str) -> None:
        """Raise :class:`FencedError` if a term above this writer's was taken (the same check as the driver's,
        :meth:`DurableHome.check_term`)."""
        if not guards.on("writer.fence"):
            return
        try:
            DurableHome(self.log.open()).check_term(self.term, where)
        except FencedError as e:
            raise FencedError(
                f"{e} This file writer must not publish: recovery has resolved or will resolve its file."
            ) from None


# -- the driver's and recovery's side -------------------------------------------------------------------------


def records(storage: Storage, *, below: int | None = None, term: int | None = None) -> Iterator[ObjectRecord]:
    """The object records of terms below ``below`` (or of exactly ``term``), as found in storage."""
    prefix = f"{PREFIX}/{term_dir(term)}" if term is not None else PREFIX
    for relpath, _size in list(storage.list_files(prefix)):
        parts = relpath.split("/")
        if len(parts) != 4 or parts[0] != PREFIX or not parts[3].endswith(".json"):
            continue
        found = parse_term_dir(parts[1])
        if found is None or (below is not None and found >= below):
            continue
        try:
            fields = json.loads(storage.read_all(relpath))
        except FileNotFoundError:
            continue
        except ValueError:
            fields = {}  # a torn record cannot exist (writes are atomic); an unreadable one is only deleted
        number, _, attempt = parts[3].removesuffix(".json").partition("-")
        yield ObjectRecord(
            term=found,
            file=parts[2],
            index=int(number) if number.isdigit() else -1,
            key=str(fields.get("key", "")),
            upload_id=fields.get("upload_id"),
            size=fields.get("size"),
            attempt=attempt,
        )


def delete_records(storage: Storage, found: list[ObjectRecord]) -> int:
    storage.delete_many([r.relpath for r in found])
    return len(found)


def forget_committed(storage: Storage, term: int, names: Collection[str]) -> None:
    """Delete the records of every attempt at writing the files ``names`` of ``term`` (committed now)."""
    prefix = f"{PREFIX}/{term_dir(term)}"
    found = [relpath for relpath, _size in storage.list_files(prefix)]
    # writers/term-<T>/<file>/<index>-<attempt>.json
    storage.delete_many([p for p in found if len(parts := p.split("/")) == 4 and parts[2] in names])
    storage.prune_dirs(prefix)


# -- per-term staging directories (local output) and fencing older writers -------------------------------------


def staging(output: OutputLocation, storage: Storage | None = None) -> list[Path]:
    """The staging directories of a local output that exist: the current one and those of earlier runs or
    versions (:meth:`OutputLocation.staging_places`), and those the term records in the durable home name (a run
    from another state directory staged there). Writers of older terms may still hold directories in any."""
    found = output.staging_places()
    if storage is not None and output.is_local:
        for record in DurableHome(storage).terms().values():
            place = record.get("staging")
            if isinstance(place, str) and Path(place) not in found and Path(place).is_dir():
                found.append(Path(place))
    return found


def term_staging(output: OutputLocation, term: int) -> Path:
    """Where writers of ``term`` put their temp files (local output)."""
    return output.local_staging() / term_dir(term)


def prepare_staging(output: OutputLocation, term: int) -> None:
    """Create the staging directory of ``term`` (local output), where its writers put their temp files."""
    if output.is_local:
        ensure_dir(term_staging(output, term))


def mark_staging(output: OutputLocation, term: int, token: str) -> Path:
    """Create the marker ``token`` names in the staging directory of ``term`` (local output): the file writers on
    the executors look for it (:mod:`filesink.tasks.shared`). Returns its path."""
    marker = term_staging(output, term) / f"{SHARED_PREFIX}{token}.tmp"
    marker.touch(exist_ok=False)
    return marker


def release_staging(output: OutputLocation, term: int) -> None:
    """Remove the staging directory of ``term`` once its writers are done (empty but for the run's marker)."""
    if output.is_local:
        try:
            for marker in term_staging(output, term).glob(f"{SHARED_PREFIX}*.tmp"):
                marker.unlink(missing_ok=True)
            term_staging(output, term).rmdir()
        except FileNotFoundError:
            pass
        except OSError as e:
            log.warning("could not remove the staging directory of writer term %d: %s", term, e)


def fence_writers(output: OutputLocation, storage: Storage, term: int) -> int:
    """Stop writers of terms below ``term`` from publishing (after ``term`` was taken); return how many
    staging directories and uploads were fenced.

    Local output: the older terms' staging directories are renamed away (atomic: a writer's open() or rename()
    of a temp file in one now fails). S3 output: every upload recorded by an older term is aborted."""
    fenced = 0
    for found_staging in staging(output, storage):
        renamed = 0
        for child in sorted(found_staging.iterdir()):
            found = parse_term_dir(child.name)
            if found is None or found >= term or not child.is_dir():
                continue
            child.rename(found_staging / f"{FENCED_PREFIX}{child.name}-{uuid.uuid4().hex[:8]}")
            renamed += 1
        if renamed:
            fsync_dir(found_staging)
        fenced += renamed
    if not output.is_local:
        fs, root = filesystem(output)
        for record in records(storage, below=term):
            if record.upload_id and is_recorded_key(record.key, record.file):
                bucket, key, _ = fs.split_path(f"{root}/{record.key}")
                fenced += abort_upload(fs, bucket, key, record.upload_id)
    return fenced


def is_recorded_key(key: str, file: str) -> bool:
    """Whether a record's key is an object of its file under the output (never outside it)."""
    return is_object_of(file, key.rsplit("/", 1)[-1]) and ".." not in key.split("/") and not key.startswith("/")
