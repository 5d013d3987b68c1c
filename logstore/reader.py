"""Reading sealed log data back: :func:`read_plan` fetches, checks and decodes the blocks of a read plan.

Kept apart from :mod:`logstore.store` so that Spark tasks, which read segments but never the state database,
do not import the state database's dependencies (``sqlite_utils``, which imports pandas).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import NamedTuple

import pyarrow as pa

from . import segment
from .errors import SEGMENT_WAY_OUT, SegmentCorruptError, SegmentMissingError
from .segment import Block, describe_vnodes
from .storage import Storage


class LogBatch(NamedTuple):
    """Rows read back from the log: one block of one vnode from one segment."""

    vnode: int
    epoch: int
    segment: str
    batch: pa.RecordBatch


@dataclass(frozen=True)
class ReadItem:
    """One vnode's rows of one sealed segment: what :func:`read_plan` fetches, checks and decodes."""

    vnode: int
    epoch: int
    segment: str
    segment_vnodes: tuple[int, ...]
    schema_bytes: bytes
    blocks: tuple[Block, ...]


def read_plan(storage: Storage, plan: Iterable[ReadItem]) -> Iterator[LogBatch]:
    """Fetch, check and decode the blocks of ``plan`` in order, one block in memory at a time."""
    schemas: dict[bytes, pa.Schema] = {}
    with storage.reading() as read:  # local segments stay open: a plan reads each one vnode after vnode
        for item in plan:
            schema = schemas.get(item.schema_bytes)
            if schema is None:
                schema = schemas[item.schema_bytes] = segment.decode_schema(item.schema_bytes)
            for block in item.blocks:
                try:
                    data = read(item.segment, block.offset, block.length)
                except FileNotFoundError as e:
                    raise SegmentMissingError(
                        f"{_where(storage, item)}: the segment file of a sealed epoch is missing. {SEGMENT_WAY_OUT}."
                    ) from e
                problem = segment.block_problem(data, block)
                if problem:
                    raise SegmentCorruptError(f"segment {_where(storage, item)}: {problem}. {SEGMENT_WAY_OUT}.")
                try:
                    batch = segment.decode_block(data, schema)
                except (pa.ArrowInvalid, OSError) as e:
                    raise SegmentCorruptError(
                        f"segment {_where(storage, item)}: block at offset {block.offset}: {e}. {SEGMENT_WAY_OUT}."
                    ) from e
                yield LogBatch(item.vnode, item.epoch, item.segment, batch)


def _where(storage: Storage, item: ReadItem) -> str:
    return f"{storage.display(item.segment)} (epoch {item.epoch}, vnodes {describe_vnodes(list(item.segment_vnodes))})"
