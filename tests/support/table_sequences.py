"""Seeded sequences of events on a Delta or an Iceberg table written by the sink without Spark's jobs, and the
checks after each step: the generator, the model of what the table must hold, and the harness that plays a
sequence and says where it went wrong.

A sequence is drawn from its seed alone (:func:`draw`), before it runs, so a seed replays it exactly on the same
code. Its events (:class:`Event`):

- ``roll``: epochs appended (``sink_helpers.append_evolving``, sizes drawn) and a flush; ``append``: the same
  without the flush (held across what follows);
- ``restart`` (a new sink object after ``close()``), ``crash`` (the sink abandoned without closing: its lock and
  log store released, nothing else), ``lose_state`` (abandoned, its state directory deleted: the next sink
  rebuilds from the durable home, a log store outside the state directory);
- ``kill``: epochs appended, then a failpoint of the roll raising in the flush, the sink abandoned and a new one
  opened; at a failpoint of recovery, the new sink's start raises there first, then one more start;
- ``schema``: the next batches' schema gains a column, a field of the struct ``p``, or ``n`` widens from int to
  bigint (Delta refuses that at the batch, before anything is written: a refusal of the documented kind is an
  outcome, the model keeps the older schema);
- ``other``: another writer (deltalake: append, ``optimize.compact()``, ``vacuum``, ``create_checkpoint()``,
  ``cleanup_metadata()``; pyiceberg: append, a rewrite of every row, snapshot expiry).

The sink's own table maintenance comes often: Delta's checkpoint interval is drawn small (2 to 4 versions,
patched as ``delta_restarts.py`` does) and its background checkpoint is waited for after each flush (so a replay
sees the same log); Iceberg keeps few snapshots and merges manifests in small tiers.

After each step (:meth:`Harness.check`): every reader reads the table (deltalake; pyiceberg for Iceberg;
DuckDB every ``duckdb_every`` steps and at the end, when its pinned environment exists); its rows lie between
what the model knows is committed and what the sink took plus the other writer's rows, and equal the latter after
a flush that left nothing pending (exact multisets); no data file is added twice in the table's history, no sink
file is in two commits; then :data:`CHECKS`: the protocol conformance checks of everything new in the log or metadata.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
from pyspark.sql import types as T
from sink_helpers import append_evolving

from filesink import ExactlyOnceParquetSink, Rollover
from filesink.errors import SchemaMismatchError
from logstore.failpoints import ENV_VAR, FailpointError

SEED_VAR = "FILESINK_TABLE_SEQ_SEED"
"""A seed to replay (read by the tests only)."""
HOLD = Rollover(target_file_size=None, max_age_seconds=None, max_epochs=1000)
DAYS = ("2024-01-01", "2024-01-02", None, "")
SIZES = (1, 3, 8, 25, 70)
ROLL_POINTS = (
    "filesink.plan.before",
    "filesink.precommit.before",
    "filesink.precommit.home_written",
    "filesink.precommit.after",
    "filesink.write.open.before",
    "filesink.write.open.after",
    "filesink.write.publish.before",
    "filesink.write.after",
    "filesink.table.before",
    "filesink.table.after",
    "filesink.commit.before",
    "filesink.commit.after",
)
"""The roll's failpoints in the driver (``grep -rn 'failpoint("' filesink``; the multipart upload's are S3's)."""
RECOVERY_POINTS = (
    "recovery.term.after",
    "recovery.sync.after",
    "recovery.fence.after",
    "recovery.resolve.after",
    "recovery.output_garbage.after",
    "recovery.table.before",
)
"""Recovery's failpoints at a start (``grep -rn 'failpoint("' recovery``)."""
TABLE_POINTS = ("filesink.table.before", "filesink.table.after", "recovery.table.before")
OTHER_OPS = {
    "delta": ("append", "compact", "vacuum", "checkpoint", "cleanup"),
    "iceberg": ("append", "rewrite", "expire"),
}
CHANGES = ("column", "field", "widen")
KINDS = {
    "roll": 30,
    "append": 8,
    "restart": 8,
    "crash": 5,
    "lose_state": 4,
    "kill": 14,
    "schema": 10,
    "other": 13,
}
"""The events' weights."""
ADDED_TYPES = (("long", pa.int64(), T.LongType()), ("string", pa.string(), T.StringType()))
FOREIGN_IDS = 50_000_000
"""The other writer's rows have ids from here on; the sink's are ``epoch * 10_000 + i``."""


@dataclass(frozen=True)
class Event:
    kind: str
    point: str = ""
    """``kill``: the failpoint; ``other``: the operation; ``schema``: the change."""
    sizes: tuple[int, ...] = ()
    """``roll``, ``append``, ``kill``: the rows of each epoch appended."""
    first: str = ""
    """``kill`` at a recovery failpoint: the roll's failpoint that leaves files pending first."""

    def __str__(self) -> str:
        parts = [self.kind]
        if self.point:
            parts.append(self.point)
        if self.first:
            parts.append(f"after {self.first}")
        if self.sizes:
            parts.append("rows " + "+".join(map(str, self.sizes)))
        return " ".join(parts)


@dataclass(frozen=True)
class Plan:
    seed: int
    format: str
    interval: int
    """Delta: the checkpoint interval; Iceberg: the snapshots kept."""
    events: tuple[Event, ...]

    def describe(self, failed_at: int | None = None) -> str:
        lines = [f"seed {self.seed} ({self.format}, interval {self.interval}), {len(self.events)} events:"]
        for i, e in enumerate(self.events):
            mark = "  <-- failed here" if i == failed_at else ""
            lines.append(f"  {i:3d}: {e}{mark}")
        return "\n".join(lines)


def draw(seed: int, table_format: str, steps: int) -> Plan:
    """The sequence of ``seed`` for ``table_format``: a pure function of its arguments."""
    rng = random.Random(f"{table_format}:{seed}")
    kinds, weights = zip(*KINDS.items(), strict=True)
    events: list[Event] = []

    def sizes() -> tuple[int, ...]:
        return tuple(rng.choice(SIZES) for _ in range(rng.choice((1, 1, 2, 3))))

    for _ in range(steps):
        kind = rng.choices(kinds, weights)[0]
        if kind in ("roll", "append"):
            events.append(Event(kind, sizes=sizes()))
        elif kind == "kill":
            # the table's failpoints half of the time, the roll's and recovery's others the rest
            pool = TABLE_POINTS if rng.random() < 0.5 else ROLL_POINTS + RECOVERY_POINTS
            point = rng.choice(pool)
            first = (
                rng.choice(("filesink.table.before", "filesink.write.after")) if point.startswith("recovery") else ""
            )
            events.append(Event(kind, point, sizes(), first))
        elif kind == "other":
            events.append(Event(kind, rng.choice(OTHER_OPS[table_format])))
        elif kind == "schema":
            events.append(Event(kind, rng.choice(CHANGES)))
        else:
            events.append(Event(kind))
    events.append(Event("roll", sizes=(5,)))  # the end: everything taken is committed
    return Plan(seed, table_format, rng.choice((2, 3, 4)), tuple(events))


# -- the model --------------------------------------------------------------------------------------------------


@dataclass
class Schema:
    """The sink's schema, as the model draws it: ``id, user_id, day, n, p struct<x, ...>`` and added columns."""

    n_wide: bool = False
    fields: list[str] = field(default_factory=lambda: ["x"])
    """``p``'s fields (``x`` bigint, the others strings)."""
    added: list[tuple[str, str]] = field(default_factory=list)
    """Added top-level columns: (name, kind of :data:`ADDED_TYPES`)."""

    def copy(self) -> Schema:
        return Schema(self.n_wide, list(self.fields), list(self.added))

    def columns(self) -> list[str]:
        return ["id", "user_id", "day", "n", "p", *(name for name, _ in self.added)]

    def _p_arrow(self) -> pa.DataType:
        return pa.struct([(f, pa.int64() if f == "x" else pa.string()) for f in self.fields])

    def arrow(self) -> pa.Schema:
        kinds = {k: t for k, t, _ in ADDED_TYPES}
        return pa.schema(
            [
                ("id", pa.int64()),
                ("user_id", pa.int64()),
                ("day", pa.string()),
                ("n", pa.int64() if self.n_wide else pa.int32()),
                ("p", self._p_arrow()),
                *((name, kinds[kind]) for name, kind in self.added),
            ]
        )

    def spark(self) -> T.StructType:
        kinds = {k: t for k, _, t in ADDED_TYPES}
        p = T.StructType([T.StructField(f, T.LongType() if f == "x" else T.StringType()) for f in self.fields])
        return T.StructType(
            [
                T.StructField("id", T.LongType()),
                T.StructField("user_id", T.LongType()),
                T.StructField("day", T.StringType()),
                T.StructField("n", T.LongType() if self.n_wide else T.IntegerType()),
                T.StructField("p", p),
                *(T.StructField(name, kinds[kind]) for name, kind in self.added),
            ]
        )


def value(column: str, kind: str, i: int) -> object:
    return i * 3 if kind == "long" else f"{column}-{i}"


def row(schema: Schema, i: int, day: str | None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": i,
        "user_id": i % 7,
        "day": day,
        "n": i % 100_000,
        "p": {f: (i if f == "x" else f"{f}-{i}") for f in schema.fields},
    }
    for name, kind in schema.added:
        out[name] = value(name, kind, i)
    return out


def canonical(r: dict[str, Any], columns: list[str], fields: list[str]) -> tuple:
    """A row as every reader must return it, over ``columns`` (``p`` over ``fields``): absent is null, the empty
    string's partition null, an integer an int."""
    out = []
    for c in columns:
        v = r.get(c)
        if c == "day" and v == "":
            v = None
        if c == "p" and v is not None:
            v = tuple(v.get(f) for f in fields)
        out.append(v)
    return tuple(out)


@dataclass
class Model:
    """What the table must hold: the sink's sealed rows and the other writer's, as dicts."""

    schema: Schema = field(default_factory=Schema)
    """The schema of the next batch."""
    columns: list[str] = field(default_factory=lambda: Schema().columns())
    """Every column the table may have had (the schema's, and any the sink refused since)."""
    fields: list[str] = field(default_factory=lambda: ["x"])
    sealed: list[dict[str, Any]] = field(default_factory=list)
    foreign: list[dict[str, Any]] = field(default_factory=list)
    committed: int = 0
    """How many of the sealed rows the table is known to hold (after a flush that left nothing pending): it never
    loses them (nor the other writer's, which land at once)."""
    epoch: int = 0
    foreign_next: int = FOREIGN_IDS
    column_next: int = 0

    def rows(self, rows: list[dict[str, Any]]) -> Counter:
        return Counter(canonical(r, self.columns, self.fields) for r in rows)

    def all(self) -> Counter:
        return self.rows(self.sealed) + self.rows(self.foreign)

    def note(self, schema: Schema) -> None:
        for c in schema.columns():
            if c not in self.columns:
                self.columns.append(c)
        for f in schema.fields:
            if f not in self.fields:
                self.fields.append(f)


# -- the harness -----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Context:
    """What a check after a step is given."""

    format: str
    location: str
    """The table's root directory."""
    table: Any
    """The table as read this step: a ``deltalake.DeltaTable`` or a pyiceberg ``Table``."""
    step: int


def conforms(ctx: Context) -> None:
    """The protocol conformance checks (``conformance.cursor``): every log entry and checkpoint (Delta), or every
    metadata file, manifest list and manifest (Iceberg), new since the previous step, the other writer's included,
    validated against the format's specification. The rows are read by the harness's own readers."""
    from conformance import cursor

    checker = cursor(ctx.format, ctx.location)
    if ctx.format == "delta":
        checker.check()
    else:
        checker.check(ctx.table.metadata_location)


CHECKS: list[Callable[[Context], None]] = [conforms]
"""Checks run after every step, after the harness's own."""


QUIET = frozenset({"append", "schema"})
"""Events that leave the table as it was (nothing is committed): not followed by the checks."""


@contextmanager
def often_maintained(table_format: str, interval: int) -> Iterator[None]:
    """The sink's table maintenance at a small interval: Delta tables created with ``delta.checkpointInterval``
    ``interval``; Iceberg keeping ``interval`` + 2 snapshots, expiring 2 at a time, merging manifests 3 at a time."""
    if table_format == "delta":
        from filesink.destination import delta

        saved = delta.CONFIGURATION
        delta.CONFIGURATION = {**saved, "delta.checkpointInterval": str(interval)}
        try:
            yield
        finally:
            delta.CONFIGURATION = saved
        return
    from filesink.destination import iceberg

    saved_tiers = iceberg.MERGE_TIERS
    keep, batch = iceberg.IcebergDestination.keep_snapshots, iceberg.IcebergDestination.expire_batch
    iceberg.MERGE_TIERS = ((3, 3), (9, 3), (27, 3))
    iceberg.IcebergDestination.keep_snapshots = interval + 2
    iceberg.IcebergDestination.expire_batch = 2
    try:
        yield
    finally:
        iceberg.MERGE_TIERS = saved_tiers
        iceberg.IcebergDestination.keep_snapshots, iceberg.IcebergDestination.expire_batch = keep, batch


@contextmanager
def failpoints(spec: str) -> Iterator[None]:
    saved = os.environ.get(ENV_VAR)
    os.environ[ENV_VAR] = spec
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop(ENV_VAR, None)
        else:
            os.environ[ENV_VAR] = saved


class Harness:
    """Plays a :class:`Plan` in ``root``, checking after each step."""

    def __init__(self, plan: Plan, root: Path, duckdb_python: Path | None = None, duckdb_every: int = 0):
        self.plan, self.root = plan, root
        self.format = plan.format
        self.location = str(root / "table")
        self.model = Model()
        self.sink: ExactlyOnceParquetSink | None = None
        self.duckdb_python, self.duckdb_every = duckdb_python, duckdb_every
        self.outcomes: Counter[str] = Counter()
        """What the steps did (failpoints fired or not reached, refusals, the other writer's no-ops)."""
        self.added: Counter[str] = Counter()
        """Delta: every data file an ``add`` action of the log names; Iceberg: every data file a snapshot added."""
        self.sink_files: Counter[str] = Counter()
        """The sink's file names, per commit that names them (its commits' metadata)."""
        self.seen_versions: set[int] = set()
        self.rows_read = 0

    # -- the sink --------------------------------------------------------------------------------------------

    def open(self) -> ExactlyOnceParquetSink:
        options: dict[str, Any] = {"table": "db.events"} if self.format == "iceberg" else {}
        self.sink = ExactlyOnceParquetSink(
            self.location,
            str(self.root / "state"),
            log_store=str(self.root / "durable" / "log"),
            vnodes=4,
            parallelism=2,
            rollover=HOLD,
            table_format=self.format,
            partition_by=["day"],
            **options,
        )
        return self.sink

    def current(self) -> ExactlyOnceParquetSink:
        return self.sink if self.sink is not None else self.open()

    def close(self) -> None:
        if self.sink is not None:
            self.sink.close()
            self.sink = None

    def abandon(self) -> None:
        """The driver dies: nothing of the sink runs after this (its background checkpoint ended first, so that a
        replay sees the same log), but its lock and log store are let go, as the end of its process would."""
        sink, self.sink = self.sink, None
        if sink is None:
            return
        sink._destination.settle(timeout=120)
        sink._state_lock.release()
        sink.log_store.close()
        from filesink.sink.face import forget

        forget(sink)

    def append(self, sizes: tuple[int, ...]) -> bool:
        """Append an epoch per size; whether all were taken (a refused schema change stops at its batch)."""
        sink = self.current()
        rng = random.Random(f"rows:{self.plan.seed}:{self.model.epoch}")
        for rows in sizes:
            epoch = self.model.epoch
            schema = self.model.schema
            data = [row(schema, epoch * 10_000 + i, rng.choice(DAYS)) for i in range(rows)]
            table = pa.Table.from_pylist(data, schema=schema.arrow())
            try:
                append_evolving(sink, epoch, table, schema.spark())
            except SchemaMismatchError as e:
                self.refused(e)
                return False
            self.model.sealed.extend(data)
            self.model.epoch += 1
        return True

    def refused(self, e: SchemaMismatchError) -> None:
        """A schema change the format cannot take: only Delta's widening, refused before the batch was written."""
        text = str(e)
        if not (self.format == "delta" and self.model.schema.n_wide and "widened" in text and "Nothing" in text):
            raise e
        assert "Delta" in text, text
        self.outcomes["widening refused"] += 1
        self.model.schema.n_wide = False  # the query casts it back

    def flush(self) -> None:
        sink = self.current()
        sink.flush()
        sink._destination.settle(timeout=120)
        if not sink.ledger.pending_names():
            self.model.committed = len(self.model.sealed)

    # -- the events ------------------------------------------------------------------------------------------

    def run(self, event: Event) -> None:
        kind = event.kind
        if kind == "roll":
            self.append(event.sizes)
            self.flush()
        elif kind == "append":
            self.append(event.sizes)
        elif kind == "restart":
            self.close()
            self.open()
        elif kind == "crash":
            self.abandon()
            self.open()
        elif kind == "lose_state":
            self.abandon()
            shutil.rmtree(self.root / "state", ignore_errors=True)
            self.open()
            self.outcomes["rebuilt"] += 1
        elif kind == "kill":
            self.kill(event)
        elif kind == "schema":
            self.change(event.point)
        elif kind == "other":
            self.other(event.point)
        else:
            raise AssertionError(f"unknown event {event}")

    def kill(self, event: Event) -> None:
        roll_point = event.first or event.point
        if not self.append(event.sizes):
            return
        try:
            with failpoints(f"{roll_point}=raise"):
                self.current().flush()
        except FailpointError:
            self.outcomes[f"fired {roll_point}"] += 1
        else:
            self.outcomes[f"not reached {roll_point}"] += 1
            self.current()._destination.settle(timeout=120)
            if not self.current().ledger.pending_names():
                self.model.committed = len(self.model.sealed)
        self.abandon()
        if event.first:
            try:
                with failpoints(f"{event.point}=raise"):
                    self.open()
            except FailpointError:
                self.outcomes[f"fired {event.point}"] += 1
                self.sink = None  # the start released what it took
            else:
                self.outcomes[f"not reached {event.point}"] += 1
                self.abandon()
        self.open()

    def change(self, change: str) -> None:
        schema = self.model.schema.copy()
        if change == "column":
            kind = ADDED_TYPES[self.model.column_next % len(ADDED_TYPES)][0]
            schema.added.append((f"c{self.model.column_next}", kind))
            self.model.column_next += 1
        elif change == "field":
            schema.fields.append(f"y{len(schema.fields)}")
        elif schema.n_wide:
            self.outcomes["widened already"] += 1
            return
        else:
            schema.n_wide = True
        self.model.schema = schema
        self.model.note(schema)

    # -- the other writer ------------------------------------------------------------------------------------

    def foreign_rows(self, arrow: pa.Schema, count: int) -> pa.Table:
        """Rows in the table's own schema (its columns may be behind the sink's)."""
        out = []
        for k in range(count):
            i = self.model.foreign_next
            self.model.foreign_next += 1
            r: dict[str, Any] = {}
            for f in arrow:
                if f.name == "id":
                    r["id"] = i
                elif f.name == "user_id":
                    r["user_id"] = i % 7
                elif f.name == "day":
                    r["day"] = ("2024-01-01", None, "2024-01-03")[k % 3]
                elif f.name == "n":
                    r["n"] = i % 100_000
                elif f.name == "p":
                    r["p"] = {s.name: (i if s.name == "x" else f"{s.name}-{i}") for s in f.type}
                else:
                    r[f.name] = i * 3 if pa.types.is_integer(f.type) else f"{f.name}-{i}"
            out.append(r)
        table = pa.Table.from_pylist(out, schema=arrow)
        self.model.foreign.extend(out)
        return table

    def other(self, op: str) -> None:
        if self.format == "delta":
            self.other_delta(op)
        else:
            self.other_iceberg(op)

    def other_delta(self, op: str) -> None:
        import deltalake
        from deltalake.exceptions import TableNotFoundError

        try:
            table = deltalake.DeltaTable(self.location)
        except TableNotFoundError:
            self.outcomes["other: no table yet"] += 1
            return
        if op == "append":
            data = self.foreign_rows(pa.schema(table.schema().to_arrow()), 4)
            deltalake.write_deltalake(self.location, data, mode="append")
        elif op == "compact":
            table.optimize.compact()
        elif op == "vacuum":
            table.vacuum(retention_hours=0, enforce_retention_duration=False, dry_run=False)
        elif op == "checkpoint":
            table.create_checkpoint()
        elif op == "cleanup":
            table.cleanup_metadata()
        self.outcomes[f"other {op}"] += 1

    def catalog(self) -> Any:
        from pyiceberg.catalog.sql import SqlCatalog

        from filesink.destination.iceberg import CATALOG_NAME, EMBEDDED_CATALOG

        root = self.root / "table"
        return SqlCatalog(CATALOG_NAME, uri=f"sqlite:///{root / EMBEDDED_CATALOG}", warehouse=f"file://{root}")

    def load_iceberg(self) -> Any:
        from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError

        if not (self.root / "table").exists():
            return None
        try:
            return self.catalog().load_table("db.events")
        except (NoSuchTableError, NoSuchNamespaceError):
            return None

    def other_iceberg(self, op: str) -> None:
        import datetime as dt

        table = self.load_iceberg()
        if table is None:
            self.outcomes["other: no table yet"] += 1
            return
        if op == "append":
            table.append(self.foreign_rows(table.schema().as_arrow(), 4))
        elif op == "rewrite":  # a compaction's effect: every row written again in new files, the old ones deleted
            rows = table.scan().to_arrow()
            if rows.num_rows == 0:
                self.outcomes["other: nothing to rewrite"] += 1
                return
            table.overwrite(rows)
        elif op == "expire":
            table.maintenance.expire_snapshots().older_than(dt.datetime.now(dt.UTC)).commit()
        self.outcomes[f"other {op}"] += 1

    # -- the checks ------------------------------------------------------------------------------------------

    def check(self, step: int, *, duckdb: bool) -> None:
        got, table = self.read()
        model = self.model
        expected = model.all()
        committed = model.rows(model.sealed[: model.committed]) + model.rows(model.foreign)
        extra = got - expected
        missing = committed - got
        assert not extra, f"rows the table holds beyond the model's (twice, or unknown): {_show(extra)}"
        assert not missing, f"rows the table lost, which it held: {_show(missing)}"
        sink = self.sink
        settled = sink is not None and not sink.ledger.pending_names() and not sink.log_store.held_totals().rows
        if settled:
            assert got == expected, f"nothing held or pending, and the table is not every row: {_show(expected - got)}"
        self.rows_read += sum(got.values())
        if table is not None:
            self.history(table)
            for check in CHECKS:  # the protocol conformance checks plug in here
                check(Context(self.format, self.location, table, step))
        if duckdb and self.duckdb_python is not None and table is not None:
            self.check_duckdb(table, got)

    def read(self) -> tuple[Counter, Any]:
        if self.format == "delta":
            import deltalake
            from deltalake.exceptions import TableNotFoundError

            try:
                table = deltalake.DeltaTable(self.location)
            except TableNotFoundError:
                return Counter(), None
            data = table.to_pyarrow_table()
        else:
            table = self.load_iceberg()
            if table is None:
                return Counter(), None
            data = table.scan().to_arrow()
        return Counter(canonical(r, self.model.columns, self.model.fields) for r in data.to_pylist()), table

    def history(self, table: Any) -> None:
        """Every data file added once in the table's history, every sink file in one commit (read as the history
        grows: a clean-up or an expiry may remove what was read before)."""
        if self.format == "delta":
            log = Path(self.location) / "_delta_log"
            for path in sorted(log.glob("*.json")):
                version = int(path.name.removesuffix(".json"))
                if version in self.seen_versions:
                    continue
                self.seen_versions.add(version)
                for line in path.read_text().splitlines():
                    action = json.loads(line)
                    if "add" in action:
                        self.added[action["add"]["path"]] += 1
                    info = action.get("commitInfo", {})
                    if "filesink.files" in info:
                        self.sink_files.update(info["filesink.files"].split(","))
        else:
            from pyiceberg.manifest import ManifestEntryStatus

            for snapshot in table.metadata.snapshots:
                if snapshot.snapshot_id in self.seen_versions:
                    continue
                self.seen_versions.add(snapshot.snapshot_id)
                summary = snapshot.summary.additional_properties if snapshot.summary is not None else {}
                if "filesink.files" in summary:
                    self.sink_files.update(summary["filesink.files"].split(","))
                for manifest in snapshot.manifests(table.io):
                    if manifest.added_snapshot_id != snapshot.snapshot_id or not manifest.has_added_files():
                        continue  # a manifest of an earlier snapshot, or one this one merged (its entries existing)
                    for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True):
                        if entry.status == ManifestEntryStatus.ADDED and entry.snapshot_id == snapshot.snapshot_id:
                            self.added[entry.data_file.file_path] += 1
        twice = [p for p, n in self.added.items() if n > 1]
        assert not twice, f"data files added more than once: {twice[:5]}"
        twice = [p for p, n in self.sink_files.items() if n > 1]
        assert not twice, f"sink files in more than one commit: {twice[:5]}"

    def check_duckdb(self, table: Any, got: Counter) -> None:
        from helpers import SUPPORT

        location = self.location if self.format == "delta" else table.metadata_location.removeprefix("file://")
        scans = [{"format": self.format, "location": location}]
        done = subprocess.run(
            [str(self.duckdb_python), str(SUPPORT / "duckdb_reader.py"), json.dumps(scans)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, f"DuckDB cannot read the table (exit {done.returncode}):\n{done.stderr[-2000:]}"
        [answer] = json.loads(done.stdout)
        rows = Counter(
            canonical(dict(zip(answer["columns"], r, strict=True)), self.model.columns, self.model.fields)
            for r in answer["rows"]
        )
        assert rows == got, (
            f"DuckDB reads other rows than deltalake/pyiceberg: {_show(rows - got)} / {_show(got - rows)}"
        )
        self.outcomes["duckdb reads"] += 1


def _show(rows: Counter, n: int = 3) -> str:
    items = list(rows.items())
    return f"{sum(rows.values())} rows, e.g. {items[:n]}"


@dataclass(frozen=True)
class Result:
    plan: Plan
    failed_at: int | None
    error: str
    outcomes: Counter[str]
    took: float

    @property
    def ok(self) -> bool:
        return self.failed_at is None

    def report(self) -> str:
        replay = (
            f"replay: {SEED_VAR}={self.plan.seed} python -m pytest -n 0 -p no:cacheprovider "
            f"tests/filesink/destination/test_table_sequences.py -k 'replay and {self.plan.format}' -s"
        )
        return f"{self.plan.describe(self.failed_at)}\nstep {self.failed_at}: {self.error}\n{replay}"


def play(
    plan: Plan, root: Path, *, duckdb_python: Path | None = None, duckdb_every: int = 0, verbose: bool = False
) -> Result:
    """Play ``plan`` in ``root`` (a new directory); the first failure ends it."""
    started = time.monotonic()
    root.mkdir(parents=True, exist_ok=True)
    harness = Harness(plan, root, duckdb_python, duckdb_every)
    step: int | None = None
    error = ""
    with ExitStack() as stack:
        stack.enter_context(often_maintained(plan.format, plan.interval))
        try:
            for step, event in enumerate(plan.events):
                if verbose:
                    print(f"step {step}: {event}", flush=True)
                harness.run(event)
                last = step == len(plan.events) - 1
                if event.kind in QUIET and not last:
                    continue
                every = duckdb_every and step % duckdb_every == duckdb_every - 1
                harness.check(step, duckdb=bool(last or every))
            step = None
        except Exception as e:
            error = f"{type(e).__name__}: {e}"
        finally:
            try:
                harness.close()
            except Exception as e:
                if step is None:
                    step, error = len(plan.events), f"close: {type(e).__name__}: {e}"
    return Result(plan, step, error, harness.outcomes, time.monotonic() - started)
