"""Exceptions raised by recovery and its command line. They are file sink errors (:class:`FileSinkError`)."""

from __future__ import annotations

from filesink.errors import EXIT_LOCKED, EXIT_NOT_A_SINK, FileSinkError


class RecoveryError(FileSinkError):
    """Base class of recovery errors."""


class NotASinkError(RecoveryError):
    """The directory given is not a sink's state directory."""

    exit_code = EXIT_NOT_A_SINK


class LiveOwnerError(RecoveryError):
    """A run of the sink showed it is alive (its term record in the durable home was renewed within the lease),
    so ``filesink recover apply``, which would take ownership from it, refuses."""

    exit_code = EXIT_LOCKED
