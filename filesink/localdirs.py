"""A local directory the sink needs (its output, state directory, log store; ``filesink run``'s checkpoint) is one,
or can be created: checked by the sink's start and by ``filesink run``'s pre-flight, with the same messages."""

from __future__ import annotations

from pathlib import Path

from logstore.diagnosis import Kind, diagnose
from logstore.storage import ensure_dir

from .errors import SinkOptionError

__all__ = ["make_local_dir"]


def make_local_dir(path: Path, what: str, *, create: bool = True) -> None:
    """Create the local directory ``path`` (and its parents) unless it exists (only check, without ``create``);
    ``what`` names it in messages (``the output path``, ``state_dir``). Raises :class:`SinkOptionError` naming the
    path if it, or one of its parents, is a file (or anything but a directory), or if it cannot be created."""
    for place in (path, *path.parents):
        if place.is_dir():
            break
        if place.exists() or place.is_symlink():
            kind = "a file" if place.is_file() else "not a directory" if place.exists() else "a broken symbolic link"
            problem = f"is {kind}, not a directory" if place == path else f"cannot be created: {place} is {kind}"
            raise SinkOptionError(
                f"{what} {path} {problem}. Nothing was written. Give a directory there, or move {place} out of the "
                "way, and start again."
            )
    if not create:
        return
    try:
        ensure_dir(path)
    except OSError as e:
        found = diagnose(e, str(e.filename or path.parent))
        advice = found.advise("start again", first=True)
        if found.kind is Kind.PERMISSION:
            advice += f" Or create {path} yourself."
        raise SinkOptionError(f"{what} {path} cannot be created: {found.cause}. Nothing was written. {advice}") from e
