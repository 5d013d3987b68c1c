"""The log store: a durable queue of sealed epochs per vnode.

Segment files hold the rows (see :mod:`logstore.segment`); the state database records which segments each
sealed epoch consists of and, per vnode, the truncate point below which data has been released. Sealing an
epoch, moving truncate points and pruning metadata are each one SQLite transaction, and each can run inside a
larger transaction of the caller's (``db.atomic()`` nests as a savepoint).

:class:`LogStore` is the class users and the sink construct: its opening, the claim of its location and the writer
term are here; its steps are in rooms it inherits (see :mod:`logstore.storecore`): :mod:`logstore.seal`,
:mod:`logstore.reads`, :mod:`logstore.damaged`, :mod:`logstore.truncation`, :mod:`logstore.garbage`,
:mod:`logstore.rebuild`, :mod:`logstore.backlog`.
"""

from __future__ import annotations

import json
import sqlite3
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import sqlite_utils

from .append import AppendTarget, compression_for
from .backlog import Backlog
from .backlog import BacklogChanges as BacklogChanges
from .backlog import HeldTotals as HeldTotals
from .backlog import VnodeBacklog as VnodeBacklog
from .damaged import Damaged
from .damaged import DamagedSegment as DamagedSegment
from .damaged import GivenUp as GivenUp
from .errors import NoLogStoreError, StateMismatchError
from .garbage import Garbage
from .garbage import GarbageReport as GarbageReport
from .home import CLAIM_FILE, DurableHome
from .reads import Reads
from .rebuild import Rebuild
from .seal import Seal
from .statedb import (
    STATE_DB_NAME,
    apply_migrations,
    connect,
    connect_readonly,
    database_path,
    migrations,
    translated,
)
from .storage import LogLocation, is_local
from .storecore import NOTHING as NOTHING
from .storecore import REBUILD_NOTICE as REBUILD_NOTICE
from .storecore import RENEW_EVERY as RENEW_EVERY
from .storecore import log
from .truncation import Truncation

DEFAULT_VNODES = 256


class LogStore(Seal, Reads, Damaged, Garbage, Truncation, Rebuild, Backlog):
    """Driver-side handle on one log store and its state database: the one owner of the database connection and
    of every read and write of the ``log_*`` tables. SQLite errors surface as :class:`StateDatabaseError`."""

    def __init__(
        self,
        db: sqlite_utils.Database,
        location: LogLocation | str,
        *,
        vnodes: int | None = None,
        storage_options: Mapping[str, Any] | None = None,
        readonly: bool = False,
    ) -> None:
        if isinstance(location, str):
            location = LogLocation(location, dict(storage_options or {}))
        if vnodes is not None and not (isinstance(vnodes, int) and 0 < vnodes <= 2**15):
            raise ValueError(f"vnodes must be an integer from 1 to 32768, not {vnodes!r}")
        self.db = db
        self.db_path = database_path(db)
        self._db_named = (
            "a state database in memory" if str(self.db_path) == ":memory:" else f"the state database {self.db_path}"
        )
        self.location = location
        self.readonly = readonly
        self._where = f"log store {location.canonical}"
        with translated(self.db_path, f"open the {self._where}"):
            self._open(vnodes)

    def _open(self, vnodes: int | None) -> None:
        db, location = self.db, self.location
        if not self.readonly:
            apply_migrations(db, migrations, where=self._where)
        row = db.execute("SELECT sink_id, vnodes, location FROM log_store").fetchone()
        if row is None and self.readonly:
            raise NoLogStoreError(f"the state database {self.db_path} holds no log store")
        self.storage = location.open()
        self.home = DurableHome(self.storage)
        self.term: int | None = None
        """The writer term this handle seals, commits and deletes under (None: unfenced, tools and tests)."""
        self._renewed = time.monotonic()
        self.rebuilt = False
        """Whether the state database was new and took the sink's identity from the durable home."""
        self._published_points: dict[int, int] | None = None
        if row is None:
            claim = self._read_claim()
            if claim is not None and not isinstance(claim.get("vnodes"), int):
                claim = None
            if claim is not None:
                self.rebuilt = True
                row = (str(claim["sink_id"]), int(claim["vnodes"]), location.canonical)
                log.warning(
                    "%s holds sink %s but %s is new: rebuilding it from the durable home",
                    self._where,
                    row[0],
                    self._db_named,
                    extra={REBUILD_NOTICE: True},
                )
            else:
                row = (uuid.uuid4().hex, vnodes or DEFAULT_VNODES, location.canonical)
            with db.atomic():
                db.execute(
                    "INSERT INTO log_store (id, sink_id, vnodes, location, created_at) "
                    "VALUES (1, ?, ?, ?, datetime('now'))",
                    row,
                )
                db.conn.executemany("INSERT INTO log_vnodes (vnode) VALUES (?)", ((v,) for v in range(row[1])))
        sink_id, recorded_vnodes, recorded_location = row
        if vnodes is not None and vnodes != recorded_vnodes:
            raise StateMismatchError(
                f"{self._where}: the state database was created with {recorded_vnodes} vnodes, not {vnodes}. "
                "The vnode count is fixed when a sink is created; open it with vnodes="
                f"{recorded_vnodes} (or leave it unset), or use a new state directory."
            )
        if recorded_location != location.canonical:
            raise StateMismatchError(
                f"the state database belongs to the log store at {recorded_location}, not {location.canonical}. "
                "Open it with the location it was created with, or use a new state directory. If the log store was "
                "moved or copied there on purpose, record it with `filesink recover move-log-store --state-dir DIR "
                f"--log-store {location.canonical}`."
            )
        self.sink_id: str = sink_id
        self.vnodes: int = recorded_vnodes
        self.target = AppendTarget(location, self.vnodes, self.sink_id, compression=compression_for(location))
        if not self.readonly:
            self.check_claim()

    def _read_claim(self) -> dict[str, Any] | None:
        return self._claim_at(self.location)

    @classmethod
    def open(
        cls,
        state_dir: str | Path,
        location: str | None = None,
        *,
        vnodes: int | None = None,
        storage_options: Mapping[str, Any] | None = None,
        require_home: bool = False,
    ) -> LogStore:
        """Open the log store of ``state_dir`` (created on first use); segments default to ``state_dir/log``.

        A new state database takes the identity of the sink whose durable home is at the location, if there is
        one (see :meth:`sync_from_home`); with ``require_home``, there must be one."""
        path = Path(state_dir) / STATE_DB_NAME
        url = location or str(Path(state_dir) / "log")
        if require_home and cls._claim_at(LogLocation(url, dict(storage_options or {}))) is None:
            raise NoLogStoreError(f"{url} holds no sink's durable home (no {CLAIM_FILE})")
        with translated(str(path.absolute()), "open the state database"):
            db = connect(path)
        try:
            return cls(db, url, vnodes=vnodes, storage_options=storage_options)
        except BaseException:
            db.close()
            raise

    @classmethod
    def from_home(cls, location: str, *, storage_options: Mapping[str, Any] | None = None) -> LogStore:
        """The sink whose durable home is at ``location``, in a state database in memory (nothing is written
        to the home by opening it; :meth:`sync_from_home` with ``adopt=False`` fills the database)."""
        log_location = LogLocation(location, dict(storage_options or {}) if not is_local(location) else {})
        if cls._claim_at(log_location) is None:
            raise NoLogStoreError(f"{log_location.canonical} holds no sink's durable home (no {CLAIM_FILE})")
        db = sqlite_utils.Database(memory=True)
        try:
            return cls(db, log_location)
        except BaseException:
            db.close()
            raise

    @staticmethod
    def _claim_at(location: LogLocation) -> dict[str, Any] | None:
        try:
            data = location.open().read_all(CLAIM_FILE)
        except FileNotFoundError:
            return None
        try:
            value = json.loads(data)
        except ValueError:
            return None
        return value if isinstance(value, dict) and "sink_id" in value else None

    @classmethod
    def open_existing(
        cls, state_dir: str | Path, *, storage_options: Mapping[str, Any] | None = None, readonly: bool = False
    ) -> LogStore:
        """Open the log store a sink created in ``state_dir``, at the location it recorded. ``readonly`` opens the
        database for reading only (no migration, nothing written; works on a read-only state directory).

        Raises :class:`NoLogStoreError` if ``state_dir`` holds no state database or no log store."""
        path = Path(state_dir).absolute() / STATE_DB_NAME
        if not path.is_file():
            raise NoLogStoreError(f"{path.parent} holds no sink state: it has no {STATE_DB_NAME}")
        with translated(str(path), "open the state database"):
            db = connect_readonly(path) if readonly else connect(path)
        try:
            with translated(str(path), "read the log store's location"):
                tables = set(db.table_names())
                row = db.execute("SELECT location FROM log_store").fetchone() if "log_store" in tables else None
            if row is None:
                raise NoLogStoreError(f"the state database {path} holds no log store")
            location = str(row[0])
            options = storage_options if not is_local(location) else None
            return cls(db, location, storage_options=options, readonly=readonly)
        except BaseException:
            db.close()
            raise

    @staticmethod
    def recorded_location(state_dir: str | Path) -> str | None:
        """The location the log store of ``state_dir`` was created with (None if there is none), read-only."""
        path = Path(state_dir).absolute() / STATE_DB_NAME
        if not path.is_file():
            return None
        try:
            db = connect_readonly(path)
        except (OSError, sqlite3.Error):
            return None
        try:
            row = db.execute("SELECT location FROM log_store").fetchone()
        except sqlite3.Error:
            return None
        finally:
            db.close()
        return str(row[0]) if row else None

    def close(self) -> None:
        self.db.close()

    def writer_id(self, writer: str) -> str:
        """The writer id an append of this handle's term uses (the term leads, so a sweep of an older term
        never deletes a newer term's segments)."""
        return f"t{self.term}-{writer}" if self.term is not None else writer
