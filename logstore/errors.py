"""Exceptions raised by the log store.

Every message names what it is about: the segment file, the epoch and the vnodes involved, and says what to do.
"""

from __future__ import annotations


class LogStoreError(Exception):
    """Base class of every log store error."""


class LogWriteError(LogStoreError, OSError):
    """A segment file could not be written (disk full, I/O error, ...); its epoch is not sealed."""


SEGMENT_WAY_OUT = (
    "Restore the segment file (the same name and bytes) from a backup, or give its rows up for good with "
    "`filesink recover apply --drop-damaged` (see `filesink recover status`)"
)
"""What to do about a damaged segment: said by every error that stops on one."""


class SegmentError(LogStoreError):
    """A sealed segment file cannot be read back as it was written."""


class SegmentCorruptError(SegmentError):
    """A segment file's bytes do not match its checksum, or the file is shorter than recorded."""


class SegmentMissingError(SegmentError, FileNotFoundError):
    """A segment file named by a sealed epoch is not in the log store."""


class InvalidSegmentInputError(LogStoreError, ValueError):
    """Rows handed to append cannot be stored (bad vnode column, vnode out of range, unsupported type)."""


class EpochSealedError(LogStoreError):
    """An append or seal targets an epoch that is already sealed."""


class EpochOrderError(LogStoreError):
    """An epoch is sealed below the last sealed epoch."""


class EpochNotSealedError(LogStoreError):
    """A read or truncate goes past the last sealed epoch."""


class TruncatedRangeError(LogStoreError):
    """A read asks for epochs that a vnode's truncate point has already released."""


class TruncateOrderError(LogStoreError):
    """A truncate would move a vnode's truncate point backwards."""


class StateMismatchError(LogStoreError):
    """The state database belongs to a log store with a different vnode count or location."""


class StateDatabaseError(LogStoreError):
    """The sink's state database could not be read or written (disk full, I/O error, read-only, locked, ...).

    Raised by the owners of the database's tables (:class:`logstore.LogStore`, and the file sink's ledger) in
    place of ``sqlite3.Error``; the message names the database file and what was being done. The transaction
    was rolled back, so nothing recorded is lost."""


class NoLogStoreError(LogStoreError):
    """A state database holds no log store (it is not a sink's, or the sink was never started)."""


class LogStoreClaimedError(StateMismatchError):
    """The log store's location belongs to another sink (its claim, ``sink.json``, names another sink id)."""


class FencedError(LogStoreError):
    """A run of the sink holds a writer term below the newest term record: a newer run (maybe on another machine,
    or ``filesink recover apply``) took ownership, and this run must not seal, pre-commit, commit or delete."""


class StateDivergedError(StateMismatchError):
    """The state database holds sealed epochs that the durable home does not count: it was changed by a run that
    no longer owned the sink. Start from an empty state directory (rebuilt from the home)."""


class HomeRecordError(LogStoreError):
    """A record of the sink's durable home (``home/`` in the log store's location) cannot be read."""


class ConditionalCreateError(LogStoreError):
    """The log store's location does not honour a conditional create (S3: a PUT with ``If-None-Match: *`` that
    replaced the object, or was refused), so the writer term records that make a run the sink's one owner are
    not exclusive. Raised at start unless single-driver operation is accepted
    (:func:`logstore.conditional.require_conditional_create`)."""
