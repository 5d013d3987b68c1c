"""Resolve the files a sink left pending, after fencing the writers that could still be writing them.

:func:`apply_recovery`, in order (each step is safe to repeat if recovery itself dies part way):

1. take a new writer term: create its record in the durable home, only if absent, then record it in the
   ledger; from then on this run owns the sink and older runs are fenced; then bring the state database up
   to date with the durable home (:mod:`logstore.home`): files pre-committed there and then epochs sealed
   there that the database lacks (all of them when the database is new: the rebuild), and the durable
   truncate points;
2. fence older writers: rename their staging directories away (local), abort their recorded multipart
   uploads (S3); from here on no file's visibility can change behind recovery's back;
   then look for damaged log segments the sink still needs (:mod:`filesink.committer.damage`): stop with
   :class:`DamagedLogError` before any file is resolved or anything deleted, or, with ``drop_damaged``, give
   them up (:meth:`logstore.LogStore.give_up`);
3. for each pending file, check visibility (objects exist, sizes as their writer recorded) and act:
   released (every vnode truncated past its end epoch, durably: a later run committed it): forget it;
   visible: commit it and truncate its vnodes to its end epoch; not visible: drop it, so its vnodes rewind
   and the data is written again; partly visible (partitioned), or not what its writer recorded: write it
   again (same plan, same objects; a file an earlier version named, every object ``<dir>/<name>.parquet``, is
   written again with those names and directories), then commit;
4. remove garbage: staging temp files, this sink's multipart uploads still in progress under the output,
   older terms' writer records, and the log store's unsealed and released segments.

:func:`plan_recovery` only looks (steps 3 and 4 as they would be now). The sink runs :func:`apply_recovery`
at every start; ``filesink recover`` runs both.

Recovery is a client of the log store, the ledger (:mod:`filesink.committer.ledger`) and the output's owner
(:mod:`filesink.output`); it touches no table and no output file itself.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum

import pyarrow as pa

from filesink.committer.damage import damaged_error
from filesink.committer.ledger import Ledger, PlannedFile
from filesink.destination import Destination
from filesink.errors import StateBehindError
from filesink.output import (
    ObjectRecord,
    OutputGarbage,
    OutputLocation,
    check_mark,
    fence_writers,
    find_output_garbage,
    is_shared_name,
    object_keys,
    prepare_staging,
    records,
    release_staging,
    remove_output_garbage,
    write_mark,
)
from filesink.tasks.writer import FileTask, WrittenObject, write_file
from logstore import DamagedSegment, GarbageReport, GivenUp, LogStore, guards
from logstore.conditional import require_conditional_create
from logstore.failpoints import failpoint

log = logging.getLogger(__name__)


class Action(StrEnum):
    COMMIT = "commit"
    """Every object of the file is visible: mark it committed and truncate its vnodes to its end epoch."""
    REWRITE = "rewrite"
    """Some partition objects are visible but not known to be all (no writer records list them), or a
    visible object is not the size its writer recorded: write the file again (the same plan gives the same
    objects), then commit it."""
    DROP = "drop"
    """Nothing is visible: drop it; its vnodes keep their truncate points and the data is written again."""
    RELEASED = "released"
    """Every vnode of the file is truncated past its end epoch already (durably, in the home): a committed file
    holds its rows (this one, resolved by a later run than the state that lists it). Nothing to write or drop:
    its pending row goes, and no truncate point moves."""


@dataclass(frozen=True)
class Resolution:
    file: PlannedFile
    visible: list[tuple[str, int]]
    action: Action
    mismatched: list[str] = field(default_factory=list)
    """Visible keys whose size differs from the size their writer recorded."""
    held: bool | None = None
    """Whether the table holds the file (its history says so); None for the directory, where visible is listed."""


@dataclass
class RecoveryPlan:
    term: int | None = None
    """The writer term recovery took (None for a dry run)."""
    fenced: int = 0
    """Staging directories and uploads of older writer terms fenced."""
    files: list[Resolution] = field(default_factory=list)
    output_garbage: OutputGarbage = field(default_factory=OutputGarbage)
    log_garbage: GarbageReport = field(default_factory=GarbageReport)
    from_home: list[str] = field(default_factory=list)
    """Pending files the durable home recorded and the state database did not (a rebuild, or a crash)."""
    home_epochs: int = 0
    """Sealed epochs the durable home holds."""
    damaged: list[DamagedSegment] = field(default_factory=list)
    """Segments the sink still needs that are missing or damaged (found; with ``drop_damaged``, given up)."""
    given_up: list[GivenUp] = field(default_factory=list)
    """Segments this run gave up (``drop_damaged``)."""
    committed_bytes: dict[str, int] = field(default_factory=dict)
    """File name -> bytes, of the files this recovery committed (as they were, or written again)."""

    def committed_files(self) -> list[tuple[int, int]]:
        """(rows, bytes) of each file this recovery committed (a sink's metrics count them as the run's)."""
        return [
            (r.file.rows, self.committed_bytes[r.file.name]) for r in self.files if r.file.name in self.committed_bytes
        ]

    @property
    def empty(self) -> bool:
        g = self.log_garbage
        return not (
            self.files
            or self.damaged
            or not self.output_garbage.empty
            or g.released_segments
            or g.orphan_segments
            or g.temp_files
        )


Recorded = dict[str, dict[str, set[int]]]
"""Per file name, per object key, the sizes its writers recorded (all objects are recorded before any is
published, and the same plan always gives the same objects)."""


def recorded_sizes(found: list[ObjectRecord]) -> Recorded:
    sizes: Recorded = {}
    for r in found:
        if r.size is not None:
            sizes.setdefault(r.file, {}).setdefault(r.key, set()).add(r.size)
    return sizes


def resolution(
    output: OutputLocation,
    partitioned: bool,
    f: PlannedFile,
    recorded: Recorded,
    points: dict[int, int],
    held: set[str] | None = None,
) -> Resolution:
    """What to do with the pending file ``f``. ``held``: the pending files a table holds (None: the directory,
    where a file is visible when its objects are listed). A table decides alone: a file it holds is committed
    whatever is left of its objects; one it does not hold is committed (made visible first) if its objects are
    whole, written again if not, dropped if none is there."""
    visible = object_keys(output, f.name)
    in_table = None if held is None else f.name in held
    if f.starts and all(points.get(v, -1) >= f.end_epoch for v in f.starts):
        return Resolution(f, visible, Action.RELEASED, held=in_table)
    if in_table:
        return Resolution(f, visible, Action.COMMIT, held=True)
    if not visible:
        return Resolution(f, visible, Action.DROP, held=in_table)
    sizes = recorded.get(f.name, {})
    mismatched = [k for k, size in visible if k in sizes and size not in sizes[k]]
    # A partitioned file is known to be complete only if its writer's records list exactly the visible keys.
    complete = not partitioned or (bool(sizes) and set(sizes) == {k for k, _ in visible})
    action = Action.COMMIT if complete and not mismatched else Action.REWRITE
    return Resolution(f, visible, action, mismatched, held=in_table)


def _committing(resolutions: list[Resolution]) -> dict[int, int]:
    """Per vnode, the truncate point the files that recovery will commit as they are move it to."""
    points: dict[int, int] = {}
    for r in resolutions:
        if r.action is Action.COMMIT:
            f = r.file
            for v in range(f.vnode_lo, f.vnode_hi + 1):
                points[v] = max(points.get(v, f.end_epoch), f.end_epoch)
    return points


def plan_recovery(
    store: LogStore,
    ledger: Ledger,
    output: OutputLocation,
    *,
    partitioned: bool,
    verify: bool = True,
    progress: Callable[[int, int], None] | None = None,
    destination: Destination | None = None,
) -> RecoveryPlan:
    """What recovery would do now. Changes nothing (and fences nothing: visibility can still change while
    writers of the current term run). With ``verify``, every segment the sink still needs is read whole and
    checked (``damaged``; ``progress(done, total)`` after each), else only listed. ``destination``: a table's,
    asked which pending files it holds."""
    term = ledger.term() + 1
    recorded = recorded_sizes(list(records(store.storage)))
    points = store.truncate_points()
    pending = ledger.pending()
    held = destination.held(pending) if destination is not None and pending else None
    files = [resolution(output, partitioned, f, recorded, points, held) for f in pending]
    return RecoveryPlan(
        files=files,
        output_garbage=find_output_garbage(output, store.storage, store.sink_id, term),
        log_garbage=store.preview_garbage(unsealed=True),
        damaged=store.damaged(progress, quick=not verify, after=_committing(files)),
    )


def _check_behind(store: LogStore, output: OutputLocation, accept_duplicates: bool) -> dict[int, int]:
    """The output's commit mark; :class:`StateBehindError` if the state is behind it (with ``accept_duplicates``,
    logged). Reads only: the durable truncate points are the state's and the home's."""
    truncation = store.home.view().truncation
    points = {v: max(e, truncation.get(v, e)) for v, e in store.truncate_points().items()}
    where = f"the state {store.db_path} with its log store at {store.location.canonical}"
    try:
        return check_mark(output, store.sink_id, points, where)
    except StateBehindError as e:
        if not accept_duplicates:
            raise
        found = str(e).split(" Nothing was written", 1)[0]  # the rest is the refusal's advice, taken now
        log.warning("%s Going on, as accept_duplicates=True accepts: those rows are written again.", found)
        return {}


def apply_recovery(
    store: LogStore,
    ledger: Ledger,
    output: OutputLocation,
    *,
    partitioned: bool,
    file_task: Callable[[PlannedFile, int], FileTask],
    progress: Callable[[int, int, Resolution], None] | None = None,
    verify: bool = False,
    drop_damaged: bool = False,
    verify_progress: Callable[[int, int], None] | None = None,
    single_driver: bool = False,
    accept_duplicates: bool = False,
    probed: bool = False,
    destination: Destination | None = None,
) -> RecoveryPlan:
    """Fence older writers, resolve every pending file, then remove garbage; see the module docstring.

    First, the log store's location is probed for conditional create (:mod:`logstore.conditional`; not with
    ``probed``: the caller did): a store without it stops here with :class:`ConditionalCreateError`, before any
    term is taken, unless ``single_driver``. Then the state is compared with the output's commit mark
    (:mod:`filesink.output.mark`): a state behind it (restored from a backup) stops here with
    :class:`StateBehindError`, unless ``accept_duplicates``: the rows of files committed after the backup are
    then written again.

    Only run while no writer of the sink's current term can run (the caller holds the state directory's
    lock). Returns what was done, with the new writer term; ``file_task(file, term)`` builds the task that
    writes a file again. ``progress(done, total, resolution)`` is called after each file.

    With a table's ``destination``, the table alone says which pending files are committed; a file it does not
    hold whose objects are whole is added to it (once: the table's marks say whether it holds a file).

    Segments the sink still needs are checked after fencing: listed (missing, truncated), or with ``verify``
    read whole (``verify_progress(done, total)`` after each). Damage raises :class:`DamagedLogError` before any
    file is resolved or anything deleted, unless ``drop_damaged``: then the damaged segments are given up.
    """
    if not probed:  # a sink's start probes before it writes anything (ExactlyOnceParquetSink._open)
        require_conditional_create(store.storage, single_driver=single_driver)
    mark = _check_behind(store, output, accept_duplicates)
    term = ledger.new_term(str(output.local_staging()) if output.is_local else None)
    failpoint("recovery.term.after")
    done = RecoveryPlan(term=term)
    # The pending records first, the truncation after: a run fenced just now may still finish a commit (its
    # check passed before this term existed), and it records the truncation before it deletes the file's record.
    # Read in this order, a file is seen pending, or its truncation is seen: never neither.
    done.from_home = ledger.sync_pending()
    home = store.sync_from_home()
    done.home_epochs = len(home.epochs)
    failpoint("recovery.sync.after")
    done.fenced = fence_writers(output, store.storage, term) if guards.on("output.fence_older_writers") else 0
    failpoint("recovery.fence.after")
    prepare_staging(output, term)
    recorded = recorded_sizes(list(records(store.storage)))
    pending = ledger.pending()
    points = store.truncate_points()
    held = destination.held(pending) if destination is not None and pending else None
    resolutions = [resolution(output, partitioned, f, recorded, points, held) for f in pending]
    done.damaged = store.damaged(verify_progress, quick=not verify, after=_committing(resolutions))
    if done.damaged and not drop_damaged:
        store.check_term("start or recover the sink")  # segments a newer owner released are not damage
        raise damaged_error(store, done.damaged, "start or recover the sink")
    done.given_up = store.give_up(done.damaged)
    whole = [r for r in resolutions if r.action is Action.COMMIT and r.held is False]
    if whole and destination is not None:  # one table commit for them all, as their roll would have made
        found = {r.file.name: [WrittenObject(key, size, 0) for key, size in r.visible] for r in whole}
        _make_visible(store, ledger, destination, [r.file for r in whole], found)
    for i, (f, r) in enumerate(zip(pending, resolutions, strict=True), 1):
        if r.action is Action.DROP:
            ledger.drop(f, term)
        elif r.action is Action.RELEASED:
            ledger.commit([f], {}, [], term)
        elif r.action is Action.COMMIT:
            done.committed_bytes[f.name] = sum(size for _, size in r.visible)
            ledger.commit([f], {f.name: done.committed_bytes[f.name]}, [], term)
        else:
            task = file_task(f, term)
            if partitioned and any(is_shared_name(key, f.name) for key, _ in r.visible):
                task = dataclasses.replace(task, legacy_names=True)  # written by an earlier version: same keys
            objects = write_file(output, task)
            if destination is not None and r.held is False:
                _make_visible(store, ledger, destination, [f], {f.name: objects})
            done.committed_bytes[f.name] = sum(o.size for o in objects)
            ledger.commit([f], {f.name: done.committed_bytes[f.name]}, [], term)
        failpoint("recovery.resolve.after", f.name)
        done.files.append(r)
        if progress is not None:
            progress(i, len(pending), r)
    release_staging(output, term)
    done.output_garbage = find_output_garbage(output, store.storage, store.sink_id, term)
    # The records of this run's rewrites are garbage once their files are committed.
    done.output_garbage.records += list(records(store.storage, term=term))
    remove_output_garbage(output, store.storage, done.output_garbage)
    failpoint("recovery.output_garbage.after")
    done.log_garbage = store.collect_garbage(unsealed=True)
    if store.truncate_points() != mark:  # durable in the home now (the sweep recorded them): the mark follows
        write_mark(output, store.sink_id, store.truncate_points())
    return done


def _make_visible(
    store: LogStore,
    ledger: Ledger,
    destination: Destination,
    files: list[PlannedFile],
    objects: dict[str, list[WrittenObject]],
) -> None:
    """Add pending files the table does not hold to it, in one commit (the term is checked first: a newer run
    decides)."""
    schema = ledger.arrow_schema()
    assert schema is not None, "a pending file was planned after a seal with rows"
    names = ", ".join(f.name for f in files)
    store.check_term(f"commit {names} to the {destination.name}")
    failpoint("recovery.table.before", names)
    destination.make_visible(files, objects, pa.ipc.read_schema(pa.py_buffer(schema)))
