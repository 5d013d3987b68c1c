"""What Spark's file source has listed, read from the query's checkpoint, and what ``filesink run`` checks of it
before the query starts.

Spark's file source lists the landing directory once per micro-batch and records the files of each batch in
``<checkpoint>/sources/0`` (one JSON line per file: its URI, its modification time, the source's batch id). A batch
that failed is run again at the next start with exactly the files it listed, read by name, and Spark never reads a
name it has listed once more. Two ways to lose rows without a word follow, and this module makes both visible:

- a file of the batch to run again was moved out: Spark runs the batch without it (a missing file it was given by
  name counts as an empty directory) and the run says ``done``. :func:`check_replay` refuses the start instead,
  naming the file and the two ways out (put it back under the same name, or give it up with
  ``--drop-missing-input FILE``);
- a file was landed again under a name the source has already read (after a fix, say): its new content is never
  read. :func:`check_replay` returns a warning naming it, and the way out (land it under a new name).

The checkpoint's format is Spark's: ``offsets/N`` (the end offset of batch N, ``{"logOffset": L}`` for a file
source, on the last line), ``commits/N`` (batch N is done), and the source log's ``N`` and ``N.compact`` files
(a compact file holds every entry up to it). A checkpoint this module cannot read is not checked (returns no
notices): the query itself reads it, and says what is wrong.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import unquote, urlparse

from ..errors import MissingInputError

__all__ = ["Listed", "Replay", "check_replay", "listed_files", "local_path", "pending_batch"]

_LOG_NAME = re.compile(r"(\d+)(\.compact)?")


@dataclass(frozen=True)
class Listed:
    """A file the source listed: its local path, modification time (ms since the epoch) and source batch id."""

    path: Path
    mtime_ms: int
    source_batch: int


@dataclass(frozen=True)
class Pending:
    """The query's batch that Spark runs again at the next start (planned in ``offsets/``, not in ``commits/``),
    and the source batches it reads: ``after < source_batch <= through``."""

    batch_id: int
    after: int
    through: int


@dataclass(frozen=True)
class Replay:
    """What the check found: the batch to run again (if any), the files given up, the files landed again."""

    pending: Pending | None = None
    dropped: tuple[Listed, ...] = ()
    landed_again: tuple[tuple[Listed, int], ...] = ()
    """Files a done batch read, with their modification time now (ms): their new content is never read."""
    notices: list[str] = field(default_factory=list)


def _log_files(directory: Path) -> dict[int, Path]:
    """The numbered files of one of Spark's metadata logs (``N``, or ``N.compact``), by number."""
    found: dict[int, Path] = {}
    try:
        names = os.listdir(directory)
    except (FileNotFoundError, NotADirectoryError):
        return found
    for name in names:
        m = _LOG_NAME.fullmatch(name)
        if m:
            found[int(m.group(1))] = directory / name
    return found


def local_path(uri: str) -> Path | None:
    """The local path of a ``file:`` URI as Spark writes it (percent-encoded), or None for another scheme."""
    parsed = urlparse(uri)
    if parsed.scheme not in ("", "file"):
        return None
    return Path(unquote(parsed.path))


def listed_files(checkpoint: Path, source: int = 0) -> list[Listed]:
    """Every local file the checkpoint's file source ``source`` has listed (its newest compact file and the
    batch files after it). A line that is not a file entry is skipped."""
    logs = _log_files(checkpoint / "sources" / str(source))
    compact = max((n for n, p in logs.items() if p.name.endswith(".compact")), default=-1)
    listed: list[Listed] = []
    for number in sorted(n for n in logs if n >= compact):
        for line in logs[number].read_text(encoding="utf-8").splitlines()[1:]:
            try:
                entry = json.loads(line)
                path = local_path(entry["path"])
                if path is not None:
                    listed.append(Listed(path, int(entry["timestamp"]), int(entry["batchId"])))
            except (ValueError, KeyError, TypeError):
                continue
    return listed


def _log_offset(offsets_file: Path, source: int = 0) -> int | None:
    """The end offset of file source ``source`` in one ``offsets/N`` file (``{"logOffset": L}``), or None."""
    try:
        lines = offsets_file.read_text(encoding="utf-8").splitlines()
        return int(json.loads(lines[2 + source])["logOffset"])
    except (OSError, ValueError, KeyError, IndexError, TypeError):
        return None


def pending_batch(checkpoint: Path, source: int = 0) -> Pending | None:
    """The batch the query runs again at its next start, if the newest planned batch was not committed."""
    offsets = _log_files(checkpoint / "offsets")
    if not offsets:
        return None
    newest = max(offsets)
    if newest in _log_files(checkpoint / "commits"):
        return None
    through = _log_offset(offsets[newest], source)
    if through is None:
        return None
    before = _log_offset(offsets[newest - 1], source) if newest - 1 in offsets else None
    after = -1 if newest == 0 else before if before is not None else through - 1
    return Pending(newest, after, through)


def _done_through(checkpoint: Path, source: int = 0) -> int:
    """The newest source batch a done query batch read (-1 if none): the end offset of the newest batch, once
    it is committed. Entries after it belong to a batch not planned yet, which reads them by name."""
    offsets = _log_files(checkpoint / "offsets")
    if not offsets:
        return -1
    through = _log_offset(offsets[max(offsets)], source)
    return -1 if through is None else through


def _mtime_ms(path: Path) -> int | None:
    try:
        return os.stat(path).st_mtime_ns // 1_000_000
    except OSError:
        return None


def _when(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def check_replay(checkpoint: Path, present: Iterable[Path], drop: Sequence[Path] = ()) -> Replay:
    """Check the checkpoint's file source against the landing directory's files now (``present``).

    Raises :class:`MissingInputError` if a file of the batch to run again is missing and not in ``drop``, or if
    ``drop`` names a file that batch does not miss. Returns the notices to print: files given up, and files landed
    again under a name a done batch read."""
    if not (checkpoint / "sources").is_dir():
        return Replay()
    try:
        listed = listed_files(checkpoint)
        pending = pending_batch(checkpoint)
    except (OSError, UnicodeDecodeError):
        return Replay()
    drop_set = {p.absolute() for p in drop}
    replayed = [e for e in listed if pending is not None and pending.after < e.source_batch <= pending.through]
    missing = [e for e in replayed if not e.path.exists()]
    not_missing = sorted(drop_set - {e.path for e in missing})
    if not_missing:
        raise MissingInputError(_not_missing_message(not_missing, pending, replayed))
    refused = [e for e in missing if e.path not in drop_set]
    if refused and pending is not None:
        raise MissingInputError(_missing_message(refused, pending))
    dropped = tuple(e for e in missing if e.path in drop_set)
    done_through = pending.after if pending is not None else _done_through(checkpoint)
    now = {p.absolute(): p for p in present}
    again = []
    for e in listed:
        if e.source_batch > done_through or e.path not in now:
            continue
        mtime = _mtime_ms(e.path)
        if mtime is not None and mtime != e.mtime_ms:
            again.append((e, mtime))
    replay = Replay(pending, dropped, tuple(again))
    if dropped and pending is not None:
        names = ", ".join(str(e.path) for e in dropped)
        replay.notices.append(
            f"gave up {len(dropped)} input file{'s' if len(dropped) != 1 else ''} of batch {pending.batch_id} "
            f"(--drop-missing-input): {names}. Batch {pending.batch_id} runs again without "
            f"{'them' if len(dropped) != 1 else 'it'}, and {'their' if len(dropped) != 1 else 'its'} rows are not "
            "in the output."
        )
    for e, mtime in again:
        replay.notices.append(
            f"warning: the input file {e.path} was landed again: the query read a file of that name already "
            f"(modified {_when(e.mtime_ms)}; this one {_when(mtime)}), and Spark's file source never reads a name "
            f"twice, so the rows of this file are NOT read. To land them, give it a name never used in "
            f"{e.path.parent} (for example {e.path.stem}-2{e.path.suffix}); if its rows are already in the output, "
            "remove it."
        )
    return replay


def _missing_message(missing: Sequence[Listed], pending: Pending) -> str:
    shown = ", ".join(str(e.path) for e in missing)
    options = " ".join(f"--drop-missing-input {e.path}" for e in missing)
    many = len(missing) != 1
    return (
        f"batch {pending.batch_id} did not finish and runs again at this start with the files Spark listed for it, "
        f"but {len(missing)} of them {'are' if many else 'is'} missing: {shown}. Spark would run it without "
        f"{'them' if many else 'it'} and never read {'those names' if many else 'that name'} again, so "
        f"{'their' if many else 'its'} rows would be lost without a word: refused, before the query started; "
        "nothing was read or written. Either put each file back (fixed, if it was damaged) under the same name "
        f"and run again; or give {'their' if many else 'its'} rows up for good by running again with {options} "
        f"(then land {'them' if many else 'it'} again only under a new name)."
    )


def _not_missing_message(names: Sequence[Path], pending: Pending | None, replayed: Sequence[Listed]) -> str:
    shown = ", ".join(str(p) for p in names)
    if pending is None:
        why = "the query has no batch to run again (its last batch finished)"
    else:
        misses = [str(e.path) for e in replayed if not e.path.exists()]
        why = f"batch {pending.batch_id}, which runs again at this start, " + (
            f"misses only {', '.join(misses)}" if misses else "misses none of its files"
        )
    return (
        f"--drop-missing-input {shown}: not a missing file of the batch to run again ({why}). Nothing was read or "
        "written. Give --drop-missing-input only for a file the refusal named, and leave it out otherwise."
    )
