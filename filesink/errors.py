"""Exceptions raised by the file sink. Messages name the file, epoch or vnode involved and what to do."""

from __future__ import annotations


class FileSinkError(Exception):
    """Base class of every file sink error."""


class SinkOptionError(FileSinkError, ValueError):
    """An option given to the sink is invalid."""


class SchemaMismatchError(FileSinkError):
    """A batch's schema differs from the schema the sink was created with."""


class CheckpointMismatchError(FileSinkError):
    """A batch id is below the last sealed epoch and is not a replay (checkpoint reset, or a second query)."""


class SinkLockedError(FileSinkError):
    """Another live query holds the sink's state directory."""


class SinkFailedError(FileSinkError):
    """A write of this sink object failed between pre-commit and commit; only a new sink (recovery) may go on."""


class CommitConflictError(FileSinkError):
    """A file's state changed under the writer (another writer or recovery got there first)."""


class FileWriteError(FileSinkError):
    """A Parquet file could not be written or made visible."""


class StateDatabaseError(FileSinkError):
    """The sink's state database could not be read or written (disk full, I/O error, ...)."""


class FencedError(FileSinkError):
    """A writer of an older writer term tried to publish a file or change state after the sink restarted."""


class InputError(FileSinkError):
    """The input of ``filesink run`` cannot be read: a missing directory, an unreadable file, mixed schemas."""


class StorageAccessError(FileSinkError):
    """An S3 endpoint cannot be reached, or it rejects the credentials or the bucket."""


class SparkMasterError(FileSinkError):
    """The Spark master given with ``--master`` cannot be reached."""
