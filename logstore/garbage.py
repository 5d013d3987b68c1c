"""Garbage collection: the segments every vnode truncated past, orphan and temp files found by a sweep of the
log store, and the home's epoch records no vnode needs; a preview that removes nothing."""

from __future__ import annotations

import re
from dataclasses import dataclass

from . import guards, segment
from .failpoints import failpoint
from .statedb import db_errors
from .truncation import Truncation

_WRITER_TERM = re.compile(r"^t(\d+)-")
"""Segment names of a sink's appends start with ``t<writer term>-`` (see :meth:`LogStore.writer_id`)."""


@dataclass
class GarbageReport:
    """What :meth:`LogStore.collect_garbage` removed."""

    released_segments: int = 0
    """Sealed segments every vnode has truncated past."""
    orphan_segments: int = 0
    """Segment files no sealed epoch names (failed or duplicate task attempts, crashes before seal)."""
    temp_files: int = 0
    bytes_freed: int = 0
    epochs_pruned: int = 0


class Garbage(Truncation):
    """Deleting what no vnode needs any more (the sweep publishes the truncate points first: :class:`Truncation`)."""

    @db_errors("collect garbage")
    def collect_garbage(self, *, sweep: bool = True, unsealed: bool = False) -> GarbageReport:
        """Delete segments no vnode needs any more, and prune their metadata.

        - Released segments (every vnode in them truncated past their epoch) lose their metadata in one
          transaction, then their files.
        - With ``sweep``, the log store is listed and files that no sealed epoch names are deleted: temp
          files and orphan segments of epochs up to the last sealed one.
        - With ``unsealed`` as well, files of epochs above the last sealed one are deleted too. Only do this
          when no append can be running (at start-up, before the query runs): those files may belong to the
          epoch being appended right now.
        """
        report = GarbageReport()
        if sweep:
            self.publish_truncation()
        with self.db.atomic():
            released = self.db.execute(
                """
                SELECT s.segment_id, s.name, s.size FROM log_segments s
                WHERE NOT EXISTS (
                    SELECT 1 FROM log_segment_vnodes sv JOIN log_vnodes v ON v.vnode = sv.vnode
                    WHERE sv.segment_id = s.segment_id AND sv.epoch > v.truncated_epoch)
                """
            ).fetchall()
            self.db.conn.executemany("DELETE FROM log_segments WHERE segment_id = ?", [(r[0],) for r in released])
            cursor = self.db.execute(
                """
                DELETE FROM log_epochs
                WHERE epoch <= (SELECT MIN(truncated_epoch) FROM log_vnodes)
                  AND NOT EXISTS (SELECT 1 FROM log_segments s WHERE s.epoch = log_epochs.epoch)
                """
            )
            report.epochs_pruned = cursor.rowcount
        failpoint("logstore.gc.after_metadata")
        if released and guards.on("gc.term"):
            self.check_term("delete released segments")
        self.storage.delete_many([name for _, name, _ in released])
        report.released_segments += len(released)
        report.bytes_freed += sum(size for _, _, size in released)
        if sweep:
            self.check_claim()
            if guards.on("gc.term"):
                self.check_term("sweep the log store")
            self._sweep(report, unsealed=unsealed)
            self._prune_home()
        return report

    @db_errors("look for garbage")
    def preview_garbage(self, *, unsealed: bool = True) -> GarbageReport:
        """What :meth:`collect_garbage` (with ``sweep``) would remove now, without removing anything."""
        report = GarbageReport()
        for (size,) in self.db.execute(
            """
            SELECT s.size FROM log_segments s
            WHERE NOT EXISTS (
                SELECT 1 FROM log_segment_vnodes sv JOIN log_vnodes v ON v.vnode = sv.vnode
                WHERE sv.segment_id = s.segment_id AND sv.epoch > v.truncated_epoch)
            """
        ):
            report.released_segments += 1
            report.bytes_freed += size
        self._sweep(report, unsealed=unsealed, delete=False)
        return report

    def _sweep(self, report: GarbageReport, *, unsealed: bool, delete: bool = True) -> None:
        last = self.last_sealed_epoch
        known = {r[0] for r in self.db.execute("SELECT name FROM log_segments")}
        for relpath, size in list(self.storage.list_files()):
            parsed = segment.parse_name(relpath)
            if parsed is None or relpath in known:
                continue  # not ours to delete, or sealed and still needed
            epoch, is_temp = parsed
            if epoch > last and not unsealed:
                continue  # may belong to an append in progress
            found = _WRITER_TERM.match(relpath.rsplit("/", 1)[-1].lstrip("."))
            if found and self.term is not None and int(found.group(1)) > self.term:
                continue  # a newer run's (this run is fenced and finds out at its next step)
            if not delete or self.storage.delete(relpath):
                report.bytes_freed += size
                if is_temp:
                    report.temp_files += 1
                else:
                    report.orphan_segments += 1
        if delete:
            self.storage.remove_empty_dirs(None if unsealed else last)

    def _prune_home(self) -> None:
        """Delete epoch records every vnode has truncated past (durably), except the last sealed epoch's."""
        points = self._published_points
        if not points:
            return
        floor, last = min(points.values()), self.last_sealed_epoch
        self.home.delete_records(p for e, p in self.home.epoch_records() if e <= floor and e < last)
