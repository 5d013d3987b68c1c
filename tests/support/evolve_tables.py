"""Tables whose schema evolves, written through the sink without Spark's jobs (``sink_helpers.append_evolving``):
shared by the table evolution tests and DuckDB's reading of them.

Epochs 0 and 1 have version 1 (``id bigint, n int, p struct<x:int>``) and are committed by a flush; epoch 2 (version
1) is still held when epoch 3 brings version 2 (``p`` gains ``y``, a new column ``extra``, and with ``widen`` ``n``
becomes ``bigint`` with values beyond an ``int``); the sink restarts, takes epoch 4 (version 2) and flushes.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pyarrow as pa
from pyspark.sql import types as T
from sink_helpers import append_evolving

from filesink import ExactlyOnceParquetSink, Rollover

HOLD = Rollover(target_file_size=None, max_age_seconds=None, max_epochs=1000)
ROWS = 12

POINT = T.StructType([T.StructField("x", T.IntegerType())])
WIDE_POINT = T.StructType([T.StructField("x", T.IntegerType()), T.StructField("y", T.StringType())])
V1 = T.StructType([T.StructField("id", T.LongType()), T.StructField("n", T.IntegerType()), T.StructField("p", POINT)])


def v2(widen: bool) -> T.StructType:
    return T.StructType(
        [
            T.StructField("id", T.LongType()),
            T.StructField("n", T.LongType() if widen else T.IntegerType()),
            T.StructField("p", WIDE_POINT),
            T.StructField("extra", T.StringType()),
        ]
    )


def batch(epoch: int, version: int, widen: bool) -> pa.Table:
    ids = list(range(epoch * ROWS, (epoch + 1) * ROWS))
    if version == 1:
        return pa.table(
            {
                "id": pa.array(ids, pa.int64()),
                "n": pa.array(ids, pa.int32()),
                "p": pa.array([{"x": i} for i in ids], pa.struct([("x", pa.int32())])),
            }
        )
    n = [i * 3_000_000_000 for i in ids] if widen else ids
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "n": pa.array(n, pa.int64() if widen else pa.int32()),
            "p": pa.array([{"x": i, "y": f"y{i}"} for i in ids], pa.struct([("x", pa.int32()), ("y", pa.string())])),
            "extra": pa.array([f"e{i}" for i in ids], pa.string()),
        }
    )


def expected(epochs: int, first_v2: int, widen: bool) -> Counter:
    rows: Counter = Counter()
    for e in range(epochs):
        for i in range(e * ROWS, (e + 1) * ROWS):
            if e < first_v2:
                rows[(i, i, i, None, None)] += 1
            else:
                rows[(i, i * 3_000_000_000 if widen else i, i, f"y{i}", f"e{i}")] += 1
    return rows


def open_sink(tmp_path: Path, table_format: str) -> ExactlyOnceParquetSink:
    options = {"table": "db.events"} if table_format == "iceberg" else {}
    return ExactlyOnceParquetSink(
        str(tmp_path / "table"),
        tmp_path / "state",
        vnodes=4,
        parallelism=2,
        rollover=HOLD,
        table_format=table_format,
        **options,
    )


EPOCHS = 5
FIRST_V2 = 3


def write_evolving(tmp_path: Path, table_format: str, widen: bool) -> Counter:
    """Write the epochs into a table of ``table_format`` at ``tmp_path / "table"``; the rows every reader must
    return, as (id, n, p.x, p.y, extra)."""
    with open_sink(tmp_path, table_format) as sink:
        for epoch in (0, 1):
            append_evolving(sink, epoch, batch(epoch, 1, widen), V1)
        sink.flush()
        append_evolving(sink, 2, batch(2, 1, widen), V1)  # held when the schema changes
        append_evolving(sink, 3, batch(3, 2, widen), v2(widen))
    with open_sink(tmp_path, table_format) as sink:  # a restart between the change and the table's commit
        append_evolving(sink, 4, batch(4, 2, widen), v2(widen))
        sink.flush()
    return expected(EPOCHS, FIRST_V2, widen)
