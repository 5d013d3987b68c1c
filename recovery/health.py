"""``filesink recover health``: is the sink healthy? A fast, read-only check of what the state already knows, fit
for a cron job or a probe; one exit code per reason.

Three reasons make a sink unhealthy:

- **visibility lag**: the oldest epoch held in the log store (sealed, not yet in committed files) was sealed more
  than ``max_lag`` seconds ago: its rows are not yet visible to readers;
- **pending files without an owner**: files were pre-committed and not finished, and no run holds the sink (the
  state directory's lock is free and the newest writer term's run stopped or has been silent for ``max_silence``):
  nothing will finish them until the query starts again or ``filesink recover apply`` runs;
- **owner silent**: the newest writer term's run did not stop cleanly and has not renewed its term record in the
  durable home for ``max_silence`` seconds: its driver was killed, or hangs.

Nothing is written and no lock is taken: the state database is opened read-only, and whether a process holds the
state directory's lock is read from the kernel's lock table (``/proc/locks``), never by taking the lock, which
would make a sink starting at that moment fail.
"""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from filesink.committer.ledger import Ledger
from filesink.lock import LOCK_FILE
from logstore import LogStore
from logstore.home import describe_age, term_path

EXIT_HEALTHY = 0
EXIT_UNHEALTHY = 8
"""Unhealthy exit codes are ``EXIT_UNHEALTHY`` plus the sum of the reasons' bits: 9 visibility lag, 10 pending
files without an owner, 12 owner silent, and their sums (11, 13, 14, 15) when several hold."""
LAG, UNOWNED, SILENT = 1, 2, 4
REASONS = {LAG: "visibility_lag", UNOWNED: "pending_without_owner", SILENT: "owner_silent"}

MAX_LAG = 900.0
"""Default bound on the visibility lag: three times the default roll age (``Rollover.max_age_seconds``, 300 s)."""
MAX_SILENCE = 300.0
"""Default bound on the owner's silence. A run renews its term record at most every 15 s, and only as it works
(each seal, roll and commit): a query that runs no batch for longer (an idle input) looks silent."""
PROC_LOCKS = Path("/proc/locks")


@dataclass(frozen=True)
class Owner:
    """What the state directory's lock and the newest term record say of the run that owns the sink."""

    term: int | None
    """The newest writer term (None: the durable home records none)."""
    silent_for: float | None
    """Seconds since its run last renewed its record, by this machine's clock (negative: that clock is ahead)."""
    closed: bool
    """Its run stopped cleanly (it no longer owns the sink)."""
    host: str | None
    lock_holder: str | None
    """Who holds the state directory's lock (None: nobody, or no state directory given)."""
    lock_known: bool = True
    """A state directory was given, so its lock was looked at."""

    def live(self, max_silence: float) -> bool:
        """A run holds the sink: the state directory's lock is held, or the newest term's run did not stop and
        renewed its record less than ``max_silence`` seconds ago."""
        if self.lock_holder is not None:
            return True
        return not self.closed and self.silent_for is not None and self.silent_for < max_silence

    def describe(self) -> str:
        if self.term is None:
            where = "no writer term recorded"
        elif self.closed:
            where = f"writer term {self.term} stopped cleanly"
        elif self.silent_for is None:
            where = f"writer term {self.term} never renewed its record"
        else:
            where = f"writer term {self.term} {describe_age(self.silent_for)}"
        if self.host and self.term is not None:
            where += f" (on {self.host})"
        if not self.lock_known:
            lock = "state directory not given (a query holding it is not seen from here)"
        elif self.lock_holder:
            lock = f"state directory held by {self.lock_holder}"
        else:
            lock = "state directory lock free"
        return f"{where}; {lock}"


@dataclass(frozen=True)
class Problem:
    bit: int
    message: str

    @property
    def reason(self) -> str:
        return REASONS[self.bit]


@dataclass(frozen=True)
class Health:
    sink_id: str
    lag: float
    """Seconds since the oldest held epoch was sealed (0 when the log store holds nothing)."""
    oldest_epoch: int | None
    held_rows: int
    pending: tuple[str, ...]
    owner: Owner
    max_lag: float
    max_silence: float
    problems: tuple[Problem, ...]

    @property
    def exit_code(self) -> int:
        bits = sum(p.bit for p in self.problems)
        return EXIT_UNHEALTHY + bits if bits else EXIT_HEALTHY

    def to_json(self) -> dict[str, Any]:
        o = self.owner
        return {
            "sink_id": self.sink_id,
            "healthy": not self.problems,
            "exit_code": self.exit_code,
            "reasons": [{"reason": p.reason, "message": p.message} for p in self.problems],
            "visibility_lag_seconds": round(self.lag, 3),
            "oldest_held_epoch": self.oldest_epoch,
            "held_rows": self.held_rows,
            "pending_files": list(self.pending),
            "owner": {
                "writer_term": o.term,
                "silent_seconds": None if o.silent_for is None else round(o.silent_for, 3),
                "stopped_cleanly": o.closed,
                "host": o.host,
                "held_by": o.lock_holder,
            },
            "max_lag_seconds": self.max_lag,
            "max_silence_seconds": self.max_silence,
        }

    def lines(self) -> list[str]:
        """One line per reason; a single ``healthy`` line when there is none."""
        if self.problems:
            return [f"{p.reason}: {p.message}" for p in self.problems]
        return [
            f"healthy: sink {self.sink_id}, visibility lag {self.lag:.0f} s (bound {self.max_lag:g} s), "
            f"{len(self.pending)} pending files, {self.owner.describe()}"
        ]


def check(
    store: LogStore,
    ledger: Ledger,
    state_dir: Path | None,
    *,
    max_lag: float = MAX_LAG,
    max_silence: float = MAX_SILENCE,
    now: float | None = None,
) -> Health:
    """The sink's health from its state (``store`` and ``ledger``, opened read-only), its durable home's newest term
    record and its state directory's lock (``state_dir``; None: unknown). Reads only."""
    now = time.time() if now is None else now
    held = [b for b in store.backlog() if b.first_epoch is not None and b.first_sealed_at is not None]
    oldest = min(held, key=lambda b: (b.first_sealed_at, b.first_epoch), default=None)
    lag = max(0.0, now - float(oldest.first_sealed_at)) if oldest is not None and oldest.first_sealed_at else 0.0
    rows = sum(b.rows for b in held)
    pending = tuple(ledger.pending_names())
    owner = owner_of(store, state_dir, now)
    problems: list[Problem] = []
    if oldest is not None and lag > max_lag:
        problems.append(
            Problem(
                LAG,
                f"the oldest epoch held in the log store, epoch {oldest.first_epoch}, was sealed {lag:.0f} s ago "
                f"(bound {max_lag:g} s, --max-lag): {rows:,} held rows are not yet in committed files. Check that "
                f"the query runs and rolls files (its log, `filesink recover status`); {owner.describe()}",
            )
        )
    if pending and not owner.live(max_silence):
        shown = ", ".join(pending[:3]) + (", ..." if len(pending) > 3 else "")
        problems.append(
            Problem(
                UNOWNED,
                f"{len(pending)} files pre-committed and not finished ({shown}) and no run holds the sink "
                f"({owner.describe()}): nothing finishes them until the query starts again, or `filesink recover "
                "apply` resolves them",
            )
        )
    if owner.term is not None and not owner.closed and owner.silent_for is not None and owner.silent_for >= max_silence:
        term_record = store.home.storage.display(term_path(owner.term))
        problems.append(
            Problem(
                SILENT,
                f"the run of writer term {owner.term}{f' on {owner.host}' if owner.host else ''} did not stop "
                f"cleanly and last renewed its record {owner.silent_for:.0f} s ago (bound {max_silence:g} s, "
                f"--max-silence; {term_record}): its driver was killed or hangs. Check it, and start the query "
                "again (its start recovers the sink)",
            )
        )
    return Health(
        store.sink_id,
        lag,
        oldest.first_epoch if oldest else None,
        rows,
        pending,
        owner,
        max_lag,
        max_silence,
        tuple(problems),
    )


def owner_of(store: LogStore, state_dir: Path | None, now: float) -> Owner:
    """The newest term record of the durable home, and who holds ``state_dir``'s lock (read without taking it)."""
    term = store.home.newest_term()
    record = store.home.read(term_path(term)) if term is not None else None
    record = record if isinstance(record, dict) else {}
    alive_at = record.get("alive_at", record.get("started_at"))
    silent = now - float(alive_at) if isinstance(alive_at, int | float) else None
    host = record.get("host")
    return Owner(
        term,
        silent,
        bool(record.get("closed")),
        str(host) if host else None,
        lock_holder_unlocked(state_dir) if state_dir is not None else None,
        state_dir is not None,
    )


def lock_holder_unlocked(state_dir: Path) -> str | None:
    """Who holds the state directory's lock (None: nobody), read from the kernel's lock table without taking the
    lock: :func:`filesink.lock.lock_holder` takes a shared lock for a moment, and a sink that starts at that
    moment would be refused. Where there is no lock table (not Linux), the pid the lock file names is checked
    instead, when it ran on this machine."""
    path = state_dir / LOCK_FILE
    try:
        st = path.stat()
        text = path.read_text(errors="replace").strip() or "unknown"
    except FileNotFoundError:
        return None
    try:
        table = PROC_LOCKS.read_text()
    except OSError:
        return text if _pid_alive(text) else None
    wanted = (os.major(st.st_dev), os.minor(st.st_dev), st.st_ino)
    pid = _pid_of(text)
    for line in table.splitlines():
        fields = line.split()
        if "->" in fields or len(fields) < 6 or fields[1] != "FLOCK":
            continue  # a waiter ("->"), or a POSIX lock: the state lock is an flock
        try:
            major, minor, inode = fields[5].split(":")
            found = (int(major, 16), int(minor, 16), int(inode))
        except ValueError:
            continue
        # The device the table names can differ from the one stat() gives (btrfs subvolumes, overlay file
        # systems): the same inode locked by the pid the lock file names is the same lock.
        if found == wanted or (found[2] == st.st_ino and pid is not None and fields[4] == str(pid)):
            return text
    return None


def _pid_of(text: str) -> int | None:
    """The pid of the lock file's ``pid N on HOST since ...``, when HOST is this machine."""
    parts = text.split()
    if len(parts) < 4 or parts[0] != "pid" or parts[2] != "on" or parts[3] != socket.gethostname():
        return None
    try:
        return int(parts[1])
    except ValueError:
        return None


def _pid_alive(text: str) -> bool:
    """Whether the lock file's ``pid N on HOST since ...`` names a live process of this machine (a process that
    released the lock and still runs counts too: the fallback where there is no lock table)."""
    pid = _pid_of(text)
    if pid is None:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
