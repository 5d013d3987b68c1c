"""Truncation: the truncate points move forward per vnode (one transaction), and are made durable in the home."""

from __future__ import annotations

from collections.abc import Mapping

from . import guards
from .errors import EpochNotSealedError, TruncateOrderError
from .failpoints import failpoint
from .statedb import db_errors
from .storecore import StoreCore


class Truncation(StoreCore):
    """Releasing epochs per vnode, and publishing the truncate points to the durable home."""

    @db_errors("truncate")
    def truncate(self, points: Mapping[int, int]) -> None:
        """Release, per vnode, every epoch up to and including the given one (one transaction)."""
        with self.db.atomic():
            last = self.last_sealed_epoch
            current = self.truncate_points()
            for vnode, epoch in points.items():
                if vnode not in current:
                    raise ValueError(f"truncate: vnode {vnode} is outside 0..{self.vnodes - 1}")
                if epoch > last:
                    raise EpochNotSealedError(
                        f"cannot truncate vnode {vnode} to epoch {epoch}: the last sealed epoch of "
                        f"{self._where} is {last}"
                    )
                if epoch < current[vnode]:
                    raise TruncateOrderError(
                        f"cannot truncate vnode {vnode} to epoch {epoch}: it is already truncated to epoch "
                        f"{current[vnode]}, and truncate points only move forward"
                    )
            self.db.conn.executemany(
                "UPDATE log_vnodes SET truncated_epoch = ? WHERE vnode = ?",
                [(epoch, vnode) for vnode, epoch in points.items()],
            )
            failpoint("logstore.truncate.before_commit")

    def publish_truncation(self) -> None:
        """Make the database's truncate points durable in the home (term-checked), if they moved since."""
        if self.readonly:
            return
        points = self.truncate_points()
        if points == self._published_points:
            return
        if guards.on("truncation.term"):
            self.check_term("record truncate points")
        self.home.write_truncation(self.term or 0, points)
        self._published_points = points
