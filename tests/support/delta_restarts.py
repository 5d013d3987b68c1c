"""A Delta table that the sink takes new columns into right after restarts from checkpoints: its own checkpoint,
and delta-rs's written after another writer's appends and compaction; shared by the checkpoint tests and DuckDB's
reading of the table.

A restarted sink reads the table's ``metaData`` from the newest checkpoint, and the commit of its first file with a
new column writes that ``metaData`` back with the new schema: so every map of it must come out of the checkpoint
as the protocol's JSON object. Written through the sink without Spark's jobs (``sink_helpers.append_evolving``),
partitioned by ``day``, with a checkpoint every :data:`INTERVAL` versions (the sink's creation of the table patched
for it):

- sink A: epochs 0-3 (``id, user_id, day``), a roll each: versions 1-4, the sink's checkpoint at 3;
- sink B (a new sink object): epoch 4 with ``extra`` (bigint): version 5, its ``metaData`` from checkpoint 3;
- another writer (delta-rs): two appends (6, 7), a compaction (8: ``remove`` and ``add`` actions), and delta-rs's
  own checkpoint at 8;
- sink C: epoch 5 with ``more`` (string): version 9 from checkpoint 8; epochs 6-7: versions 10-11, the sink's
  checkpoint at 11 (holding the other writer's actions and the compaction's tombstones);
- sink D: epoch 8 with ``last`` (double): version 12 from checkpoint 11.

Days are two dates, null and the empty string; both of the last two are written to ``__HIVE_DEFAULT_PARTITION__``,
a null partition value, and read back as null.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
from pyspark.sql import types as T
from sink_helpers import append_evolving

from filesink import ExactlyOnceParquetSink, Rollover

HOLD = Rollover(target_file_size=None, max_age_seconds=None, max_epochs=1000)
INTERVAL = 3
DAYS = ("2024-01-01", "2024-01-02", None, "")
ROWS = 8
BASE = [("id", pa.int64()), ("user_id", pa.int64()), ("day", pa.string())]
ADDED = [("extra", pa.int64()), ("more", pa.string()), ("last", pa.float64())]
"""The columns the restarted sinks add, one at each restart."""
COLUMNS = [name for name, _ in BASE + ADDED]
_SPARK = {pa.int64(): T.LongType(), pa.string(): T.StringType(), pa.float64(): T.DoubleType()}


@dataclass(frozen=True)
class Written:
    rows: Counter
    """The rows every reader must return, as tuples over :data:`COLUMNS` (the empty string day read as null)."""
    schema_changes: tuple[int, ...]
    """The versions at which a restarted sink wrote a ``metaData`` action (its first commit with a new column)."""
    checkpoints: tuple[int, ...]
    """The versions of the checkpoints: the sink's, delta-rs's after another writer, the sink's."""


def _fields(added: int) -> list[tuple[str, pa.DataType]]:
    return BASE + ADDED[:added]


def _value(name: str, i: int) -> object:
    return {"extra": i * 7, "more": f"m{i}", "last": i / 4}.get(name)


def _batch(epoch: int, added: int) -> tuple[pa.Table, T.StructType, Counter]:
    fields = _fields(added)
    ids = range(epoch * 100, epoch * 100 + ROWS)
    columns: dict[str, list[object]] = {
        "id": list(ids),
        "user_id": [i % 5 for i in ids],
        "day": [DAYS[i % len(DAYS)] for i in ids],
    }
    for name, _ in ADDED[:added]:
        columns[name] = [_value(name, i) for i in ids]
    table = pa.table({name: pa.array(columns[name], type_) for name, type_ in fields})
    spark = T.StructType([T.StructField(name, _SPARK[type_]) for name, type_ in fields])
    read = [[(v or None) if n == "day" else v for v in columns[n]] for n, _ in fields]  # "" reads back as null
    padding = [None] * (len(COLUMNS) - len(fields))
    return table, spark, Counter(tuple(row) + tuple(padding) for row in zip(*read, strict=True))


def _sink(root: Path) -> ExactlyOnceParquetSink:
    return ExactlyOnceParquetSink(
        str(root / "table"),
        str(root / "state"),
        vnodes=4,
        parallelism=1,
        rollover=HOLD,
        table_format="delta",
        partition_by=["day"],
    )


@contextmanager
def _checkpoint_interval(versions: int) -> Iterator[None]:
    """New tables created by the sink with ``delta.checkpointInterval`` ``versions``."""
    from filesink.destination import delta

    saved = delta.CONFIGURATION
    delta.CONFIGURATION = {**saved, "delta.checkpointInterval": str(versions)}
    try:
        yield
    finally:
        delta.CONFIGURATION = saved


def _rolls(root: Path, epochs: range, added: int) -> Counter:
    """A new sink object: each epoch appended with ``added`` of :data:`ADDED`'s columns, a roll (commit) each."""
    rows: Counter = Counter()
    with _sink(root) as sink:
        for epoch in epochs:
            table, spark, expected = _batch(epoch, added)
            append_evolving(sink, epoch, table, spark)
            sink.flush()
            rows += expected
    return rows  # closed: the background checkpoint has ended


def _other_writer(table_uri: str) -> Counter:
    """delta-rs writing to the table: two appends into one day's partition and the null one, then a compaction."""
    import deltalake

    rows: Counter = Counter()
    for n in range(2):
        ids = [10_000 + 10 * n + i for i in range(3)]
        days = ["2024-01-01", "2024-01-01", None]
        data = {"id": ids, "user_id": [1] * 3, "day": days, "extra": [i * 7 for i in ids]}
        deltalake.write_deltalake(table_uri, pa.table({k: pa.array(data[k], t) for k, t in _fields(1)}), mode="append")
        rows.update((i, 1, d, i * 7, None, None) for i, d in zip(ids, days, strict=True))
    deltalake.DeltaTable(table_uri).optimize.compact()
    return rows


def write_restarted_table(root: Path) -> Written:
    """The table of the module's notes at ``root / "table"`` (the sinks' state at ``root / "state"``)."""
    import deltalake

    uri = str(root / "table")
    with _checkpoint_interval(INTERVAL):
        rows = _rolls(root, range(4), 0)
    rows += _rolls(root, range(4, 5), 1)
    rows += _other_writer(uri)
    table = deltalake.DeltaTable(uri)
    assert table.version() == 8, table.history(3)
    table.create_checkpoint()
    rows += _rolls(root, range(5, 8), 2)
    rows += _rolls(root, range(8, 9), 3)
    return Written(rows, (5, 9, 12), (3, 8, 11))
