"""The sink's SQLite state database: connection settings and the log store's schema migrations.

One database per sink holds the log store tables (this module) and, later, the file sink's tables, so that
seal, pre-commit and commit-with-truncate are each a single transaction. Each package registers its own
``sqlite_utils.migrations.Migrations`` set; a set's migrations are applied in order, once, each in its own
transaction together with the record that it ran.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Concatenate, ParamSpec, Protocol, TypeVar

import sqlite_utils
from sqlite_utils.migrations import Migrations

from .diagnosis import cause_of, diagnose
from .errors import StateDatabaseError, StateMismatchError
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


@migrations(name="0002_given_up")
def _given_up(db: sqlite_utils.Database) -> None:
    """What the operator gave up of damaged segments (``filesink recover apply --drop-damaged``): one row per
    (segment, vnode), kept for the sink's life."""
    db.executescript(
        """
        CREATE TABLE log_given_up (
            segment TEXT NOT NULL,
            vnode INTEGER NOT NULL,
            epoch INTEGER NOT NULL,
            rows INTEGER NOT NULL,
            problem TEXT NOT NULL,
            term INTEGER NOT NULL,
            given_up_at REAL NOT NULL,
            PRIMARY KEY (segment, vnode)
        ) WITHOUT ROWID;
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


def connect_readonly(path: str | Path) -> sqlite_utils.Database:
    """Open an existing state database for reading only (progress displays, ``filesink recover status``): no
    migration runs, nothing is created, and it works where the database file or its directory is read-only.

    SQLite reads a database in WAL mode through an index file (``-shm``) next to it, which it creates if missing.
    Where it cannot (a read-only directory or file system) and there is no write-ahead log to read (``-wal``
    missing or empty: the sink was closed, or checkpointed everything), the database is opened ``immutable``,
    reading the file alone. A write-ahead log that cannot be read is :class:`StateDatabaseError` saying what to do.

    Raises ``FileNotFoundError`` if there is no database at ``path``."""
    path = Path(path).absolute()
    if not path.is_file():
        raise FileNotFoundError(f"no state database at {path}")
    try:
        return _open_readonly(path, immutable=False)
    except sqlite3.OperationalError as e:
        if os.access(path.parent, os.W_OK):
            raise  # not for want of a writable directory (the caller translates it)
        wal = path.with_name(path.name + "-wal")
        if wal.exists() and wal.stat().st_size > 0:
            raise StateDatabaseError(
                f"the state database {path} cannot be read here ({e}): its write-ahead log {wal.name} holds "
                f"transactions, and reading them needs an index file ({path.name}-shm) that cannot be created in "
                f"the read-only directory {path.parent}. Run this where the directory is writable (as the user "
                "that runs the sink), or copy the state directory to a writable place and give that copy."
            ) from e
        return _open_readonly(path, immutable=True)


def _open_readonly(path: Path, *, immutable: bool) -> sqlite_utils.Database:
    uri = f"{path.as_uri()}?mode=ro{'&immutable=1' if immutable else ''}"
    conn = sqlite3.connect(uri, uri=True, timeout=30.0, check_same_thread=False)
    try:
        conn.execute("PRAGMA busy_timeout=30000")
        conn.execute("SELECT count(*) FROM sqlite_master").fetchone()  # opens the file (and its WAL index) now
    except BaseException:
        conn.close()
        raise
    return sqlite_utils.Database(conn)


def database_path(db: sqlite_utils.Database) -> str:
    """The file of an open database (for messages)."""
    row = db.execute("PRAGMA database_list").fetchone()
    return str(row[2]) if row and row[2] else ":memory:"


@contextlib.contextmanager
def translated(path: str, what: str) -> Iterator[None]:
    """Turn ``sqlite3.Error`` into :class:`StateDatabaseError` naming the database, what was being done, and
    what to do about it (which depends on the error: a file that is not a database, a damaged one, a lock held
    elsewhere, a read-only place, a full disk, ...).

    The one place SQLite errors are translated; the owners of the database's tables use it (directly or through
    :func:`db_errors`)."""
    try:
        yield
    except sqlite3.Error as e:
        raise StateDatabaseError(f"{what}: the state database {path} failed: {cause_of(e)}. {advice(e, path)}") from e


def advice(error: sqlite3.Error, path: str) -> str:
    """What to do about the SQLite error ``error`` of the state database at ``path``."""
    name = getattr(error, "sqlite_errorname", "") or ""
    where = str(Path(path).parent)
    rebuild = (
        f"Restore {path} from a backup; or move it away, with its -wal and -shm files if there are any (keep them "
        "for diagnosis), and start the sink again with the same log store: it rebuilds its state from the durable "
        "home there."
    )
    if name == "SQLITE_NOTADB" or "file is not a database" in str(error):
        return f"The file is not a SQLite database (or its header is damaged). {rebuild}"
    if name.startswith("SQLITE_CORRUPT") or "malformed" in str(error):
        return f"The database file is damaged. {rebuild}"
    if name.startswith(("SQLITE_BUSY", "SQLITE_LOCKED")) or "locked" in str(error):
        return (
            "Another process holds a lock on it (a sink, a recovery, or a tool with a transaction open) and did not "
            "release it within 30 s. Stop that process (filesink recover status shows which sink holds the state "
            "directory), then run again. Nothing was changed."
        )
    if name.startswith("SQLITE_READONLY"):
        return (
            f"It cannot be written here (a read-only file, directory or file system). Make {path} and {where} "
            "writable by the user that runs the sink, then run again; nothing recorded is lost."
        )
    if name.startswith("SQLITE_CANTOPEN") and not os.access(where, os.W_OK):
        return (
            f"Its directory {where} is read-only here, and writing needs SQLite's -wal and -shm files next to the "
            f"database: make {where} writable by the user that runs this (read-only commands such as filesink "
            "recover status and plan work as they are), then run again. Nothing was changed."
        )
    if name.startswith("SQLITE_CANTOPEN"):
        return (
            f"SQLite cannot open it: check that {where} exists and is readable and writable (SQLite creates "
            f"{Path(path).name}-wal and -shm files next to the database), then run again."
        )
    found = diagnose(error, where)
    return f"Its transaction was rolled back, so nothing is lost: {found.advise('restart the query')}"


class HasDatabase(Protocol):
    db_path: str


S = TypeVar("S", bound=HasDatabase)
P = ParamSpec("P")
R = TypeVar("R")


def db_errors(what: str) -> Callable[[Callable[Concatenate[S, P], R]], Callable[Concatenate[S, P], R]]:
    """Decorate a method of a table owner (an object with ``db_path``) so that SQLite errors become
    :class:`StateDatabaseError` (see :func:`translated`)."""

    def decorate(method: Callable[Concatenate[S, P], R]) -> Callable[Concatenate[S, P], R]:
        @functools.wraps(method)
        def wrapper(self: S, /, *args: P.args, **kwargs: P.kwargs) -> R:
            with translated(self.db_path, what):
                return method(self, *args, **kwargs)

        return wrapper

    return decorate


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
