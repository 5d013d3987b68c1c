"""Damaged log segments as the sink sees them: when it stops, what it says, and the way out.

A sealed segment the sink still needs (one of its vnodes is above its truncate point) can go missing or be
damaged (truncated, bytes changed). Its rows cannot be written, and nothing after them can be committed for its
vnodes. The sink stops before it pre-commits or deletes anything, with :class:`DamagedLogError` naming each
segment, its epoch, its vnodes and its rows, and the two ways out: restore the file, or give its rows up for good
with ``filesink recover apply --drop-damaged`` (:meth:`logstore.LogStore.give_up`), which writes every other
row. Checks:

- at start (:func:`recovery.resolve.apply_recovery`): a listing of the log store (missing and truncated files);
- before each roll's pre-commit (:func:`check_planned`): the same, for the segments the planned files read;
- when a roll's write (or its size sample) fails on a segment (:func:`diagnose`): the segments read whole, so a
  changed byte is named too.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

from logstore import DamagedSegment, GivenUp, LogStore
from logstore.segment import describe_vnodes

from ..errors import DamagedLogError
from .ledger import PlannedFile

SHOWN = 5
"""Damaged segments named one by one in a message (the rest are counted)."""


def _state_dir(store: LogStore) -> str | None:
    return None if store.db_path == ":memory:" else str(Path(store.db_path).parent)


def damaged_error(
    store: LogStore, damaged: Sequence[DamagedSegment], doing: str, *, pending: bool = False
) -> DamagedLogError:
    """The error a sink or ``recover apply`` stops with when ``damaged`` blocks what it was ``doing``."""
    rows = sum(d.rows for d in damaged)
    shown = "; ".join(f"{d.error}" for d in damaged[:SHOWN])
    more = f"; and {len(damaged) - SHOWN} more (`filesink recover status` lists them)" if len(damaged) > SHOWN else ""
    state = _state_dir(store)
    where = f"--state-dir {state}" if state else f"--log-store {store.location.canonical}"
    after = (
        "The files this roll pre-committed are resolved by recovery at the next start (those not published are "
        "dropped). "
        if pending
        else ""
    )
    return DamagedLogError(
        f"cannot {doing}: {len(damaged)} log segment{'s' if len(damaged) != 1 else ''} of sink {store.sink_id} "
        f"that the sink still needs {'are' if len(damaged) != 1 else 'is'} missing or damaged, so {rows:,} rows "
        f"({_slices(damaged)}) cannot be written, nor anything after them for those vnodes: {shown}{more}. "
        f"Nothing was deleted. {after}Either restore each segment file (the same name and bytes) from a backup "
        f"and start again; or stop the query and give exactly these rows up for good with `filesink recover apply "
        f"{where} --drop-damaged`, which writes every other row, records what it gave up (shown by `filesink "
        "recover status` from then on), and lets the query go on.",
        list(damaged),
    )


def _slices(damaged: Iterable[DamagedSegment | GivenUp]) -> str:
    """``epoch 3 vnodes 1, 2; epoch 5 vnodes 7`` (the given-up or damaged (epoch, vnodes) slices)."""
    by_epoch: dict[int, set[int]] = {}
    for d in damaged:
        by_epoch.setdefault(d.epoch, set()).update(d.vnodes)
    return "; ".join(f"epoch {e} vnodes {describe_vnodes(sorted(v))}" for e, v in sorted(by_epoch.items()))


def check_planned(store: LogStore, files: Sequence[PlannedFile]) -> None:
    """Before a roll pre-commits ``files``: raise :class:`DamagedLogError` if a segment the sink still needs, up to
    the files' last epoch, is missing or not the size it was sealed with (one query and one listing of the log
    store; changed bytes are found when read). That covers the segments the files read, and those of other
    writers' vnodes up to that epoch, which would stop a later roll anyway."""
    if not files:
        return
    damaged = store.damaged(quick=True, up_to=max(f.end_epoch for f in files))
    if damaged:
        raise damaged_error(store, damaged, f"write {len(files)} files")


def diagnose(
    store: LogStore, error: BaseException, files: Sequence[PlannedFile] | None, doing: str
) -> DamagedLogError | None:
    """After ``error`` stopped a roll: the :class:`DamagedLogError` to raise instead if it came from a damaged
    segment (the needed segments up to the last epoch of ``files``, or with None all of them, are read whole to
    find which), else None. Failures of the check itself leave ``error`` as it was."""
    if isinstance(error, DamagedLogError) or "Segment" not in f"{type(error).__name__} {error}":
        return None
    try:
        damaged = store.damaged(up_to=max(f.end_epoch for f in files) if files else None)
    except Exception:
        return None
    if not damaged:
        return None
    return damaged_error(store, damaged, doing, pending=files is not None)


def given_up_line(given: Sequence[GivenUp]) -> str:
    """One line saying what was given up so far (for the sink's log at start and ``filesink run``)."""
    rows = sum(g.rows for g in given)
    return (
        f"{len(given)} damaged log segment{'s' if len(given) != 1 else ''} {'were' if len(given) != 1 else 'was'} "
        f"given up (`filesink recover apply --drop-damaged`): {rows:,} rows are not in the output ({_slices(given)}); "
        "`filesink recover status` lists them"
    )
