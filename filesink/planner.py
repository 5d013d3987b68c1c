"""Plan rollover at a barrier: which files to write now, each covering one writer's vnode range.

Writers own contiguous vnode ranges (``writer_ranges``). For each writer the rollover rules look at what its
vnodes hold above their truncate points; a file covers, per vnode, ``(truncate point, end epoch]``. The plan
and the file name are functions of the state database alone, so re-planning after a crash gives the same
names for the same data.
"""

from __future__ import annotations

import json
import re
import zlib

from logstore import LogStore

from .backlog import BacklogTracker
from .rollover import EpochBacklog, Rollover, choose_end_epoch
from .state import PlannedFile


def writer_ranges(vnodes: int, parallelism: int) -> list[range]:
    """``parallelism`` contiguous vnode ranges covering ``0..vnodes-1`` (sizes differ by at most one)."""
    parallelism = max(1, min(parallelism, vnodes))
    return [range(i * vnodes // parallelism, (i + 1) * vnodes // parallelism) for i in range(parallelism)]


def file_name(sink_id: str, writer: range, starts: dict[int, int], end_epoch: int) -> str:
    """A name that only this data can have: sink, first and last epoch, vnode range, per-vnode starts."""
    digest = zlib.crc32(json.dumps(sorted(starts.items())).encode())
    first = min(starts.values())
    return f"part-{sink_id[:8]}-{first:020d}-{end_epoch:020d}-{writer.start:05d}-{writer.stop - 1:05d}-{digest:08x}"


def is_file_name(sink_id: str, basename: str) -> bool:
    """Whether ``basename`` is a Parquet object name that :func:`file_name` gives files of this sink."""
    pattern = rf"part-{re.escape(sink_id[:8])}-\d{{20}}-\d{{20}}-\d{{5}}-\d{{5}}-[0-9a-f]{{8}}\.parquet"
    return re.fullmatch(pattern, basename) is not None


def plan(
    store: LogStore,
    rules: Rollover,
    parallelism: int,
    *,
    now: float,
    bytes_per_log_byte: float,
    force: bool = False,
    backlog: BacklogTracker | None = None,
) -> tuple[list[PlannedFile], list[int]]:
    """The files to write now, and the vnodes that hold nothing (their truncate points can just advance).

    With ``force`` (flush), every writer with data writes a file up to the last sealed epoch. ``backlog`` keeps
    what the log store holds between calls (a sink plans at every batch); without it, it is read whole.
    """
    tracker = backlog or BacklogTracker(store)
    held_now = tracker.refresh()
    held, sealed_at, points = held_now.epochs, held_now.sealed_at, held_now.points
    writers = writer_ranges(store.vnodes, parallelism)
    files: list[PlannedFile] = []
    for writer, per_epoch in zip(writers, tracker.totals(writers), strict=True):
        if not per_epoch:
            continue
        epochs = [EpochBacklog(e, t[0], t[1], sealed_at[e]) for e, t in sorted(per_epoch.items())]
        if force:
            end, reason = epochs[-1].epoch, "flush"
        else:
            decision = choose_end_epoch(rules, epochs, now=now, bytes_per_log_byte=bytes_per_log_byte)
            if decision is None:
                continue
            end, reason = decision.end_epoch, decision.reason
        starts = {v: points[v] + 1 for v in writer if any(e <= end for e in held.get(v, {}))}
        rows = sum(r for v in starts for e, (r, _) in held[v].items() if e <= end)
        size = sum(b for v in starts for e, (_, b) in held[v].items() if e <= end)
        name = file_name(store.sink_id, writer, starts, end)
        files.append(PlannedFile(name, writer.start, writer.stop - 1, starts, end, rows, size, reason))
    return files, held_now.idle
