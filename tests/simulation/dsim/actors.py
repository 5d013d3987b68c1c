"""The actors: drivers (a sink over a state directory, running batches from the shared checkpoint) and
``recover apply`` (from the log store alone). They call the real start-up, batch, roll and recovery code; only
Spark (the append's job, the write's tasks) and the output are modelled.

A driver's life is one process: start-up (``ExactlyOnceParquetSink._open`` without the state directory's lock
and the output's claim: the probe of conditional create, the log store, the ledger, the recorded configuration,
``_recover``), then batches from
the checkpoint on, each as ``__call__`` runs it (``_check_batch``, append and seal, ``_roll``), the checkpoint
advancing past a batch only once its call returned; at the end maybe ``flush()`` and ``close()``. A process that
is killed loses its memory; its state directory stays, unless the scenario loses it or restores an old backup.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import recovery.cli
from filesink.committer.ledger import Ledger, PlannedFile
from filesink.destination import DirectoryDestination, TableOptions
from filesink.errors import FileSinkError
from filesink.metrics.figures import MetricsBook
from filesink.rolling.backlog import BacklogTracker
from filesink.rolling.planner import file_task
from filesink.rolling.rollover import Rollover
from filesink.sink.description import SinkDescription
from filesink.sink.face import ExactlyOnceParquetSink, SinkStats
from logstore import LogStore, SegmentDescriptor, append_segment
from logstore.conditional import require_conditional_create
from logstore.errors import LogStoreError, SegmentError
from recovery.errors import NotASinkError
from recovery.resolve import apply_recovery

from .scheduler import Actor, Crash
from .world import INSIDE, ConcurrentQueryError, StateDisk, World

REFUSALS = (LogStoreError, FileSinkError, OSError, ConcurrentQueryError)
"""What a run may stop with: the product's errors (and Spark's), each saying what went wrong. Anything else
(an assertion, a ``TypeError``) fails the simulation."""
SCHEMA = json.dumps([["batch", "bigint"], ["i", "bigint"]])


@dataclass(frozen=True)
class Habits:
    """How a driver lives, drawn from the seed."""

    lives: int = 1
    """Processes, one after the other (each after the previous one ended or was killed)."""
    batches_per_life: int = 100
    lose_state: float = 0.0
    """Chance that a new process finds its state directory empty (lost with the machine)."""
    restore_backup: float = 0.0
    """Chance that a new process starts on an earlier copy of its state directory."""
    take_backup: float = 0.0
    """Chance that a copy of the state directory is kept as it is when a process starts."""
    flush: float = 0.0
    close: float = 0.5
    restart_steps: int = 40
    """Longest wait before a new process starts."""
    skews: tuple[float, ...] = (0.0,)
    """How far the driver's clock may be ahead of the true time (negative: behind), in seconds: one is drawn for
    each process, and again when the clock jumps."""
    jump: float = 0.0
    """Chance, before each batch, that the clock jumps (to another of :attr:`skews`)."""


class Driver:
    def __init__(
        self,
        world: World,
        name: str,
        *,
        parallelism: int,
        rollover: Rollover,
        habits: Habits,
        disk: StateDisk,
        single_driver: bool = False,
    ) -> None:
        self.world = world
        self.single_driver = single_driver
        """The sink's ``single_driver`` option: go on where the store has no conditional create."""
        self.name = name
        self.parallelism = parallelism
        self.rollover = rollover
        self.habits = habits
        self.disk = disk
        self.backups: list[tuple[StateDisk, dict[str, bytes] | None]] = []
        """Copies of the state directory: its database, and the log store's files where it lives inside it."""
        self.store: LogStore | None = None
        """The log store of the running process (its term: the run's)."""

    # -- one process -------------------------------------------------------------------------------------

    def open(self) -> ExactlyOnceParquetSink:
        """Start-up, as ``ExactlyOnceParquetSink._open`` does it (the state directory's lock and the output's claim
        aside: a state directory has one process at a time here, and the output is the model)."""
        world = self.world
        self.store = None
        # As _open: the probe of conditional create before anything of the sink is written.
        require_conditional_create(world.location.open(), single_driver=self.single_driver)
        store = self.store = LogStore(self.disk.open(), world.location, vnodes=world.vnodes)
        ledger = Ledger(store)
        ledger.check_config(world.output.url, None, [])
        sink = SimSink.__new__(SimSink)
        sink._description = SinkDescription(
            path=world.output.url,
            state_dir=f"/simulated/{self.name}",
            log_store=world.location.url,
            key_columns=None,
            vnodes=world.vnodes,
            parallelism=self.parallelism,
            partition_by=(),
            rollover=self.rollover,
            storage_options={},
            row_group_rows=1000,
            compression="zstd",
            accept_state_loss=False,
            **self.options(),
        )
        sink._describe()
        vars(sink).update(
            _is_open=True,
            _sample=None,
            _row_group_rows=1000,
            _compression="zstd",
            _accept_state_loss=False,
            _lock=threading.RLock(),
            _state_lock=SimpleNamespace(release=lambda: None),
            _output=world.output,
            _destination=DirectoryDestination(
                TableOptions(), output=world.output, sink_id=store.sink_id, partition_by=()
            ),
            _store=store,
            _ledger=ledger,
            _epochs_since_sweep=world.scheduler.rng.randrange(20),
            _term=0,
            recovered=None,
            _stop=threading.Event(),
            _timer=None,
            _timer_error=None,
            _take_over_from=None,
            _accept_duplicates=False,
            _created_claim=False,
            _metrics=MetricsBook(),
            _metrics_server=None,
        )
        sink._recover()
        sink.stats = SinkStats(last_epoch=store.last_sealed_epoch)
        sink._backlog = BacklogTracker(store)
        return sink

    def options(self) -> dict[str, Any]:
        """Options of the sink that versions before them do not have (given only when set)."""
        return {"single_driver": True} if self.single_driver else {}

    def call(self, sink: ExactlyOnceParquetSink, batch: int) -> None:
        """``foreachBatch``: one batch, as ``ExactlyOnceParquetSink.__call__`` runs it (Spark's jobs aside)."""
        with sink._lock:
            sink._check_usable()
            last = sink._check_batch(batch)
            if batch > last:
                if sink._ledger.spark_schema() is None:
                    sink._ledger.record_schema(SCHEMA, None)
                sink._store.seal(batch, self.append(sink._store, batch))
            sink._roll(force=False)

    def append(self, store: LogStore, batch: int) -> list[SegmentDescriptor | None]:
        """The append job: one or two tasks, each writing one segment of its share of the batch's rows."""
        table = self.world.table(batch)
        rng = self.world.scheduler.rng
        cut = rng.randint(0, table.num_rows) if rng.random() < 0.5 else table.num_rows
        parts = [p for p in (table.slice(0, cut), table.slice(cut)) if p.num_rows] or [table]
        return [
            append_segment(store.target, batch, part, writer_id=store.writer_id(f"p{k}-a0"))
            for k, part in enumerate(parts)
        ]

    def life(self, batches: int, *, flush: bool, close: bool) -> None:
        world = self.world
        s, actor = world.scheduler, world.scheduler.current()
        sink = self.open()
        batch = world.checkpoint.next_batch()
        for _ in range(batches):
            if batch >= len(world.sizes):
                break
            if actor is not None and self.habits.jump and s.choice(self.habits.jump):
                actor.skew = s.rng.choice(self.habits.skews)
                s.note(f"the clock jumps: {actor.skew:+g} s from the true time")
            self.call(sink, batch)
            world.outcome.returned.add(batch)
            world.checkpoint.commit(batch)
            batch += 1
        if flush:
            sink.flush()
        if close:
            sink.close()

    # -- the actor -----------------------------------------------------------------------------------------

    def body(self, actor: Actor) -> None:
        s, h = self.world.scheduler, self.habits
        for life in range(h.lives):
            if life:
                s.sleep(s.rng.randint(0, h.restart_steps), "restarts")
            if len(h.skews) > 1 or h.skews[0]:
                actor.skew = s.rng.choice(h.skews)
                s.note(f"clock {actor.skew:+g} s from the true time")
            self.choose_state()
            self.survive(
                actor,
                lambda: self.life(
                    s.rng.randint(1, h.batches_per_life), flush=s.choice(h.flush), close=s.choice(h.close)
                ),
            )

    def choose_state(self) -> None:
        s, h = self.world.scheduler, self.habits
        inside = self.world.setup == INSIDE
        if s.choice(h.take_backup):
            self.backups.append((self.disk.backup(), self.world.storage.snapshot() if inside else None))
            s.note("state directory backed up" + (" (with the log store in it)" if inside else ""))
        if s.choice(h.lose_state):
            self.disk = StateDisk.empty()
            s.note("state directory lost: starts on an empty one")
        elif self.backups and s.choice(h.restore_backup):
            disk, log = s.rng.choice(self.backups)
            self.disk = disk.backup()
            if log is not None:
                self.world.storage.restore(log)
            s.note("state directory restored from a backup" + (" (with the log store in it)" if log else ""))

    def survive(self, actor: Actor, run: Any) -> str:
        """Run one process; return how it ended: ``ok``, ``crashed`` or the name of the error that stopped it."""
        try:
            run()
            return "ok"
        except Crash:
            actor.reborn()
            return "crashed"
        except REFUSALS as e:
            refused(self.world, e, self.store)
            return type(e).__name__


class SimSink(ExactlyOnceParquetSink):
    """The real sink, opened by :meth:`Driver.open`. A private attribute that the product's ``_open`` sets and
    :meth:`Driver.open` does not know (yet) reads as None (an option off, nothing deferred), and is noted."""

    def __getattr__(self, name: str) -> Any:
        if not name.startswith("_") or name.startswith("__"):
            raise AttributeError(name)
        DEFAULTED.add(name)
        return None


DEFAULTED: set[str] = set()
"""Attributes :class:`SimSink` read as None (reported by the tests, to keep :meth:`Driver.open` up to date)."""


def refused(world: World, e: BaseException, store: LogStore | None) -> None:
    """Count a refusal. A damaged or missing segment is suspect: nothing damages segments here, so only a run that
    lost ownership (a newer term exists: the newer run released them) may see one; the owner seeing one is a loss,
    loud but a loss, and the checker reports it."""
    world.outcome.refusals[type(e).__name__] += 1
    world.scheduler.note(f"refused: {type(e).__name__}: {str(e)[:160]}")
    term = store.term if store is not None else None
    if isinstance(e, SegmentError) and term is not None and not world.newer_term(term):
        world.outcome.anomalies.append(f"the owner (term {term}) found log segments missing: {str(e)[:300]}")


def recover_apply(world: World, actor: Actor, lease: float, skew: float = 0.0) -> None:
    """``filesink recover apply --log-store URL --owner-lease LEASE``: the state rebuilt in memory from the durable
    home (as ``recovery.cli.open_sink`` and ``run_recover`` do), then the real :func:`apply_recovery`. A short lease
    is an operator who does not wait for a driver to be silent: the drivers' fences must hold then too."""
    store = None
    actor.skew = skew
    try:
        if LogStore._claim_at(world.location) is None:
            raise NotASinkError("the log store holds no sink's durable home")
        store = LogStore(StateDisk.empty().open(), world.location)
        ledger = Ledger(store)
        if store.rebuilt:
            ledger.config_from_home()
            store.sync_from_home(adopt=False)
            ledger.sync_pending()
        if ledger.config() is None:
            raise NotASinkError("the state holds no sink")
        check_owner = getattr(recovery.cli, "check_no_live_owner", None)
        if check_owner is not None:
            check_owner(store, lease, locked=False)

        def task(f: PlannedFile, term: int) -> Any:
            return file_task(store, ledger, f, [], term=term)

        apply_recovery(store, ledger, world.output, partitioned=False, file_task=task)  # type: ignore[arg-type]
    except Crash:
        actor.reborn()
    except REFUSALS as e:
        refused(world, e, store)
