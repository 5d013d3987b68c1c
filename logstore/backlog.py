"""The backlog queries of the log store: what it holds above the vnodes' truncate points, per vnode and epoch, and
summed (for the planner's in-memory backlog, progress displays and the health check)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from .statedb import db_errors
from .storecore import StoreCore


@dataclass(frozen=True)
class VnodeBacklog:
    """What a vnode holds above its truncate point."""

    vnode: int
    truncated_epoch: int
    rows: int
    bytes: int
    epochs: int
    """Number of sealed epochs with rows for this vnode above the truncate point."""
    first_epoch: int | None
    """Oldest such epoch (None when the vnode holds nothing)."""
    first_sealed_at: float | None
    """Unix time at which ``first_epoch`` was sealed."""


class BacklogChanges(NamedTuple):
    """One consistent read of what the planner's in-memory backlog needs (:meth:`LogStore.backlog_changes`)."""

    last_sealed_epoch: int
    truncate_points: dict[int, int]
    holding: set[int]
    """Vnodes that hold rows above their truncate points."""
    rows: list[tuple[int, int, int, int, float]]
    """``(vnode, epoch, rows, log bytes, sealed_at)`` per vnode and epoch: of every held epoch, or of the epochs
    sealed since the given one."""


class HeldTotals(NamedTuple):
    """What the log store holds above the truncate points, summed over every vnode."""

    rows: int
    bytes: int
    epochs: int
    first_epoch: int | None
    last_epoch: int | None


_BACKLOG_WHOLE = """
    SELECT sv.vnode, sv.epoch, SUM(sv.rows), SUM(sv.bytes), e.sealed_at
    FROM log_segment_vnodes sv
    JOIN log_vnodes v ON v.vnode = sv.vnode
    JOIN log_epochs e ON e.epoch = sv.epoch
    WHERE sv.epoch > v.truncated_epoch
    GROUP BY sv.vnode, sv.epoch
"""

# Through the held segments (one row each), then their vnode rows by index: CROSS JOIN keeps SQLite from
# scanning every vnode row instead.
_BACKLOG_SEALED_SINCE = """
    SELECT sv.vnode, s.epoch, SUM(sv.rows), SUM(sv.bytes), e.sealed_at
    FROM log_segments s
    CROSS JOIN log_segment_vnodes sv ON sv.segment_id = s.segment_id
    JOIN log_epochs e ON e.epoch = s.epoch
    WHERE s.epoch > ? AND s.epoch <= ?
    GROUP BY sv.vnode, s.epoch
"""

_HOLDING = """
    SELECT v.vnode FROM log_vnodes v
    WHERE EXISTS (SELECT 1 FROM log_segment_vnodes sv WHERE sv.vnode = v.vnode AND sv.epoch > v.truncated_epoch)
"""


class Backlog(StoreCore):
    """What the log store holds: sealed epochs and segments, per vnode and epoch above the truncate points."""

    @db_errors("list the sealed epochs")
    def sealed_epochs(self) -> list[int]:
        """Sealed epochs still recorded (epochs below every truncate point are pruned by garbage collection)."""
        return self._held_epochs()

    @db_errors("read the backlog")
    def backlog(self) -> list[VnodeBacklog]:
        """Per vnode: rows, bytes and epochs held above its truncate point."""
        rows = self.db.execute(
            """
            SELECT b.*, (SELECT sealed_at FROM log_epochs e WHERE e.epoch = b.first_epoch) FROM (
                SELECT v.vnode, v.truncated_epoch, COALESCE(SUM(sv.rows), 0), COALESCE(SUM(sv.bytes), 0),
                       COUNT(DISTINCT sv.epoch), MIN(sv.epoch) AS first_epoch
                FROM log_vnodes v
                LEFT JOIN log_segment_vnodes sv ON sv.vnode = v.vnode AND sv.epoch > v.truncated_epoch
                GROUP BY v.vnode
            ) b ORDER BY b.vnode
            """
        ).fetchall()
        return [VnodeBacklog(*r) for r in rows]

    @db_errors("read the backlog's changes")
    def backlog_changes(self, since: int | None) -> BacklogChanges:
        """In one transaction: the last sealed epoch, the truncate points, the vnodes holding rows, and the held
        rows and bytes per (vnode, epoch) of every held epoch (``since`` None) or of the epochs sealed after
        ``since`` (which may include epochs some vnodes have released since: the caller filters)."""
        with self.db.atomic():
            last = self.last_sealed_epoch
            points = self.truncate_points()
            holding = {row[0] for row in self.db.execute(_HOLDING)}
            if since is None:
                rows = self.db.execute(_BACKLOG_WHOLE).fetchall()
            else:
                rows = self.db.execute(_BACKLOG_SEALED_SINCE, (since, last)).fetchall()
        return BacklogChanges(last, points, holding, rows)

    @db_errors("sum the backlog")
    def held_totals(self) -> HeldTotals:
        """Rows, bytes and epochs held above the vnodes' truncate points (sealed, not yet in committed files)."""
        row = self.db.execute(
            """
            SELECT COALESCE(SUM(sv.rows), 0), COALESCE(SUM(sv.bytes), 0), COUNT(DISTINCT sv.epoch),
                   MIN(sv.epoch), MAX(sv.epoch)
            FROM log_segment_vnodes sv LEFT JOIN log_vnodes v ON v.vnode = sv.vnode
            WHERE sv.epoch > COALESCE(v.truncated_epoch, -1)
            """
        ).fetchone()
        return HeldTotals(*row)

    @db_errors("read a held segment's schema")
    def first_segment_schema(self) -> bytes | None:
        """The serialized Arrow schema of the oldest held segment (every segment carries its schema), or None."""
        row = self.db.execute("SELECT schema_bytes FROM log_segments ORDER BY epoch, segment_id LIMIT 1").fetchone()
        return bytes(row[0]) if row is not None else None
