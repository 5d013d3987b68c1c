"""Input batches and output readers for the sink tests: outputs are compared as exact multisets of rows."""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path

import duckdb
import fsspec
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq

COLUMNS = ["id", "user_id", "event_date", "amount"]
TYPES = [pa.int64(), pa.int64(), pa.string(), pa.float64()]


def batch_rows(batch: int, rows: int, seed: int = 0) -> list[tuple]:
    """Rows of one micro-batch: ids are unique per batch, values a pure function of (seed, batch)."""
    rng = random.Random(seed * 100_003 + batch)
    first = batch * 1_000_000
    return [
        (first + i, rng.randrange(1000), f"2024-01-{1 + rng.randrange(3):02d}", round(rng.random() * 100, 2))
        for i in range(rows)
    ]


def batch_df(spark, rows: list[tuple]):
    return spark.createDataFrame(rows, "id long, user_id long, event_date string, amount double")


def _fs(path: str, options: dict | None):
    if "://" not in path:
        return fsspec.filesystem("file"), path
    fs, root = fsspec.core.url_to_fs(path, **(options or {}))
    fs.invalidate_cache()
    return fs, root


def parquet_files(path: str, options: dict | None = None) -> list[str]:
    """Every object under the output, relative to it (but the sink's claim and commit mark, ``_filesink*.json``)."""
    from filesink.output import CLAIM_NAME, MARK_NAME

    fs, root = _fs(path, options)
    if not fs.exists(root):
        return []
    keys = (p[len(root.rstrip("/")) + 1 :] for p in fs.find(root))
    return sorted(k for k in keys if k not in (CLAIM_NAME, MARK_NAME))


def read_pyarrow(path: str, options: dict | None = None, partition_by: tuple[str, ...] = ()) -> Counter:
    fs, root = _fs(path, options)
    hive = ds.partitioning(pa.schema([(c, pa.string()) for c in partition_by]), flavor="hive") if partition_by else None
    table = ds.dataset(root, filesystem=fs, format="parquet", partitioning=hive).to_table(columns=COLUMNS)
    return Counter(zip(*(table[c].to_pylist() for c in COLUMNS), strict=True))


def read_duckdb(path: str, options: dict | None = None, partition_by: tuple[str, ...] = ()) -> Counter:
    con = duckdb.connect()
    if "://" in path:
        fs, _ = _fs(path, options)
        con.register_filesystem(fs)
    hive = "true" if partition_by else "false"
    glob = path.rstrip("/") + "/**/*.parquet"
    types = ", hive_types={" + ", ".join(f"'{c}': 'VARCHAR'" for c in partition_by) + "}" if partition_by else ""
    rows = con.execute(
        f"SELECT {', '.join(COLUMNS)} FROM read_parquet('{glob}', hive_partitioning={hive}{types})"
    ).fetchall()
    return Counter(rows)


def append_epoch(sink, epoch: int, rows: list[tuple]) -> None:
    """What the sink's Spark append and seal do for one micro-batch, in this process (vnode = user_id % V)."""
    from filesink.schema.conform import file_schema_bytes
    from logstore import VNODE_COLUMN

    columns = list(zip(*rows, strict=True))
    table = pa.table({c: pa.array(v, t) for c, v, t in zip(COLUMNS, columns, TYPES, strict=True)})
    table = table.append_column(VNODE_COLUMN, pa.array([u % sink.vnodes for u in columns[1]], pa.int32()))
    descriptor = sink.log_store.append(epoch, table, writer_id="test")
    sink.log_store.seal(epoch, [descriptor])
    if sink.ledger.arrow_schema() is None:
        sink.ledger.record_schema("[]", file_schema_bytes(descriptor.schema_bytes))


def append_evolving(sink, epoch: int, table: pa.Table, spark_schema) -> None:
    """What the sink's ``__call__`` does for a batch whose schema may differ from the sink's, without Spark: the
    schema check with the Spark ``spark_schema`` (a new version is recorded after the append, before the seal), the
    append of ``table`` (vnode = id % V) and the seal."""
    from logstore import VNODE_COLUMN

    version = sink._check_schema(spark_schema, epoch)
    vnodes = pa.array([i % sink.vnodes for i in table["id"].to_pylist()], pa.int32())
    descriptor = sink.log_store.append(epoch, table.append_column(VNODE_COLUMN, vnodes), writer_id="test")
    if version is not None:
        sink._record_version(version, [descriptor])
    sink.log_store.seal(epoch, [descriptor])


STREAM_SCHEMA = "id long, user_id long, event_date string, amount double"


def input_file(directory: Path, batch: int, rows: int = 300, *, seed: int = 7) -> Counter:
    """One Parquet input file of ``batch_rows(batch, rows, seed)`` in ``directory``; returns its rows."""
    directory.mkdir(parents=True, exist_ok=True)
    data = batch_rows(batch, rows, seed=seed)
    columns = list(zip(*data, strict=True))
    table = pa.table({c: pa.array(v, t) for c, v, t in zip(COLUMNS, columns, TYPES, strict=True)})
    pq.write_table(table, directory / f"batch-{batch:03d}.parquet")
    return Counter(data)


def run_query(spark, sink, source: Path, checkpoint: Path, *, files_per_batch: int = 1, fix=None):
    """One available-now run of a query over ``source`` (``files_per_batch`` files a batch) into ``sink``, the
    user's ``fix`` applied to the stream if given; the query's error, or None."""
    stream = spark.readStream.schema(STREAM_SCHEMA).option("maxFilesPerTrigger", files_per_batch).parquet(str(source))
    if fix is not None:
        stream = fix(stream)
    query = (
        stream.writeStream.foreachBatch(sink)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    from pyspark.errors import StreamingQueryException

    try:
        assert query.awaitTermination(300), "the query did not finish in 300 s"
    except StreamingQueryException as e:
        return e
    return query.exception()


def needs_single_driver(log_store: str, options: dict | None) -> bool:
    """Whether the log store's server fails the start's probe of conditional create (rclone's ignores it), so
    a sink there runs only with ``single_driver=True``: asked of the server, as the sink does."""
    from logstore import LogLocation
    from logstore.conditional import ConditionalCreate, probe_conditional_create

    storage = LogLocation(log_store, dict(options or {})).open()
    return probe_conditional_create(storage).outcome is not ConditionalCreate.HONOURED
