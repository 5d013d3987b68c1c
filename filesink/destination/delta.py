"""The Delta Lake destination: a roll's files are added to a Delta table in one log entry.

- **The table** is at the output path (local or S3), created by delta-rs at the first commit from the sink's
  schema and partition columns (timestamps are Delta's ``timestamp``, in UTC: Delta keeps no other zone).
- **A roll's commit** is one log entry: an ``add`` per object (its path relative to the root, its size, its
  partition values from its directories, statistics from its footer) and one application transaction per vnode
  the files hold rows of (``txn``: app id ``<sink id>-v<vnode>``, version the file's end epoch), with the sink id
  and the file names in the commit's metadata. The sink writes the entry itself (:mod:`.delta_log`), created only
  if absent at the version after the newest; one that loses that race reads the winning entries: if they hold
  this sink's marks of the files' vnodes the commit ends there (landed if the table now holds the files,
  :class:`TableCommitFailedError` if not), otherwise it tries the next version. So two runs of one sink cannot both
  commit the same vnode's epochs.
- **Is a file visible?** Every vnode it holds has a transaction at or past its end epoch (:func:`.base.held_files`):
  the table alone decides, whatever a later compaction or vacuum did to the file itself. The transactions are read
  from the newest checkpoint's ``txn`` column and the entries after it: never the table's file list, which
  delta-rs materializes in each snapshot it holds (its commits and table opening grew with the files: 12 ms to
  69 ms a commit from 100 to 3,000 files).
- **delta-rs** still creates the table, writes the checkpoints and cleans the log up
  (:meth:`DeltaDestination.maintain`), and commits to a table with what the sink's writer does not honour
  (:func:`.delta_log.unsupported`: invariants, check constraints, generated columns, column mapping, deletion
  vectors, row tracking, ...) or on a store without conditional create. delta-rs's ``create_write_transaction``
  does not evaluate a check constraint on the files it is given either (measured with 1.6.6): the files are what
  the sink wrote.
- **History:** the sink writes a checkpoint every ``delta.checkpointInterval`` versions (100) and, at every 10th,
  removes log entries older than ``delta.logRetentionDuration`` (30 days), in a background thread started by the
  roll that reaches the interval (:meth:`DeltaDestination.maintain` says why there and not written by the sink);
  application transactions are kept in every checkpoint.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import CommitProperties, DeltaTable, Transaction
from deltalake import Schema as DeltaSchema
from deltalake.exceptions import TableNotFoundError
from deltalake.transaction import AddAction, RemoveAction

from logstore.diagnosis import Kind, diagnose, told
from logstore.storage import PutAnswer

from ..errors import TableCommitFailedError, TableFormatError
from ..schema.evolution import Change, upgradable
from .base import Destination, TableFormat, held_files, marks_of, s3_settings
from .delta_log import DeltaLog, LogState, UnsupportedLogError, add_path, entry_name, unsupported
from .partitions import partition_texts, typed_value

if TYPE_CHECKING:
    from ..committer.ledger import PlannedFile
    from ..tasks.writer import WrittenObject

log = logging.getLogger(__name__)

ENGINE = "exactly-once-parquet-sink"
"""The ``engineInfo`` of the sink's own commits."""
COMMIT_ATTEMPTS = 100
"""Versions a commit tries, one after the other, while other writers' commits take them first."""
CLEANUP_EVERY = 10
"""The log clean-up runs at every 10th checkpoint (when a checkpoint's version passes a multiple of 10 intervals,
whatever the restarts in between)."""
CHECKPOINT_WAIT = 300.0
"""How long a roll waits for the previous checkpoint when the next is due (:meth:`DeltaDestination.maintain`);
past it the roll goes on, and the roll an interval later waits again."""
DEFAULT_CHECKPOINT_INTERVAL = "100"
"""delta-rs's checkpoint interval, for a table without ``delta.checkpointInterval``."""

CONFIGURATION = {"delta.checkpointInterval": "100", "delta.logRetentionDuration": "interval 30 days"}
"""The table properties a new table is created with: a checkpoint every 100 commits (delta-rs's default; a checkpoint
rewrites every active file's entry, so every 10, Delta Lake's default, cost 4 times as much per commit at 3,000
files), log entries kept 30 days."""


def app_id(sink_id: str, vnode: int) -> str:
    return f"{sink_id}-v{vnode}"


def table_uri(url: str) -> str:
    if "://" not in url or url.startswith("file://"):
        from pathlib import Path

        return str(Path(url.removeprefix("file://")).expanduser().absolute())
    return url.replace("s3a://", "s3://", 1)


def storage_options(options: Mapping[str, Any]) -> dict[str, str]:
    """delta-rs's storage options for the sink's s3fs options: endpoint, region, credentials (or the standard AWS
    variables, which delta-rs reads itself)."""
    names = {
        "endpoint": "AWS_ENDPOINT_URL",
        "region": "AWS_REGION",
        "key": "AWS_ACCESS_KEY_ID",
        "secret": "AWS_SECRET_ACCESS_KEY",
        "token": "AWS_SESSION_TOKEN",
    }
    out = {names[k]: v for k, v in s3_settings(options, environ={}).items() if k in names}
    if out.get("AWS_ENDPOINT_URL", "").startswith("http://"):
        out["AWS_ALLOW_HTTP"] = "true"
    return out


def delta_arrow_schema(schema: pa.Schema) -> pa.Schema:
    """The table's schema: the files' schema with every timestamp in UTC (the instants are the same)."""

    def convert(t: pa.DataType) -> pa.DataType:
        if pa.types.is_timestamp(t):
            return pa.timestamp("us", tz="UTC" if t.tz is not None else None)
        if pa.types.is_struct(t):
            return pa.struct([f.with_type(convert(f.type)) for f in t])
        if pa.types.is_list(t) or pa.types.is_large_list(t):
            return pa.list_(t.value_field.with_type(convert(t.value_type)))
        if pa.types.is_map(t):
            return pa.map_(convert(t.key_type), t.item_field.with_type(convert(t.item_type)))
        return t

    return pa.schema([f.with_type(convert(f.type)).with_nullable(True) for f in schema], metadata=None)


def _json_bound(value: object, type_: pa.DataType) -> object | None:
    """A footer statistic as Delta's ``minValues`` / ``maxValues`` take it; None where a column's bound is left out
    (statistics are optional: they only let readers skip files)."""
    if pa.types.is_integer(type_) or pa.types.is_string(type_) or pa.types.is_boolean(type_):
        return value
    if pa.types.is_floating(type_) and isinstance(value, float) and value == value and abs(value) != float("inf"):
        return value
    if pa.types.is_date(type_):
        return value.isoformat() if hasattr(value, "isoformat") else None
    return None


def stats(footer: pq.FileMetaData, partition_by: Sequence[str]) -> str:
    """Delta's file statistics (numRecords, minValues, maxValues, nullCount) from a footer: top-level columns."""
    schema = footer.schema.to_arrow_schema()
    mins: dict[str, object] = {}
    maxs: dict[str, object] = {}
    nulls: dict[str, int] = {}
    for i in range(footer.num_columns):
        path = footer.schema.column(i).path
        if "." in path or path in partition_by:
            continue
        type_ = schema.field(path).type
        lo: Any = None
        hi: Any = None
        count, bounded = 0, footer.num_row_groups > 0
        for g in range(footer.num_row_groups):
            st = footer.row_group(g).column(i).statistics
            if st is None or not st.has_null_count:
                count = -1
            elif count >= 0:
                count += st.null_count
            if st is None or not st.has_min_max:
                bounded = bounded and footer.row_group(g).num_rows == (st.null_count if st is not None else -1)
                continue
            lo = st.min if lo is None or st.min < lo else lo
            hi = st.max if hi is None or st.max > hi else hi
        if count >= 0:
            nulls[path] = count
        if bounded and lo is not None:
            low, high = _json_bound(lo, type_), _json_bound(hi, type_)
            if low is not None and high is not None:
                mins[path], maxs[path] = low, high
    return json.dumps({"numRecords": footer.num_rows, "minValues": mins, "maxValues": maxs, "nullCount": nulls})


class DeltaDestination(Destination):
    format = TableFormat.DELTA
    transaction = (
        "in the driver, after every file of a roll is written: one Delta log entry adds them all, with one "
        "application transaction per vnode (version: the epoch the vnode's committed files reach)"
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.uri = table_uri(self.output.url)
        self.storage = storage_options(self.output.storage_options)
        self._log = DeltaLog(self.output.url, self.output.storage_options)
        self._state: LogState | None = None
        """The log as last read (the sink's own writer); None before the first read or after an error."""
        self.delta_rs: str | None = None
        """Why this table is read and committed to through delta-rs (None: the sink's own log writer)."""
        self._table: DeltaTable | None = None
        self._checked = False
        """Whether the table's columns were compared with the files' schema."""
        self._checked_at: int | None = None
        """The version of the ``metaData`` action the columns were compared with."""
        self._checkpoint_retry: int | None = None
        """After a checkpoint failed: the version from which to try again."""
        self._checkpointer: threading.Thread | None = None
        """The background checkpoint (:meth:`maintain`), until its outcome is taken."""
        self._checkpointing_at = 0
        """The version :attr:`_checkpointer` checkpoints."""
        self._outcome: tuple[int, bool] | None = None
        """The background checkpoint's outcome: the version it reached (or was of, if it failed), and whether it
        failed; written by the thread before it ends, read after it is joined."""
        self.checkpoint_took: tuple[int, float] | None = None
        """The last background checkpoint that ended well: its version and its time (seconds, clean-up included)."""

    @property
    def name(self) -> str:
        return f"Delta table {self.uri}"

    # -- reading the table -------------------------------------------------------------------------------------

    def _use_delta_rs(self, reason: str) -> None:
        if self.delta_rs is None:
            log.info("%s: committed to through delta-rs (%s)", self.name, reason)
        self.delta_rs = reason
        self._state = None

    def _light(self, action: str) -> LogState | None:
        """The log at its newest version (None: no table yet), read by the sink's own reader; with
        :attr:`delta_rs` set on return, the table is one for delta-rs instead."""
        try:
            if self._state is None:
                self._state = self._log.load()
            else:
                self._log.refresh(self._state)
        except UnsupportedLogError as e:
            self._use_delta_rs(str(e))
            return None
        except Exception as e:
            self._state = None
            if isinstance(e, OSError):
                raise
            raise OSError(f"{self.name}: cannot {action}: {e}") from e
        state = self._state
        if state is not None:
            reason = unsupported(state)
            if reason is not None:
                self._use_delta_rs(f"the table has {reason}")
                return None
            if state.metadata_at != self._checked_at:
                self._checked = False  # a new metaData action: the columns are compared again before a commit
        return state

    def _load(self) -> DeltaTable | None:
        """The table at its newest version, or None if there is none yet (delta-rs)."""
        if self._table is not None:
            self._table.update_incremental()
            return self._table
        try:
            self._table = DeltaTable(self.uri, storage_options=self.storage or None)
        except TableNotFoundError:
            return None
        return self._table

    def reach(self, table: DeltaTable, vnodes: Sequence[int]) -> dict[int, int]:
        """Per vnode, the newest mark the table holds (vnodes without one are left out)."""
        found: dict[int, int] = {}
        for v in vnodes:
            version = table.transaction_version(app_id(self.sink_id, v))
            if version is not None:
                found[v] = int(version)
        return found

    def _reach(self, state: LogState, vnodes: Sequence[int]) -> dict[int, int]:
        found: dict[int, int] = {}
        for v in vnodes:
            version = state.txns.get(app_id(self.sink_id, v))
            if version is not None:
                found[v] = version
        return found

    def held(self, files: Sequence[PlannedFile]) -> set[str] | None:
        vnodes = sorted({v for f in files for v in f.starts})
        if self.delta_rs is None:
            state = self._light("read the table's application transactions")
            if self.delta_rs is None:
                return set() if state is None else held_files(files, self._reach(state, vnodes), self.name)
        table = self._read("read the table's application transactions")
        if table is None:
            return set()
        return held_files(files, self.reach(table, vnodes), self.name)

    def _read(self, action: str) -> DeltaTable | None:
        try:
            return self._load()
        except OSError:
            raise
        except Exception as e:  # delta-rs raises its own exceptions for storage errors
            self._table = None
            raise OSError(f"{self.name}: cannot {action}: {e}") from e

    # -- checks ------------------------------------------------------------------------------------------------

    def check_schema(self, schema: pa.Schema) -> str | None:
        for field in delta_arrow_schema(schema):
            if pa.types.is_time(field.type) or pa.types.is_duration(field.type):
                return f"column {field.name!r} of type {field.type}: a Delta table has no such type"
            try:
                DeltaSchema.from_arrow(pa.schema([field]))
            except Exception as e:
                return f"column {field.name!r} of type {field.type}: a Delta table cannot hold it ({e})"
        for column in self.partition_by:
            type_ = schema.field(column).type
            if not (
                pa.types.is_string(type_)
                or pa.types.is_integer(type_)
                or pa.types.is_boolean(type_)
                or pa.types.is_date(type_)
                or pa.types.is_timestamp(type_)
                or pa.types.is_decimal(type_)
                or pa.types.is_floating(type_)
            ):
                return f"partition column {column!r} of type {type_}: a Delta partition value cannot hold it"
        return None

    def _columns(self) -> tuple[list[str], pa.Schema] | None:
        """The table's partition columns and schema (None: no table)."""
        if self.delta_rs is None:
            state = self._light("open the table")
            if self.delta_rs is None:
                if state is None:
                    return None
                self._checked_at = state.metadata_at
                have = pa.schema(DeltaSchema.from_json(state.metadata["schemaString"]).to_arrow())
                return state.partition_columns, have
        table = self._read("open the table")
        if table is None:
            return None
        return list(table.metadata().partition_columns), pa.schema(table.schema().to_arrow())

    def evolution_problems(self, changes: Sequence[Change]) -> list[str]:
        problems = [
            f"{c} on the {self.name}: a wider type is Delta's typeWidening table feature, which this sink does not "
            f"write. Cast {c.column} back to {c.old} in the query, or write the wider values as a new column"
            for c in changes
            if c.kind == "widened"
        ]
        if changes and self.delta_rs is not None:
            problems.append(
                f"the {self.name} is committed to through delta-rs ({self.delta_rs}), whose commits cannot change a "
                "table's schema. Keep the schema, or change the table's schema first with a Delta writer that "
                "honours its features (ALTER TABLE ... ADD COLUMNS), then start the query again"
            )
        return problems

    def check(self, schema: pa.Schema | None) -> None:
        found = self._columns()
        if found is None:
            return
        columns, have = found
        if columns != list(self.partition_by):
            raise TableFormatError(
                f"the {self.name} exists, partitioned by {columns}, and this sink partitions by "
                f"{list(self.partition_by)}. Nothing was written. Give partition_by={columns}, or a new table path."
            )
        if schema is None:
            return
        self._checked = True
        want = delta_arrow_schema(schema)
        have_types = {f.name: f.type for f in have}
        different = [
            f"{f.name} ({have_types.get(f.name, 'missing')} in the table, {f.type} here)"
            for f in want
            if f.name in have_types
            and not _same_type(have_types[f.name], f.type)
            and not upgradable(have_types[f.name], f.type)  # an older schema of the sink's: evolved at the next commit
        ]
        extra = [f.name for f in have if f.name not in want.names]
        if different or extra:
            shown = "; ".join(different + [f"{c} (only in the table)" for c in extra])
            raise TableFormatError(
                f"the {self.name} exists with other columns than this sink's: {shown}. Nothing was written. "
                "Give the sink a new table path, or write the columns the table has."
            )

    # -- committing --------------------------------------------------------------------------------------------

    def _create(self, schema: pa.Schema) -> DeltaTable:
        try:
            self._table = DeltaTable.create(
                self.uri,
                schema=delta_arrow_schema(schema),
                partition_by=list(self.partition_by) or None,
                mode="ignore",
                configuration=CONFIGURATION,
                storage_options=self.storage or None,
                commit_properties=CommitProperties(custom_metadata={"filesink.sink_id": self.sink_id}),
            )
        except Exception as e:
            raise self._cannot_create(e) from e
        return self._table

    def _cannot_create(self, error: Exception) -> TableCommitFailedError:
        found = diagnose(error, self.output.url)
        advice = (
            found.advise("start again", first=True)
            if found.kind is not Kind.OTHER
            else "Check the table path and its storage's permissions."
        )
        return TableCommitFailedError(
            f"cannot create the {self.name}: {told(error)}. Nothing was committed; the files stay pending and the "
            f"next start commits them. {advice}"
        )

    def _create_entry(self, schema: pa.Schema) -> bool:
        """Create the table: write its version 0 (``protocol``, ``metaData``, as delta-rs writes a new table's) only
        if absent, with the sink's own conditional create. True when version 0 exists now, written by this call or
        by another writer (:meth:`check` then compares its columns); False where delta-rs creates it instead (a
        schema that needs a table feature, a store without conditional create). delta-rs's own create takes a lost
        answer to its write for a conflict and writes the creation again at the next version; this does not."""
        schema_string = DeltaSchema.from_arrow(delta_arrow_schema(schema)).to_json()
        if '"timestamp_ntz"' in schema_string:  # needs the timestampNtz reader and writer feature: delta-rs knows it
            return False
        now = int(time.time() * 1000)
        protocol = {"minReaderVersion": 1, "minWriterVersion": 2}
        metadata = {
            "id": str(uuid.uuid4()),
            "name": None,
            "description": None,
            "format": {"provider": "parquet", "options": {}},
            "schemaString": schema_string,
            "partitionColumns": list(self.partition_by),
            "createdTime": now,
            "configuration": dict(CONFIGURATION),
        }
        info = {
            "timestamp": now,
            "operation": "CREATE TABLE",
            "operationParameters": {
                "mode": "ErrorIfExists",
                "location": self.uri,
                "metadata": json.dumps(metadata, separators=(",", ":")),
                "protocol": json.dumps(protocol, separators=(",", ":")),
            },
            "engineInfo": ENGINE,
            "filesink.sink_id": self.sink_id,
        }
        body = _json_lines([{"commitInfo": info}, {"protocol": protocol}, {"metaData": metadata}])
        try:
            answer = self._log.put(0, body)
        except Exception as e:
            raise self._cannot_create(e) from e
        return answer is not PutAnswer.REFUSED

    def _partition_values(self, obj: WrittenObject, schema: pa.Schema) -> dict[str, str | None]:
        texts = partition_texts(obj.key, self.partition_by)
        values: dict[str, str | None] = {}
        for column, text in zip(self.partition_by, texts, strict=True):
            type_ = schema.field(column).type
            value = typed_value(text, type_, column)
            if pa.types.is_timestamp(type_) and value is not None:
                values[column] = value.strftime("%Y-%m-%d %H:%M:%S.%f")  # type: ignore[attr-defined]
            else:
                values[column] = text
        return values

    def _add(self, obj: WrittenObject, schema: pa.Schema, now: int) -> AddAction:
        return AddAction(
            path=obj.key,
            size=obj.size,
            partition_values=self._partition_values(obj, schema),
            modification_time=now,
            data_change=True,
            stats=stats(self.footer(obj.key, obj.footer), self.partition_by),
        )

    def _metadata(self, pending: Sequence[PlannedFile]) -> dict[str, str]:
        return {
            "filesink.sink_id": self.sink_id,
            "filesink.files": ",".join(f.name for f in pending),
            "filesink.epochs": f"{min(min(f.starts.values(), default=f.end_epoch) for f in pending)}-"
            f"{max(f.end_epoch for f in pending)}",
        }

    def make_visible(
        self, files: Sequence[PlannedFile], written: Mapping[str, Sequence[WrittenObject]], schema: pa.Schema
    ) -> None:
        state: LogState | None = None
        if self.delta_rs is None:
            state = self._light("read the table before a commit")
            if state is None and self.delta_rs is None:
                if not self._create_entry(schema):
                    self._create(schema)
                state = self._light("read the table after creating it")
        if self.delta_rs is not None or state is None:
            self._commit_with_delta_rs(files, written, schema)
            return
        if not self._checked:
            self.check(schema)  # a table made by someone else since the start, or its metadata changed since
            self._checked = True
        vnodes = sorted({v for f in files for v in f.starts})
        held = held_files(files, self._reach(state, vnodes), self.name)
        pending = [f for f in files if f.name not in held]
        if not pending:
            return
        self._commit_entry(state, pending, written, schema)

    def _entry(
        self, pending: Sequence[PlannedFile], written: Mapping[str, Sequence[WrittenObject]], schema: pa.Schema
    ) -> list[dict[str, Any]]:
        """The actions of a roll's log entry, as delta-rs writes them (without the commitInfo). A ``txn`` has no
        ``lastUpdated``, as delta-rs writes none: a table's ``delta.setTransactionRetentionDuration`` could
        otherwise expire the sink's marks at a checkpoint, and the table would no longer say which files it holds."""
        now = int(time.time() * 1000)
        actions: list[dict[str, Any]] = [
            {
                "add": {
                    "path": add_path(obj.key),
                    "partitionValues": self._partition_values(obj, schema),
                    "size": obj.size,
                    "modificationTime": now,
                    "dataChange": True,
                    "stats": stats(self.footer(obj.key, obj.footer), self.partition_by),
                }
            }
            for f in pending
            for obj in written[f.name]
        ]
        marks: dict[int, int] = {}
        for f in pending:
            for v, e in marks_of(f).items():
                marks[v] = max(marks.get(v, -1), e)
        actions += [{"txn": {"appId": app_id(self.sink_id, v), "version": e}} for v, e in sorted(marks.items())]
        return actions

    def _schema_change(self, state: LogState, schema: pa.Schema) -> list[dict[str, Any]]:
        """A ``metaData`` action with the sink's schema when the table's is older (:mod:`filesink.schema.evolution`):
        the table's columns change in the entry of the first files that hold the new ones. Nothing when they are the
        same. The fields' metadata the table had is kept."""
        have = json.loads(state.metadata["schemaString"])
        want = json.loads(DeltaSchema.from_arrow(delta_arrow_schema(schema)).to_json())
        if _without_metadata(have) == _without_metadata(want):
            return []
        kept = {f["name"]: f.get("metadata") or {} for f in have.get("fields", [])}
        for f in want["fields"]:
            f["metadata"] = kept.get(f["name"], f.get("metadata") or {})
        changed = dict(state.metadata, schemaString=json.dumps(want, separators=(",", ":")))
        return [{"metaData": changed}]

    def _body(self, actions: Sequence[Mapping[str, Any]], metadata: Mapping[str, str]) -> bytes:
        info = {
            "timestamp": int(time.time() * 1000),
            "operation": "WRITE",
            "operationParameters": {
                "mode": "Append",
                "partitionBy": json.dumps(list(self.partition_by), separators=(",", ":")),
            },
            "engineInfo": ENGINE,
            **metadata,
        }
        return _json_lines([{"commitInfo": info}, *actions])

    def _commit_entry(
        self,
        state: LogState,
        pending: Sequence[PlannedFile],
        written: Mapping[str, Sequence[WrittenObject]],
        schema: pa.Schema,
    ) -> None:
        """Create the roll's entry at the version after the newest; where another commit has that version, read
        it (and any after it): one that wrote this sink's marks of the files' vnodes ends the commit (landed if the
        table now holds the files, refused otherwise); any other is passed by, at the next version."""
        files = self._entry(pending, written, schema)
        metadata = self._metadata(pending)
        ours = {app_id(self.sink_id, v) for f in pending for v in f.starts}
        vnodes = sorted({v for f in pending for v in f.starts})
        try:
            for _ in range(COMMIT_ATTEMPTS):
                version = state.version + 1
                actions = self._schema_change(state, schema) + files
                answer = self._log.put(version, self._body(actions, metadata))
                if answer is PutAnswer.CREATED:
                    state.apply(version, actions)
                    return
                if answer is PutAnswer.REFUSED:
                    self._use_delta_rs("its store has no conditional create (put if absent)")
                    self._commit_with_delta_rs(pending, written, schema)
                    return
                others = self._log.refresh(state)
                reason = unsupported(state)
                if reason is not None:  # another writer changed the protocol: delta-rs honours it
                    self._use_delta_rs(f"the table has {reason} since version {others[-1][0] if others else version}")
                    self._commit_with_delta_rs(pending, written, schema)
                    return
                touched = [
                    (v, a["txn"]["appId"])
                    for v, entry in others
                    for a in entry
                    if a.get("txn", {}).get("appId") in ours
                ]
                if not touched:
                    if state.metadata_at > version - 1 and state.metadata_at != self._checked_at:
                        self.check(schema)  # another writer changed the columns: still the sink's?
                    continue
                held = held_files(pending, self._reach(state, vnodes), self.name)
                if held == {f.name for f in pending}:
                    return  # landed: this commit's own entry (a retried request), or the same files by a run before
                at, app = touched[0]
                raise TableCommitFailedError(
                    f"the commit of {len(pending)} files ({', '.join(f.name for f in pending)}) to the {self.name} "
                    f"did not land: version {at} ({self._log.display(entry_name(at))}), written by another commit "
                    f"first, holds this sink's application transaction {app} (vnode "
                    f"{app.rsplit('-v', 1)[-1]}), and the table does not hold the files. The files stay pending: the "
                    "next start, or filesink recover apply, decides from the table alone. If another writer commits "
                    f"to this table, make sure it leaves this sink's application ids ({app_id(self.sink_id, 0)} ...) "
                    "alone."
                )
            raise TableCommitFailedError(
                f"the commit of {len(pending)} files ({', '.join(f.name for f in pending)}) to the {self.name} did "
                f"not land: {COMMIT_ATTEMPTS} versions in a row, up to {state.version}, were written by other "
                "commits first. The files stay pending: the next start, or filesink recover apply, commits them "
                "once. Give this table fewer concurrent writers."
            )
        except (TableCommitFailedError, TableFormatError):
            raise
        except Exception as e:
            self._state = None
            self.after_failure(pending, e, leave_alone=f"this sink's application ids ({app_id(self.sink_id, 0)} ...)")

    def _commit_with_delta_rs(
        self, files: Sequence[PlannedFile], written: Mapping[str, Sequence[WrittenObject]], schema: pa.Schema
    ) -> None:
        """The commit through delta-rs, for a table the sink's own writer does not commit to (:attr:`delta_rs`)."""
        table = self._read("read the table before a commit")
        if table is None:
            table = self._create(schema)
        elif not self._checked:
            self.check(schema)  # a table made by someone else since the start: its columns must be the sink's
        self._checked = True
        vnodes = sorted({v for f in files for v in f.starts})
        held = held_files(files, self.reach(table, vnodes), self.name)
        pending = [f for f in files if f.name not in held]
        if not pending:
            return
        have = {f.name for f in pa.schema(table.schema().to_arrow())}
        lacking = [c for c in delta_arrow_schema(schema).names if c not in have]
        if lacking:
            raise TableCommitFailedError(
                f"the {self.name} is committed to through delta-rs ({self.delta_rs}), whose commits cannot change a "
                f"table's schema, and it lacks columns {lacking} that files {', '.join(f.name for f in pending)} "
                "hold. Nothing was committed; the files stay pending. Add the columns with a Delta writer that "
                "honours the table's features (ALTER TABLE ... ADD COLUMNS), then start the query again."
            )
        now = int(time.time() * 1000)
        actions: list[AddAction | RemoveAction] = [
            self._add(obj, schema, now) for f in pending for obj in written[f.name]
        ]
        marks = [Transaction(app_id(self.sink_id, v), e) for f in pending for v, e in sorted(marks_of(f).items())]
        try:
            table.create_write_transaction(
                actions,
                mode="append",
                schema=table.schema(),
                partition_by=list(self.partition_by) or None,
                commit_properties=CommitProperties(custom_metadata=self._metadata(pending), app_transactions=marks),
            )
        except Exception as e:
            self._table = None
            self.after_failure(pending, e, leave_alone=f"this sink's application ids ({app_id(self.sink_id, 0)} ...)")

    # -- history -----------------------------------------------------------------------------------------------

    def maintain(self) -> None:
        """A checkpoint every ``delta.checkpointInterval`` versions (delta-rs's ``create_checkpoint``) and, at every
        :data:`CLEANUP_EVERY` th checkpoint, the clean-up of log entries and checkpoints older than
        ``delta.logRetentionDuration`` (``cleanup_metadata``, unless ``delta.enableExpiredLogCleanup`` is false),
        in a background thread (:meth:`_checkpoint`), off the roll's path.

        Why in the background rather than a checkpoint written by the sink: delta-rs's checkpoint loads and writes
        every file of the table (220 to 460 ms at 10,000 files, in every 100th roll), so a roll's mean time grew
        with the table. A checkpoint the sink wrote itself (the previous checkpoint merged with the entries since)
        would still read and write every file on the roll's path, and is a larger part of the protocol than a
        commit (the checkpoint schema, statistics, tombstones kept for the retention) that every reader must read
        right; delta-rs writes it right. A checkpoint only makes reading faster, so it need not be on the roll's
        path: the roll starts it and goes on; its cost (CPU, I/O) moves to the thread, it does not vanish.

        - **One at a time**: the next is due an interval after the version the running one is of, and starts only
          once that one ended and its outcome was taken (the version it reached, or its failure). A roll at which
          the next is due while the previous still runs waits for it: only where a checkpoint takes longer than an
          interval's rolls (a benchmark's rolls, a few milliseconds apart, at 10,000 files on a busy machine; not a
          query's, seconds apart). That keeps the entries after the newest checkpoint, which every start reads, to
          about an interval, and the checkpoints at their versions.
        - **Never racing the roll**: the thread reads the table with its own delta-rs snapshot and changes nothing
          the roll reads but the log's files, as any other writer's checkpoint would: the sink's reader takes a
          newer ``_last_checkpoint`` as such (:meth:`.delta_log.DeltaLog.refresh`). The outcome is taken by the
          next roll's :meth:`maintain`, on the roll's thread.
        - **``_last_checkpoint`` never set back** by the sink: the checkpoint is of the version the roll that
          started it reached (later than the one before, which ended first), and is skipped if
          ``_last_checkpoint`` names that version or a newer one already (another writer's checkpoint; one written
          between that read and delta-rs's write of the hint is the window every Delta writer has).
        - **Failures** are logged as a warning and tried again 10 versions later: the commit had landed.
        - :meth:`settle` waits for it (the sink's close does); the thread is a daemon, so a process that ends
          without closing does not wait: a checkpoint is written whole or not at all, and ``_last_checkpoint``
          after it.

        delta-rs's own commits clean up at every checkpoint; a clean-up lists the whole log (74 ms at 10,000
        entries, measured), which every 10th checkpoint keeps to a tenth."""
        state = self._state
        if self.delta_rs is not None or state is None:
            return
        running = self._checkpointer is not None and self._checkpointer.is_alive()
        if not running:
            self._collect(state)
        config = state.configuration
        try:
            interval = max(1, int(config.get("delta.checkpointInterval", DEFAULT_CHECKPOINT_INTERVAL)))
        except ValueError:
            interval = int(DEFAULT_CHECKPOINT_INTERVAL)
        last = state.checkpoint if state.checkpoint is not None else 0
        if running:
            last = max(last, self._checkpointing_at)
        due = last + interval
        if self._checkpoint_retry is not None:
            due = max(due, self._checkpoint_retry)
        if state.version < due:
            return
        if running:  # an interval behind: the roll waits for the previous checkpoint (see above)
            if not self.settle(CHECKPOINT_WAIT):
                self._checkpointing_at = state.version  # a store that hangs: waited for again an interval later
                return
            self._collect(state)
        clean = state.version // (interval * CLEANUP_EVERY) > last // (interval * CLEANUP_EVERY)
        clean = clean and config.get("delta.enableExpiredLogCleanup", "true").lower() != "false"
        self._outcome = None
        self._checkpointing_at = state.version
        self._checkpointer = threading.Thread(
            target=self._checkpoint, args=(state.version, clean), name=f"delta-checkpoint-{self.sink_id}", daemon=True
        )
        self._checkpointer.start()

    def _collect(self, state: LogState) -> None:
        """Take the outcome of the background checkpoint, which ended, into ``state`` and the retry."""
        thread = self._checkpointer
        if thread is None:
            return
        thread.join()
        self._checkpointer = None
        outcome, self._outcome = self._outcome, None
        if outcome is None:
            return
        reached, failed = outcome
        if failed:
            self._checkpoint_retry = reached + 10
        else:
            self._checkpoint_retry = None
            state.checkpoint = max(state.checkpoint or 0, reached)

    def _checkpoint(self, version: int, clean: bool) -> None:
        """The background thread: a checkpoint of ``version`` and, with ``clean``, the log's clean-up."""
        started = time.perf_counter()
        try:
            # At the version the roll reached, not the newest: the roll's next commits go on meanwhile, and a
            # listing of a local directory may miss an entry created while it runs and show the next (delta-rs
            # refuses such a gap: measured, 6 loads of 46 at the newest version, none of 46 at a version reached)
            table = DeltaTable(self.uri, version=version, storage_options=self.storage or None)
            reached = version
            hint = self._log.last_checkpoint()
            if hint is None or hint < version:  # never set back: a checkpoint as new or newer is left as it is
                table.create_checkpoint()
            else:
                reached = hint
            if clean:
                table.cleanup_metadata()
        except Exception as e:
            self._outcome = (version, True)
            log.warning(
                "%s: the checkpoint at version %d failed (%s); the commits go on, and the checkpoint is tried again "
                "at version %d. A reader reads the log entries since the last checkpoint meanwhile.",
                self.name,
                version,
                e,
                version + 10,
            )
            return
        self.checkpoint_took = (reached, time.perf_counter() - started)
        self._outcome = (reached, False)

    def settle(self, timeout: float | None = None) -> bool:
        """Wait for the background checkpoint (and clean-up) to end, at most ``timeout`` seconds; whether it did.
        Its outcome is taken by the next :meth:`maintain`."""
        thread = self._checkpointer
        if thread is None:
            return True
        thread.join(timeout)
        if thread.is_alive():
            log.warning(
                "%s: the checkpoint in the background has not ended after %s s; it goes on in the background (a "
                "process that ends meanwhile leaves it unwritten, which only makes reading slower)",
                self.name,
                timeout,
            )
            return False
        return True

    def status(self) -> dict[str, Any]:
        out = super().status()
        try:
            if self.delta_rs is None:
                state = self._light("read the table")
                if self.delta_rs is None:
                    out["version"] = state.version if state is not None else None
                    return out
            table = self._load()
        except Exception as e:
            out["error"] = str(e)
            return out
        out["version"] = table.version() if table is not None else None
        if self.delta_rs is not None:
            out["committed through"] = f"delta-rs ({self.delta_rs})"
        return out


def _json_lines(actions: Sequence[Mapping[str, Any]]) -> bytes:
    """A log entry's bytes: one compact JSON action a line."""
    return "".join(json.dumps(a, separators=(",", ":")) + "\n" for a in actions).encode()


def _without_metadata(schema: Any) -> Any:
    """A Delta schema's JSON without the fields' metadata (at every depth), to compare the columns alone."""
    if isinstance(schema, dict):
        return {k: _without_metadata(v) for k, v in schema.items() if k != "metadata"}
    if isinstance(schema, list):
        return [_without_metadata(v) for v in schema]
    return schema


def _same_type(have: pa.DataType | None, want: pa.DataType) -> bool:
    if have is None:
        return False
    if have.equals(want):
        return True
    loose = {pa.large_string(): pa.string(), pa.large_binary(): pa.binary()}
    return loose.get(have, have).equals(loose.get(want, want)) or str(have) == str(want)
