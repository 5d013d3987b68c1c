"""What the sink's start needs from recovery, in one entry point: :func:`recover_at_start`, and the
:class:`~recovery.resolve.RecoveryPlan` it returns.

The committer's recovery path is its normal path: every start of a sink takes a new writer term and resolves the
files an earlier run left pending (a commit or a drop in the ledger) before its first batch, exactly as
``filesink recover apply`` does offline (:func:`recovery.resolve.apply_recovery`). The sink's modules import
recovery through this module only (``tests/test_layout.py``).
"""

from __future__ import annotations

from collections.abc import Callable

from filesink.committer.ledger import Ledger, PlannedFile
from filesink.destination import Destination
from filesink.output import OutputLocation
from filesink.tasks.writer import FileTask
from logstore import LogStore

from .resolve import RecoveryPlan, apply_recovery

__all__ = ["RecoveryPlan", "recover_at_start"]


def recover_at_start(
    store: LogStore,
    ledger: Ledger,
    output: OutputLocation,
    *,
    partitioned: bool,
    file_task: Callable[[PlannedFile, int], FileTask],
    single_driver: bool,
    accept_duplicates: bool,
    destination: Destination | None,
) -> RecoveryPlan:
    """Recovery at a sink's start, after its start probed the log store for conditional create (so
    :func:`~recovery.resolve.apply_recovery` does not probe again): a new writer term, the pending files resolved
    by visibility (by the table alone for a table's ``destination``), garbage removed. Returns what was done."""
    return apply_recovery(
        store,
        ledger,
        output,
        partitioned=partitioned,
        file_task=file_task,
        single_driver=single_driver,
        accept_duplicates=accept_duplicates,
        probed=True,
        destination=destination,
    )
