"""The output's claim: ``_filesink.json`` at the output's root names the sink that writes there.

Two sinks writing to one output would each write every row they are given, and a reader would see both: the
claim makes the second one refuse to start, before it writes or deletes anything. Readers skip it: Spark,
pyarrow and most engines ignore names starting with ``_``, and it is not a ``.parquet`` file.

It is created at the sink's first start (a conditional create where the store has one) and checked at every start.
The sink's files also carry its id in their names, and the sink never touches files that do not.
"""

from __future__ import annotations

import json
import logging

from logstore import LogLocation

from ..errors import OutputClaimedError
from .location import OutputLocation

log = logging.getLogger(__name__)

CLAIM_NAME = "_filesink.json"


def claim_output(output: OutputLocation, sink_id: str, *, state: str, take_over: bool = False) -> None:
    """Claim ``output`` for the sink ``sink_id``, or raise :class:`OutputClaimedError` if another sink did (with
    ``take_over``, the sink replaces one whose state was lost: the claim is rewritten, and logged)."""
    storage = LogLocation(output.url, dict(output.storage_options)).open()
    record = json.dumps({"sink_id": sink_id}).encode()
    try:
        data = storage.read_all(CLAIM_NAME)
    except FileNotFoundError:
        if storage.create(CLAIM_NAME, record):
            return
        data = storage.read_all(CLAIM_NAME)
    try:
        claimed = str(json.loads(data)["sink_id"])
    except (ValueError, KeyError, TypeError):
        claimed = f"unreadable ({data[:80]!r})"
    if claimed == sink_id:
        return
    if take_over:
        log.warning("output %s: sink %s takes it over from sink %s, whose state was lost", output.url, sink_id, claimed)
        storage.put(CLAIM_NAME, record)
        return
    raise OutputClaimedError(
        f"the output {output.url} belongs to sink {claimed} (its {storage.display(CLAIM_NAME)}), not to this sink "
        f"{sink_id} ({state}). Two sinks writing to one output would both write their rows there, and readers would "
        "see both. Nothing was written or deleted. Give this sink an output of its own, or start the sink that owns "
        "the output with its state directory or its log store (a sink whose log store outlived it rebuilds from "
        "there). If that sink's state is lost for good (its state directory held its log store), this sink can "
        "replace it with accept_state_loss=True (filesink run --accept-state-loss): the rows that state held and "
        "had not written yet are then not in the output."
    )
