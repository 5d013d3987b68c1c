"""What every room of the log store reads and writes: the state a :class:`~logstore.store.LogStore` holds, in one place.

The log store (:class:`logstore.store.LogStore`, the class users and the sink construct) is made of rooms, each in a
module named for what it holds: the append and the seal (:mod:`logstore.seal`), reads (:mod:`logstore.reads`),
damaged and given-up segments (:mod:`logstore.damaged`), truncation (:mod:`logstore.truncation`), garbage
collection (:mod:`logstore.garbage`), the rebuild from the durable home (:mod:`logstore.rebuild`) and the backlog
queries (:mod:`logstore.backlog`). Each room is a class of methods over the state declared here (:class:`StoreCore`),
set when the store opens (:mod:`logstore.store`); ``LogStore`` inherits them all, so a log store is one object, the
one owner of the ``log_*`` tables, as before.
"""

from __future__ import annotations

import base64
import json
import logging
import time
from collections.abc import Mapping
from typing import Any

import sqlite_utils

from .append import AppendTarget
from .errors import LogStoreClaimedError
from .home import CLAIM_FILE, DurableHome
from .segment import Block, SegmentDescriptor, VnodeRun
from .statedb import db_errors
from .storage import LogLocation, Storage

NOTHING = -1
"""The epoch value meaning "none yet" for last sealed epochs and truncate points."""
RENEW_EVERY = 15.0
"""Seconds between renewals of a run's term record (``alive_at``) as it checks its term."""
log = logging.getLogger("logstore.store")
"""Every room logs as the log store: one logger's name, whichever module writes the record (``filesink run``
filters the rebuild's notices by it)."""

REBUILD_NOTICE = "logstore_rebuild_notice"
"""Set (as ``extra``) on the log records that say a new state database is rebuilt from the durable home, so that
a caller that reports the rebuild itself (``filesink run``) can drop them."""


class StoreCore:
    """The state a log store holds, set when it opens (:mod:`logstore.store`) and read by its rooms; and the few
    steps more than one room takes (the state queries, the term and claim checks, recording a sealed epoch and a
    given-up segment)."""

    db: sqlite_utils.Database
    db_path: str
    _db_named: str
    location: LogLocation
    readonly: bool
    _where: str
    storage: Storage
    home: DurableHome
    term: int | None
    _renewed: float
    rebuilt: bool
    _published_points: dict[int, int] | None
    sink_id: str
    vnodes: int
    target: AppendTarget

    @property
    @db_errors("read the last sealed epoch")
    def last_sealed_epoch(self) -> int:
        """The highest sealed epoch, or -1 if none."""
        value: int = self.db.execute("SELECT last_sealed_epoch FROM log_store").fetchone()[0]
        return value

    def _held_epochs(self) -> list[int]:
        """The sealed epochs recorded, in order (callers translate the database's errors)."""
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
