"""The durable home: what recovery needs, kept in the log store's location so that it outlives the driver.

The state database (in ``state_dir``) is the working copy; everything it holds that recovery needs is first
made durable here, so a sink started on another machine (or after its state directory was lost) rebuilds its
database from the home and recovers as usual. Under ``home/`` in the log store's location:

- ``terms/<T>.json``: one record per writer term, created only if absent (a conditional create) when a run
  starts. Once the run has read the home, it adds ``base``: the last sealed epoch it adopted; as it works, it
  renews ``alive_at`` (``filesink recover apply`` refuses while the owner is alive);
- ``epochs/<E>-<T>.json``: each sealed epoch's segment list, as term ``T`` sealed it, written before the database
  records the seal. Each term writes only its own names, so no run ever replaces another run's record (a
  read-then-replace raced a newer run's seal and lost it; ``tests/simulation/findings.md``, G). Records of
  earlier versions, ``epochs/<E>.json``, name their term inside and are read alike;
- ``truncated/<T>.json``: per vnode, the truncate point, written by term ``T`` after its commits; the durable
  truncate point of a vnode is the highest over these records (each is a fact: a file covering it is visible);
- ``files/<name>.json``: each pre-committed file, written before any byte of the file, deleted once the
  file is resolved and its truncation is durable (the file sink's ledger owns these);
- ``sink.json``: the file sink's configuration (output, keys, partitioning, schema, query id);
- ``given_up/<E>-<segment>.json``: a damaged segment of epoch ``E`` the operator gave up
  (``filesink recover apply --drop-damaged``): which vnodes' rows of ``E`` it held, how many, and why. Written
  before the state database drops the segment, never deleted: a rebuild never takes the segment again, and
  ``filesink recover status`` reports it for the sink's life.

**Ownership is one fact: the newest term record.** A run owns the sink from the moment it creates the record
of a term above every recorded one, until a newer one exists. Every fence check (seal, pre-commit, commit,
drop, truncation, sweep, give-up, and each file writer before it publishes) asks "is there a term record above
mine?" (one listing of ``terms/``); no pointer is compared, so nothing an older run writes moves ownership
back. Term records are pruned only below the pruning run's own term, so the newest always stays.
``writers/term``, a pointer earlier versions published, is read only as a lower bound for new terms.

**Which epoch records count.** A driver from before a restart may still write a record after the newer run
read the home (split brain). Let ``B`` be the newest term that recorded its base. A record of term ``B`` or
newer counts; a record of an older term counts only if its epoch is at most ``B``'s base: anything an older
term wrote above it came after the newer run read the home, and the newer run ignores it (and deletes it).
Where several records of one epoch count, the newest term's is the epoch's.
Every change a driver makes here is preceded and followed by a term check, so a fenced driver stops at its
next step. A store that does not create only if absent cannot host two runs: start-up probes it
(:mod:`logstore.conditional`).

Records are pruned with truncation: the home holds open work and the last sealed epoch, not history.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from . import guards
from .diagnosis import diagnose
from .errors import FencedError, HomeRecordError
from .storage import Storage, is_temp_name

log = logging.getLogger(__name__)

CLAIM_FILE = "sink.json"
"""At the log store's root: the id of the sink that owns the location. Two sinks never share a log store."""
HOME = "home"
TERMS = f"{HOME}/terms"
EPOCHS = f"{HOME}/epochs"
TRUNCATED = f"{HOME}/truncated"
FILES = f"{HOME}/files"
SINK_RECORD = f"{HOME}/sink.json"
GIVEN_UP = f"{HOME}/given_up"
TERM_FILE = "writers/term"
"""Where earlier versions published the writer term; read only as a lower bound for a new term."""
TAKE_TERM_ATTEMPTS = 20
READ_ATTEMPTS = 10
"""Listings of a prefix of the home before a reader gives up on records that keep vanishing under it."""


def describe_age(age: float) -> str:
    """How long ago a term record was renewed, ``age`` seconds by this machine's clock: "alive 4 s ago", or, for a
    record from the future (the owner's clock is ahead of this one), "renewed by a clock ahead of this one by
    3594 s" rather than a negative age."""
    if age < 0:
        return f"renewed at a time this machine's clock has not reached: its clock is ahead of this one by {-age:.0f} s"
    return f"alive {age:.0f} s ago"


def is_home_record(relpath: str) -> bool:
    """Whether a path of the log store's location is a record of the durable home (or the claim)."""
    return relpath == CLAIM_FILE or relpath.startswith(HOME + "/")


def _number(relpath: str, digits: int) -> int | None:
    base = relpath.rsplit("/", 1)[-1]
    stem = base.removesuffix(".json")
    if base == stem or len(stem) != digits or not stem.isdigit():
        return None
    return int(stem)


def term_path(term: int) -> str:
    return f"{TERMS}/{term:010d}.json"


def epoch_path(epoch: int, term: int) -> str:
    return f"{EPOCHS}/{epoch:020d}-{term:010d}.json"


def epoch_of(relpath: str) -> tuple[int, int | None] | None:
    """``(epoch, term)`` of an epoch record's path; the term is None for an earlier version's ``<E>.json`` (its
    record names it inside); None for a path that is no epoch record."""
    stem = relpath.rsplit("/", 1)[-1].removesuffix(".json")
    if not relpath.endswith(".json"):
        return None
    epoch, _, term = stem.partition("-")
    if len(epoch) != 20 or not epoch.isdigit() or (term and (len(term) != 10 or not term.isdigit())):
        return None
    return int(epoch), (int(term) if term else None)


def truncated_path(term: int) -> str:
    return f"{TRUNCATED}/{term:010d}.json"


def file_path(name: str) -> str:
    return f"{FILES}/{name}.json"


def given_up_path(epoch: int, segment: str) -> str:
    """The record of a given-up segment (``<epoch, 20 digits>/<name>.seg``): one per segment."""
    base = segment.rsplit("/", 1)[-1].removesuffix(".seg")
    return f"{GIVEN_UP}/{epoch:020d}-{base}.json"


@dataclass
class HomeView:
    """What counts in the home now: the newest term that read it and the last epoch that term adopted, the
    epoch records that count (by epoch), those that do not, and the durable truncate points."""

    term: int | None
    base: int | None
    epochs: list[dict[str, Any]] = field(default_factory=list)
    """The record that counts of each epoch that has one."""
    stale_records: list[str] = field(default_factory=list)
    """Paths of epoch records that are not their epoch's: they do not count, or a newer term's counts."""
    truncation: dict[int, int] = field(default_factory=dict)

    @property
    def stale_epochs(self) -> list[int]:
        """Epochs with records of which none counts."""
        stale = {named[0] for named in map(epoch_of, self.stale_records) if named is not None}
        return sorted(stale - {int(r["epoch"]) for r in self.epochs})

    @property
    def last_epoch(self) -> int | None:
        found = [int(r["epoch"]) for r in self.epochs]
        if self.base is not None:
            found.append(self.base)
        return max(found) if found else None


class DurableHome:
    """Reads and writes the records under ``home/`` of one log store location (see the module docstring)."""

    def __init__(self, storage: Storage) -> None:
        self.storage = storage

    # -- plain records ---------------------------------------------------------------------------------

    def read(self, relpath: str) -> Any:
        """The JSON record at ``relpath``, or None if there is none."""
        try:
            data = self.storage.read_all(relpath)
        except FileNotFoundError:
            return None
        try:
            return json.loads(data)
        except ValueError as e:
            raise HomeRecordError(
                f"{self.storage.display(relpath)} is not a readable record of the sink's durable home ({e}); "
                "records are written whole, so something else changed it. Restore it from a backup, or move it "
                "away and run `filesink recover plan` to see what recovery would do without it."
            ) from e

    def write(self, relpath: str, record: Any) -> None:
        with self._recording(relpath):
            self.storage.put(relpath, json.dumps(record, sort_keys=True).encode())

    def create(self, relpath: str, record: Any) -> bool:
        """Write ``record`` unless ``relpath`` exists (a conditional create where the store has one)."""
        with self._recording(relpath):
            return self.storage.create(relpath, json.dumps(record, sort_keys=True).encode())

    @contextlib.contextmanager
    def _recording(self, relpath: str) -> Iterator[None]:
        try:
            yield
        except OSError as e:
            found = diagnose(e, self.storage.display(""))
            message = (
                f"cannot record {self.storage.display(relpath)} in the sink's durable home: {found.cause}. What it "
                f"records has not taken effect: "
                f"{found.advise('restart the query; recovery goes on from the records that are there')}"
            )
            raise (type(e)(message) if e.errno is None else type(e)(e.errno, message)) from e

    def delete(self, relpath: str) -> None:
        self.storage.delete(relpath)

    def names(self, prefix: str) -> list[str]:
        """The records under ``prefix``; a temp file a crash or a full disk left beside them is not one."""
        return sorted(relpath for relpath, _ in self.storage.list_files(prefix) if not is_temp_name(relpath))

    def exists(self) -> bool:
        """Whether the home holds any record of a sink."""
        return any(True for _ in self.storage.list_files(HOME))

    # -- terms: ownership ------------------------------------------------------------------------------

    def legacy_published_term(self) -> int | None:
        """The term an earlier version published in ``writers/term`` (a lower bound for new terms only: ownership
        is the newest term record, never this pointer)."""
        try:
            return int(self.storage.read_all(TERM_FILE).decode().strip())
        except (FileNotFoundError, ValueError):
            return None

    def newest_term(self) -> int | None:
        """The newest term record: its run owns the sink (one listing)."""
        found = [t for t in (_number(p, 10) for p in self.names(TERMS)) if t is not None]
        return max(found) if found else None

    def check_term(self, term: int, action: str) -> None:
        """Raise :class:`FencedError` if a term above ``term`` was taken: the one fact of ownership is the newest
        term record (created only if absent), so this asks "is there a term above mine?", never "is a pointer
        equal to mine?", and nothing an older run writes can move ownership back."""
        newest = self.newest_term()
        if guards.on("term.newer_fences") and newest is not None and newest > term:
            raise FencedError(
                f"cannot {action}: this run holds writer term {term}, but a newer run took term {newest} "
                f"({self.storage.display(term_path(newest))}), maybe on another machine or by `filesink recover "
                "apply`. The newer run owns the sink now; this one must stop. Nothing was changed by this step."
            )

    def terms(self) -> dict[int, dict[str, Any]]:
        """Every term record, by term."""
        found: dict[int, dict[str, Any]] = {}
        for relpath, record in self.records(TERMS).items():
            term = _number(relpath, 10)
            if term is not None:
                found[term] = record
        return found

    def records(self, prefix: str) -> dict[str, Any]:
        """Every record under ``prefix``, by path, as of one listing in which none went missing: a record is
        deleted only once a newer one holds what it held (another run may be compacting or pruning right now),
        so one that vanishes between the listing and its read means listing again, never reading it as empty."""
        for _ in range(READ_ATTEMPTS):
            found = {relpath: self.read(relpath) for relpath in self.names(prefix)}
            if all(record is not None for record in found.values()):
                return found
            if not guards.on("home.vanished_record_relisted"):
                return {relpath: record for relpath, record in found.items() if record is not None}
        raise HomeRecordError(
            f"the records under {self.storage.display(prefix)} kept changing while this run read them "
            f"({READ_ATTEMPTS} listings): another run of the sink is changing its durable home right now. Stop the "
            "other run (only one may own the sink), then start this one again."
        )

    def take_term(self, at_least: int, extra: Mapping[str, Any] | None = None) -> int:
        """Create the record of a new term above every recorded one and above ``at_least`` (with ``extra``
        fields); return it. The run that creates it owns the sink from then on (older runs are fenced at their
        next check)."""
        known = max([at_least, self.legacy_published_term() or 0, *self.terms()])
        for term in range(known + 1, known + 1 + TAKE_TERM_ATTEMPTS):
            nonce = uuid.uuid4().hex
            now = time.time()
            record = {**(extra or {}), "term": term, "nonce": nonce, "started_at": now, "alive_at": now}
            if not self.create(term_path(term), record):
                continue
            found = self.read(term_path(term)) or {}
            if (
                guards.on("term.taken_once") and found.get("nonce") != nonce
            ):  # a store that ignored the condition let another run replace it
                raise FencedError(
                    f"two runs took writer term {term} at once in {self.storage.display(TERMS)}: the store replaced "
                    "this run's term record, so it does not create records only if absent (conditional create). "
                    "Stop the other run of this sink, and see the runbook for a server without conditional create."
                )
            return term
        raise FencedError(
            f"could not take a writer term above {known} in {self.storage.display(TERMS)}: {TAKE_TERM_ATTEMPTS} "
            "other runs took the next ones first. Stop the other runs of this sink, then start it again."
        )

    def renew(self, term: int) -> None:
        """Record that the run of ``term`` is alive now (``alive_at`` in its term record); see :meth:`live_owner`."""
        record = self.read(term_path(term))
        if record is None:
            return  # pruned by a newer run: this one is fenced, and finds out at its next check
        record["alive_at"] = time.time()
        self.write(term_path(term), record)

    def live_owner(self, lease: float) -> tuple[int, float, dict[str, Any]] | None:
        """The newest term, the seconds since its run last showed it was alive, and its record, if that is less
        than ``lease`` and the run did not stop cleanly (a run renews its record as it works:
        :meth:`logstore.LogStore.check_term`).

        The age is this machine's clock minus the owner's at its renewal, so it assumes the clocks agree to within
        the lease. A record from the future (the owner's clock is ahead: a negative age) cannot be judged: it
        counts as alive whatever its skew, and :func:`describe_age` says so. A lease of 0 or less never finds a
        live owner: the operator says the run is gone (if it is not, it is fenced at its next step)."""
        if lease <= 0:
            return None
        newest = self.newest_term()
        if newest is None:
            return None
        record = self.read(term_path(newest)) or {}
        alive_at = record.get("alive_at", record.get("started_at"))
        if not isinstance(alive_at, (int, float)) or record.get("closed"):
            return None
        age = time.time() - float(alive_at)
        return (newest, age, record) if age < lease else None

    def close_term(self, term: int) -> None:
        """Record that the run of ``term`` stopped cleanly (it is no longer a live owner)."""
        record = self.read(term_path(term))
        if record is not None:
            record["closed"] = time.time()
            self.write(term_path(term), record)

    def record_base(self, term: int, base: int) -> None:
        """Record that term ``term`` adopted every epoch up to ``base`` (and none above it) from the home."""
        record = self.read(term_path(term)) or {"term": term}
        record["base"] = base
        self.write(term_path(term), record)

    def prune_terms(self, keep_from: int) -> None:
        """Delete the records of terms below ``keep_from`` (they no longer decide which records count)."""
        for relpath in self.names(TERMS):
            term = _number(relpath, 10)
            if term is not None and term < keep_from:
                self.storage.delete(relpath)

    # -- epochs --------------------------------------------------------------------------------------------

    def view(self) -> HomeView:
        """What the home holds that counts (see the module docstring), read in one pass."""
        based = {t: r["base"] for t, r in self.terms().items() if isinstance(r.get("base"), int)}
        newest = max(based) if based else None
        base = based[newest] if newest is not None else None
        view = HomeView(newest, base)
        counted: dict[int, tuple[int, str, dict[str, Any]]] = {}
        for relpath, record in self.records(EPOCHS).items():
            named = epoch_of(relpath)
            if named is None:
                continue
            epoch, term = named[0], int(record.get("term", 0))
            if not self._counts(term, epoch, newest, base):
                view.stale_records.append(relpath)
                continue
            if epoch in counted:  # several count: the newest term's is the epoch's
                other = counted[epoch]
                if other[0] > term or not guards.on("home.newer_epoch_record_wins"):
                    view.stale_records.append(relpath)
                    continue
                view.stale_records.append(other[1])
            counted[epoch] = (term, relpath, record)
        view.epochs = [counted[e][2] for e in sorted(counted)]
        for record in self.records(TRUNCATED).values():
            term = int(record.get("term", 0))
            for vnode, epoch in enumerate(record.get("points", [])):
                point = int(epoch)
                if (
                    guards.on("home.older_truncation_capped")
                    and newest is not None
                    and base is not None
                    and term < newest
                ):
                    point = min(point, base)  # an older term cannot have released what it did not seal in time
                view.truncation[vnode] = max(view.truncation.get(vnode, -1), point)
        return view

    @staticmethod
    def _counts(term: int, epoch: int, newest: int | None, base: int | None) -> bool:
        return (
            newest is None
            or base is None
            or term >= newest
            or epoch <= base
            or not guards.on("home.late_record_ignored")
        )

    def write_epoch(self, epoch: int, term: int, record: Mapping[str, Any]) -> None:
        """Make the seal record of ``epoch`` durable for term ``term``, under a name only this term writes (an
        earlier attempt of this term's is replaced): a record of another run is never touched, so a run fenced
        between reading and writing cannot overwrite a newer run's seal. Whether it counts is the view's
        business (:meth:`view`), and the caller checks the term right after."""
        self.write(epoch_path(epoch, term), dict(record, epoch=epoch, term=term))

    def delete_records(self, relpaths: Iterable[str]) -> None:
        self.storage.delete_many(list(relpaths))

    def epoch_records(self) -> list[tuple[int, str]]:
        """``(epoch, path)`` of every epoch record, in epoch order."""
        named = ((epoch_of(p), p) for p in self.names(EPOCHS))
        return sorted((n[0], p) for n, p in named if n is not None)

    def epoch_numbers(self) -> list[int]:
        return sorted({epoch for epoch, _ in self.epoch_records()})

    # -- given-up segments ----------------------------------------------------------------------------------

    def given_up(self) -> list[dict[str, Any]]:
        """Every record of a given-up segment, in epoch and segment order."""
        found = []
        for relpath in self.names(GIVEN_UP):
            record = self.read(relpath) if relpath.endswith(".json") else None
            if record is not None and "segment" in record:
                found.append(record)
        return sorted(found, key=lambda r: (int(r["epoch"]), str(r["segment"])))

    def write_given_up(self, record: Mapping[str, Any]) -> None:
        self.write(given_up_path(int(record["epoch"]), str(record["segment"])), dict(record))

    # -- truncate points -----------------------------------------------------------------------------------

    def write_truncation(self, term: int, points: Mapping[int, int]) -> None:
        ordered = [points[v] for v in sorted(points)]
        self.write(truncated_path(term), {"term": term, "points": ordered, "written_at": time.time()})

    def compact_truncation(self, term: int, points: Mapping[int, int]) -> None:
        """Record ``points`` (at least every recorded point) as term ``term``'s, then delete older terms' records."""
        self.write_truncation(term, points)
        for relpath in self.names(TRUNCATED):
            found = _number(relpath, 10)
            if found is not None and found < term:
                self.storage.delete(relpath)
