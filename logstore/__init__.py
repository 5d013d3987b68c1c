"""A durable queue of sealed epochs per vnode, from which the file sink writes Parquet files.

- :func:`append_segment` (in Spark tasks) writes one segment file for one epoch;
- :meth:`LogStore.seal` records an epoch and its segments in the state database (the log's checkpoint);
- :meth:`LogStore.read` streams a vnode range over an epoch range;
- :meth:`LogStore.truncate` and :meth:`LogStore.collect_garbage` release what every vnode has moved past.

See ``docs/logstore.md`` for the file format and the durability rules.
"""

from .append import VNODE_COLUMN, AppendTarget, append_segment
from .errors import (
    EpochNotSealedError,
    EpochOrderError,
    EpochSealedError,
    InvalidSegmentInputError,
    LogStoreError,
    LogWriteError,
    SegmentCorruptError,
    SegmentError,
    SegmentMissingError,
    StateMismatchError,
    TruncatedRangeError,
    TruncateOrderError,
)
from .segment import SegmentDescriptor
from .statedb import STATE_DB_NAME, connect
from .storage import LogLocation
from .store import NOTHING, GarbageReport, LogBatch, LogStore, ReadItem, VnodeBacklog, read_plan

__all__ = [
    "NOTHING",
    "STATE_DB_NAME",
    "VNODE_COLUMN",
    "AppendTarget",
    "EpochNotSealedError",
    "EpochOrderError",
    "EpochSealedError",
    "GarbageReport",
    "InvalidSegmentInputError",
    "LogBatch",
    "LogLocation",
    "LogStore",
    "LogStoreError",
    "LogWriteError",
    "ReadItem",
    "SegmentCorruptError",
    "SegmentDescriptor",
    "SegmentError",
    "SegmentMissingError",
    "StateMismatchError",
    "TruncateOrderError",
    "TruncatedRangeError",
    "VnodeBacklog",
    "append_segment",
    "connect",
    "read_plan",
]
