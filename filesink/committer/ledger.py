"""The commit ledger: the file sink's tables in the sink's state database, and every change to them.

Pre-commit (:meth:`Ledger.precommit`), commit with truncate (:meth:`Ledger.commit`), drop
(:meth:`Ledger.drop`) and writer terms (:meth:`Ledger.new_term`) are each one transaction, in the same
database as the log store's tables (whose connection :class:`logstore.LogStore` owns), so that a commit and
the truncation it allows are one. SQLite errors surface as :class:`StateDatabaseError`.

A file is **pending** from pre-commit until recovery or the commit step resolves it. Both terminal states
delete its rows (the vnodes' truncate points then say everything), so the tables hold open work only:

- **committed**: the file is visible; its vnodes are truncated to its end epoch in the same transaction;
- **dropped**: the file is not visible; its vnodes keep their truncate points and the data is written again.

Each transition is a compare-and-swap on the pending row: if it is gone, another writer or recovery got
there first and :class:`CommitConflictError` is raised.

The **writer term** (fencing generation, :mod:`logstore.home`) goes up at every sink start and every recovery
run. Pre-commit and commit carry the term of the run that does them and are refused with :class:`FencedError`
once a newer term record exists in the durable home, so a run from before a restart cannot change state.
"""

from __future__ import annotations

import base64
import json
import socket
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import sqlite_utils
from sqlite_utils.migrations import Migrations

from logstore import NOTHING, LogStore, LogStoreClaimedError, guards
from logstore.failpoints import failpoint
from logstore.home import FILES, SINK_RECORD, file_path
from logstore.statedb import apply_migrations, db_errors, translated

from ..errors import CommitConflictError, FencedError, SinkOptionError
from ..schema.conform import file_schema_bytes

IDENTITY = ("output", "key_columns", "partition_by", "table_format", "table")
"""What makes a sink the sink it is, besides its id and its log store: kept for life."""

migrations = Migrations("filesink")


@migrations(name="0001_sink_tables")
def _initial(db: sqlite_utils.Database) -> None:
    db.executescript(
        """
        CREATE TABLE sink_config (
            id INTEGER PRIMARY KEY CHECK (id = 1),
            output TEXT NOT NULL,
            key_columns TEXT NOT NULL,
            partition_by TEXT NOT NULL,
            spark_schema TEXT,
            arrow_schema BLOB,
            bytes_per_log_byte REAL NOT NULL DEFAULT 1.0,
            files_written INTEGER NOT NULL DEFAULT 0,
            created_at TEXT NOT NULL
        );
        CREATE TABLE sink_files (
            name TEXT PRIMARY KEY,
            state TEXT NOT NULL CHECK (state IN ('pending')),
            vnode_lo INTEGER NOT NULL,
            vnode_hi INTEGER NOT NULL,
            end_epoch INTEGER NOT NULL,
            rows INTEGER NOT NULL,
            log_bytes INTEGER NOT NULL,
            reason TEXT NOT NULL,
            created_at REAL NOT NULL
        );
        CREATE TABLE sink_file_vnodes (
            name TEXT NOT NULL REFERENCES sink_files(name) ON DELETE CASCADE,
            vnode INTEGER NOT NULL,
            start_epoch INTEGER NOT NULL,
            end_epoch INTEGER NOT NULL,
            PRIMARY KEY (name, vnode)
        ) WITHOUT ROWID;
        CREATE INDEX sink_file_vnodes_by_vnode ON sink_file_vnodes(vnode);
        """
    )


@migrations(name="0002_writer_terms")
def _writer_terms(db: sqlite_utils.Database) -> None:
    db.executescript(
        """
        ALTER TABLE sink_config ADD COLUMN writer_term INTEGER NOT NULL DEFAULT 0;
        ALTER TABLE sink_files ADD COLUMN term INTEGER NOT NULL DEFAULT 0;
        """
    )


@migrations(name="0003_query_id")
def _query_id(db: sqlite_utils.Database) -> None:
    db.execute("ALTER TABLE sink_config ADD COLUMN query_id TEXT")


@migrations(name="0004_table_format")
def _table_format(db: sqlite_utils.Database) -> None:
    db.executescript(
        """
        ALTER TABLE sink_config ADD COLUMN table_format TEXT NOT NULL DEFAULT 'directory';
        ALTER TABLE sink_config ADD COLUMN table_name TEXT;
        """
    )


@migrations(name="0005_schema_versions")
def _schema_versions(db: sqlite_utils.Database) -> None:
    db.executescript(
        """
        CREATE TABLE schema_versions (
            version INTEGER PRIMARY KEY,
            first_epoch INTEGER NOT NULL,
            spark_schema TEXT NOT NULL,
            spark_type TEXT,
            arrow_schema BLOB,
            changes TEXT NOT NULL DEFAULT '[]',
            recorded_at TEXT NOT NULL
        );
        INSERT INTO schema_versions (version, first_epoch, spark_schema, arrow_schema, recorded_at)
            SELECT 1, 0, spark_schema, arrow_schema, datetime('now') FROM sink_config WHERE spark_schema IS NOT NULL;
        """
    )


@dataclass(frozen=True)
class SchemaVersion:
    """One schema of the sink's history: its Spark schema (``[name, type]`` pairs, and Spark's full JSON where
    recorded), the files' Arrow schema (None until the first rows of version 1), the first epoch it applies to and
    what changed from the version before (:class:`filesink.schema.evolution.Change` as text)."""

    version: int
    first_epoch: int
    spark_schema: str
    spark_type: str | None
    arrow_schema: bytes | None
    changes: tuple[str, ...]


def _version_json(v: SchemaVersion) -> dict[str, Any]:
    return {
        "version": v.version,
        "first_epoch": v.first_epoch,
        "spark_schema": v.spark_schema,
        "spark_type": v.spark_type,
        "arrow_schema": None if v.arrow_schema is None else base64.b64encode(v.arrow_schema).decode(),
        "changes": list(v.changes),
    }


class FileState(StrEnum):
    PENDING = "pending"
    """Pre-committed: the file may or may not be visible; its log data is kept until it is resolved."""
    COMMITTED = "committed"
    """Visible and recorded by truncating its vnodes to its end epoch; its rows are deleted."""
    DROPPED = "dropped"
    """Not visible; its rows are deleted and its vnodes' data is written again from the log store."""


@dataclass(frozen=True)
class PlannedFile:
    """One file of a plan: for each vnode of ``vnode_lo..vnode_hi`` with data, epochs ``start..end_epoch``."""

    name: str
    vnode_lo: int
    vnode_hi: int
    starts: dict[int, int] = field(hash=False)
    end_epoch: int
    rows: int
    log_bytes: int
    reason: str

    def after(self) -> dict[int, int]:
        """Per vnode, the epoch after which the file's data starts (for ``LogStore.plan_read``)."""
        return {v: s - 1 for v, s in self.starts.items()}


class Ledger:
    """Reads and changes the file sink's tables; every multi-row change is one transaction.

    Opened on a read-only log store (:meth:`LogStore.open_existing`), it only reads (no migration runs)."""

    def __init__(self, store: LogStore) -> None:
        self.store = store
        self.db = store.db
        self.db_path = store.db_path
        if not store.readonly:
            with translated(self.db_path, "prepare the sink's tables"):
                apply_migrations(self.db, migrations, where=f"sink state of {store.location.canonical}")

    # -- configuration -------------------------------------------------------------------------------

    @db_errors("read the sink's configuration")
    def config(self) -> dict[str, object] | None:
        """The sink's recorded configuration (output, key_columns, partition_by, table_format, table), or None before
        the first start."""
        if "sink_config" not in self.db.table_names():
            return None
        columns = {c.name for c in self.db["sink_config"].columns}
        table = ", table_format, table_name" if "table_format" in columns else ", 'directory', NULL"
        row = self.db.execute(f"SELECT output, key_columns, partition_by{table} FROM sink_config").fetchone()
        if row is None:
            return None
        return {
            "output": row[0],
            "key_columns": json.loads(row[1]),
            "partition_by": json.loads(row[2]),
            "table_format": row[3],
            "table": row[4],
        }

    @db_errors("check the sink's configuration")
    def check_config(
        self,
        output: str,
        key_columns: list[str] | None,
        partition_by: list[str],
        *,
        table_format: str = "directory",
        table: str | None = None,
        before_record: Callable[[], None] | None = None,
    ) -> None:
        """Record the sink's identity at creation (in the database and the durable home); later, refuse a
        different output, keys, partitioning or table. A new database takes the identity the home recorded
        (rebuild), and refuses, before anything is written, a home that belongs to a sink with another identity."""
        given = {
            "output": output,
            "key_columns": key_columns,
            "partition_by": partition_by,
            "table_format": table_format,
            "table": table,
        }
        row = self.db.execute(
            "SELECT output, key_columns, partition_by, table_format, table_name FROM sink_config"
        ).fetchone()
        if row is None:
            home = self.store.home.read(SINK_RECORD)
            if home is not None and home.get("sink_id") == self.store.sink_id:
                home = {"table_format": "directory", "table": None, **home}  # recorded before table formats
                different = [k for k in IDENTITY if home.get(k) != given[k]]
                if different:
                    shown = "; ".join(f"{k} {home.get(k)!r} there, {given[k]!r} here" for k in different)
                    raise LogStoreClaimedError(
                        f"the log store at {self.store.location.canonical} is the durable home of sink "
                        f"{self.store.sink_id}, which writes to {home.get('output')}, not of this sink (state "
                        f"directory {self.db_path.rsplit('/', 1)[0]}): {shown}. Nothing was written or deleted. Give "
                        "this sink a log store location of its own (e.g. a subdirectory per sink), or open the sink "
                        "that owns it with its own options."
                    )
            if before_record is not None:
                before_record()  # e.g. the output's claim: refused before anything is recorded
            with self.db.atomic():
                self.db.execute(
                    "INSERT INTO sink_config (id, output, key_columns, partition_by, table_format, table_name, "
                    "spark_schema, query_id, created_at) VALUES (1, ?, ?, ?, ?, ?, ?, ?, datetime('now'))",
                    (
                        output,
                        json.dumps(key_columns),
                        json.dumps(partition_by),
                        table_format,
                        table,
                        (home or {}).get("spark_schema"),
                        (home or {}).get("query_id"),
                    ),
                )
                self._restore_schema_history(home or {})
            if home is None:
                self._write_home_record()
            return
        if not self.store.readonly and self.store.home.read(SINK_RECORD) is None:
            self._write_home_record()  # a sink created before it had a durable home
        changed = (row[1], row[2], row[3], row[4]) != (
            json.dumps(key_columns),
            json.dumps(partition_by),
            table_format,
            table,
        )
        if row[0] == output and changed and not self.store.readonly and self.store.last_sealed_epoch == NOTHING:
            # Nothing was ever sealed (e.g. the first batch was refused): keys, partitioning and the table format may
            # still change.
            with self.db.atomic():
                self.db.execute(
                    "UPDATE sink_config SET key_columns = ?, partition_by = ?, table_format = ?, table_name = ?",
                    (json.dumps(key_columns), json.dumps(partition_by), table_format, table),
                )
            self._write_home_record()
            return
        for what, recorded, value in (
            ("output path", row[0], output),
            ("key_columns", row[1], json.dumps(key_columns)),
            ("partition_by", row[2], json.dumps(partition_by)),
            ("table_format", row[3], table_format),
            ("table", row[4], table),
        ):
            if recorded != value:
                raise SinkOptionError(
                    f"the state directory belongs to a sink created with {what} {recorded}, not {value}. "
                    "A sink keeps these for life: use the original value, or a new state directory and output."
                )

    @db_errors("take the sink's configuration from the durable home")
    def config_from_home(self) -> None:
        """A new database: take the sink's configuration from the durable home, as the sink recorded it."""
        home = self.store.home.read(SINK_RECORD)
        if home is None or self.config() is not None:
            return
        self.check_config(
            str(home["output"]),
            home.get("key_columns"),
            list(home.get("partition_by") or []),
            table_format=str(home.get("table_format") or "directory"),
            table=home.get("table"),
        )
        with self.db.atomic():  # the term the sink runs under now (a new term is taken above it at start)
            newest = self.store.home.newest_term() or 0
            self.db.execute("UPDATE sink_config SET writer_term = MAX(writer_term, ?)", (newest,))

    def _write_home_record(self) -> None:
        """The sink's configuration, durable in the home (rebuild takes it from there)."""
        if self.store.readonly:
            return
        row = self.db.execute(
            "SELECT output, key_columns, partition_by, spark_schema, query_id, table_format, table_name "
            "FROM sink_config"
        ).fetchone()
        self.store.home.write(
            SINK_RECORD,
            {
                "sink_id": self.store.sink_id,
                "output": row[0],
                "key_columns": json.loads(row[1]),
                "partition_by": json.loads(row[2]),
                "spark_schema": row[3],
                "query_id": row[4],
                "table_format": row[5],
                "table": row[6],
                "schema_history": [_version_json(v) for v in self.schema_history()],
            },
        )

    def _restore_schema_history(self, home: dict[str, Any]) -> None:
        """A rebuilt database takes the schema history the home recorded (a home from before it: its schema as
        version 1), and the newest version's files' schema."""
        history = home.get("schema_history")
        if history is None and home.get("spark_schema") is not None:
            history = [{"version": 1, "first_epoch": 0, "spark_schema": home["spark_schema"]}]
        for v in history or []:
            arrow = base64.b64decode(v["arrow_schema"]) if v.get("arrow_schema") else None
            self.db.execute(
                "INSERT INTO schema_versions (version, first_epoch, spark_schema, spark_type, arrow_schema, changes, "
                "recorded_at) VALUES (?, ?, ?, ?, ?, ?, datetime('now'))",
                (
                    v["version"],
                    v["first_epoch"],
                    v["spark_schema"],
                    v.get("spark_type"),
                    arrow,
                    json.dumps(v.get("changes") or []),
                ),
            )
        if history and history[-1].get("arrow_schema"):
            self.db.execute("UPDATE sink_config SET arrow_schema = ?", (base64.b64decode(history[-1]["arrow_schema"]),))

    @db_errors("read the recorded schema")
    def spark_schema(self) -> str | None:
        value: str | None = self.db.execute("SELECT spark_schema FROM sink_config").fetchone()[0]
        return value

    @db_errors("read the files' schema")
    def arrow_schema(self) -> bytes | None:
        """The Arrow schema files are written with (every field nullable): taken from the first held segment
        (every segment carries its schema) the first time it is asked for after a seal with rows, and recorded."""
        value: bytes | None = self.db.execute("SELECT arrow_schema FROM sink_config").fetchone()[0]
        if value is None:
            first = self.store.first_segment_schema()
            if first is not None and self.store.readonly:
                return file_schema_bytes(first)
            if first is not None:
                value = file_schema_bytes(first)
                with self.db.atomic():
                    self.db.execute("UPDATE sink_config SET arrow_schema = COALESCE(arrow_schema, ?)", (value,))
                    self.db.execute(
                        "UPDATE schema_versions SET arrow_schema = COALESCE(arrow_schema, ?) WHERE version = "
                        "(SELECT MAX(version) FROM schema_versions)",
                        (value,),
                    )
                self._write_home_record()
        # A schema recorded before nested fields were made nullable too is widened the same way.
        return None if value is None else file_schema_bytes(value)

    @db_errors("list the pending files")
    def pending_names(self) -> list[str]:
        """Names of the files pre-committed and not yet resolved (none while a healthy run is between rolls)."""
        return [r[0] for r in self.db.execute("SELECT name FROM sink_files WHERE state = 'pending' ORDER BY name")]

    @db_errors("record the schema")
    def record_schema(
        self,
        spark_schema: str,
        arrow_schema: bytes | None = None,
        *,
        spark_type: str | None = None,
        first_epoch: int = 0,
    ) -> None:
        """Record the sink's first schema (version 1), or replace it while nothing was sealed under it; the files'
        Arrow schema is taken from the first segment later unless given."""
        with self.db.atomic():
            self.db.execute("UPDATE sink_config SET spark_schema = ?, arrow_schema = ?", (spark_schema, arrow_schema))
            self.db.execute("DELETE FROM schema_versions")
            self.db.execute(
                "INSERT INTO schema_versions (version, first_epoch, spark_schema, spark_type, arrow_schema, "
                "recorded_at) VALUES (1, ?, ?, ?, ?, datetime('now'))",
                (first_epoch, spark_schema, spark_type, arrow_schema),
            )
        self._write_home_record()

    @db_errors("read the schema history")
    def schema_history(self) -> list[SchemaVersion]:
        """The sink's schemas, oldest first (empty before its first batch)."""
        if "schema_versions" not in self.db.table_names():  # a read-only database from before schema evolution
            recorded = self.spark_schema()
            return [] if recorded is None else [SchemaVersion(1, 0, recorded, None, None, ())]
        return [
            SchemaVersion(r[0], r[1], r[2], r[3], None if r[4] is None else bytes(r[4]), tuple(json.loads(r[5])))
            for r in self.db.execute(
                "SELECT version, first_epoch, spark_schema, spark_type, arrow_schema, changes FROM schema_versions "
                "ORDER BY version"
            )
        ]

    @db_errors("record a new schema version")
    def add_schema_version(
        self, spark_schema: str, spark_type: str | None, arrow_schema: bytes, first_epoch: int, changes: list[str]
    ) -> None:
        """Record the schema batches take from ``first_epoch`` on; versions from that epoch on that no seal used (a
        run stopped between recording and sealing) are replaced. In the home before the epoch is sealed, so a
        rebuild writes the epoch's rows under it."""
        with self.db.atomic():
            self.db.execute("DELETE FROM schema_versions WHERE first_epoch >= ? AND version > 1", (first_epoch,))
            self.db.execute(
                "INSERT INTO schema_versions (version, first_epoch, spark_schema, spark_type, arrow_schema, changes, "
                "recorded_at) VALUES ((SELECT MAX(version) + 1 FROM schema_versions), ?, ?, ?, ?, ?, "
                "datetime('now'))",
                (first_epoch, spark_schema, spark_type, arrow_schema, json.dumps(changes)),
            )
            self.db.execute("UPDATE sink_config SET spark_schema = ?, arrow_schema = ?", (spark_schema, arrow_schema))
        self._write_home_record()

    @db_errors("drop an unsealed schema version")
    def drop_schema_versions_after(self, version: int) -> None:
        """Forget the versions after ``version``, which no seal used: the batches went back to ``version``."""
        with self.db.atomic():
            self.db.execute("DELETE FROM schema_versions WHERE version > ?", (version,))
            row = self.db.execute(
                "SELECT spark_schema, arrow_schema FROM schema_versions WHERE version = ?", (version,)
            ).fetchone()
            self.db.execute("UPDATE sink_config SET spark_schema = ?, arrow_schema = ?", (row[0], row[1]))
        self._write_home_record()

    # -- writer terms ---------------------------------------------------------------------------------

    @db_errors("read the recorded query id")
    def query_id(self) -> str | None:
        """The id of the Spark streaming query (its checkpoint's) whose batches this sink takes; None before the
        first batch of a query."""
        value: str | None = self.db.execute("SELECT query_id FROM sink_config").fetchone()[0]
        return value

    @db_errors("record the query id")
    def record_query_id(self, query_id: str) -> None:
        """Record the query whose batches the sink takes (once: an id recorded already is never replaced)."""
        with self.db.atomic():
            self.db.execute("UPDATE sink_config SET query_id = COALESCE(query_id, ?)", (query_id,))
        self._write_home_record()

    @db_errors("read the writer term")
    def term(self) -> int:
        value: int = self.db.execute("SELECT writer_term FROM sink_config").fetchone()[0]
        return value

    @db_errors("take a new writer term")
    def new_term(self, staging: str | None = None) -> int:
        """Take the next writer term: created in the durable home (a conditional create, above every term
        recorded there and here), then recorded here (compare-and-swap). From now on, older terms are fenced.
        The term record names this run's host and state database (``filesink recover apply``, holding the state
        directory's lock, knows a run of its own state directory is not alive) and ``staging``, the local
        output's staging directory this run's writers use, so any later run can fence them
        (:func:`filesink.output.fence_writers`)."""
        current = self.term()
        holder = {"host": socket.gethostname(), "state": self.store.db_path}
        term = self.store.home.take_term(current, {**holder, "staging": staging} if staging else holder)
        with self.db.atomic():
            cursor = self.db.execute("UPDATE sink_config SET writer_term = ? WHERE writer_term = ?", (term, current))
            if cursor.rowcount != 1:
                raise FencedError(f"writer term {current} changed while taking the next one; another run started")
        self.store.term = term
        return term

    def _check_term(self, term: int, action: str) -> None:
        current = self.term()
        if current != term and guards.on("ledger.database_term"):
            raise FencedError(
                f"cannot {action}: this run holds writer term {term}, but the sink has since restarted (term "
                f"{current}). Another run owns the sink now; this one must stop."
            )

    def _check_home_term(self, term: int, action: str) -> None:
        if not self.store.readonly:
            self.store.home.check_term(term, action)

    @db_errors("read the size ratio")
    def bytes_per_log_byte(self) -> float | None:
        """Parquet bytes per log byte of the latest committed files; None before the first file is committed."""
        value, files = self.db.execute("SELECT bytes_per_log_byte, files_written FROM sink_config").fetchone()
        return float(value) if files else None

    # -- pending files -------------------------------------------------------------------------------

    @db_errors("pre-commit files")
    def precommit(self, files: Iterable[PlannedFile], term: int) -> None:
        """Record every planned file as pending, in one transaction, before any byte of them is written."""
        files = list(files)
        action = f"pre-commit {len(files)} files"
        self._check_term(term, action)
        if guards.on("precommit.home_term"):
            self._check_home_term(term, action)
        for f in files:  # durable in the home before the database, and so before any byte of the files
            self.store.home.write(file_path(f.name), _file_record(f, term))
        failpoint("filesink.precommit.home_written")
        if guards.on("precommit.home_term_after_record"):
            self._check_home_term(term, action)
        with self.db.atomic():
            self._check_term(term, action)
            for f in files:
                self._insert_pending(f, term)

    def _insert_pending(self, f: PlannedFile, term: int) -> None:
        self.db.execute(
            "INSERT INTO sink_files (name, state, vnode_lo, vnode_hi, end_epoch, rows, log_bytes, reason, "
            "created_at, term) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                f.name,
                FileState.PENDING.value,
                f.vnode_lo,
                f.vnode_hi,
                f.end_epoch,
                f.rows,
                f.log_bytes,
                f.reason,
                time.time(),
                term,
            ),
        )
        self.db.conn.executemany(
            "INSERT INTO sink_file_vnodes (name, vnode, start_epoch, end_epoch) VALUES (?, ?, ?, ?)",
            [(f.name, v, s, f.end_epoch) for v, s in sorted(f.starts.items())],
        )

    @db_errors("read the pending files")
    def pending(self) -> list[PlannedFile]:
        files = []
        for name, lo, hi, end, rows, log_bytes, reason in self.db.execute(
            "SELECT name, vnode_lo, vnode_hi, end_epoch, rows, log_bytes, reason FROM sink_files ORDER BY name"
        ).fetchall():
            starts = dict(
                self.db.execute("SELECT vnode, start_epoch FROM sink_file_vnodes WHERE name = ?", (name,)).fetchall()
            )
            files.append(PlannedFile(name, lo, hi, starts, end, rows, log_bytes, reason))
        return files

    def _resolve(self, f: PlannedFile, to: FileState) -> None:
        cursor = self.db.execute(
            "DELETE FROM sink_files WHERE name = ? AND state = ?", (f.name, FileState.PENDING.value)
        )
        if cursor.rowcount != 1:
            raise CommitConflictError(
                f"file {f.name} (vnodes {f.vnode_lo}..{f.vnode_hi}, epochs up to {f.end_epoch}) is no longer "
                f"pending, so it cannot become {to.value}: another writer or recovery resolved it first"
            )

    @db_errors("commit files")
    def commit(
        self, files: Iterable[PlannedFile], written_bytes: dict[str, int], idle_vnodes: Iterable[int], term: int
    ) -> None:
        """Mark files committed and advance their vnodes' truncate points, in one transaction.

        ``idle_vnodes`` (vnodes with nothing held) are truncated to the last sealed epoch at the same time, so
        that truncate points, and with them the log's metadata, keep up where there is no data.
        """
        files = list(files)
        if not files and not self._idle_behind(idle_vnodes):
            return  # nothing would change: no check, no transaction (one request less per batch on S3)
        action = f"commit {', '.join(f.name for f in files) or 'idle vnodes'}"
        if guards.on("commit.home_term"):
            self._check_home_term(term, action)
        with self.db.atomic():
            self._check_term(term, action)
            points: dict[int, int] = {}
            for f in files:
                self._resolve(f, FileState.COMMITTED)
                points.update(dict.fromkeys(range(f.vnode_lo, f.vnode_hi + 1), f.end_epoch))
            current = self.store.truncate_points()
            last = self.store.last_sealed_epoch
            for v in idle_vnodes:
                if v not in points and current[v] < last:
                    points[v] = last
            self.store.truncate({v: e for v, e in points.items() if e > current[v]})
            log_bytes = sum(f.log_bytes for f in files if f.name in written_bytes)
            if log_bytes:
                ratio = sum(written_bytes.values()) / log_bytes
                # The latest files' ratio: Parquet compresses better as files grow, so older, smaller files
                # would keep the estimate too high.
                self.db.execute(
                    "UPDATE sink_config SET files_written = files_written + ?, bytes_per_log_byte = ?",
                    (len(files), ratio),
                )
        if files:  # the truncation durable in the home before the records that let recovery re-derive it go
            self.store.publish_truncation()
            self._forget(files)

    def _idle_behind(self, idle_vnodes: Iterable[int]) -> bool:
        """Whether a commit would move the truncate point of any of ``idle_vnodes`` (to the last sealed epoch)."""
        current, last = self.store.truncate_points(), self.store.last_sealed_epoch
        return any(current[v] < last for v in idle_vnodes)

    def _forget(self, files: Iterable[PlannedFile]) -> None:
        if not self.store.readonly:
            self.store.home.delete_records(file_path(f.name) for f in files)

    @db_errors("drop a file")
    def drop(self, f: PlannedFile, term: int) -> None:
        if guards.on("drop.home_term"):
            self._check_home_term(term, f"drop {f.name}")
        with self.db.atomic():
            self._check_term(term, f"drop {f.name}")
            self._resolve(f, FileState.DROPPED)
        self._forget([f])

    @db_errors("take the pending files from the durable home")
    def sync_pending(self) -> list[str]:
        """Add the pending files the durable home records and the database lacks (a crash between the two, or a
        rebuilt database). One the database holds and the home does not (resolved by a later run elsewhere, or
        pre-committed before the sink had a durable home) stays: recovery resolves it by visibility, which is
        right either way. Returns the names taken from the home."""
        recorded = {}
        for relpath, record in self.store.home.records(FILES).items():
            if relpath.endswith(".json"):
                recorded[str(record["name"])] = record
        have = set(self.pending_names())
        added = [recorded[n] for n in sorted(set(recorded) - have)]
        with self.db.atomic():
            for r in added:
                self._insert_pending(_planned(r), int(r.get("term", 0)))
        return [str(r["name"]) for r in added]


def _file_record(f: PlannedFile, term: int) -> dict[str, object]:
    """A pre-commit record for the durable home."""
    return {
        "name": f.name,
        "vnode_lo": f.vnode_lo,
        "vnode_hi": f.vnode_hi,
        "starts": [[v, s] for v, s in sorted(f.starts.items())],
        "end_epoch": f.end_epoch,
        "rows": f.rows,
        "log_bytes": f.log_bytes,
        "reason": f.reason,
        "term": term,
    }


def _planned(record: dict[str, object]) -> PlannedFile:
    starts = {int(v): int(e) for v, e in record["starts"]}  # type: ignore[attr-defined]
    return PlannedFile(
        str(record["name"]),
        int(record["vnode_lo"]),  # type: ignore[call-overload]
        int(record["vnode_hi"]),  # type: ignore[call-overload]
        starts,
        int(record["end_epoch"]),  # type: ignore[call-overload]
        int(record["rows"]),  # type: ignore[call-overload]
        int(record["log_bytes"]),  # type: ignore[call-overload]
        str(record["reason"]),
    )
