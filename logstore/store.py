"""The log store: a durable queue of sealed epochs per vnode.

Segment files hold the rows (see :mod:`logstore.segment`); the state database records which segments each
sealed epoch consists of and, per vnode, the truncate point below which data has been released. Sealing an
epoch, moving truncate points and pruning metadata are each one SQLite transaction, and each can run inside a
larger transaction of the caller's (``db.atomic()`` nests as a savepoint).
"""

from __future__ import annotations

import base64
import json
import logging
import re
import sqlite3
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import sqlite_utils

from . import guards, segment
from .append import AppendTarget, append_segment, compression_for
from .errors import (
    EpochNotSealedError,
    EpochOrderError,
    EpochSealedError,
    FencedError,
    LogStoreClaimedError,
    NoLogStoreError,
    SegmentCorruptError,
    SegmentError,
    SegmentMissingError,
    StateDivergedError,
    StateMismatchError,
    TruncatedRangeError,
    TruncateOrderError,
)
from .failpoints import failpoint
from .home import CLAIM_FILE, DurableHome, HomeView, given_up_path
from .reader import LogBatch, ReadItem, read_plan
from .segment import Block, SegmentDescriptor, VnodeRun, describe_vnodes
from .statedb import (
    STATE_DB_NAME,
    apply_migrations,
    connect,
    connect_readonly,
    database_path,
    db_errors,
    migrations,
    translated,
)
from .storage import LogLocation, is_local

DEFAULT_VNODES = 256
NOTHING = -1
RENEW_EVERY = 15.0
"""Seconds between renewals of a run's term record (``alive_at``) as it checks its term."""
"""The epoch value meaning "none yet" for last sealed epochs and truncate points."""
log = logging.getLogger(__name__)

REBUILD_NOTICE = "logstore_rebuild_notice"
"""Set (as ``extra``) on the log records that say a new state database is rebuilt from the durable home, so that
a caller that reports the rebuild itself (``filesink run``) can drop them."""

_WRITER_TERM = re.compile(r"^t(\d+)-")
"""Segment names of a sink's appends start with ``t<writer term>-`` (see :meth:`LogStore.writer_id`)."""


@dataclass(frozen=True)
class VnodeBacklog:
    """What a vnode holds above its truncate point."""

    vnode: int
    truncated_epoch: int
    rows: int
    bytes: int
    epochs: int
    """Number of sealed epochs with rows for this vnode above the truncate point."""
    first_epoch: int | None
    """Oldest such epoch (None when the vnode holds nothing)."""
    first_sealed_at: float | None
    """Unix time at which ``first_epoch`` was sealed."""


class BacklogChanges(NamedTuple):
    """One consistent read of what the planner's in-memory backlog needs (:meth:`LogStore.backlog_changes`)."""

    last_sealed_epoch: int
    truncate_points: dict[int, int]
    holding: set[int]
    """Vnodes that hold rows above their truncate points."""
    rows: list[tuple[int, int, int, int, float]]
    """``(vnode, epoch, rows, log bytes, sealed_at)`` per vnode and epoch: of every held epoch, or of the epochs
    sealed since the given one."""


class HeldTotals(NamedTuple):
    """What the log store holds above the truncate points, summed over every vnode."""

    rows: int
    bytes: int
    epochs: int
    first_epoch: int | None
    last_epoch: int | None


_BACKLOG_WHOLE = """
    SELECT sv.vnode, sv.epoch, SUM(sv.rows), SUM(sv.bytes), e.sealed_at
    FROM log_segment_vnodes sv
    JOIN log_vnodes v ON v.vnode = sv.vnode
    JOIN log_epochs e ON e.epoch = sv.epoch
    WHERE sv.epoch > v.truncated_epoch
    GROUP BY sv.vnode, sv.epoch
"""

# Through the held segments (one row each), then their vnode rows by index: CROSS JOIN keeps SQLite from
# scanning every vnode row instead.
_BACKLOG_SEALED_SINCE = """
    SELECT sv.vnode, s.epoch, SUM(sv.rows), SUM(sv.bytes), e.sealed_at
    FROM log_segments s
    CROSS JOIN log_segment_vnodes sv ON sv.segment_id = s.segment_id
    JOIN log_epochs e ON e.epoch = s.epoch
    WHERE s.epoch > ? AND s.epoch <= ?
    GROUP BY sv.vnode, s.epoch
"""

_HOLDING = """
    SELECT v.vnode FROM log_vnodes v
    WHERE EXISTS (SELECT 1 FROM log_segment_vnodes sv WHERE sv.vnode = v.vnode AND sv.epoch > v.truncated_epoch)
"""


class DamagedSegment(NamedTuple):
    """A held segment file that is missing or does not match its seal record."""

    name: str
    epoch: int
    vnodes: list[int]
    """The vnodes the sink still needs the segment for (above their truncate points): their data of this epoch
    in it cannot be read."""
    error: SegmentError
    rows: int = 0
    """The rows the segment holds for those vnodes."""


class GivenUp(NamedTuple):
    """A damaged segment the operator gave up (:meth:`LogStore.give_up`): its rows of ``vnodes`` for ``epoch``
    are not written to the output."""

    segment: str
    epoch: int
    vnodes: list[int]
    rows: int
    problem: str
    term: int
    given_up_at: float

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> GivenUp:
        pairs = [(int(v), int(n)) for v, n in record.get("vnodes", [])]
        return cls(
            str(record["segment"]),
            int(record["epoch"]),
            [v for v, _ in pairs],
            sum(n for _, n in pairs),
            str(record.get("problem", "")),
            int(record.get("term", 0)),
            float(record.get("given_up_at", 0.0)),
        )


@dataclass
class GarbageReport:
    """What :meth:`LogStore.collect_garbage` removed."""

    released_segments: int = 0
    """Sealed segments every vnode has truncated past."""
    orphan_segments: int = 0
    """Segment files no sealed epoch names (failed or duplicate task attempts, crashes before seal)."""
    temp_files: int = 0
    bytes_freed: int = 0
    epochs_pruned: int = 0


class LogStore:
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

    def check_claim(self) -> None:
        """Claim the log store's location for this sink (``sink.json`` at its root, created if missing, with a
        conditional create where the store has one), and raise :class:`LogStoreClaimedError` if it names another
        sink. Checked at every open and before every garbage sweep, so that a sink never deletes files of a log
        store it does not own."""
        record = json.dumps({"sink_id": self.sink_id, "vnodes": self.vnodes}, sort_keys=True).encode()
        try:
            data = self.storage.read_all(CLAIM_FILE)
        except FileNotFoundError:
            self.storage.create(CLAIM_FILE, record)
            data = self.storage.read_all(CLAIM_FILE)
        try:
            claimed = str(json.loads(data)["sink_id"])
        except (ValueError, KeyError, TypeError):
            claimed = f"unreadable claim {data[:80]!r}"
        if claimed != self.sink_id:
            raise LogStoreClaimedError(
                f"the {self._where} belongs to sink {claimed} (its {self.storage.display(CLAIM_FILE)}), not to this "
                f"sink {self.sink_id} (state database {self.db_path}). Two sinks cannot share a log store: their "
                "garbage collection would delete each other's segments. Nothing was written or deleted. Give this "
                "sink a log store location of its own (e.g. a subdirectory per sink), or open the sink that owns it."
            )

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

    # -- queries -------------------------------------------------------------------------------------

    @property
    @db_errors("read the last sealed epoch")
    def last_sealed_epoch(self) -> int:
        """The highest sealed epoch, or -1 if none."""
        value: int = self.db.execute("SELECT last_sealed_epoch FROM log_store").fetchone()[0]
        return value

    @db_errors("list the sealed epochs")
    def sealed_epochs(self) -> list[int]:
        """Sealed epochs still recorded (epochs below every truncate point are pruned by garbage collection)."""
        return [r[0] for r in self.db.execute("SELECT epoch FROM log_epochs ORDER BY epoch")]

    @db_errors("read the truncate points")
    def truncate_points(self) -> dict[int, int]:
        return dict(self.db.execute("SELECT vnode, truncated_epoch FROM log_vnodes ORDER BY vnode").fetchall())

    @db_errors("list the sealed segments")
    def segments(self, epoch: int | None = None) -> list[str]:
        """Names (relative to the log root) of the sealed segments still held, optionally for one epoch."""
        if epoch is None:
            return [r[0] for r in self.db.execute("SELECT name FROM log_segments ORDER BY name")]
        return [r[0] for r in self.db.execute("SELECT name FROM log_segments WHERE epoch = ? ORDER BY name", (epoch,))]

    @db_errors("read the backlog")
    def backlog(self) -> list[VnodeBacklog]:
        """Per vnode: rows, bytes and epochs held above its truncate point."""
        rows = self.db.execute(
            """
            SELECT b.*, (SELECT sealed_at FROM log_epochs e WHERE e.epoch = b.first_epoch) FROM (
                SELECT v.vnode, v.truncated_epoch, COALESCE(SUM(sv.rows), 0), COALESCE(SUM(sv.bytes), 0),
                       COUNT(DISTINCT sv.epoch), MIN(sv.epoch) AS first_epoch
                FROM log_vnodes v
                LEFT JOIN log_segment_vnodes sv ON sv.vnode = v.vnode AND sv.epoch > v.truncated_epoch
                GROUP BY v.vnode
            ) b ORDER BY b.vnode
            """
        ).fetchall()
        return [VnodeBacklog(*r) for r in rows]

    @db_errors("read the backlog's changes")
    def backlog_changes(self, since: int | None) -> BacklogChanges:
        """In one transaction: the last sealed epoch, the truncate points, the vnodes holding rows, and the held
        rows and bytes per (vnode, epoch) of every held epoch (``since`` None) or of the epochs sealed after
        ``since`` (which may include epochs some vnodes have released since: the caller filters)."""
        with self.db.atomic():
            last = self.last_sealed_epoch
            points = self.truncate_points()
            holding = {row[0] for row in self.db.execute(_HOLDING)}
            if since is None:
                rows = self.db.execute(_BACKLOG_WHOLE).fetchall()
            else:
                rows = self.db.execute(_BACKLOG_SEALED_SINCE, (since, last)).fetchall()
        return BacklogChanges(last, points, holding, rows)

    @db_errors("sum the backlog")
    def held_totals(self) -> HeldTotals:
        """Rows, bytes and epochs held above the vnodes' truncate points (sealed, not yet in committed files)."""
        row = self.db.execute(
            """
            SELECT COALESCE(SUM(sv.rows), 0), COALESCE(SUM(sv.bytes), 0), COUNT(DISTINCT sv.epoch),
                   MIN(sv.epoch), MAX(sv.epoch)
            FROM log_segment_vnodes sv LEFT JOIN log_vnodes v ON v.vnode = sv.vnode
            WHERE sv.epoch > COALESCE(v.truncated_epoch, -1)
            """
        ).fetchone()
        return HeldTotals(*row)

    @db_errors("read a held segment's schema")
    def first_segment_schema(self) -> bytes | None:
        """The serialized Arrow schema of the oldest held segment (every segment carries its schema), or None."""
        row = self.db.execute("SELECT schema_bytes FROM log_segments ORDER BY epoch, segment_id LIMIT 1").fetchone()
        return bytes(row[0]) if row is not None else None

    # -- append and seal -----------------------------------------------------------------------------

    def append(self, epoch: int, data: Any, *, writer_id: str = "driver") -> SegmentDescriptor | None:
        """Append from the driver (tasks call :func:`logstore.append_segment` with :attr:`target`)."""
        self._check_unsealed(epoch, "append to")
        return append_segment(self.target, epoch, data, writer_id=writer_id)

    def discard(self, epoch: int, descriptors: Iterable[SegmentDescriptor]) -> None:
        """Delete the segment files an append wrote for ``epoch`` that will not be sealed (its batch was refused).
        Best effort: a file left behind is unsealed garbage, which the next sweep removes."""
        self._check_unsealed(epoch, "discard segments of")
        for d in descriptors:
            try:
                self.storage.delete(d.name)
            except OSError as e:
                log.warning("could not delete segment %s of refused epoch %d: %s", d.name, epoch, e)

    @db_errors("check the epoch order")
    def _check_unsealed(self, epoch: int, action: str) -> None:
        last = self.last_sealed_epoch
        if epoch < last:
            raise EpochOrderError(
                f"cannot {action} epoch {epoch}: epoch {last} is already sealed in {self._where}, and epochs "
                "must increase. This happens when the query's checkpoint was reset or deleted, or when two "
                "queries write to one state directory; give the query a new state directory or restore its "
                "checkpoint."
            )
        if epoch == last:
            raise EpochSealedError(
                f"cannot {action} epoch {epoch}: it is already sealed in {self._where}. A replayed batch must "
                "skip its append (compare the batch id with last_sealed_epoch first)."
            )

    @db_errors("seal an epoch")
    def seal(self, epoch: int, descriptors: Iterable[SegmentDescriptor | None]) -> None:
        """Record ``epoch`` and its segments in one transaction: the checkpoint of the log store.

        Every descriptor must come from :func:`append_segment` for this epoch, and its file must be in the
        log store with the recorded size. Segments of the epoch that are not listed become garbage.
        """
        if epoch < 0:
            raise ValueError(f"epoch {epoch} is negative; epochs are Spark batch ids (0, 1, 2, ...)")
        descs = [d for d in descriptors if d is not None]
        self._check_unsealed(epoch, "seal")
        try:
            self._check_descriptors(epoch, descs)
        except SegmentError:  # a newer run's start sweeps a fenced run's unsealed segments: say that, not damage
            self.check_term(f"seal epoch {epoch}")
            raise
        sealed_at = time.time()
        # Durable in the home first, then fenced: a rebuild finds every epoch the database sealed, and a record a
        # fenced driver writes after the newer run read the home does not count (see logstore.home).
        self.home.write_epoch(epoch, self.term or 0, _epoch_record(descs, sealed_at))
        failpoint("logstore.seal.home_written")
        if guards.on("seal.term_after_home_record"):
            self.check_term(f"seal epoch {epoch}")
        with self.db.atomic():
            if guards.on("seal.order_under_transaction"):
                self._check_unsealed(epoch, "seal")  # again, under the write transaction
            self._insert_epoch(epoch, descs, sealed_at)
            failpoint("logstore.seal.before_commit")
        failpoint("logstore.seal.after_commit")

    def _insert_epoch(self, epoch: int, descs: list[SegmentDescriptor], sealed_at: float) -> None:
        self.db.execute(
            "INSERT INTO log_epochs (epoch, segments, rows, bytes, sealed_at) VALUES (?, ?, ?, ?, ?)",
            (epoch, len(descs), sum(d.rows for d in descs), sum(d.size for d in descs), sealed_at),
        )
        for d in descs:
            cursor = self.db.execute(
                "INSERT INTO log_segments (epoch, name, size, schema_block, schema_bytes) VALUES (?, ?, ?, ?, ?)",
                (epoch, d.name, d.size, json.dumps(d.schema.to_json()), d.schema_bytes),
            )
            segment_id = cursor.lastrowid
            self.db.conn.executemany(
                "INSERT INTO log_segment_vnodes (vnode, epoch, segment_id, rows, bytes, blocks) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                [
                    (r.vnode, epoch, segment_id, r.rows, r.bytes, json.dumps([b.to_json() for b in r.blocks]))
                    for r in d.runs
                ],
            )
        self.db.execute("UPDATE log_store SET last_sealed_epoch = MAX(last_sealed_epoch, ?)", (epoch,))

    def _check_descriptors(self, epoch: int, descs: list[SegmentDescriptor]) -> None:
        names = [d.name for d in descs]
        if len(set(names)) != len(names):
            dup = next(n for n in names if names.count(n) > 1)
            raise ValueError(f"seal of epoch {epoch}: segment {dup} is listed twice")
        prefix = segment.epoch_dir(epoch) + "/"
        for d in descs:
            if d.epoch != epoch or not d.name.startswith(prefix):
                raise ValueError(f"seal of epoch {epoch}: segment {d.name} was appended for epoch {d.epoch}")
            if d.sink_id != self.sink_id:
                raise ValueError(
                    f"seal of epoch {epoch}: segment {d.name} was appended for sink {d.sink_id!r}, "
                    f"not this one ({self.sink_id})"
                )
            bad = [v for v in d.vnodes if not 0 <= v < self.vnodes]
            if bad:
                raise ValueError(
                    f"seal of epoch {epoch}: segment {d.name} has vnodes {bad} outside 0..{self.vnodes - 1}"
                )
        if not descs:
            return
        present = dict(self.storage.list_files(segment.epoch_dir(epoch)))
        for d in descs:
            size = present.get(d.name)
            where = f"{self.storage.display(d.name)} (epoch {epoch}, vnodes {describe_vnodes(d.vnodes)})"
            if size is None:
                raise SegmentMissingError(f"cannot seal epoch {epoch}: segment {where} is not in the log store")
            if size != d.size:
                raise SegmentCorruptError(
                    f"cannot seal epoch {epoch}: segment {where} has {size} bytes, its writer recorded {d.size}"
                )

    # -- the durable home: terms, rebuild, truncation -------------------------------------------------

    def writer_id(self, writer: str) -> str:
        """The writer id an append of this handle's term uses (the term leads, so a sweep of an older term
        never deletes a newer term's segments)."""
        return f"t{self.term}-{writer}" if self.term is not None else writer

    def check_term(self, action: str) -> None:
        """Raise :class:`FencedError` if a newer run took a writer term (a no-op without a term); renew this run's
        term record now and then, so that ``filesink recover apply`` sees the owner is alive."""
        if self.term is None:
            return
        self.home.check_term(self.term, action)
        now = time.monotonic()
        if now - self._renewed >= RENEW_EVERY:
            self._renewed = now
            self.home.renew(self.term)

    @db_errors("bring the state database up to date with the durable home")
    def sync_from_home(self, *, adopt: bool = True) -> HomeView:
        """Make the database hold what the durable home holds: the epochs sealed there that it lacks (a crash
        between the two, or a new database: the rebuild), and the durable truncate points where they are ahead.

        With ``adopt`` (a run that took a new term), record the last sealed epoch as the term's base and delete
        epoch records that do not count. Returns what the home held."""
        view = self.home.view()
        given_up = self.home.given_up()
        gone = {str(r["segment"]) for r in given_up}
        last = self.last_sealed_epoch
        have = set(self._held_epochs())
        # An epoch this database took from a record that a newer term's seal replaced (its segments swept as
        # unsealed, the epoch sealed again): the record that counts now replaces it.
        replaced = [r for r in view.epochs if int(r["epoch"]) in have and self._replaced(r)]
        imported = [r for r in sorted(view.epochs, key=lambda r: int(r["epoch"])) if int(r["epoch"]) > last]
        imported = sorted(replaced + imported, key=lambda r: int(r["epoch"]))
        points = self.truncate_points()
        durable = {v: max(points.get(v, NOTHING), view.truncation.get(v, NOTHING)) for v in points}
        with self.db.atomic():
            for record in replaced:
                self._forget_epoch(int(record["epoch"]))
            for record in imported:
                epoch = int(record["epoch"])
                # Segments every vnode of which was released (committed) are deleted, or will be: not imported;
                # nor are segments the operator gave up (they must never be read again).
                held = [
                    d
                    for d in _descriptors(record)
                    if d.name not in gone and any(durable.get(v, NOTHING) < epoch for v in d.vnodes)
                ]
                self._insert_epoch(epoch, held, float(record.get("sealed_at", time.time())))
            known = {r[0] for r in self.db.execute("SELECT DISTINCT segment FROM log_given_up")}
            taken = [r for r in given_up if str(r["segment"]) not in known]
            for record in taken:  # given up in the home; the database did not record it (a crash, or a rebuild)
                self._apply_given_up(record)
            if view.base is not None:
                self.db.execute("UPDATE log_store SET last_sealed_epoch = MAX(last_sealed_epoch, ?)", (view.base,))
            last = self.last_sealed_epoch
            ahead = {v: min(e, last) for v, e in view.truncation.items() if v in points and min(e, last) > points[v]}
            self.db.conn.executemany(
                "UPDATE log_vnodes SET truncated_epoch = ? WHERE vnode = ?", [(e, v) for v, e in ahead.items()]
            )
        if taken:
            log.warning(
                "%s: took %d given-up segments from the durable home into %s (%s): they are never read again",
                self._where,
                len(taken),
                self._db_named,
                ", ".join(str(r["segment"]) for r in taken),
            )
        if imported:
            log.warning(
                "%s: took %d sealed epochs (%d to %d) from the durable home into %s",
                self._where,
                len(imported),
                int(imported[0]["epoch"]),
                int(imported[-1]["epoch"]),
                self._db_named,
                extra={REBUILD_NOTICE: True} if self.rebuilt else None,
            )
        if adopt and self.term is not None:
            counted = {int(r["epoch"]) for r in view.epochs}
            uncounted = [e for e in self._held_epochs() if e not in counted]
            if view.term is not None:
                # A run read the home and recorded its base: every epoch this database sealed (or took from the
                # home) in time has a record that counts, unless pruned once every vnode was durably truncated
                # past it. Any other held epoch was sealed, or adopted, by a run that no longer owned the sink;
                # its record may be gone already (deleted as stale by the newer run, its segments swept).
                floor = min((view.truncation.get(v, NOTHING) for v in self.truncate_points()), default=NOTHING)
                diverged = [e for e in uncounted if e > floor]
                if diverged and guards.on("start.diverged_state"):
                    raise StateDivergedError(
                        f"the state database {self.db_path} holds sealed epochs {describe_vnodes(diverged)} that "
                        f"the durable home at {self.location.canonical} does not count: a newer run (term "
                        f"{view.term}) read the home before this state took them, so a run that no longer owned "
                        "the sink sealed or adopted them. Nothing was changed. Move this state directory away and "
                        "start the sink with an empty one: it is rebuilt from the durable home, and the query's "
                        "checkpoint tells whether those batches run again."
                    )
            else:  # no run recorded a base: epochs sealed before the sink had a durable home, made durable now
                for epoch in uncounted:
                    self.home.write_epoch(epoch, self.term, _epoch_record(*self._epoch_rows(epoch)))
            self.home.record_base(self.term, last)
            if guards.on("start.term_before_clean"):
                self.check_term("clean the durable home")  # a fenced run deletes nothing a newer one may be reading
            self.home.delete_records(view.stale_records)
            self.home.prune_terms(keep_from=self.term)
            self.home.compact_truncation(self.term, self.truncate_points())
            self._published_points = self.truncate_points()
        return view

    def _replaced(self, record: Mapping[str, Any]) -> bool:
        """Whether the database holds segments of the record's epoch that the record does not name."""
        names = {d.name for d in _descriptors(record)}
        return any(name not in names for name in self.segments(int(record["epoch"])))

    def _forget_epoch(self, epoch: int) -> None:
        self.db.execute(
            "DELETE FROM log_segment_vnodes WHERE segment_id IN (SELECT segment_id FROM log_segments WHERE epoch = ?)",
            (epoch,),
        )
        self.db.execute("DELETE FROM log_segments WHERE epoch = ?", (epoch,))
        self.db.execute("DELETE FROM log_epochs WHERE epoch = ?", (epoch,))

    def _held_epochs(self) -> list[int]:
        return [r[0] for r in self.db.execute("SELECT epoch FROM log_epochs ORDER BY epoch")]

    def _epoch_rows(self, epoch: int) -> tuple[list[SegmentDescriptor], float]:
        """What the database holds of a sealed epoch, as descriptors (the inverse of :meth:`_insert_epoch`)."""
        sealed_at = self.db.execute("SELECT sealed_at FROM log_epochs WHERE epoch = ?", (epoch,)).fetchone()[0]
        descs = []
        for segment_id, name, size, schema_block, schema_bytes in self.db.execute(
            "SELECT segment_id, name, size, schema_block, schema_bytes FROM log_segments WHERE epoch = ? ORDER BY name",
            (epoch,),
        ).fetchall():
            runs = tuple(
                VnodeRun(vnode, tuple(map(Block.from_json, json.loads(blocks))))
                for vnode, blocks in self.db.execute(
                    "SELECT vnode, blocks FROM log_segment_vnodes WHERE segment_id = ? ORDER BY vnode", (segment_id,)
                )
            )
            block = Block.from_json(json.loads(schema_block))
            descs.append(SegmentDescriptor(name, epoch, size, block, bytes(schema_bytes), runs, self.sink_id))
        return descs, float(sealed_at)

    def publish_truncation(self) -> None:
        """Make the database's truncate points durable in the home (term-checked), if they moved since."""
        if self.readonly:
            return
        points = self.truncate_points()
        if points == self._published_points:
            return
        if guards.on("truncation.term"):
            self.check_term("record truncate points")
        self.home.write_truncation(self.term or 0, points)
        self._published_points = points

    def _prune_home(self) -> None:
        """Delete epoch records every vnode has truncated past (durably), except the last sealed epoch's."""
        points = self._published_points
        if not points:
            return
        floor, last = min(points.values()), self.last_sealed_epoch
        self.home.delete_records(p for e, p in self.home.epoch_records() if e <= floor and e < last)

    # -- read ----------------------------------------------------------------------------------------

    def read(self, vnodes: range, after_epoch: int, up_to_epoch: int) -> Iterator[LogBatch]:
        """Stream the rows of ``vnodes`` for the epochs in ``(after_epoch, up_to_epoch]``.

        Order: vnode, epoch, segment name, row. Memory is bounded by one block (see ``max_block_bytes``).
        Arguments are checked before this returns; a damaged segment raises :class:`SegmentError` naming the
        file, epoch and vnodes when its turn comes, never skipped.
        """
        if vnodes.step != 1 or vnodes.start < 0 or vnodes.stop > self.vnodes:
            raise ValueError(f"vnode range {vnodes} must be contiguous within 0..{self.vnodes - 1}")
        return read_plan(self.storage, self.plan_read(dict.fromkeys(vnodes, after_epoch), up_to_epoch))

    @db_errors("plan a read")
    def plan_read(self, after: Mapping[int, int], up_to_epoch: int) -> list[ReadItem]:
        """What to read for each vnode of ``after`` over ``(after[vnode], up_to_epoch]``, in read order.

        The plan is picklable and :func:`read_plan` executes it with the storage alone, so a Spark task can
        read without the state database.
        """
        last = self.last_sealed_epoch
        if up_to_epoch > last:
            raise EpochNotSealedError(
                f"cannot read up to epoch {up_to_epoch}: the last sealed epoch of {self._where} is {last}"
            )
        points = self.truncate_points()
        released = []
        for vnode, after_epoch in sorted(after.items()):
            if vnode not in points:
                raise ValueError(f"vnode {vnode} is outside 0..{self.vnodes - 1}")
            if after_epoch > up_to_epoch:
                raise ValueError(f"read of epochs ({after_epoch}, {up_to_epoch}]: the range is reversed")
            if points[vnode] > after_epoch:
                released.append((vnode, after_epoch, points[vnode]))
        if released:
            shown = ", ".join(f"vnode {v} after epoch {a}: truncated up to epoch {t}" for v, a, t in released[:5])
            raise TruncatedRangeError(
                f"cannot read from {self._where}: that data was already released by truncation ({shown}"
                f"{', ...' if len(released) > 5 else ''}); read after each vnode's truncate point instead"
            )
        plan: list[ReadItem] = []
        segment_vnodes: dict[int, tuple[int, ...]] = {}
        for vnode, after_epoch in sorted(after.items()):
            for epoch, segment_id, name, schema_bytes, blocks_json in self.db.execute(
                """
                SELECT sv.epoch, s.segment_id, s.name, s.schema_bytes, sv.blocks
                FROM log_segment_vnodes sv JOIN log_segments s ON s.segment_id = sv.segment_id
                WHERE sv.vnode = ? AND sv.epoch > ? AND sv.epoch <= ?
                ORDER BY sv.epoch, s.name
                """,
                (vnode, after_epoch, up_to_epoch),
            ).fetchall():
                if segment_id not in segment_vnodes:
                    segment_vnodes[segment_id] = tuple(
                        r[0]
                        for r in self.db.execute(
                            "SELECT vnode FROM log_segment_vnodes WHERE segment_id = ? ORDER BY vnode", (segment_id,)
                        )
                    )
                blocks = tuple(map(Block.from_json, json.loads(blocks_json)))
                plan.append(ReadItem(vnode, epoch, name, segment_vnodes[segment_id], schema_bytes, blocks))
        return plan

    def _describe_segment(self, segment_id: int, name: str, epoch: int) -> Callable[[], str]:
        def describe() -> str:
            vnodes = [
                r[0]
                for r in self.db.execute(
                    "SELECT vnode FROM log_segment_vnodes WHERE segment_id = ? ORDER BY vnode", (segment_id,)
                )
            ]
            return f"{self.storage.display(name)} (epoch {epoch}, vnodes {describe_vnodes(vnodes)})"

        return describe

    @db_errors("verify the held segments")
    def damaged(
        self,
        progress: Callable[[int, int], None] | None = None,
        *,
        quick: bool = False,
        after: Mapping[int, int] | None = None,
        up_to: int | None = None,
    ) -> list[DamagedSegment]:
        """The held segments the sink still needs that are missing or do not match their seal records.

        A segment is needed for the vnodes whose truncate point (or ``after[vnode]``, where that is higher: say,
        the end epoch of a pending file about to be committed) is below its epoch; a segment needed for none is
        not checked (garbage collection deletes it). Each segment is read whole, and its size and the CRC-32 of
        every block of those vnodes checked against the seal's records: what a read checks (a damaged footer
        stops nothing; :meth:`verify` finds it). With ``quick`` the log store is only listed and names and sizes
        compared (that finds missing and truncated files, not changed bytes). ``up_to`` limits the check to
        segments of epochs up to it. ``progress(done, total)`` is called after each segment checked.
        """
        points = self.truncate_points()
        for vnode, epoch in (after or {}).items():
            points[vnode] = max(points.get(vnode, NOTHING), epoch)
        candidates = self.db.execute(
            """
            SELECT s.segment_id, s.name, s.epoch, s.size FROM log_segments s
            WHERE s.epoch <= ? AND EXISTS (
                SELECT 1 FROM log_segment_vnodes sv JOIN log_vnodes v ON v.vnode = sv.vnode
                WHERE sv.segment_id = s.segment_id AND sv.epoch > v.truncated_epoch)
            ORDER BY s.epoch, s.name
            """,
            (self.last_sealed_epoch if up_to is None else up_to,),
        ).fetchall()

        def needed(segment_id: int) -> list[tuple[int, int]]:
            """The segment's (vnode, rows) for the vnodes that still need it."""
            return [
                (vnode, rows)
                for vnode, epoch, rows in self.db.execute(
                    "SELECT vnode, epoch, rows FROM log_segment_vnodes WHERE segment_id = ? ORDER BY vnode",
                    (segment_id,),
                )
                if epoch > points.get(vnode, NOTHING)
            ]

        segments = [row for row in candidates if needed(row[0])] if after else candidates
        present = dict(self.storage.list_files()) if quick and segments else {}
        found: list[DamagedSegment] = []
        for i, (segment_id, name, epoch, size) in enumerate(segments, 1):
            where = self._describe_segment(segment_id, name, epoch)
            problem: SegmentError | None = None
            if quick:
                if name not in present:
                    problem = SegmentMissingError(f"{where()}: the segment file of a sealed epoch is missing")
                elif present[name] != size:
                    problem = SegmentCorruptError(f"{where()}: {present[name]} bytes, sealed with {size}")
            else:
                try:
                    data = self.storage.read_all(name)
                except FileNotFoundError:
                    problem = SegmentMissingError(f"{where()}: the segment file of a sealed epoch is missing")
                else:
                    problem = self._block_problem(segment_id, data, size, points, where)
            if problem is not None:
                vnode_rows = needed(segment_id)
                found.append(
                    DamagedSegment(name, epoch, [v for v, _ in vnode_rows], problem, sum(n for _, n in vnode_rows))
                )
            if progress is not None:
                progress(i, len(segments))
        return found

    def _block_problem(
        self, segment_id: int, data: bytes, size: int, points: Mapping[int, int], where: Callable[[], str]
    ) -> SegmentError | None:
        """What keeps the blocks of a segment's needed vnodes (as its seal recorded them: reads never use the
        file's own footer) from being read back from ``data``, or None."""
        if len(data) != size:
            return SegmentCorruptError(f"{where()}: {len(data)} bytes, sealed with {size}")
        for vnode, epoch, blocks in self.db.execute(
            "SELECT vnode, epoch, blocks FROM log_segment_vnodes WHERE segment_id = ? ORDER BY vnode", (segment_id,)
        ):
            if epoch <= points.get(vnode, NOTHING):
                continue
            for block in map(Block.from_json, json.loads(blocks)):
                problem = segment.block_problem(data[block.offset : block.offset + block.length], block)
                if problem:
                    return SegmentCorruptError(f"{where()}: vnode {vnode}: {problem}")
        return None

    @db_errors("verify the held segments")
    def verify(self) -> list[SegmentError]:
        """Read every held segment file whole and check all of it (magic, footer, every block) against its seal
        record; return the problems. Stricter than :meth:`damaged`, which checks only what the sink reads."""
        problems: list[SegmentError] = []
        for segment_id, name, epoch, size in self.db.execute(
            "SELECT segment_id, name, epoch, size FROM log_segments ORDER BY epoch, name"
        ).fetchall():
            where = self._describe_segment(segment_id, name, epoch)
            try:
                data = self.storage.read_all(name)
            except FileNotFoundError:
                problems.append(SegmentMissingError(f"{where()}: the segment file of a sealed epoch is missing"))
                continue
            try:
                if len(data) != size:
                    raise SegmentCorruptError(f"{where()}: {len(data)} bytes, sealed with {size}")
                segment.parse_file(data, where=where())
            except SegmentCorruptError as e:
                problems.append(e)
            except (ValueError, KeyError, TypeError) as e:  # a footer that parses but is not one of ours
                problems.append(SegmentCorruptError(f"{where()}: unreadable footer ({e})"))
        return problems

    @db_errors("give up damaged segments")
    def give_up(self, damaged: Iterable[DamagedSegment]) -> list[GivenUp]:
        """Give up damaged segments for good: their rows of the vnodes they were still needed for are never read
        (nor written to the output); every other row is kept.

        The record of each is made durable in the home first (``home/given_up/``: a rebuild never takes the
        segment again), then one transaction records it in ``log_given_up`` and removes the segment from the
        sealed epoch (so no read plan names it; the file, if any, is garbage for the next sweep). Each step is
        safe to repeat: a run killed part way is finished by the next start (:meth:`sync_from_home` applies
        what the home records). Term-checked like a seal."""
        damaged = list(damaged)
        if not damaged:
            return []
        action = f"give up {len(damaged)} damaged log segments"
        self.check_term(action)
        now = time.time()
        records = []
        for d in damaged:
            rows = dict(
                self.db.execute(
                    "SELECT sv.vnode, sv.rows FROM log_segment_vnodes sv JOIN log_segments s "
                    "ON s.segment_id = sv.segment_id WHERE s.name = ?",
                    (d.name,),
                ).fetchall()
            )
            records.append(
                {
                    "segment": d.name,
                    "epoch": d.epoch,
                    "vnodes": [[v, int(rows.get(v, 0))] for v in d.vnodes],
                    "problem": str(d.error),
                    "term": self.term or 0,
                    "given_up_at": now,
                }
            )
        for record in records:
            self.home.write_given_up(record)
        failpoint("logstore.give_up.home_written")
        try:
            self.check_term(action)
        except FencedError:  # a newer run owns the sink: this run's decision does not take effect
            for d in damaged:
                self.home.delete(given_up_path(d.epoch, d.name))
            raise
        with self.db.atomic():
            for record in records:
                self._apply_given_up(record)
            failpoint("logstore.give_up.before_commit")
        given = [GivenUp.from_record(r) for r in records]
        for g in given:
            log.warning(
                "%s: gave up the damaged segment %s (epoch %d): its %d rows of vnodes %s are not written to the "
                "output (%s)",
                self._where,
                self.storage.display(g.segment),
                g.epoch,
                g.rows,
                describe_vnodes(g.vnodes),
                g.problem,
            )
        return given

    def _apply_given_up(self, record: Mapping[str, Any]) -> None:
        """In the caller's transaction: record a given-up segment and remove it from its sealed epoch."""
        name = str(record["segment"])
        self.db.conn.executemany(
            "INSERT OR IGNORE INTO log_given_up (segment, vnode, epoch, rows, problem, term, given_up_at) "
            "VALUES (?, ?, ?, ?, ?, ?, ?)",
            [
                (
                    name,
                    int(v),
                    int(record["epoch"]),
                    int(n),
                    str(record.get("problem", "")),
                    int(record.get("term", 0)),
                    float(record.get("given_up_at", 0.0)),
                )
                for v, n in record.get("vnodes", [])
            ],
        )
        ids = [r[0] for r in self.db.execute("SELECT segment_id FROM log_segments WHERE name = ?", (name,))]
        for segment_id in ids:
            self.db.execute("DELETE FROM log_segment_vnodes WHERE segment_id = ?", (segment_id,))
            self.db.execute("DELETE FROM log_segments WHERE segment_id = ?", (segment_id,))

    @db_errors("list the given-up segments")
    def given_up(self) -> list[GivenUp]:
        """Every segment given up so far: what the state database records, and what the durable home records
        that it does not yet (a run killed between the two; the next start takes it)."""
        found: dict[str, GivenUp] = {}
        if "log_given_up" in self.db.table_names():
            for segment_name, epoch, vnode, rows, problem, term, at in self.db.execute(
                "SELECT segment, epoch, vnode, rows, problem, term, given_up_at FROM log_given_up "
                "ORDER BY epoch, segment, vnode"
            ):
                g = found.get(segment_name)
                if g is None:
                    found[segment_name] = GivenUp(segment_name, epoch, [vnode], rows, problem, term, at)
                else:
                    found[segment_name] = g._replace(vnodes=[*g.vnodes, vnode], rows=g.rows + rows)
        for record in self.home.given_up():
            g = GivenUp.from_record(record)
            found.setdefault(g.segment, g)
        return sorted(found.values(), key=lambda g: (g.epoch, g.segment))

    # -- truncate and garbage collection -------------------------------------------------------------

    @db_errors("truncate")
    def truncate(self, points: Mapping[int, int]) -> None:
        """Release, per vnode, every epoch up to and including the given one (one transaction)."""
        with self.db.atomic():
            last = self.last_sealed_epoch
            current = self.truncate_points()
            for vnode, epoch in points.items():
                if vnode not in current:
                    raise ValueError(f"truncate: vnode {vnode} is outside 0..{self.vnodes - 1}")
                if epoch > last:
                    raise EpochNotSealedError(
                        f"cannot truncate vnode {vnode} to epoch {epoch}: the last sealed epoch of "
                        f"{self._where} is {last}"
                    )
                if epoch < current[vnode]:
                    raise TruncateOrderError(
                        f"cannot truncate vnode {vnode} to epoch {epoch}: it is already truncated to epoch "
                        f"{current[vnode]}, and truncate points only move forward"
                    )
            self.db.conn.executemany(
                "UPDATE log_vnodes SET truncated_epoch = ? WHERE vnode = ?",
                [(epoch, vnode) for vnode, epoch in points.items()],
            )
            failpoint("logstore.truncate.before_commit")

    @db_errors("collect garbage")
    def collect_garbage(self, *, sweep: bool = True, unsealed: bool = False) -> GarbageReport:
        """Delete segments no vnode needs any more, and prune their metadata.

        - Released segments (every vnode in them truncated past their epoch) lose their metadata in one
          transaction, then their files.
        - With ``sweep``, the log store is listed and files that no sealed epoch names are deleted: temp
          files and orphan segments of epochs up to the last sealed one.
        - With ``unsealed`` as well, files of epochs above the last sealed one are deleted too. Only do this
          when no append can be running (at start-up, before the query runs): those files may belong to the
          epoch being appended right now.
        """
        report = GarbageReport()
        if sweep:
            self.publish_truncation()
        with self.db.atomic():
            released = self.db.execute(
                """
                SELECT s.segment_id, s.name, s.size FROM log_segments s
                WHERE NOT EXISTS (
                    SELECT 1 FROM log_segment_vnodes sv JOIN log_vnodes v ON v.vnode = sv.vnode
                    WHERE sv.segment_id = s.segment_id AND sv.epoch > v.truncated_epoch)
                """
            ).fetchall()
            self.db.conn.executemany("DELETE FROM log_segments WHERE segment_id = ?", [(r[0],) for r in released])
            cursor = self.db.execute(
                """
                DELETE FROM log_epochs
                WHERE epoch <= (SELECT MIN(truncated_epoch) FROM log_vnodes)
                  AND NOT EXISTS (SELECT 1 FROM log_segments s WHERE s.epoch = log_epochs.epoch)
                """
            )
            report.epochs_pruned = cursor.rowcount
        failpoint("logstore.gc.after_metadata")
        if released and guards.on("gc.term"):
            self.check_term("delete released segments")
        self.storage.delete_many([name for _, name, _ in released])
        report.released_segments += len(released)
        report.bytes_freed += sum(size for _, _, size in released)
        if sweep:
            self.check_claim()
            if guards.on("gc.term"):
                self.check_term("sweep the log store")
            self._sweep(report, unsealed=unsealed)
            self._prune_home()
        return report

    @db_errors("look for garbage")
    def preview_garbage(self, *, unsealed: bool = True) -> GarbageReport:
        """What :meth:`collect_garbage` (with ``sweep``) would remove now, without removing anything."""
        report = GarbageReport()
        for (size,) in self.db.execute(
            """
            SELECT s.size FROM log_segments s
            WHERE NOT EXISTS (
                SELECT 1 FROM log_segment_vnodes sv JOIN log_vnodes v ON v.vnode = sv.vnode
                WHERE sv.segment_id = s.segment_id AND sv.epoch > v.truncated_epoch)
            """
        ):
            report.released_segments += 1
            report.bytes_freed += size
        self._sweep(report, unsealed=unsealed, delete=False)
        return report

    def _sweep(self, report: GarbageReport, *, unsealed: bool, delete: bool = True) -> None:
        last = self.last_sealed_epoch
        known = {r[0] for r in self.db.execute("SELECT name FROM log_segments")}
        for relpath, size in list(self.storage.list_files()):
            parsed = segment.parse_name(relpath)
            if parsed is None or relpath in known:
                continue  # not ours to delete, or sealed and still needed
            epoch, is_temp = parsed
            if epoch > last and not unsealed:
                continue  # may belong to an append in progress
            found = _WRITER_TERM.match(relpath.rsplit("/", 1)[-1].lstrip("."))
            if found and self.term is not None and int(found.group(1)) > self.term:
                continue  # a newer run's (this run is fenced and finds out at its next step)
            if not delete or self.storage.delete(relpath):
                report.bytes_freed += size
                if is_temp:
                    report.temp_files += 1
                else:
                    report.orphan_segments += 1
        if delete:
            self.storage.remove_empty_dirs(None if unsealed else last)


def _epoch_record(descs: list[SegmentDescriptor], sealed_at: float) -> dict[str, Any]:
    """An epoch's seal record for the durable home: everything :meth:`LogStore._insert_epoch` records."""
    return {
        "sealed_at": sealed_at,
        "segments": [
            {
                "name": d.name,
                "size": d.size,
                "sink_id": d.sink_id,
                "schema": d.schema.to_json(),
                "schema_bytes": base64.b64encode(d.schema_bytes).decode(),
                "runs": [[r.vnode, [b.to_json() for b in r.blocks]] for r in d.runs],
            }
            for d in descs
        ],
    }


def _descriptors(record: Mapping[str, Any]) -> list[SegmentDescriptor]:
    epoch = int(record["epoch"])
    return [
        SegmentDescriptor(
            name=str(s["name"]),
            epoch=epoch,
            size=int(s["size"]),
            schema=Block.from_json(s["schema"]),
            schema_bytes=base64.b64decode(s["schema_bytes"]),
            runs=tuple(VnodeRun(int(v), tuple(map(Block.from_json, blocks))) for v, blocks in s["runs"]),
            sink_id=str(s.get("sink_id", "")),
        )
        for s in record.get("segments", [])
    ]
