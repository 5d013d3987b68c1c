"""The output's claim: ``_filesink.json`` at the output's root names the sink that writes there, and where that
sink's log store is.

Two sinks writing to one output would each write every row they are given, and a reader would see both: the
claim makes the second one refuse to start, before it writes or deletes anything. Readers skip it: Spark,
pyarrow and most engines ignore names starting with ``_``, and it is not a ``.parquet`` file.

A copy of a sink's log store at another location (a copied directory or S3 prefix, a state directory restored
to another path with its ``log/``) carries the same sink id, but its writer terms live in its own durable
home, so it would not fence the original, nor the original it: the claim binds the log store's location
(``LogLocation.canonical``) as well, and a start with the sink's id but another location is refused
(:class:`LogStoreMovedError`). A log store moved on purpose is recorded with :func:`move_claim`
(``filesink recover move-log-store``).

It is created at the sink's first start (a conditional create where the store has one) and checked at every start.
A claim of an earlier version (a sink id alone) is taken as naming this run's location and rewritten with it.
The sink's files also carry its id in their names, and the sink never touches files that do not.
"""

from __future__ import annotations

import json
import logging
from typing import NamedTuple

from logstore import LogLocation
from logstore.storage import Storage, is_local

from ..errors import LogStoreMovedError, OutputClaimedError
from .location import OutputLocation

log = logging.getLogger(__name__)

CLAIM_NAME = "_filesink.json"


class OutputClaim(NamedTuple):
    """What ``_filesink.json`` records: the sink that writes to the output and its log store's canonical location
    (None in a claim of an earlier version)."""

    sink_id: str
    log_store: str | None


def _storage(output: OutputLocation) -> Storage:
    return LogLocation(output.url, dict(output.storage_options)).open()


def _record(sink_id: str, log_store: str | None) -> bytes:
    value = {"sink_id": sink_id} if log_store is None else {"sink_id": sink_id, "log_store": log_store}
    return json.dumps(value, sort_keys=True).encode()


def _parse(data: bytes) -> OutputClaim:
    try:
        value = json.loads(data)
        sink_id = str(value["sink_id"])
    except (ValueError, KeyError, TypeError):
        return OutputClaim(f"unreadable ({data[:80]!r})", None)
    location = value.get("log_store")
    return OutputClaim(sink_id, str(location) if isinstance(location, str) and location else None)


def read_claim(output: OutputLocation) -> OutputClaim | None:
    """The output's claim, or None if it has none (nothing is written)."""
    try:
        return _parse(_storage(output).read_all(CLAIM_NAME))
    except FileNotFoundError:
        return None


def claim_output(
    output: OutputLocation,
    sink_id: str,
    *,
    state: str,
    take_over: bool = False,
    log_store: str | None = None,
) -> None:
    """Claim ``output`` for the sink ``sink_id`` whose log store is at ``log_store`` (its canonical location), or
    raise :class:`OutputClaimedError` if another sink did (with ``take_over``, the sink replaces one whose state
    was lost: the claim is rewritten, and logged), or :class:`LogStoreMovedError` if this sink did with its log
    store at another location. A claim without a location (an earlier version) is rewritten with ``log_store``."""
    storage = _storage(output)
    record = _record(sink_id, log_store)
    try:
        data = storage.read_all(CLAIM_NAME)
    except FileNotFoundError:
        if storage.create(CLAIM_NAME, record):
            return
        data = storage.read_all(CLAIM_NAME)
    claimed = _parse(data)
    if claimed.sink_id == sink_id:
        if log_store is None or claimed.log_store == log_store:
            return
        if claimed.log_store is None:
            log.warning(
                "output %s: its claim %s (written by an earlier version) names sink %s without its log store's "
                "location; recorded %s as that location",
                output.url,
                storage.display(CLAIM_NAME),
                sink_id,
                log_store,
            )
            storage.put(CLAIM_NAME, record)
            return
        where = storage.display(CLAIM_NAME)
        raise LogStoreMovedError(moved_message(output, where, sink_id, claimed.log_store, log_store))
    if take_over:
        log.warning(
            "output %s: sink %s takes it over from sink %s, whose state was lost", output.url, sink_id, claimed.sink_id
        )
        storage.put(CLAIM_NAME, record)
        return
    raise OutputClaimedError(
        f"the output {output.url} belongs to sink {claimed.sink_id} (its {storage.display(CLAIM_NAME)}), not to this "
        f"sink {sink_id} ({state}). Two sinks writing to one output would both write their rows there, and readers "
        "would see both. Nothing was written or deleted. Give this sink an output of its own, or start the sink that "
        "owns the output with its state directory or its log store (a sink whose log store outlived it rebuilds from "
        "there). If that sink's state is lost for good (its state directory held its log store), this sink can "
        "replace it with accept_state_loss=True (filesink run --accept-state-loss): the rows that state held and "
        "had not written yet are then not in the output."
    )


def check_claim(output: OutputLocation, sink_id: str, log_store: str) -> None:
    """Raise :class:`LogStoreMovedError` if the output's claim names the sink ``sink_id`` with its log store at
    another location than ``log_store``; writes nothing (``filesink recover apply``)."""
    claimed = read_claim(output)
    if claimed is not None and claimed.sink_id == sink_id and claimed.log_store not in (None, log_store):
        assert claimed.log_store is not None
        raise LogStoreMovedError(
            moved_message(output, _storage(output).display(CLAIM_NAME), sink_id, claimed.log_store, log_store)
        )


def moved_message(output: OutputLocation, claim: str, sink_id: str, claimed: str, here: str) -> str:
    """What :class:`LogStoreMovedError` says: whose output, which two locations, why not, and the ways out."""
    local = ""
    if is_local(claimed) or is_local(here):
        local = (
            " A local log store is by default the state directory's log/ subdirectory, so a state directory copied or "
            "restored to another path counts as a copy or move of its log store too."
        )
    return (
        f"the output {output.url} belongs to sink {sink_id} with its log store at {claimed} (its {claim}), but this "
        f"run of sink {sink_id} has its log store at {here}: a copy or a move of that log store.{local} Two copies of "
        "one log store would not fence each other (each takes its writer terms in its own durable home), so both "
        "would write their rows to the output, and readers would see them twice. Nothing was written or deleted. "
        f"Start the sink with its log store at {claimed} (log_store=, filesink run --log-store). Or, if the log "
        f"store was moved on purpose and {claimed} will not be used again, record the move with `filesink recover "
        f"move-log-store --log-store {here} [--state-dir DIR]` (it refuses if {claimed} was used after the copy was "
        "made), then start again."
    )


def move_claim(output: OutputLocation, sink_id: str, old: str | None, new: str) -> bool:
    """Rewrite the output's claim of sink ``sink_id`` from its log store at ``old`` (None: a claim without a
    location, or no claim) to ``new``. Returns False if it named ``new`` already (nothing written); raises
    :class:`OutputClaimedError` if it names another sink, :class:`LogStoreMovedError` if another location."""
    storage = _storage(output)
    try:
        claimed: OutputClaim | None = _parse(storage.read_all(CLAIM_NAME))
    except FileNotFoundError:
        claimed = None
    if claimed is not None and claimed.sink_id != sink_id:
        raise OutputClaimedError(
            f"the output {output.url} belongs to sink {claimed.sink_id} (its {storage.display(CLAIM_NAME)}), not to "
            f"sink {sink_id} of the log store at {new}: nothing to move. Nothing was changed."
        )
    if claimed is not None and claimed.log_store == new:
        return False
    if claimed is not None and claimed.log_store not in (None, old):
        raise LogStoreMovedError(
            f"the output {output.url} names the log store of sink {sink_id} at {claimed.log_store} (its "
            f"{storage.display(CLAIM_NAME)}), not at {old}: the log store was moved from there, not from {old}. "
            "Nothing was changed."
        )
    storage.put(CLAIM_NAME, _record(sink_id, new))
    log.info("output %s: the log store of sink %s moved from %s to %s", output.url, sink_id, old, new)
    return True
