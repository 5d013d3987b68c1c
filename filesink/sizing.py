"""How large a file's Parquet will be: the ratio of Parquet bytes to log bytes, for the size rule.

The planner estimates a file's size as its log bytes times this ratio. Once the sink has committed a file,
the ratio is learned from it (:meth:`filesink.state.SinkState.commit`). Before that, a new sink measures it
with :func:`sample_ratio`: it encodes rows it holds exactly as a file of them would be written (same row
groups, compression and partition directories), in memory, and divides by the log bytes they came from.
Parquet compresses better with more rows per row group, so a sample of one full row group is representative
of a large file, and a smaller one overestimates its size.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.parquet as pq

from logstore import read_plan

from .writer import FileTask, conform, file_schemas, parquet_options, split_partitions

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Sample:
    """The ratio of Parquet bytes to log bytes measured on ``rows`` rows."""

    ratio: float
    rows: int


def sample_ratio(task: FileTask, max_rows: int) -> Sample:
    """Encode the first blocks of ``task``'s read plan, at least ``max_rows`` rows of them (or all it has), as
    the task's file would be written, and return Parquet bytes per log byte.

    Raises the log store's errors (:class:`logstore.SegmentError`) as the file writer would.
    """
    schema, data_columns, file_schema = file_schemas(task)
    lengths = [block.length for item in task.plan for block in item.blocks]
    per_partition: dict[str, list[pa.RecordBatch]] = {}
    rows = log_bytes = 0
    for length, item in zip(lengths, read_plan(task.log.open(), task.plan), strict=False):
        log_bytes += length
        batch = conform(item.batch, schema, task, item)
        if batch.num_rows == 0:
            continue
        for directory, part in split_partitions(batch, task.partition_by, data_columns):
            per_partition.setdefault(directory, []).append(part)
        rows += batch.num_rows
        if rows >= max_rows:
            break
    parquet_bytes = 0
    for batches in per_partition.values():
        sink = pa.BufferOutputStream()
        table = pa.Table.from_batches(batches, file_schema)
        with pq.ParquetWriter(sink, file_schema, **parquet_options(task, table)) as writer:
            writer.write_table(table, row_group_size=task.row_group_rows)
        parquet_bytes += sink.tell()
    ratio = parquet_bytes / log_bytes if log_bytes else 1.0
    log.info("file %s: %d sampled rows encode to %.3f Parquet bytes per log byte", task.name, rows, ratio)
    return Sample(ratio, rows)
