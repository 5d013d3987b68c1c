"""Exceptions raised by the file sink. Messages name the file, epoch or vnode involved and what to do.

:class:`StateDatabaseError` and :class:`FencedError` belong to :mod:`logstore` and are the same classes here.
Each error has the exit code the ``filesink`` command ends with when it stops on it (:func:`exit_code`).
"""

from __future__ import annotations

import sys
from typing import Any

from logstore.errors import FencedError, LogStoreError, SegmentError, StateDatabaseError

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_LOCKED, EXIT_NOT_A_SINK, EXIT_INTERRUPTED = 0, 1, 2, 3, 4, 130
"""Exit codes of every ``filesink`` command: done, failed, bad usage, a live query holds the sink, not a sink's
state directory, stopped at once by a second Ctrl-C or SIGTERM."""
EXIT_DAMAGED = 5
"""Log segments the sink still needs are missing or damaged: restore them, or give their rows up
(``filesink recover apply --drop-damaged``)."""


def exit_code(error: BaseException) -> int:
    """The exit code for a command that stops on ``error`` (:data:`EXIT_FAILED` unless the error says)."""
    code = getattr(error, "exit_code", EXIT_FAILED)
    return code if isinstance(code, int) else EXIT_FAILED


class FileSinkError(Exception):
    """Base class of every file sink error."""


COMMAND_ERRORS = (FileSinkError, LogStoreError, OSError)
"""What a ``filesink`` command reports as ``error: <message>`` and an exit code, without a traceback."""


def report(error: BaseException) -> int:
    """Print ``error`` for the user of a command; return the exit code to end with."""
    print(f"error: {error}", file=sys.stderr)
    return exit_code(error)


class SinkOptionError(FileSinkError, ValueError):
    """An option given to the sink is invalid."""


class SchemaMismatchError(FileSinkError):
    """A batch's schema differs from the schema the sink was created with."""


class BatchRefusedError(FileSinkError):
    """Rows of a batch that a file writer would refuse (a type that cannot be conformed to the sink's schema, a
    partition value too long for the output, ...): refused by the append tasks before the epoch is sealed, so
    nothing of the batch is in the log store and Spark keeps it."""


class CheckpointMismatchError(FileSinkError):
    """A batch id is below the last sealed epoch and is not a replay (checkpoint reset, or a second query)."""


class StateLostError(CheckpointMismatchError):
    """A new, empty sink state got a batch id above 0: the query's checkpoint has moved on, so the state the sink
    had (and the rows it held) was lost, unless this is a new sink for an existing query
    (``accept_state_loss=True``)."""


class OutputClaimedError(FileSinkError):
    """The output belongs to another sink (its ``_filesink.json`` names another sink id)."""


class LogStoreMovedError(FileSinkError):
    """The output belongs to this sink, but with its log store at another location (its ``_filesink.json`` names
    it): this run's log store is a copy, or was moved (``filesink recover move-log-store`` records a move)."""


class SinkLockedError(FileSinkError):
    """Another live query holds the sink's state directory."""

    exit_code = EXIT_LOCKED


class SinkFailedError(FileSinkError):
    """A write of this sink object failed between pre-commit and commit; only a new sink (recovery) may go on."""


class DamagedLogError(FileSinkError, SegmentError):
    """Log segments the sink still needs are missing or damaged, so their rows cannot be written: the sink (its
    start and its rolls) and ``filesink recover apply`` stop, before anything is deleted, until the segments are
    restored or their rows given up (``filesink recover apply --drop-damaged``). ``damaged`` lists them
    (:class:`logstore.DamagedSegment`)."""

    exit_code = EXIT_DAMAGED

    def __init__(self, message: str, damaged: list[Any]) -> None:
        super().__init__(message)
        self.damaged = damaged


class CommitConflictError(FileSinkError):
    """A file's state changed under the writer (another writer or recovery got there first)."""


class FileWriteError(FileSinkError):
    """A Parquet file could not be written or made visible."""


class NotSharedError(FileSinkError):
    """A local directory of the sink is not the driver's on an executor: a local log store (the default,
    ``<state_dir>/log``), or a local output and its staging directory, which on a cluster whose executors run on other
    machines must be one shared file system mounted at the same path everywhere (:mod:`filesink.tasks.shared`). Found by
    the Spark tasks before they write anything, and refused before the batch is sealed or its files written."""


class InputError(FileSinkError):
    """The input of ``filesink run`` cannot be read: a missing directory, an unreadable file, mixed schemas."""


class MissingInputError(InputError):
    """A file of the batch Spark runs again is missing from the landing directory (``filesink run`` refuses to start,
    since Spark would run the batch without it and never read its name again), or ``--drop-missing-input`` names a
    file that is not missing."""


class StorageAccessError(FileSinkError):
    """An S3 endpoint cannot be reached, or it rejects the credentials or the bucket, or what answers there is not
    an S3 server."""


class S3EndpointError(SinkOptionError):
    """An S3 endpoint (``--s3-endpoint``, ``AWS_ENDPOINT_URL``, a storage option) is not an ``http://`` or
    ``https://`` URL: refused as bad usage, before anything is opened."""

    exit_code = EXIT_USAGE


class SparkMasterError(FileSinkError):
    """The Spark master given with ``--master`` cannot be reached."""


class StateBehindError(CheckpointMismatchError):
    """A batch id more than one above the last sealed epoch: Spark numbers batches without gaps, so the sink's state
    (state directory and log store) is behind the query's checkpoint, most likely restored from a backup. Refused
    unless ``accept_state_loss=True``, which accepts that the rows of the skipped epochs not yet in files are lost
    and that rows the restored state holds and the newer state had already written are written again."""


class OutputHasRowsError(FileSinkError):
    """A sink that replaces a lost one (``accept_state_loss=True``) got batch 0 while the output already holds
    files: the query's checkpoint is new too, so it reads its input again from the start and every row the output
    holds would be written twice. Refused unless ``accept_duplicates=True``."""


class MetricsPortError(SinkOptionError):
    """The sink's metrics cannot be served at the address and port given (``metrics_port``, ``filesink run
    --metrics-port``): the port is in use, or the address is not this machine's. Refused at the start, before the
    sink opens its state."""


__all__ = [
    "COMMAND_ERRORS",
    "EXIT_DAMAGED",
    "EXIT_FAILED",
    "EXIT_INTERRUPTED",
    "EXIT_LOCKED",
    "EXIT_NOT_A_SINK",
    "EXIT_OK",
    "EXIT_USAGE",
    "CheckpointMismatchError",
    "CommitConflictError",
    "DamagedLogError",
    "FencedError",
    "FileSinkError",
    "FileWriteError",
    "InputError",
    "LogStoreMovedError",
    "MetricsPortError",
    "MissingInputError",
    "NotSharedError",
    "OutputClaimedError",
    "OutputHasRowsError",
    "S3EndpointError",
    "SchemaMismatchError",
    "SinkFailedError",
    "SinkLockedError",
    "SinkOptionError",
    "SparkMasterError",
    "StateBehindError",
    "StateDatabaseError",
    "StateLostError",
    "StorageAccessError",
    "exit_code",
    "report",
]


class TableFormatError(FileSinkError, ValueError):
    """A table format (``table_format="delta"`` or ``"iceberg"``) cannot be used as asked: its library is not
    installed, a catalog is missing or unreachable, the table exists with another schema or partitioning, or a
    column's type has no equivalent in the format. Refused before anything is written or sealed."""


class TableCommitFailedError(FileSinkError):
    """A roll's table commit did not land (the table's history was read again after the error and does not hold
    the files). The files stay pending: the next start or ``filesink recover apply`` commits them or writes them
    again, exactly once."""


class TableCommitUnknownError(FileSinkError):
    """A roll's table commit may or may not have landed, and the table could not be read again to tell. The
    files stay pending: the next start or ``filesink recover apply`` decides from the table's history alone."""


class KafkaSourceError(FileSinkError):
    """Spark's Kafka source cannot be had (its jar for this Spark version), or refuses the Kafka options: raised
    before the sink's state is opened, so nothing is sealed or written."""


class JarFetchError(FileSinkError):
    """Maven artifacts (Spark's Kafka source, Kafka's broker) could not be fetched: the message quotes what the
    resolver said failed (an artifact not published, a dependency's download, a repository out of reach) and what to
    do. Raised before anything is opened. ``unpublished``: the artifacts asked for that the repositories do not
    have (``group:name:version``)."""

    def __init__(self, message: str, unpublished: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.unpublished = unpublished


class KafkaBrokerError(FileSinkError):
    """``filesink kafka-broker`` could not start its broker, or one of Kafka's tools failed: the message says
    which, with the end of the broker's log or the tool's answer."""
