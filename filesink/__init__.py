"""The Spark-facing exactly-once Parquet sink (built on :mod:`logstore`).

```python
from filesink import ExactlyOnceParquetSink, Rollover
sink = ExactlyOnceParquetSink(path="s3://bucket/table", state_dir="/var/lib/app/sink", key_columns=["user_id"])
query = df.writeStream.foreachBatch(sink).option("checkpointLocation", ckpt).start()
```
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .errors import (
    CheckpointMismatchError,
    CommitConflictError,
    DamagedLogError,
    FencedError,
    FileSinkError,
    FileWriteError,
    InputError,
    LogStoreMovedError,
    MetricsPortError,
    OutputClaimedError,
    OutputHasRowsError,
    SchemaMismatchError,
    SinkFailedError,
    SinkLockedError,
    SinkOptionError,
    SparkMasterError,
    StateBehindError,
    StateDatabaseError,
    StorageAccessError,
)
from .rolling.rollover import Rollover

# The sink (and with it the state database's dependencies) is imported on first use: Spark tasks import this
# package to write files, and never need it.
if TYPE_CHECKING:
    from .metrics.figures import SinkMetrics
    from .sink.face import ExactlyOnceParquetSink, SinkStats


def __getattr__(name: str) -> Any:
    if name not in ("ExactlyOnceParquetSink", "SinkStats", "SinkMetrics"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from .metrics import figures as metrics
    from .sink import face as sink

    value = getattr(metrics if name == "SinkMetrics" else sink, name)
    globals()[name] = value
    return value


__all__ = [
    "CheckpointMismatchError",
    "CommitConflictError",
    "DamagedLogError",
    "ExactlyOnceParquetSink",
    "FencedError",
    "FileSinkError",
    "FileWriteError",
    "InputError",
    "LogStoreMovedError",
    "MetricsPortError",
    "OutputClaimedError",
    "OutputHasRowsError",
    "Rollover",
    "SchemaMismatchError",
    "SinkFailedError",
    "SinkLockedError",
    "SinkMetrics",
    "SinkOptionError",
    "SinkStats",
    "SparkMasterError",
    "StateBehindError",
    "StateDatabaseError",
    "StorageAccessError",
]
