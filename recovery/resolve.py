"""Resolve the files a sink left pending: visible ones are committed, invisible ones dropped (their vnodes
rewind and the data is written again), partly visible partitioned ones written again and committed.

:func:`plan_recovery` only looks; :func:`apply_recovery` acts and is idempotent: a second run finds nothing
pending and no garbage. The sink runs :func:`apply_recovery` at every start; ``filesink recover`` runs both.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum

from filesink.state import PlannedFile, SinkState
from filesink.writer import FileTask, OutputLocation, clear_staging, object_keys, staging_files, write_file
from logstore import GarbageReport, LogStore


class Action(StrEnum):
    COMMIT = "commit"
    """Every object of the file is visible: mark it committed and truncate its vnodes to its end epoch."""
    REWRITE = "rewrite"
    """Some partition objects are visible, maybe not all: write the file again (the same plan gives the
    same objects), then commit it."""
    DROP = "drop"
    """Nothing is visible: drop it; its vnodes keep their truncate points and the data is written again."""


@dataclass(frozen=True)
class Resolution:
    file: PlannedFile
    visible: list[tuple[str, int]]
    action: Action


@dataclass
class RecoveryPlan:
    files: list[Resolution] = field(default_factory=list)
    staging_temp_files: int = 0
    log_garbage: GarbageReport = field(default_factory=GarbageReport)

    @property
    def empty(self) -> bool:
        g = self.log_garbage
        return not (self.files or self.staging_temp_files or g.released_segments or g.orphan_segments or g.temp_files)


def _resolution(output: OutputLocation, partitioned: bool, f: PlannedFile) -> Resolution:
    visible = object_keys(output, f.name)
    if not visible:
        return Resolution(f, visible, Action.DROP)
    return Resolution(f, visible, Action.REWRITE if partitioned else Action.COMMIT)


def plan_recovery(store: LogStore, state: SinkState, output: OutputLocation, *, partitioned: bool) -> RecoveryPlan:
    """What recovery would do now. Changes nothing."""
    return RecoveryPlan(
        files=[_resolution(output, partitioned, f) for f in state.pending()],
        staging_temp_files=len(staging_files(output)),
        log_garbage=store.preview_garbage(unsealed=True),
    )


def apply_recovery(
    store: LogStore,
    state: SinkState,
    output: OutputLocation,
    *,
    partitioned: bool,
    file_task: Callable[[PlannedFile], FileTask],
    progress: Callable[[int, int, Resolution], None] | None = None,
) -> RecoveryPlan:
    """Resolve every pending file, then remove staging temp files and the log's garbage.

    Only run while no writer of the sink can run (the caller holds the state directory's lock). Returns what
    was done. ``progress(done, total, resolution)`` is called after each file.
    """
    pending = state.pending()
    done = RecoveryPlan()
    for i, f in enumerate(pending, 1):
        r = _resolution(output, partitioned, f)
        if r.action is Action.DROP:
            state.drop(f)
        elif r.action is Action.COMMIT:
            state.commit([f], {f.name: sum(size for _, size in r.visible)}, [])
        else:
            objects = write_file(output, file_task(f))
            state.commit([f], {f.name: sum(o.size for o in objects)}, [])
        done.files.append(r)
        if progress is not None:
            progress(i, len(pending), r)
    done.staging_temp_files = clear_staging(output)
    done.log_garbage = store.collect_garbage(unsealed=True)
    return done
