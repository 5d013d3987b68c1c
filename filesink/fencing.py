"""Writer terms: how a file writer from before a restart is kept from making a file visible afterwards.

Every sink start (and every ``filesink recover apply``) takes a new **writer term** in the state database
(:meth:`filesink.state.SinkState.new_term`) and publishes it here, in the log store's location, which every
file writer can read (writers have no access to the state database). A writer holds the term of the run that
started it, in its :class:`~filesink.writer.FileTask`, and is **fenced** once a newer term exists:

- **Local output**: a writer's temp files live in its term's staging directory ``<staging>/term-<T>``, which
  only the driver creates. Recovery renames the directories of older terms away before it looks at any file:
  a writer that had not opened its temp file yet finds no directory, and one that had finds that its rename
  into the output fails. Both are atomic on one file system, so a writer either published before recovery
  looked, or never does.
- **S3 output**: a writer records each multipart upload id under ``writers/term-<T>/`` in the log store
  before it sends the first part, then reads the published term and gives up if it is newer. Recovery
  publishes the new term first, then aborts every recorded upload of older terms; S3 refuses to complete an
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
import re
from collections.abc import Iterator
from dataclasses import dataclass

from logstore import LogLocation
from logstore.storage import Storage

from .errors import FencedError

PREFIX = "writers"
"""Log store subdirectory of the writers' records (the log store's garbage collection leaves it alone)."""
TERM_FILE = f"{PREFIX}/term"
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
    """A writer's side of fencing: its term, and where the records and the published term are. Picklable."""

    log: LogLocation
    term: int
    attempt: str = ""
    """Set by each run of a writer (:func:`filesink.writer.write_file`), which names its records after it."""

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
        """Raise :class:`FencedError` unless this writer's term is still the published one."""
        current = published_term(self.log.open())
        if current != self.term:
            raise FencedError(
                f"{where}: this writer belongs to writer term {self.term}, but the sink has since restarted "
                f"(term {current}); it must not publish. Recovery has resolved or will resolve this file."
            )


# -- the driver's and recovery's side -------------------------------------------------------------------------


def publish_term(storage: Storage, term: int) -> None:
    """Make ``term`` the term writers check against (after the state database recorded it)."""
    storage.write(TERM_FILE, [str(term).encode()])


def published_term(storage: Storage) -> int | None:
    try:
        return int(storage.read_all(TERM_FILE).decode().strip())
    except FileNotFoundError:
        return None


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
    return sum(storage.delete(r.relpath) for r in found)
