"""Exceptions raised by recovery and its command line."""

from __future__ import annotations


class RecoveryError(Exception):
    """Base class of recovery errors."""


class NotASinkError(RecoveryError):
    """The directory given is not a sink's state directory."""
