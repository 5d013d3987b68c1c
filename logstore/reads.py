"""Reading the log store: a vnode range over an epoch range, and the picklable plan a Spark task reads without the
state database (:func:`logstore.reader.read_plan` executes it)."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping

from .errors import EpochNotSealedError, TruncatedRangeError
from .reader import LogBatch, ReadItem, read_plan
from .segment import Block
from .statedb import db_errors
from .storecore import StoreCore


class Reads(StoreCore):
    """Read plans, checked against the last sealed epoch and the truncate points."""

    def read(self, vnodes: range, after_epoch: int, up_to_epoch: int) -> Iterator[LogBatch]:
        """Stream the rows of ``vnodes`` for the epochs in ``(after_epoch, up_to_epoch]``.

        Order: vnode, epoch, segment name, row. Memory is bounded by one block (see ``max_block_bytes``).
        Arguments are checked before this returns; a damaged segment raises :class:`SegmentError` naming the
        file, epoch and vnodes when its turn comes, never skipped.
        """
        if vnodes.step != 1 or vnodes.start < 0 or vnodes.stop > self.vnodes:
            raise ValueError(f"vnode range {vnodes} must be contiguous within 0..{self.vnodes - 1}")
        return read_plan(self.storage, self.plan_read(dict.fromkeys(vnodes, after_epoch), up_to_epoch))

    @db_errors("plan a read")
    def plan_read(self, after: Mapping[int, int], up_to_epoch: int) -> list[ReadItem]:
        """What to read for each vnode of ``after`` over ``(after[vnode], up_to_epoch]``, in read order.

        The plan is picklable and :func:`read_plan` executes it with the storage alone, so a Spark task can
        read without the state database.
        """
        last = self.last_sealed_epoch
        if up_to_epoch > last:
            raise EpochNotSealedError(
                f"cannot read up to epoch {up_to_epoch}: the last sealed epoch of {self._where} is {last}"
            )
        points = self.truncate_points()
        released = []
        for vnode, after_epoch in sorted(after.items()):
            if vnode not in points:
                raise ValueError(f"vnode {vnode} is outside 0..{self.vnodes - 1}")
            if after_epoch > up_to_epoch:
                raise ValueError(f"read of epochs ({after_epoch}, {up_to_epoch}]: the range is reversed")
            if points[vnode] > after_epoch:
                released.append((vnode, after_epoch, points[vnode]))
        if released:
            shown = ", ".join(f"vnode {v} after epoch {a}: truncated up to epoch {t}" for v, a, t in released[:5])
            raise TruncatedRangeError(
                f"cannot read from {self._where}: that data was already released by truncation ({shown}"
                f"{', ...' if len(released) > 5 else ''}); read after each vnode's truncate point instead"
            )
        plan: list[ReadItem] = []
        segment_vnodes: dict[int, tuple[int, ...]] = {}
        for vnode, after_epoch in sorted(after.items()):
            for epoch, segment_id, name, schema_bytes, blocks_json in self.db.execute(
                """
                SELECT sv.epoch, s.segment_id, s.name, s.schema_bytes, sv.blocks
                FROM log_segment_vnodes sv JOIN log_segments s ON s.segment_id = sv.segment_id
                WHERE sv.vnode = ? AND sv.epoch > ? AND sv.epoch <= ?
                ORDER BY sv.epoch, s.name
                """,
                (vnode, after_epoch, up_to_epoch),
            ).fetchall():
                if segment_id not in segment_vnodes:
                    segment_vnodes[segment_id] = tuple(
                        r[0]
                        for r in self.db.execute(
                            "SELECT vnode FROM log_segment_vnodes WHERE segment_id = ? ORDER BY vnode", (segment_id,)
                        )
                    )
                blocks = tuple(map(Block.from_json, json.loads(blocks_json)))
                plan.append(ReadItem(vnode, epoch, name, segment_vnodes[segment_id], schema_bytes, blocks))
        return plan
