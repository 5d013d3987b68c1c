"""The output's commit mark: ``_filesink_mark.json`` at the output's root says, per vnode, the epoch up to which
this sink's committed files hold its rows (the truncate points of the last commit that wrote files).

It is written after each commit of files, once the truncate points are durable in the sink's durable home, so a
state that is whole (a running sink, or one rebuilt from its home) always has every vnode at or past the mark. A
state that is behind it was restored from a backup (in the default setup the log store, and with it the durable
home, is inside the state directory, so both come back old together): it would write again the rows of files
committed after the backup. Recovery compares before it takes a term (:func:`check_mark`) and refuses.

A mark lost in a crash (between the commit and its write) only lags, which refuses nothing. Readers skip it: its
name starts with ``_`` and it is not a ``.parquet`` file.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping

from logstore import LogLocation, guards
from logstore.segment import describe_vnodes

from ..errors import StateBehindError
from .location import OutputLocation

MARK_NAME = "_filesink_mark.json"


def write_mark(output: OutputLocation, sink_id: str, points: Mapping[int, int]) -> None:
    """Record ``points`` (every vnode's truncate point after a commit of files) as the output's mark."""
    record = {"sink_id": sink_id, "points": [points[v] for v in sorted(points)], "written_at": time.time()}
    storage = LogLocation(output.url, dict(output.storage_options)).open()
    storage.put(MARK_NAME, json.dumps(record, sort_keys=True).encode())


def read_mark(output: OutputLocation, sink_id: str) -> dict[int, int]:
    """The mark's points by vnode, if the output holds a readable mark of sink ``sink_id`` (else empty)."""
    storage = LogLocation(output.url, dict(output.storage_options)).open()
    try:
        record = json.loads(storage.read_all(MARK_NAME))
    except (FileNotFoundError, ValueError):
        return {}
    if not isinstance(record, dict) or record.get("sink_id") != sink_id:
        return {}  # another sink's (it was replaced: accept_state_loss): says nothing of this one
    return {v: int(e) for v, e in enumerate(record.get("points") or [])}


def check_mark(output: OutputLocation, sink_id: str, points: Mapping[int, int], where: str) -> dict[int, int]:
    """Raise :class:`StateBehindError` if the output's mark has a vnode past ``points`` (the state's durable
    truncate points): files were committed that this state does not know. Returns the mark."""
    mark = read_mark(output, sink_id)
    behind = sorted(v for v, e in mark.items() if e > points.get(v, e)) if guards.on("mark.restored_state") else []
    if not behind:
        return mark
    first = behind[0]
    has = f"only up to epoch {points[first]}" if points[first] >= 0 else "no epoch"
    raise StateBehindError(
        f"the output {output.url} holds files of sink {sink_id} committed through epoch {mark[first]} for vnode "
        f"{first}, but {where} has {has} of that vnode (vnodes behind: "
        f"{describe_vnodes(behind)}): this state is older than the output, most likely a state directory (and its log "
        f"store) restored from a backup or a snapshot. Starting from it would write those rows again. Nothing was "
        f"written or deleted. Restore the newest state directory and log store of the sink; or, if there is none, "
        "accept that the newer state is lost and the rows between the two epochs are written again (duplicates) "
        "with accept_state_loss=True and accept_duplicates=True (filesink run --accept-state-loss "
        "--accept-duplicates)."
    )
