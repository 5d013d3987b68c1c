"""Damaged segments: the held segments the sink still needs that are missing or do not match their seal records,
the stricter whole-file check, and giving them up for good (recorded in the home first)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, NamedTuple

from . import segment
from .errors import FencedError, SegmentCorruptError, SegmentError, SegmentMissingError
from .failpoints import failpoint
from .home import given_up_path
from .segment import Block, describe_vnodes
from .statedb import db_errors
from .storecore import NOTHING, StoreCore, log


class DamagedSegment(NamedTuple):
    """A held segment file that is missing or does not match its seal record."""

    name: str
    epoch: int
    vnodes: list[int]
    """The vnodes the sink still needs the segment for (above their truncate points): their data of this epoch
    in it cannot be read."""
    error: SegmentError
    rows: int = 0
    """The rows the segment holds for those vnodes."""


class GivenUp(NamedTuple):
    """A damaged segment the operator gave up (:meth:`LogStore.give_up`): its rows of ``vnodes`` for ``epoch``
    are not written to the output."""

    segment: str
    epoch: int
    vnodes: list[int]
    rows: int
    problem: str
    term: int
    given_up_at: float

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> GivenUp:
        pairs = [(int(v), int(n)) for v, n in record.get("vnodes", [])]
        return cls(
            str(record["segment"]),
            int(record["epoch"]),
            [v for v, _ in pairs],
            sum(n for _, n in pairs),
            str(record.get("problem", "")),
            int(record.get("term", 0)),
            float(record.get("given_up_at", 0.0)),
        )


class Damaged(StoreCore):
    """Finding damaged segments (:meth:`damaged`, :meth:`verify`) and giving them up (:meth:`give_up`)."""

    def _describe_segment(self, segment_id: int, name: str, epoch: int) -> Callable[[], str]:
        def describe() -> str:
            vnodes = [
                r[0]
                for r in self.db.execute(
                    "SELECT vnode FROM log_segment_vnodes WHERE segment_id = ? ORDER BY vnode", (segment_id,)
                )
            ]
            return f"{self.storage.display(name)} (epoch {epoch}, vnodes {describe_vnodes(vnodes)})"

        return describe

    @db_errors("verify the held segments")
    def damaged(
        self,
        progress: Callable[[int, int], None] | None = None,
        *,
        quick: bool = False,
        after: Mapping[int, int] | None = None,
        up_to: int | None = None,
    ) -> list[DamagedSegment]:
        """The held segments the sink still needs that are missing or do not match their seal records.

        A segment is needed for the vnodes whose truncate point (or ``after[vnode]``, where that is higher: say,
        the end epoch of a pending file about to be committed) is below its epoch; a segment needed for none is
        not checked (garbage collection deletes it). Each segment is read whole, and its size and the CRC-32 of
        every block of those vnodes checked against the seal's records: what a read checks (a damaged footer
        stops nothing; :meth:`verify` finds it). With ``quick`` the log store is only listed and names and sizes
        compared (that finds missing and truncated files, not changed bytes). ``up_to`` limits the check to
        segments of epochs up to it. ``progress(done, total)`` is called after each segment checked.
        """
        points = self.truncate_points()
        for vnode, epoch in (after or {}).items():
            points[vnode] = max(points.get(vnode, NOTHING), epoch)
        candidates = self.db.execute(
            """
            SELECT s.segment_id, s.name, s.epoch, s.size FROM log_segments s
            WHERE s.epoch <= ? AND EXISTS (
                SELECT 1 FROM log_segment_vnodes sv JOIN log_vnodes v ON v.vnode = sv.vnode
                WHERE sv.segment_id = s.segment_id AND sv.epoch > v.truncated_epoch)
            ORDER BY s.epoch, s.name
            """,
            (self.last_sealed_epoch if up_to is None else up_to,),
        ).fetchall()

        def needed(segment_id: int) -> list[tuple[int, int]]:
            """The segment's (vnode, rows) for the vnodes that still need it."""
            return [
                (vnode, rows)
                for vnode, epoch, rows in self.db.execute(
                    "SELECT vnode, epoch, rows FROM log_segment_vnodes WHERE segment_id = ? ORDER BY vnode",
                    (segment_id,),
                )
                if epoch > points.get(vnode, NOTHING)
            ]

        segments = [row for row in candidates if needed(row[0])] if after else candidates
        present = dict(self.storage.list_files()) if quick and segments else {}
        found: list[DamagedSegment] = []
        for i, (segment_id, name, epoch, size) in enumerate(segments, 1):
            where = self._describe_segment(segment_id, name, epoch)
            problem: SegmentError | None = None
            if quick:
                if name not in present:
                    problem = SegmentMissingError(f"{where()}: the segment file of a sealed epoch is missing")
                elif present[name] != size:
                    problem = SegmentCorruptError(f"{where()}: {present[name]} bytes, sealed with {size}")
            else:
                try:
                    data = self.storage.read_all(name)
                except FileNotFoundError:
                    problem = SegmentMissingError(f"{where()}: the segment file of a sealed epoch is missing")
                else:
                    problem = self._block_problem(segment_id, data, size, points, where)
            if problem is not None:
                vnode_rows = needed(segment_id)
                found.append(
                    DamagedSegment(name, epoch, [v for v, _ in vnode_rows], problem, sum(n for _, n in vnode_rows))
                )
            if progress is not None:
                progress(i, len(segments))
        return found

    def _block_problem(
        self, segment_id: int, data: bytes, size: int, points: Mapping[int, int], where: Callable[[], str]
    ) -> SegmentError | None:
        """What keeps the blocks of a segment's needed vnodes (as its seal recorded them: reads never use the
        file's own footer) from being read back from ``data``, or None."""
        if len(data) != size:
            return SegmentCorruptError(f"{where()}: {len(data)} bytes, sealed with {size}")
        for vnode, epoch, blocks in self.db.execute(
            "SELECT vnode, epoch, blocks FROM log_segment_vnodes WHERE segment_id = ? ORDER BY vnode", (segment_id,)
        ):
            if epoch <= points.get(vnode, NOTHING):
                continue
            for block in map(Block.from_json, json.loads(blocks)):
                problem = segment.block_problem(data[block.offset : block.offset + block.length], block)
                if problem:
                    return SegmentCorruptError(f"{where()}: vnode {vnode}: {problem}")
        return None

    @db_errors("verify the held segments")
    def verify(self) -> list[SegmentError]:
        """Read every held segment file whole and check all of it (magic, footer, every block) against its seal
        record; return the problems. Stricter than :meth:`damaged`, which checks only what the sink reads."""
        problems: list[SegmentError] = []
        for segment_id, name, epoch, size in self.db.execute(
            "SELECT segment_id, name, epoch, size FROM log_segments ORDER BY epoch, name"
        ).fetchall():
            where = self._describe_segment(segment_id, name, epoch)
            try:
                data = self.storage.read_all(name)
            except FileNotFoundError:
                problems.append(SegmentMissingError(f"{where()}: the segment file of a sealed epoch is missing"))
                continue
            try:
                if len(data) != size:
                    raise SegmentCorruptError(f"{where()}: {len(data)} bytes, sealed with {size}")
                segment.parse_file(data, where=where())
            except SegmentCorruptError as e:
                problems.append(e)
            except (ValueError, KeyError, TypeError) as e:  # a footer that parses but is not one of ours
                problems.append(SegmentCorruptError(f"{where()}: unreadable footer ({e})"))
        return problems

    @db_errors("give up damaged segments")
    def give_up(self, damaged: Iterable[DamagedSegment]) -> list[GivenUp]:
        """Give up damaged segments for good: their rows of the vnodes they were still needed for are never read
        (nor written to the output); every other row is kept.

        The record of each is made durable in the home first (``home/given_up/``: a rebuild never takes the
        segment again), then one transaction records it in ``log_given_up`` and removes the segment from the
        sealed epoch (so no read plan names it; the file, if any, is garbage for the next sweep). Each step is
        safe to repeat: a run killed part way is finished by the next start (:meth:`sync_from_home` applies
        what the home records). Term-checked like a seal."""
        damaged = list(damaged)
        if not damaged:
            return []
        action = f"give up {len(damaged)} damaged log segments"
        self.check_term(action)
        now = time.time()
        records = []
        for d in damaged:
            rows = dict(
                self.db.execute(
                    "SELECT sv.vnode, sv.rows FROM log_segment_vnodes sv JOIN log_segments s "
                    "ON s.segment_id = sv.segment_id WHERE s.name = ?",
                    (d.name,),
                ).fetchall()
            )
            records.append(
                {
                    "segment": d.name,
                    "epoch": d.epoch,
                    "vnodes": [[v, int(rows.get(v, 0))] for v in d.vnodes],
                    "problem": str(d.error),
                    "term": self.term or 0,
                    "given_up_at": now,
                }
            )
        for record in records:
            self.home.write_given_up(record)
        failpoint("logstore.give_up.home_written")
        try:
            self.check_term(action)
        except FencedError:  # a newer run owns the sink: this run's decision does not take effect
            for d in damaged:
                self.home.delete(given_up_path(d.epoch, d.name))
            raise
        with self.db.atomic():
            for record in records:
                self._apply_given_up(record)
            failpoint("logstore.give_up.before_commit")
        given = [GivenUp.from_record(r) for r in records]
        for g in given:
            log.warning(
                "%s: gave up the damaged segment %s (epoch %d): its %d rows of vnodes %s are not written to the "
                "output (%s)",
                self._where,
                self.storage.display(g.segment),
                g.epoch,
                g.rows,
                describe_vnodes(g.vnodes),
                g.problem,
            )
        return given

    @db_errors("list the given-up segments")
    def given_up(self) -> list[GivenUp]:
        """Every segment given up so far: what the state database records, and what the durable home records
        that it does not yet (a run killed between the two; the next start takes it)."""
        found: dict[str, GivenUp] = {}
        if "log_given_up" in self.db.table_names():
            for segment_name, epoch, vnode, rows, problem, term, at in self.db.execute(
                "SELECT segment, epoch, vnode, rows, problem, term, given_up_at FROM log_given_up "
                "ORDER BY epoch, segment, vnode"
            ):
                g = found.get(segment_name)
                if g is None:
                    found[segment_name] = GivenUp(segment_name, epoch, [vnode], rows, problem, term, at)
                else:
                    found[segment_name] = g._replace(vnodes=[*g.vnodes, vnode], rows=g.rows + rows)
        for record in self.home.given_up():
            g = GivenUp.from_record(record)
            found.setdefault(g.segment, g)
        return sorted(found.values(), key=lambda g: (g.epoch, g.segment))
