"""The rebuild: the state database brought up to date with the durable home (the epochs sealed there that it lacks,
given-up segments, truncate points ahead of it), and a new term's adoption of what the home holds."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import Any

from . import guards
from .errors import StateDivergedError
from .home import HomeView
from .segment import Block, SegmentDescriptor, VnodeRun, describe_vnodes
from .statedb import db_errors
from .storecore import NOTHING, REBUILD_NOTICE, StoreCore, _descriptors, _epoch_record, log


class Rebuild(StoreCore):
    """:meth:`sync_from_home` and what it reads of the database's epochs."""

    @db_errors("bring the state database up to date with the durable home")
    def sync_from_home(self, *, adopt: bool = True) -> HomeView:
        """Make the database hold what the durable home holds: the epochs sealed there that it lacks (a crash
        between the two, or a new database: the rebuild), and the durable truncate points where they are ahead.

        With ``adopt`` (a run that took a new term), record the last sealed epoch as the term's base and delete
        epoch records that do not count. Returns what the home held."""
        view = self.home.view()
        given_up = self.home.given_up()
        gone = {str(r["segment"]) for r in given_up}
        last = self.last_sealed_epoch
        have = set(self._held_epochs())
        # An epoch this database took from a record that a newer term's seal replaced (its segments swept as
        # unsealed, the epoch sealed again): the record that counts now replaces it.
        replaced = [r for r in view.epochs if int(r["epoch"]) in have and self._replaced(r)]
        imported = [r for r in sorted(view.epochs, key=lambda r: int(r["epoch"])) if int(r["epoch"]) > last]
        imported = sorted(replaced + imported, key=lambda r: int(r["epoch"]))
        points = self.truncate_points()
        durable = {v: max(points.get(v, NOTHING), view.truncation.get(v, NOTHING)) for v in points}
        with self.db.atomic():
            for record in replaced:
                self._forget_epoch(int(record["epoch"]))
            for record in imported:
                epoch = int(record["epoch"])
                # Segments every vnode of which was released (committed) are deleted, or will be: not imported;
                # nor are segments the operator gave up (they must never be read again).
                held = [
                    d
                    for d in _descriptors(record)
                    if d.name not in gone and any(durable.get(v, NOTHING) < epoch for v in d.vnodes)
                ]
                self._insert_epoch(epoch, held, float(record.get("sealed_at", time.time())))
            known = {r[0] for r in self.db.execute("SELECT DISTINCT segment FROM log_given_up")}
            taken = [r for r in given_up if str(r["segment"]) not in known]
            for record in taken:  # given up in the home; the database did not record it (a crash, or a rebuild)
                self._apply_given_up(record)
            if view.base is not None:
                self.db.execute("UPDATE log_store SET last_sealed_epoch = MAX(last_sealed_epoch, ?)", (view.base,))
            last = self.last_sealed_epoch
            ahead = {v: min(e, last) for v, e in view.truncation.items() if v in points and min(e, last) > points[v]}
            self.db.conn.executemany(
                "UPDATE log_vnodes SET truncated_epoch = ? WHERE vnode = ?", [(e, v) for v, e in ahead.items()]
            )
        if taken:
            log.warning(
                "%s: took %d given-up segments from the durable home into %s (%s): they are never read again",
                self._where,
                len(taken),
                self._db_named,
                ", ".join(str(r["segment"]) for r in taken),
            )
        if imported:
            log.warning(
                "%s: took %d sealed epochs (%d to %d) from the durable home into %s",
                self._where,
                len(imported),
                int(imported[0]["epoch"]),
                int(imported[-1]["epoch"]),
                self._db_named,
                extra={REBUILD_NOTICE: True} if self.rebuilt else None,
            )
        if adopt and self.term is not None:
            counted = {int(r["epoch"]) for r in view.epochs}
            uncounted = [e for e in self._held_epochs() if e not in counted]
            if view.term is not None:
                # A run read the home and recorded its base: every epoch this database sealed (or took from the
                # home) in time has a record that counts, unless pruned once every vnode was durably truncated
                # past it. Any other held epoch was sealed, or adopted, by a run that no longer owned the sink;
                # its record may be gone already (deleted as stale by the newer run, its segments swept).
                floor = min((view.truncation.get(v, NOTHING) for v in self.truncate_points()), default=NOTHING)
                diverged = [e for e in uncounted if e > floor]
                if diverged and guards.on("start.diverged_state"):
                    raise StateDivergedError(
                        f"the state database {self.db_path} holds sealed epochs {describe_vnodes(diverged)} that "
                        f"the durable home at {self.location.canonical} does not count: a newer run (term "
                        f"{view.term}) read the home before this state took them, so a run that no longer owned "
                        "the sink sealed or adopted them. Nothing was changed. Move this state directory away and "
                        "start the sink with an empty one: it is rebuilt from the durable home, and the query's "
                        "checkpoint tells whether those batches run again."
                    )
            else:  # no run recorded a base: epochs sealed before the sink had a durable home, made durable now
                for epoch in uncounted:
                    self.home.write_epoch(epoch, self.term, _epoch_record(*self._epoch_rows(epoch)))
            self.home.record_base(self.term, last)
            if guards.on("start.term_before_clean"):
                self.check_term("clean the durable home")  # a fenced run deletes nothing a newer one may be reading
            self.home.delete_records(view.stale_records)
            self.home.prune_terms(keep_from=self.term)
            self.home.compact_truncation(self.term, self.truncate_points())
            self._published_points = self.truncate_points()
        return view

    def _replaced(self, record: Mapping[str, Any]) -> bool:
        """Whether the database holds segments of the record's epoch that the record does not name."""
        names = {d.name for d in _descriptors(record)}
        return any(name not in names for name in self.segments(int(record["epoch"])))

    def _forget_epoch(self, epoch: int) -> None:
        self.db.execute(
            "DELETE FROM log_segment_vnodes WHERE segment_id IN (SELECT segment_id FROM log_segments WHERE epoch = ?)",
            (epoch,),
        )
        self.db.execute("DELETE FROM log_segments WHERE epoch = ?", (epoch,))
        self.db.execute("DELETE FROM log_epochs WHERE epoch = ?", (epoch,))

    def _epoch_rows(self, epoch: int) -> tuple[list[SegmentDescriptor], float]:
        """What the database holds of a sealed epoch, as descriptors (the inverse of :meth:`_insert_epoch`)."""
        sealed_at = self.db.execute("SELECT sealed_at FROM log_epochs WHERE epoch = ?", (epoch,)).fetchone()[0]
        descs = []
        for segment_id, name, size, schema_block, schema_bytes in self.db.execute(
            "SELECT segment_id, name, size, schema_block, schema_bytes FROM log_segments WHERE epoch = ? ORDER BY name",
            (epoch,),
        ).fetchall():
            runs = tuple(
                VnodeRun(vnode, tuple(map(Block.from_json, json.loads(blocks))))
                for vnode, blocks in self.db.execute(
                    "SELECT vnode, blocks FROM log_segment_vnodes WHERE segment_id = ? ORDER BY vnode", (segment_id,)
                )
            )
            block = Block.from_json(json.loads(schema_block))
            descs.append(SegmentDescriptor(name, epoch, size, block, bytes(schema_bytes), runs, self.sink_id))
        return descs, float(sealed_at)
