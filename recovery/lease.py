"""The owner lease: whether a run of the sink showed it was alive recently, so that ``recover apply`` (and
``move-log-store``) must not take the sink from it."""

from __future__ import annotations

import socket

from logstore import LogStore
from logstore.home import describe_age, term_path

from .errors import LiveOwnerError

OWNER_LEASE = 120.0
"""Seconds after its last renewal during which a run of the sink counts as alive (``--owner-lease``)."""


def check_no_live_owner(store: LogStore, lease: float, *, locked: bool) -> None:
    """Refuse to take ownership from a run that showed it was alive less than ``lease`` seconds ago (with
    ``locked``, the caller holds the state directory's lock: a run of that state directory is not alive)."""
    found = store.home.live_owner(lease)
    if found is None:
        return
    term, age, record = found
    if locked and record.get("host") == socket.gethostname() and record.get("state") == store.db_path:
        return
    raise LiveOwnerError(
        f"a run of sink {store.sink_id} holds writer term {term} and was {describe_age(age)} (its record in "
        f"{store.home.storage.display(term_path(term))}): `recover apply` would take the sink from it, and that run "
        "would then stop with FencedError at its next step. Nothing of the sink was changed (a new --state-dir keeps "
        "the state rebuilt into it, and the next apply goes on from it). Stop the query first (a query that "
        f"stops cleanly releases the sink at once), or wait until the run has been silent for {lease:.0f} s (a "
        "killed driver): then run this again. --owner-lease SECONDS sets that wait; --owner-lease 0 takes over at "
        "once, for when you know the run is gone."
    )


def lease_assumption(store: LogStore, lease: float) -> str | None:
    """What ``apply`` assumes with ``--owner-lease 0`` (or less), said before it takes over: nothing is checked,
    so a run that is still working is fenced at its next step (its unsealed batch fails; no row is lost). None
    for a positive lease, or when the newest term's run stopped cleanly (nothing is assumed then)."""
    if lease > 0:
        return None
    term = store.home.newest_term()
    record = store.home.read(term_path(term)) if term is not None else None
    if term is None or not isinstance(record, dict) or record.get("closed"):
        return None
    return (
        f"--owner-lease {lease:g}: taking the sink over from writer term {term} without checking when its run was "
        f"last alive ({store.home.storage.display(term_path(term))}), on your word that it is gone. If it is still "
        "running, it stops with FencedError at its next step and its unfinished batch is retried by the next run: "
        "no row is lost."
    )
