"""What the actors share: the log store's location, the output, the Spark checkpoint, the source of batches, and
the state directories (SQLite databases in memory) that outlive a driver's process."""

from __future__ import annotations

import sqlite3
from collections import Counter
from dataclasses import dataclass, field

import pyarrow as pa
import sqlite_utils

from filesink.committer import ledger
from logstore import VNODE_COLUMN, statedb

from .output import ModelOutput, Row
from .scheduler import Scheduler
from .storage import ROOT, MemStorage, SimLocation

SHARED = "shared"
"""The log store on a disk of its own or on S3: shared by every driver, and not in the state directory's backups."""
INSIDE = "inside"
"""The log store inside the state directory (the default): its backups hold the log store, and a restore puts the
durable home back as it was too."""


class StateDisk:
    """A state directory's database: what survives a driver's process (committed transactions only). Copies are
    made with SQLite's backup API from a template that holds every migration already."""

    _template: sqlite3.Connection | None = None

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn

    @classmethod
    def template(cls) -> sqlite3.Connection:
        if cls._template is None:
            conn = sqlite3.connect(":memory:", check_same_thread=False)
            db = sqlite_utils.Database(conn)
            statedb.apply_migrations(db, statedb.migrations, where="the simulation's template")
            statedb.apply_migrations(db, ledger.migrations, where="the simulation's template")
            cls._template = conn
        return cls._template

    @classmethod
    def empty(cls) -> StateDisk:
        return cls._copy(cls.template())

    def backup(self) -> StateDisk:
        return self._copy(self.conn)

    @staticmethod
    def _copy(source: sqlite3.Connection) -> StateDisk:
        conn = sqlite3.connect(":memory:", check_same_thread=False)
        source.backup(conn)
        return StateDisk(conn)

    def open(self) -> sqlite_utils.Database:
        """The database as a new process opens it: what a killed process left uncommitted is gone."""
        if self.conn.in_transaction:
            self.conn.rollback()
        db = KeptDatabase(self.conn)
        db.execute("PRAGMA foreign_keys=ON")
        return db


class KeptDatabase(sqlite_utils.Database):
    """A connection the sink may close: the disk (the connection) stays for the next process."""

    from_template = True
    """Made from the template, which every migration of this version went through."""

    def close(self) -> None:
        pass


class Checkpoint:
    """Spark's checkpoint: the last batch whose sink call returned. Committing a batch that is committed already
    fails, as Spark's commit log refuses a second writer of one batch id."""

    def __init__(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler
        self.committed = -1

    def next_batch(self) -> int:
        self.scheduler.point("checkpoint: read")
        return self.committed + 1

    def commit(self, batch: int) -> None:
        self.scheduler.point(f"checkpoint: commit batch {batch}")
        if self.committed >= batch:
            raise ConcurrentQueryError(f"batch {batch} was committed already (by another run of the query)")
        self.committed = batch


class ConcurrentQueryError(Exception):
    """Spark's refusal: another run of the query committed this batch first."""


@dataclass
class Outcome:
    """What happened in a run, for the checker and the report."""

    returned: set[int] = field(default_factory=set)
    """Batches whose sink call returned without an error (at least once)."""
    refusals: Counter[str] = field(default_factory=Counter)
    """Errors the product raised, by type."""
    final: str = "not run"
    """How the final, clean driver ended: ``drained``, or the error that refused it."""
    anomalies: list[str] = field(default_factory=list)
    """Refusals no correct run gives here (the checker reports them)."""


class World:
    def __init__(
        self, scheduler: Scheduler, *, batches: list[int], vnodes: int, conditional: bool = True, setup: str = SHARED
    ) -> None:
        self.scheduler = scheduler
        self.setup = setup
        """Where the log store lives: :data:`SHARED` or :data:`INSIDE`."""
        self.storage = MemStorage(scheduler, conditional=conditional)
        self.location = SimLocation(ROOT, storage=self.storage)
        self.output = ModelOutput(scheduler)
        self.checkpoint = Checkpoint(scheduler)
        self.sizes = batches
        """Rows of each batch of the source (batch id -> rows); the source is deterministic."""
        self.vnodes = vnodes
        self.outcome = Outcome()
        self._tables: dict[int, pa.Table] = {}

    def newer_term(self, term: int) -> bool:
        """Whether a term above ``term`` was taken (its record is in the home; records are pruned only below the
        newest). Read directly: not a scheduling point."""
        prefix = "home/terms/"
        return any(
            int(k[len(prefix) : -5]) > term
            for k in self.storage.files
            if k.startswith(prefix) and k.endswith(".json") and k[len(prefix) : -5].isdigit()
        )

    def rows(self, batch: int) -> list[Row]:
        return [(batch, i) for i in range(self.sizes[batch])]

    def table(self, batch: int) -> pa.Table:
        """Batch ``batch`` as the append sees it: its rows and their vnodes."""
        if batch not in self._tables:
            self._tables[batch] = self._table(batch)
        return self._tables[batch]

    def _table(self, batch: int) -> pa.Table:
        rows = self.rows(batch)
        return pa.table(
            {
                "batch": pa.array([b for b, _ in rows], pa.int64()),
                "i": pa.array([i for _, i in rows], pa.int64()),
                VNODE_COLUMN: pa.array([(7 * b + 3 * i) % self.vnodes for b, i in rows], pa.int32()),
            }
        )
