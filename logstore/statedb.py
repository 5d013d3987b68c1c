"""The sink's SQLite state database: connection settings and the log store's schema migrations.

One database per sink holds the log store tables (this module) and, later, the file sink's tables, so that
seal, pre-commit and commit-with-truncate are each a single transaction. Each package registers its own
``sqlite_utils.migrations.Migrations`` set; a set's migrations are applied in order, once, each in its own
transaction together with the record that it ran.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import sqlite_utils
from sqlite_utils.migrations import Migrations

from .errors import StateMismatchError
from .storage import ensure_dir

STATE_DB_NAME = "state.sqlite"

migrations = Migrations("logstore")


@migrations(name="0001_log_tables")
def _initial(db: sqlite_utils.Database) -> None:
    db.executescript(
        """
        CREATE TABLE log_store (
            id INTEGER PRIMARY KEY CHECK (id = 1),
            sink_id TEXT NOT NULL,
            vnodes INTEGER NOT NULL CHECK (vnodes > 0),
            location TEXT NOT NULL,
            last_sealed_epoch INTEGER NOT NULL DEFAULT -1,
            created_at TEXT NOT NULL
        );
        CREATE TABLE log_epochs (
            epoch INTEGER PRIMARY KEY,
            segments INTEGER NOT NULL,
            rows INTEGER NOT NULL,
            bytes INTEGER NOT NULL,
            sealed_at REAL NOT NULL
        );
        CREATE TABLE log_segments (
            segment_id INTEGER PRIMARY KEY,
            epoch INTEGER NOT NULL REFERENCES log_epochs(epoch),
            name TEXT NOT NULL UNIQUE,
            size INTEGER NOT NULL,
            schema_block TEXT NOT NULL,
            schema_bytes BLOB NOT NULL
        );
        CREATE TABLE log_segment_vnodes (
            vnode INTEGER NOT NULL,
            epoch INTEGER NOT NULL,
            segment_id INTEGER NOT NULL REFERENCES log_segments(segment_id) ON DELETE CASCADE,
            rows INTEGER NOT NULL,
            bytes INTEGER NOT NULL,
            blocks TEXT NOT NULL,
            PRIMARY KEY (vnode, epoch, segment_id)
        ) WITHOUT ROWID;
        CREATE INDEX log_segment_vnodes_by_segment ON log_segment_vnodes(segment_id);
        CREATE TABLE log_vnodes (
            vnode INTEGER PRIMARY KEY,
            truncated_epoch INTEGER NOT NULL DEFAULT -1
        );
        """
    )


def connect(path: str | Path) -> sqlite_utils.Database:
    """Open (creating if needed) a state database with the durability settings every writer relies on.

    WAL journal, ``synchronous=FULL`` (a commit is on disk when it returns), foreign keys on, and a busy
    timeout so a concurrent reader does not fail a writer. The state database must be on a local file
    system: SQLite's WAL mode does not work over network file systems.
    """
    path = Path(path)
    ensure_dir(path.parent.absolute())
    conn = sqlite3.connect(str(path), timeout=30.0, check_same_thread=False)
    db = sqlite_utils.Database(conn)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=FULL")
    db.execute("PRAGMA foreign_keys=ON")
    db.execute("PRAGMA busy_timeout=30000")
    return db


def apply_migrations(db: sqlite_utils.Database, migration_set: Migrations, *, where: str) -> None:
    """Apply pending migrations of ``migration_set``; refuse a database written by a newer version."""
    known = {m.name for m in migration_set.pending(sqlite_utils.Database(memory=True))}
    unknown = [m.name for m in migration_set.applied(db) if m.name not in known]
    if unknown:
        raise StateMismatchError(
            f"{where}: the state database has schema migrations this version does not know "
            f"({', '.join(unknown)} in set {migration_set.name!r}); it was written by a newer version of the "
            "sink. Upgrade the package to open it."
        )
    migration_set.apply(db)
