"""A Delta table's log, read and appended to without delta-rs's snapshot: what a commit of the sink needs to know
(the newest version, the application transactions, the protocol and the metadata), never the table's file list.

delta-rs (1.6) materializes every active file of a table in each snapshot it holds, and a commit through it
advances that snapshot, so its commits and its table opening grow with the files in the table. The sink needs
far less: per vnode, its application transaction's version. :class:`DeltaLog` keeps only that:

- **Reading** (:meth:`DeltaLog.load`): ``_delta_log/_last_checkpoint`` names a checkpoint; its Parquet file(s) are
  read for the ``txn``, ``protocol`` and ``metaData`` columns only, then the JSON entries after it, one version
  after the other until the next is absent. The file is only a hint (a newer checkpoint may exist, and a clean-up
  after it may have removed entries), so where the next entry is absent the end must be shown to be the end
  (:meth:`DeltaLog._confirmed`); what cannot be shown so is listed (below). Without ``_last_checkpoint`` the log is
  listed for the newest checkpoint (none: the entries from version 0). :meth:`DeltaLog.refresh` reads the entries
  after the newest one read, with the same care.
- **Why not list at every start**: on local disk a listing reads the whole directory, every entry within the log
  retention (30 days: 10,000 entries after 10,000 rolls, 5 ms), so a start grew with the log's length. Entries are
  contiguous (every writer creates ``<v>.json`` only if absent, after reading ``<v-1>``), so reading on from the
  checkpoint finds every entry but those a clean-up removed; on S3 the listing starts after the checkpoint's name
  (``StartAfter``): one request whatever the log's length, which also shows a newer checkpoint, so S3 keeps it.
- **Writing** (:meth:`DeltaLog.put`): a commit is the newline-delimited JSON entry ``<version %020d>.json``,
  created only if absent (local disk: a hard link of a fsynced temp file; S3: a PUT with ``If-None-Match: *``), as
  the Delta protocol requires of every writer. Who loses the race for a version reads the winner and decides
  (:class:`filesink.destination.delta.DeltaDestination`).
- **What is honoured** (:func:`unsupported`): the tables delta-rs creates for the sink (reader 1 / writer 2, or
  reader 3 / writer 7 with ``timestampNtz``), and ``appendOnly``, which an append honours. A table with anything
  else a writer must do (column invariants, check constraints, generated or identity columns, column mapping, row
  tracking, change data feed, deletion vectors, in-commit timestamps, ...) is committed to through delta-rs.

Checkpoints and log clean-up stay delta-rs's (``DeltaTable.create_checkpoint``, ``cleanup_metadata``): the sink
runs a checkpoint every ``delta.checkpointInterval`` versions and the clean-up at every 10th checkpoint
(:meth:`filesink.destination.delta.DeltaDestination.maintain`).
"""

from __future__ import annotations

import io
import json
import os
import re
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import pyarrow.parquet as pq

from logstore.storage import FsspecStorage, LocalStorage, LogLocation, PutAnswer, Storage

from .delta_actions import checkpoint_actions, protocol_shape

LOG_DIR = "_delta_log"
LAST_CHECKPOINT = "_last_checkpoint"
READER_FEATURES = frozenset({"timestampNtz"})
"""Reader features whose tables this reader reads right (a timestamp without zone changes nothing in the log)."""
WRITER_FEATURES = frozenset({"appendOnly", "invariants", "timestampNtz"})
"""Writer features this writer honours: ``appendOnly`` (it only adds files), ``invariants`` (only while no column
has one), ``timestampNtz``."""
PATH_SAFE = "/!$&'()+,-.:;=@_~"
"""The characters an ``add`` path keeps as they are; every other is percent-encoded (UTF-8), as delta-rs encodes
the paths it is given (the protocol's paths are URIs)."""
_CHECKPOINT = re.compile(r"^(\d{20})\.checkpoint(?:\.(\d{10})\.(\d{10}))?\.parquet$")
_ENTRY = re.compile(r"^(\d{20})\.json$")


LOAD_ATTEMPTS = 5
"""Times the log is listed and read again when it changed under the listing (:class:`_Moved`); and times a start
reads on from a newer checkpoint that ``_last_checkpoint`` named meanwhile, before it lists."""
DEFAULT_RETENTION = 30 * 86400.0
"""``delta.logRetentionDuration``'s default (30 days), in seconds."""
CLOCK_MARGIN = 3600.0
"""How far the clocks of the machines that write and clean the log (and of its store) may disagree, in seconds:
an entry is taken to be out of every clean-up's reach only while it is younger than the retention less this."""
_INTERVAL = re.compile(r"^\s*(?:interval\s+)?((?:\d+\s+[a-z]+\s*)+)$", re.IGNORECASE)
_UNITS = {
    "week": 7 * 86400.0,
    "day": 86400.0,
    "hour": 3600.0,
    "minute": 60.0,
    "second": 1.0,
    "millisecond": 1e-3,
    "microsecond": 1e-6,
    "nanosecond": 1e-9,
}


class _Moved(Exception):
    """The log changed under a listing: an entry listed was gone when read (a clean-up after a newer checkpoint),
    or the listing shows a gap (a listing of a local directory may miss an entry created while it runs, and show
    the next); list again."""


class UnsupportedLogError(Exception):
    """The log has something this reader does not read (a V2 checkpoint, a log whose first entries are gone
    without a checkpoint): the table is read and committed to through delta-rs."""


def retention(configuration: Mapping[str, str]) -> float:
    """``delta.logRetentionDuration`` in seconds (``interval 30 days``, ``interval 1 week 2 hours``, ...); 0 for a
    value this reader cannot parse (nothing is then taken to be out of a clean-up's reach)."""
    text = configuration.get("delta.logRetentionDuration")
    if text is None:
        return DEFAULT_RETENTION
    m = _INTERVAL.match(text)
    if m is None:
        return 0.0
    words = m.group(1).split()
    total = 0.0
    for count, unit in zip(words[::2], words[1::2], strict=True):
        seconds = _UNITS.get(unit.lower().removesuffix("s"))
        if seconds is None:
            return 0.0
        total += int(count) * seconds
    return total


def entry_name(version: int) -> str:
    return f"{version:020d}.json"


def add_path(key: str) -> str:
    """An object's key under the table's root as an ``add`` action's path (a relative URI)."""
    return quote(key, safe=PATH_SAFE)


@dataclass
class LogState:
    """What the sink knows of a Delta table's log: read up to ``version``."""

    version: int
    checkpoint: int | None = None
    """The version of the newest checkpoint known (None: none)."""
    txns: dict[str, int] = field(default_factory=dict)
    """Per application id, the version of its newest transaction."""
    protocol: dict[str, Any] = field(default_factory=dict)
    metadata: dict[str, Any] = field(default_factory=dict)
    metadata_at: int = 0
    """The version whose ``metaData`` action :attr:`metadata` is."""
    ended_at: float = 0.0
    """A wall-clock time (seconds) at which the entry after :attr:`version` was absent: every entry after
    :attr:`version` was written after it (0: unknown)."""

    def apply(self, version: int, actions: Iterable[Mapping[str, Any]]) -> None:
        """The actions of the entry at ``version`` (the next one after :attr:`version`)."""
        for action in actions:
            if "txn" in action:
                self.txns[str(action["txn"]["appId"])] = int(action["txn"]["version"])
            elif "protocol" in action:
                self.protocol = protocol_shape("protocol", action["protocol"])
            elif "metaData" in action:
                self.metadata = protocol_shape("metaData", action["metaData"])  # written back with a new column
                self.metadata_at = version
        self.version = version

    @property
    def configuration(self) -> dict[str, str]:
        return dict(self.metadata.get("configuration") or {})

    @property
    def partition_columns(self) -> list[str]:
        return list(self.metadata.get("partitionColumns") or [])

    def out_of_cleanup(self, written_after: float) -> bool:
        """Whether entries written after ``written_after`` are out of every clean-up's reach: a clean-up (delta-rs's,
        Delta Spark's) removes only entries older than the log retention, by their modification time."""
        return time.time() - written_after < retention(self.configuration) - CLOCK_MARGIN


def _has_invariants(schema: Any) -> bool:
    """Whether a Delta schema (parsed ``schemaString``) has a column with an invariant, at any depth."""
    if isinstance(schema, dict):
        if "delta.invariants" in (schema.get("metadata") or {}):
            return True
        return any(_has_invariants(v) for v in schema.values())
    if isinstance(schema, list):
        return any(_has_invariants(v) for v in schema)
    return False


def unsupported_reader(state: LogState) -> str | None:
    """Why this reader cannot read the table's log right (None: it can)."""
    reader = int(state.protocol.get("minReaderVersion", 1))
    features = set(state.protocol.get("readerFeatures") or ())
    if reader <= 1 or (reader == 3 and features <= READER_FEATURES):
        return None
    return f"reader version {reader}" + (f" with features {sorted(features)}" if features else "")


def unsupported(state: LogState) -> str | None:
    """Why this writer cannot commit to the table as the protocol requires (None: it can)."""
    reason = unsupported_reader(state)
    if reason is not None:
        return reason
    writer = int(state.protocol.get("minWriterVersion", 2))
    features = set(state.protocol.get("writerFeatures") or ())
    if writer > 2 and not (writer == 7 and features <= WRITER_FEATURES):
        return f"writer version {writer}" + (f" with features {sorted(features)}" if features else "")
    schema = state.metadata.get("schemaString")
    if schema and _has_invariants(json.loads(schema)):
        return "a column with an invariant (delta.invariants), which this writer does not check"
    return None


class DeltaLog:
    """The ``_delta_log`` directory of the table at ``url`` (a local path or an fsspec URL, with the sink's
    storage options)."""

    def __init__(self, url: str, storage_options: Mapping[str, Any]) -> None:
        self.storage: Storage = LogLocation(f"{url.rstrip('/')}/{LOG_DIR}", dict(storage_options)).open()

    def display(self, name: str) -> str:
        return self.storage.display(name)

    def read_entry(self, version: int) -> list[dict[str, Any]] | None:
        """The actions of the entry at ``version``; None if there is none."""
        try:
            data = self.storage.read_all(entry_name(version))
        except FileNotFoundError:
            return None
        return [json.loads(line) for line in data.splitlines() if line.strip()]

    def refresh(self, state: LogState) -> list[tuple[int, list[dict[str, Any]]]]:
        """Read the entries after ``state.version`` into ``state``, until the next is absent; return them.

        An absent next entry is the log's end, unless a clean-up removed entries after ``state`` (older than the log
        retention, or another writer's shorter retention; a clean-up runs after a newer checkpoint): so
        ``_last_checkpoint`` is read, and if it names a newer checkpoint, or if ``state``'s end was last seen longer
        ago than the retention (``_last_checkpoint`` could have been set back since: every writer overwrites it),
        the log is read again (:meth:`load`). Without that an idle sink could take a removed version's name for its
        commit, which no reader would see."""
        read, ended = self._follow(state)
        hint = self._last_checkpoint()
        if (hint is not None and hint[0] > state.version) or not state.out_of_cleanup(state.ended_at):
            fresh = self.load()
            if fresh is None:
                raise UnsupportedLogError(f"{self.display('')} has a checkpoint hint and no entries")
            changed = {k: v for k, v in fresh.txns.items() if state.txns.get(k) != v}  # what the entries read held
            read.append((fresh.version, [{"txn": {"appId": k, "version": v}} for k, v in changed.items()]))
            state.__dict__.update(fresh.__dict__)
        else:
            state.ended_at = ended
        return read

    def _follow(self, state: LogState) -> tuple[list[tuple[int, list[dict[str, Any]]]], float]:
        """Read the entries after ``state.version`` until the next is absent; return them and the time just before
        the read that found none."""
        read: list[tuple[int, list[dict[str, Any]]]] = []
        while True:
            asked = time.time()
            actions = self.read_entry(state.version + 1)
            if actions is None:
                return read, asked
            state.apply(state.version + 1, actions)
            read.append((state.version, actions))

    def put(self, version: int, body: bytes) -> PutAnswer:
        """Create the entry at ``version`` only if absent: CREATED, EXISTS (another commit has the version), or
        REFUSED (the store has no conditional create: an S3 server that refuses ``If-None-Match``, or neither local
        disk nor S3)."""
        return self.storage.conditional_put(entry_name(version), body).answer

    def load(self) -> LogState | None:
        """The log's state at its newest version; None if the table has no log.

        On local disk (where a listing reads the whole directory) from the checkpoint ``_last_checkpoint`` names,
        read on until an entry is absent (:meth:`_probed`); elsewhere, or where that cannot show the log's end, the
        log is listed from the checkpoint's version (S3: the names after it only) for a newer checkpoint and the
        entries after the newest, which must follow it without a gap."""
        hint = self._last_checkpoint()
        if hint is not None and isinstance(self.storage, LocalStorage):
            state = self._probed(hint)
            if state is not None:
                return state
            hint = self._last_checkpoint()
        for attempt in range(LOAD_ATTEMPTS):
            try:
                return self._load(hint)
            except _Moved as e:
                if attempt + 1 == LOAD_ATTEMPTS:
                    raise UnsupportedLogError(f"{self.display('')}: {e}, {LOAD_ATTEMPTS} listings in a row") from None
                hint = self._last_checkpoint()
        return None  # not reached

    def _probed(self, hint: tuple[int, int | None]) -> LogState | None:
        """The log's state read from the checkpoint ``hint`` names and the entries after it, without a listing;
        None where the log must be listed.

        Reading on finds every entry after the checkpoint (they are contiguous) unless a clean-up removed some, and
        a clean-up removes entries only (1) below the version ``_last_checkpoint`` names when it starts (delta-rs's
        and Delta Spark's clean-ups both take their bound from it) and (2) older than the log retention. So where
        the next entry is absent, the end is confirmed (:meth:`_confirmed`) if ``_last_checkpoint``, read again,
        names no newer checkpoint (one that does is read from instead) and the newest entry read is younger than the
        retention (a later one, written after it, is then out of every clean-up's reach, even if a writer has set
        ``_last_checkpoint`` back since). A checkpoint that is gone (a clean-up after a newer one), a log idle for
        longer than the retention, or a hint that keeps moving: None."""
        for _ in range(LOAD_ATTEMPTS):
            try:
                state = self._read_checkpoint(*hint)
            except _Moved:
                return None
            _, ended = self._follow(state)
            again = self._last_checkpoint()
            if again is not None and again[0] > state.version:
                hint = again  # a newer checkpoint: a clean-up may have removed entries after the older one
                continue
            return state if self._confirmed(state, ended) else None
        return None

    def _confirmed(self, state: LogState, ended: float) -> bool:
        """Whether ``state``'s newest entry is young enough that no later one can have been cleaned up (local disk:
        its modification time); records when the end was seen."""
        try:
            written = os.stat(self.storage.root / entry_name(state.version)).st_mtime  # type: ignore[attr-defined]
        except (FileNotFoundError, AttributeError):
            return False  # the checkpoint's own entry is gone (cleaned up): list
        if not state.out_of_cleanup(written):
            return False
        state.ended_at = ended
        return True

    def _load(self, hint: tuple[int, int | None] | None) -> LogState | None:
        since = hint[0] if hint is not None else None
        listed_at = time.time()
        checkpoints: dict[int, tuple[int | None, set[int]]] = {}
        commits: list[int] = []
        for name in self._listed(since):
            m = _CHECKPOINT.match(name)
            if m is not None:
                total = int(m.group(3)) if m.group(3) else None
                checkpoints.setdefault(int(m.group(1)), (total, set()))[1].add(int(m.group(2) or 1))
                continue
            m = _ENTRY.match(name)
            if m is not None:
                commits.append(int(m.group(1)))
        complete = [v for v, (total, parts) in checkpoints.items() if len(parts) == (total or 1)]
        if since is not None:
            complete = [v for v in complete if v >= since]
        if complete:
            newest = max(complete)
            state = self._read_checkpoint(newest, checkpoints[newest][0])
        elif since is not None:
            raise UnsupportedLogError(f"{self.display(LAST_CHECKPOINT)} names checkpoint {since}, which is missing")
        elif not commits:
            return None
        elif min(commits) != 0:
            raise UnsupportedLogError(f"{self.display('')} has neither a checkpoint nor its first entry")
        else:
            state = LogState(-1)
        after = sorted(v for v in commits if v > state.version)
        if after != list(range(state.version + 1, state.version + 1 + len(after))):
            raise _Moved(f"the log has a gap in its entries after version {state.version}")
        for version in after:
            actions = self.read_entry(version)
            if actions is None:
                raise _Moved(f"entry {version} was listed and gone when read")
            state.apply(version, actions)
        self._follow(state)
        state.ended_at = listed_at  # an entry after the newest was not listed: written after the listing
        return state

    def _listed(self, since: int | None) -> list[str]:
        """The names in the log directory (from version ``since`` on where the store can list from a name)."""
        start = f"{since:020d}" if since is not None else ""
        if isinstance(self.storage, LocalStorage):
            try:
                names = os.listdir(self.storage.root)
            except FileNotFoundError:
                return []
            return [n for n in names if n >= start]
        if not isinstance(self.storage, FsspecStorage):
            raise UnsupportedLogError(f"{self.display('')}: a store the sink cannot list")
        fs, root = self.storage.fs, self.storage.root
        if self.storage._is_s3:
            bucket, key, _ = fs.split_path(root)
            prefix = f"{key}/"
            found: list[str] = []
            token: str | None = None
            while True:
                kwargs: dict[str, Any] = {"Bucket": bucket, "Prefix": prefix, "StartAfter": prefix + start}
                if token:
                    kwargs["ContinuationToken"] = token
                page = fs.call_s3("list_objects_v2", **kwargs)
                found += [str(o["Key"])[len(prefix) :] for o in page.get("Contents", [])]
                token = page.get("NextContinuationToken")
                if not page.get("IsTruncated") or not token:
                    return [n for n in found if "/" not in n]
        try:
            paths = fs.ls(root, detail=False, refresh=True)
        except FileNotFoundError:
            return []
        return [n for n in (str(p).rsplit("/", 1)[-1] for p in paths) if n >= start]

    def last_checkpoint(self) -> int | None:
        """The version ``_last_checkpoint`` names (None: there is none)."""
        hint = self._last_checkpoint()
        return hint[0] if hint is not None else None

    def _last_checkpoint(self) -> tuple[int, int | None] | None:
        try:
            hint = json.loads(self.storage.read_all(LAST_CHECKPOINT))
        except FileNotFoundError:
            return None
        if "v2Checkpoint" in hint:
            raise UnsupportedLogError(f"{self.display(LAST_CHECKPOINT)} names a V2 checkpoint")
        parts = hint.get("parts")
        return int(hint["version"]), int(parts) if parts else None

    def _read_checkpoint(self, version: int, parts: int | None) -> LogState:
        if parts:
            names = [f"{version:020d}.checkpoint.{i:010d}.{parts:010d}.parquet" for i in range(1, parts + 1)]
        else:
            names = [f"{version:020d}.checkpoint.parquet"]
        state = LogState(version, checkpoint=version, metadata_at=version)
        for name in names:
            state.apply(version, self._actions(name, ("txn", "protocol", "metaData")))
        if not state.metadata or not state.protocol:
            raise UnsupportedLogError(f"{self.display(names[0])} holds no metaData or protocol action")
        return state

    def _actions(self, name: str, columns: Sequence[str]) -> list[dict[str, Any]]:
        """The actions of some top-level columns of a checkpoint file, read alone (the ``add`` column, the table's
        file list, is never decoded), in the protocol's JSON shapes (:mod:`.delta_actions`)."""
        try:
            if isinstance(self.storage, LocalStorage):
                file = pq.ParquetFile(str(self.storage.root / name))
            else:
                file = pq.ParquetFile(io.BytesIO(self.storage.read_all(name)))
        except FileNotFoundError:
            raise _Moved(f"{name} was gone when read") from None  # a clean-up after a newer checkpoint removed it
        present = [c for c in columns if c in file.schema_arrow.names]
        return checkpoint_actions(file.read(columns=present))
