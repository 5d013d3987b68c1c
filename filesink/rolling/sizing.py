"""How large a file's Parquet will be: the ratio of Parquet bytes to log bytes, for the size rule.

The planner estimates a file's size as its log bytes times this ratio. Once the sink has committed a file,
the ratio is learned from it (:meth:`filesink.state.SinkState.commit`). Before that, a new sink measures it
with :func:`sample_ratio`: it encodes rows it holds exactly as a file of them would be written (same row
groups, compression and partition directories), in memory, and divides by the log bytes they came from.
Parquet compresses better with more rows per row group, so a sample of one full row group is representative
of a large file, and a smaller one overestimates its size.

A large sample is encoded in parallel, by groups of columns (the driver runs it between Spark jobs, while the
cores are otherwise idle). A Parquet object's size is the sum of its column chunks plus a footer that describes
each column, so the groups' objects add up to the whole object's size plus the part of a footer that does not
depend on the columns, a few hundred bytes per extra group: under 0.1 % of a sample of ``PARALLEL_BYTES``.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from logstore import ReadItem, read_plan
from logstore.segment import Block

from ..tasks.writer import FileTask, conform, file_schemas, parquet_options, split_partitions

log = logging.getLogger(__name__)

PARALLEL_BYTES = 16 * 2**20
"""A sample of at least this many bytes in memory (of one partition directory) is encoded by column groups in
parallel; a smaller one is encoded whole."""

THREADS = max(1, min(4, os.cpu_count() or 1))
"""At most this many column groups, each encoded by a thread of its own (pyarrow's writer releases the GIL)."""

RESAMPLE_GROWTH = 2
"""A new sink samples again only for a file of at least this many times the rows of its last sample. Each sample
encodes its rows from scratch, and a sample of a few more rows barely moves the ratio: on the benchmarks' ``events``
rows, 0.900 and 1.0 million rows measured 0.210 and 0.207, and the second encode cost 0.57 s before a batch."""

_FRAMING = 12
"""Bytes of a Parquet file outside its column chunks and footer: ``PAR1``, the footer's length, ``PAR1``."""


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
    plan = first_rows(task.plan, max_rows)
    lengths = [block.length for item in plan for block in item.blocks]
    per_partition: dict[str, list[pa.RecordBatch]] = {}
    rows = log_bytes = 0
    with contextlib.closing(read_plan(task.log.open(), plan)) as read:  # closed: its read-ahead stops
        for length, item in zip(lengths, read, strict=True):
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
        table = pa.Table.from_batches(batches, file_schema)
        parquet_bytes += encoded_size(table, parquet_options(task, table), task.row_group_rows)
    ratio = parquet_bytes / log_bytes if log_bytes else 1.0
    log.info("file %s: %d sampled rows encode to %.3f Parquet bytes per log byte", task.name, rows, ratio)
    return Sample(ratio, rows)


def first_rows(plan: Sequence[ReadItem], rows: int) -> list[ReadItem]:
    """The start of ``plan`` that holds at least ``rows`` rows (by the blocks' row counts), or all of it.

    Only these blocks are read: on an object store the reader fetches ahead of the rows it yields (up to its
    buffer), so a sample that stopped reading the whole plan early still fetched far more than it used."""
    taken: list[ReadItem] = []
    left = rows
    for item in plan:
        if left <= 0:
            break
        blocks: list[Block] = []
        for block in item.blocks:
            if left <= 0:
                break
            blocks.append(block)
            left -= block.rows
        taken.append(item if len(blocks) == len(item.blocks) else replace(item, blocks=tuple(blocks)))
    return taken


def encoded_size(table: pa.Table, options: dict[str, Any], row_group_rows: int) -> int:
    """The size of ``table`` written as one Parquet object with ``options`` (``ParquetWriter`` keyword arguments),
    encoded in memory: by column groups in parallel when the table is large (see the module's docstring)."""
    big = table.get_total_buffer_size() >= PARALLEL_BYTES  # fast: no walk over every chunk, as ``nbytes`` does
    groups = column_groups(table, THREADS) if big else [table.column_names]
    if len(groups) == 1:
        return _encode(table, options, row_group_rows)
    parts = [table.select(names) for names in groups]
    parts[1:] = [part.replace_schema_metadata(None) for part in parts[1:]]  # the schema's metadata is written once
    # ``use_dictionary`` may name the columns that keep a dictionary: the writer skips names a part does not have
    with ThreadPoolExecutor(len(parts), thread_name_prefix="filesink-sample") as pool:
        sizes = list(pool.map(lambda part: _encode(part, options, row_group_rows), parts))
    return sum(sizes) - _FRAMING * (len(parts) - 1)


def column_groups(table: pa.Table, groups: int) -> list[list[str]]:
    """The table's columns in at most ``groups`` groups of about equal bytes, each in the table's order."""
    sizes = {name: table.column(name).get_total_buffer_size() for name in table.column_names}
    loads = [0] * max(1, min(groups, len(sizes)))
    members: list[list[str]] = [[] for _ in loads]
    for name in sorted(sizes, key=lambda n: -sizes[n]):
        least = loads.index(min(loads))
        loads[least] += sizes[name]
        members[least].append(name)
    order = {name: i for i, name in enumerate(table.column_names)}
    return [sorted(m, key=order.__getitem__) for m in members if m]


def _encode(table: pa.Table, options: dict[str, Any], row_group_rows: int) -> int:
    sink = pa.BufferOutputStream()
    with pq.ParquetWriter(sink, table.schema, **options) as writer:
        writer.write_table(table, row_group_size=row_group_rows)
    return int(sink.tell())
