"""The Spark-facing exactly-once Parquet sink (built on :mod:`logstore`).

```python
from filesink import ExactlyOnceParquetSink, Rollover
sink = ExactlyOnceParquetSink(path="s3://bucket/table", state_dir="/var/lib/app/sink", key_columns=["user_id"])
query = df.writeStream.foreachBatch(sink).option("checkpointLocation", ckpt).start()
```
"""

from .errors import (
    CheckpointMismatchError,
    CommitConflictError,
    FencedError,
    FileSinkError,
    FileWriteError,
    InputError,
    SchemaMismatchError,
    SinkFailedError,
    SinkLockedError,
    SinkOptionError,
    SparkMasterError,
    StateDatabaseError,
    StorageAccessError,
)
from .rollover import Rollover
from .sink import ExactlyOnceParquetSink, SinkStats

__all__ = [
    "CheckpointMismatchError",
    "CommitConflictError",
    "ExactlyOnceParquetSink",
    "FencedError",
    "FileSinkError",
    "FileWriteError",
    "InputError",
    "Rollover",
    "SchemaMismatchError",
    "SinkFailedError",
    "SinkLockedError",
    "SinkOptionError",
    "SinkStats",
    "SparkMasterError",
    "StateDatabaseError",
    "StorageAccessError",
]
