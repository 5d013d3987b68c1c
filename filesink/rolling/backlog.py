"""What the log store holds above its truncate points, per vnode and epoch: the planner's input, kept in
memory and brought up to date at each plan by reading only what changed.

Reading the whole backlog from the state database costs about 1 µs per held (vnode, epoch, segment) row: with
the default 300-second age rule at 1-second triggers, 256 vnodes and two append tasks per batch, 153,600 rows
and about 170 ms at every batch (``tests/benchmarks/bench_planner.py``). What can change between two plans of
a running sink is little, and of two kinds only, because the sink holds the state directory's lock and sealed
epochs never change:

- epochs sealed since the last plan: read through their segments (:meth:`logstore.LogStore.backlog_changes`);
- truncate points, which only move forward (one row per vnode): what they released is dropped from memory.

Which vnodes hold nothing (the planner's idle vnodes, whose truncate points a commit advances to the last
sealed epoch) is not taken from memory: it is read from the log store at every plan, one index seek per vnode,
because a mistake there would release rows that no file holds. It also checks the memory: if the vnodes that
hold rows differ from those the memory has, the memory is dropped and read again whole (and a warning logged).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from logstore import LogStore

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Held:
    """The backlog at one moment. Read it, do not change it: the dictionaries are the tracker's own."""

    epochs: dict[int, dict[int, tuple[int, int]]]
    """vnode -> epoch -> (rows, log bytes), for every vnode that holds rows above its truncate point."""
    sealed_at: dict[int, float]
    """epoch -> when it was sealed (Unix seconds), for at least every epoch in ``epochs``."""
    points: dict[int, int]
    """vnode -> truncate point, for every vnode."""
    idle: list[int]
    """Vnodes that hold nothing above their truncate points (read from the log store, not from memory)."""


class BacklogTracker:
    """Keeps the backlog of one open log store, for a sink that holds its lock (see the module docstring), and
    its sums per writer and epoch, which the rollover rules look at."""

    def __init__(self, store: LogStore) -> None:
        self._store = store
        self._epochs: dict[int, dict[int, tuple[int, int]]] = {}
        self._sealed_at: dict[int, float] = {}
        self._points: dict[int, int] = {}
        self._loaded: int | None = None  # the last sealed epoch read into memory
        self._writers: list[range] | None = None  # the writer ranges of _totals
        self._writer_of: list[int] = []  # vnode -> index of its writer range
        self._totals: list[dict[int, list[int]]] = []  # per writer: epoch -> [rows, log bytes, vnodes]

    def refresh(self, *, check: bool = True) -> Held:
        """Bring the memory up to date with the log store and return it."""
        store = self._store
        last, points, holding, rows = store.backlog_changes(self._loaded)  # one consistent view
        if self._loaded is None:
            self._epochs, self._sealed_at, self._points, self._writers = {}, {}, {}, None
        self._add(rows, points)
        self._release(points)
        self._loaded = last
        if check and set(self._epochs) != holding:
            log.warning(
                "the in-memory backlog of %s disagrees with the log store (vnodes %s in memory only, %s in the "
                "store only); reading it again whole",
                store.location.canonical,
                sorted(set(self._epochs) - holding)[:8],
                sorted(holding - set(self._epochs))[:8],
            )
            self._loaded = None
            return self.refresh(check=False)  # read whole in one transaction, it agrees by construction
        return Held(self._epochs, self._sealed_at, points, sorted(set(points) - holding))

    def totals(self, writers: list[range]) -> list[dict[int, list[int]]]:
        """Per writer range, ``epoch -> [rows, log bytes, vnodes holding rows]`` of what it holds, as of the last
        :meth:`refresh`. Kept up to date from then on; computed again when the ranges change (a rescale)."""
        if writers != self._writers:
            self._writer_of = [0] * self._store.vnodes
            for index, writer in enumerate(writers):
                for vnode in writer:
                    self._writer_of[vnode] = index
            self._totals = [{} for _ in writers]
            self._writers = writers
            for vnode, epochs in self._epochs.items():
                for epoch, (count, size) in epochs.items():
                    self._count(vnode, epoch, count, size, 1)
        return self._totals

    def _count(self, vnode: int, epoch: int, count: int, size: int, sign: int) -> None:
        if self._writers is None:
            return
        per_epoch = self._totals[self._writer_of[vnode]]
        total = per_epoch.setdefault(epoch, [0, 0, 0])
        total[0] += sign * count
        total[1] += sign * size
        total[2] += sign
        if total[2] == 0:
            del per_epoch[epoch]

    def _add(self, rows: list[tuple[int, int, int, int, float]], points: dict[int, int]) -> None:
        for vnode, epoch, count, size, sealed_at in rows:
            if epoch > points[vnode]:
                epochs = self._epochs.setdefault(vnode, {})
                if epoch in epochs:  # not expected (sealed epochs are read once); keep the sums right anyway
                    self._count(vnode, epoch, *epochs[epoch], -1)
                epochs[epoch] = (count, size)
                self._count(vnode, epoch, count, size, 1)
                self._sealed_at[epoch] = sealed_at

    def _release(self, points: dict[int, int]) -> None:
        """Drop what truncate points that moved since the last refresh released."""
        moved = [v for v, p in points.items() if self._points.get(v) != p]
        for vnode in moved:
            epochs = self._epochs.get(vnode)
            if epochs:
                for epoch in [e for e in epochs if e <= points[vnode]]:
                    self._count(vnode, epoch, *epochs.pop(epoch), -1)
                if not epochs:
                    del self._epochs[vnode]
        if moved and self._sealed_at:
            floor = min(points.values())
            if min(self._sealed_at) <= floor:
                self._sealed_at = {e: at for e, at in self._sealed_at.items() if e > floor}
        self._points = points

    def summary(self) -> tuple[int, int, int, float | None]:
        """Rows, log bytes and epochs held, and when the oldest held epoch was sealed (None when nothing is held),
        as of the last :meth:`refresh`: summed over the per-writer totals the planner keeps (writers times epochs
        held), or over every (vnode, epoch) before the first plan."""
        rows = size = 0
        epochs: set[int] = set()
        if self._writers is not None:
            for per_epoch in self._totals:
                for epoch, (count, length, _) in per_epoch.items():
                    rows, size = rows + count, size + length
                    epochs.add(epoch)
        else:
            for per_vnode in self._epochs.values():
                for epoch, (count, length) in per_vnode.items():
                    rows, size = rows + count, size + length
                    epochs.add(epoch)
        oldest = self._sealed_at.get(min(epochs)) if epochs else None
        return rows, size, len(epochs), oldest
