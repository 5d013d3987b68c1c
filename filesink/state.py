"""The file sink's tables in the sink's state database: its configuration and the pre-committed files.

A file is **pending** from pre-commit until recovery or the commit step resolves it. Both terminal states
delete its rows (the vnodes' truncate points then say everything), so the tables hold open work only:

- **committed**: the file is visible; its vnodes are truncated to its end epoch in the same transaction;
- **dropped**: the file is not visible; its vnodes keep their truncate points and the data is written again.

Each transition is a compare-and-swap on the pending row: if it is gone, another writer or recovery got
there first and :class:`CommitConflictError` is raised.

The **writer term** (fencing generation, :mod:`filesink.fencing`) goes up by one at every sink start and
every recovery run. Pre-commit and commit carry the term of the run that does them and are refused with
:class:`FencedError` once a newer term exists, so a run from before a restart cannot change state.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

import pyarrow as pa
import sqlite_utils
from sqlite_utils.migrations import Migrations

from logstore import LogStore
from logstore.statedb import apply_migrations

from .errors import CommitConflictError, FencedError, SinkOptionError
from .writer import FileTask

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


class SinkState:
    """Reads and changes the file sink's tables; every multi-row change is one transaction."""

    def __init__(self, store: LogStore) -> None:
        self.store = store
        self.db = store.db
        apply_migrations(self.db, migrations, where=f"sink state of {store.location.canonical}")

    # -- configuration -------------------------------------------------------------------------------

    def check_config(self, output: str, key_columns: list[str] | None, partition_by: list[str]) -> None:
        """Record the sink's identity at creation; later, refuse a different output, keys or partitioning."""
        row = self.db.execute("SELECT output, key_columns, partition_by FROM sink_config").fetchone()
        keys = json.dumps(key_columns)
        parts = json.dumps(partition_by)
        if row is None:
            with self.db.atomic():
                self.db.execute(
                    "INSERT INTO sink_config (id, output, key_columns, partition_by, created_at) "
                    "VALUES (1, ?, ?, ?, datetime('now'))",
                    (output, keys, parts),
                )
            return
        for what, recorded, given in (
            ("output path", row[0], output),
            ("key_columns", row[1], keys),
            ("partition_by", row[2], parts),
        ):
            if recorded != given:
                raise SinkOptionError(
                    f"the state directory belongs to a sink created with {what} {recorded}, not {given}. "
                    "A sink keeps these for life: use the original value, or a new state directory and output."
                )

    def spark_schema(self) -> str | None:
        value: str | None = self.db.execute("SELECT spark_schema FROM sink_config").fetchone()[0]
        return value

    def arrow_schema(self) -> bytes | None:
        """The Arrow schema files are written with (every field nullable): taken from the first held segment
        (every segment carries its schema) the first time it is asked for after a seal with rows, and recorded."""
        value: bytes | None = self.db.execute("SELECT arrow_schema FROM sink_config").fetchone()[0]
        if value is None:
            row = self.db.execute("SELECT schema_bytes FROM log_segments ORDER BY epoch, segment_id LIMIT 1").fetchone()
            if row is not None:
                value = nullable_schema(row[0])
                with self.db.atomic():
                    self.db.execute("UPDATE sink_config SET arrow_schema = COALESCE(arrow_schema, ?)", (value,))
        return value

    def pending_names(self) -> list[str]:
        """Names of the files pre-committed and not yet resolved (none while a healthy run is between rolls)."""
        return [r[0] for r in self.db.execute("SELECT name FROM sink_files WHERE state = 'pending' ORDER BY name")]

    def record_schema(self, spark_schema: str, arrow_schema: bytes | None) -> None:
        with self.db.atomic():
            self.db.execute(
                "UPDATE sink_config SET spark_schema = ?, arrow_schema = COALESCE(arrow_schema, ?)",
                (spark_schema, arrow_schema),
            )

    # -- writer terms ---------------------------------------------------------------------------------

    def term(self) -> int:
        value: int = self.db.execute("SELECT writer_term FROM sink_config").fetchone()[0]
        return value

    def new_term(self) -> int:
        """Take the next writer term (compare-and-swap); from now on, older terms are fenced."""
        with self.db.atomic():
            current = self.term()
            cursor = self.db.execute(
                "UPDATE sink_config SET writer_term = ? WHERE writer_term = ?", (current + 1, current)
            )
            if cursor.rowcount != 1:
                raise FencedError(f"writer term {current} changed while taking the next one; another run started")
        return current + 1

    def _check_term(self, term: int, action: str) -> None:
        current = self.term()
        if current != term:
            raise FencedError(
                f"cannot {action}: this run holds writer term {term}, but the sink has since restarted (term "
                f"{current}). Another run owns the sink now; this one must stop."
            )

    def file_task(
        self,
        f: PlannedFile,
        partition_by: Sequence[str],
        *,
        term: int,
        row_group_rows: int = 1_000_000,
        compression: str = "zstd",
    ) -> FileTask:
        """What a writer task needs to write ``f``: its read plan over the log store and the sink's schema."""
        schema = self.arrow_schema()
        assert schema is not None, "files are planned only once data, and so its schema, was sealed"
        return FileTask(
            name=f.name,
            log=self.store.target.location,
            plan=tuple(self.store.plan_read(f.after(), f.end_epoch)),
            schema_bytes=schema,
            partition_by=tuple(partition_by),
            row_group_rows=row_group_rows,
            compression=compression,
            term=term,
        )

    def bytes_per_log_byte(self) -> float | None:
        """Parquet bytes per log byte of the latest committed files; None before the first file is committed."""
        value, files = self.db.execute("SELECT bytes_per_log_byte, files_written FROM sink_config").fetchone()
        return float(value) if files else None

    # -- pending files -------------------------------------------------------------------------------

    def precommit(self, files: Iterable[PlannedFile], term: int) -> None:
        """Record every planned file as pending, in one transaction, before any byte of them is written."""
        files = list(files)
        with self.db.atomic():
            self._check_term(term, f"pre-commit {len(files)} files")
            for f in files:
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

    def commit(
        self, files: Iterable[PlannedFile], written_bytes: dict[str, int], idle_vnodes: Iterable[int], term: int
    ) -> None:
        """Mark files committed and advance their vnodes' truncate points, in one transaction.

        ``idle_vnodes`` (vnodes with nothing held) are truncated to the last sealed epoch at the same time, so
        that truncate points, and with them the log's metadata, keep up where there is no data.
        """
        files = list(files)
        with self.db.atomic():
            self._check_term(term, f"commit {', '.join(f.name for f in files) or 'idle vnodes'}")
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

    def drop(self, f: PlannedFile, term: int) -> None:
        with self.db.atomic():
            self._check_term(term, f"drop {f.name}")
            self._resolve(f, FileState.DROPPED)


def nullable_schema(schema_bytes: bytes) -> bytes:
    """A segment's serialized Arrow schema with every field nullable: the schema of the sink's files."""
    schema = pa.ipc.read_schema(pa.py_buffer(schema_bytes))
    nullable = pa.schema([f.with_nullable(True) for f in schema], metadata=schema.metadata)
    return bytes(nullable.serialize().to_pybytes())
