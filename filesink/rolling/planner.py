"""Plan rollover at a barrier: which files to write now, each covering one writer's vnode range, and the task
that writes a planned file (:func:`file_task`).

Writers own contiguous vnode ranges (``writer_ranges``). For each writer the rollover rules look at what its
vnodes hold above their truncate points; a file covers, per vnode, ``(truncate point, end epoch]``. The plan
and the file name are functions of the state database alone, so re-planning after a crash gives the same
names for the same data.
"""

from __future__ import annotations

from collections.abc import Sequence

from logstore import LogStore

from ..committer.ledger import Ledger, PlannedFile
from ..output import file_name
from ..tasks.writer import FileTask
from .backlog import BacklogTracker
from .rollover import EpochBacklog, Rollover, choose_end_epoch


def writer_ranges(vnodes: int, parallelism: int) -> list[range]:
    """``parallelism`` contiguous vnode ranges covering ``0..vnodes-1`` (sizes differ by at most one)."""
    parallelism = max(1, min(parallelism, vnodes))
    return [range(i * vnodes // parallelism, (i + 1) * vnodes // parallelism) for i in range(parallelism)]


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


def file_task(
    store: LogStore,
    ledger: Ledger,
    f: PlannedFile,
    partition_by: Sequence[str],
    *,
    term: int,
    row_group_rows: int = 1_000_000,
    compression: str = "zstd",
    utc_timestamps: bool = False,
) -> FileTask:
    """What a writer task needs to write ``f``: its read plan over the log store and the sink's schema."""
    schema = ledger.arrow_schema()
    assert schema is not None, "files are planned only once data, and so its schema, was sealed"
    return FileTask(
        name=f.name,
        log=store.target.location,
        plan=tuple(store.plan_read(f.after(), f.end_epoch)),
        schema_bytes=schema,
        partition_by=tuple(partition_by),
        row_group_rows=row_group_rows,
        compression=compression,
        term=term,
        utc_timestamps=utc_timestamps,
    )
