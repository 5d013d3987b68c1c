"""A durable queue of sealed epochs per vnode, from which the file sink writes Parquet files.

- :func:`append_segment` (in Spark tasks) writes one segment file for one epoch;
- :meth:`LogStore.seal` records an epoch and its segments in the state database (the log's checkpoint);
- :meth:`LogStore.read` streams a vnode range over an epoch range;
- :meth:`LogStore.truncate` and :meth:`LogStore.collect_garbage` release what every vnode has moved past.

See ``docs/logstore.md`` for the file format and the durability rules.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .append import VNODE_COLUMN, AppendTarget, append_segment
from .errors import (
    EpochNotSealedError,
    EpochOrderError,
    EpochSealedError,
    FencedError,
    InvalidSegmentInputError,
    LogStoreClaimedError,
    LogStoreError,
    LogWriteError,
    NoLogStoreError,
    SegmentCorruptError,
    SegmentError,
    SegmentMissingError,
    StateDatabaseError,
    StateDivergedError,
    StateMismatchError,
    TruncatedRangeError,
    TruncateOrderError,
)
from .reader import LogBatch, ReadItem, read_plan
from .segment import SegmentDescriptor
from .storage import LogLocation

# The state database's side (sqlite_utils, which imports pandas) is imported on first use: Spark tasks import
# this package to append and read segments, and never need it.
_LAZY = {
    "STATE_DB_NAME": "statedb",
    "connect": "statedb",
    "NOTHING": "store",
    "DamagedSegment": "store",
    "GarbageReport": "store",
    "GivenUp": "store",
    "LogStore": "store",
    "VnodeBacklog": "store",
}

if TYPE_CHECKING:
    from .statedb import STATE_DB_NAME, connect
    from .store import NOTHING, DamagedSegment, GarbageReport, GivenUp, LogStore, VnodeBacklog


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


__all__ = [
    "NOTHING",
    "STATE_DB_NAME",
    "VNODE_COLUMN",
    "AppendTarget",
    "DamagedSegment",
    "EpochNotSealedError",
    "EpochOrderError",
    "EpochSealedError",
    "FencedError",
    "GarbageReport",
    "GivenUp",
    "InvalidSegmentInputError",
    "LogBatch",
    "LogLocation",
    "LogStore",
    "LogStoreClaimedError",
    "LogStoreError",
    "LogWriteError",
    "NoLogStoreError",
    "ReadItem",
    "SegmentCorruptError",
    "SegmentDescriptor",
    "SegmentError",
    "SegmentMissingError",
    "StateDatabaseError",
    "StateDivergedError",
    "StateMismatchError",
    "TruncateOrderError",
    "TruncatedRangeError",
    "VnodeBacklog",
    "append_segment",
    "connect",
    "read_plan",
]
