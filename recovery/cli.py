"""``filesink recover status|plan|apply``: inspects and repairs a sink's state without Spark (SQLite, pyarrow and
the output's owner only). The ``filesink`` command (:mod:`filesink.cli`) adds these steps as its ``recover``
command; ``python -m recovery STEP`` runs them on their own. This module never imports :mod:`filesink.cli`.

``status`` and ``plan`` open the state database read-only; ``apply`` takes the state directory's lock. Without a
state database (``--log-store URL``, the state directory lost), the state is rebuilt from the durable home: in
memory for ``status`` and ``plan``, into the state directory (if one is given) for ``apply``.

A sink that writes a table (Delta, Iceberg) has its destination opened from its recorded table format and table,
with the catalog properties given as ``--catalog KEY=VALUE`` (never recorded: they may hold secrets); the table
alone says which pending files it holds (:func:`open_table`).

Exit codes: 0 done (or nothing to do), 1 failed, 2 bad usage, 3 a live query holds the sink, 4 not a sink's
state directory, 5 damaged log segments block the sink (``apply`` without ``--drop-damaged``). ``health``
(:mod:`recovery.health`) exits 0 when the sink is healthy, else 8 plus a bit per reason (9 to 15).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import socket
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from filesink import s3options
from filesink.argparsing import Parser, catalog_property
from filesink.destination import Destination, TableFormat, open_destination, table_options
from filesink.errors import COMMAND_ERRORS, EXIT_OK, LogStoreMovedError, SinkLockedError, report
from filesink.ledger import Ledger, PlannedFile, SchemaVersion
from filesink.lock import StateLock, lock_holder
from filesink.output import OutputLocation, records
from filesink.output.claim import CLAIM_NAME, check_claim, move_claim, read_claim
from filesink.output.probe import check_s3
from filesink.planner import file_task, writer_ranges
from filesink.progress import plural
from filesink.writer import FileTask
from logstore import DamagedSegment, GivenUp, LogLocation, LogStore, NoLogStoreError
from logstore.home import CLAIM_FILE, FILES, SINK_RECORD, DurableHome, HomeView, describe_age, term_path
from logstore.statedb import STATE_DB_NAME, connect, translated
from logstore.storage import is_local

from . import health
from .errors import LiveOwnerError, NotASinkError
from .resolve import Action, RecoveryPlan, Resolution, apply_recovery, plan_recovery, recorded_sizes, resolution


@dataclass
class OpenSink:
    state_dir: Path | None
    store: LogStore
    ledger: Ledger
    output: OutputLocation
    config: dict[str, Any]

    def file_task(self, f: PlannedFile, term: int) -> FileTask:
        return file_task(self.store, self.ledger, f, self.config["partition_by"], term=term)

    def close(self) -> None:
        self.store.close()


def _storage_options(args: argparse.Namespace) -> dict[str, Any]:
    """S3 settings from the flags (:mod:`filesink.s3options`, the same as ``filesink run``'s); credentials from the
    standard AWS variables or profile (never flags). The endpoint and region the state directory remembers (the
    ones its sink last ran with) fill in what neither the flags nor the AWS variables give."""
    state_dir = Path(args.state_dir).absolute() if getattr(args, "state_dir", None) else None
    return s3options.with_remembered(s3options.from_args(args), state_dir)


def open_sink(
    state_dir: Path | None,
    storage_options: dict[str, Any],
    *,
    readonly: bool = False,
    log_store: str | None = None,
) -> OpenSink:
    """Open the sink whose state is in ``state_dir``; :class:`NotASinkError` if there is none.

    With ``log_store`` and no state database in ``state_dir`` (or no ``state_dir``), the sink's state is rebuilt
    from the durable home at ``log_store``: into a new database in ``state_dir`` unless ``readonly``, else in
    memory (nothing is written)."""
    has_db = state_dir is not None and LogStore.recorded_location(state_dir) is not None
    if not has_db and state_dir is not None and (state_dir / STATE_DB_NAME).is_file():
        with contextlib.suppress(NoLogStoreError):  # a database SQLite cannot read is an error naming it
            LogStore.open_existing(state_dir, storage_options=storage_options, readonly=True).close()
    if not has_db and log_store is None:
        raise NotASinkError(
            f"{state_dir} is not a sink's state directory: it holds no {STATE_DB_NAME}. If the sink's state "
            "directory was lost, give its log store location (--log-store URL): its durable home rebuilds it."
        )
    try:
        if has_db:
            assert state_dir is not None
            store = LogStore.open_existing(state_dir, storage_options=storage_options, readonly=readonly)
            if log_store is not None and LogLocation(log_store).canonical != store.location.canonical:
                store.close()
                raise NotASinkError(
                    f"{state_dir} belongs to the log store at {store.location.canonical}, not {log_store}: give "
                    "the one it was created with, or leave --log-store out"
                )
        elif readonly or state_dir is None:
            assert log_store is not None
            store = LogStore.from_home(log_store, storage_options=storage_options)
        else:
            assert log_store is not None
            store = LogStore.open(state_dir, log_store, storage_options=storage_options, require_home=True)
    except NoLogStoreError as e:
        raise NotASinkError(f"{state_dir or log_store} is not a sink's state directory or log store: {e}") from None
    try:
        ledger = Ledger(store)
        if store.rebuilt:
            ledger.config_from_home()
            if store.readonly or state_dir is None or not has_db:
                store.sync_from_home(adopt=False)
                ledger.sync_pending()
        config = ledger.config()
        if config is None:
            raise NotASinkError(f"{store.db_path} holds no sink: its sink tables are missing or empty")
        if state_dir is not None:
            output = OutputLocation.of_sink(str(config["output"]), storage_options, state_dir)
        else:  # no state directory: a local output stages in itself
            url = str(config["output"])
            output = OutputLocation(url, storage_options if not is_local(url) else {})
        if not readonly:  # apply may write files again: where its temp files can be renamed into the output
            output = output.checked()
        return OpenSink(state_dir, store, ledger, output, config)
    except BaseException:
        store.close()
        raise


def open_table(sink: OpenSink, catalog: dict[str, str], step: argparse.ArgumentParser) -> Destination:
    """The sink's destination: its recorded table format and table, and the catalog properties ``catalog`` (from
    ``--catalog``: the state does not record them, as they may hold secrets). ``step.error`` (exit 2) for
    ``--catalog`` on a sink that writes no Iceberg table, and for an Iceberg table whose catalog is not the
    embedded default when no ``--catalog`` is given."""
    kind = str(sink.config.get("table_format") or TableFormat.DIRECTORY.value)
    table = sink.config.get("table")
    if catalog and kind != TableFormat.ICEBERG.value:
        what = "a Delta table, named by its path alone" if kind == TableFormat.DELTA.value else "a directory"
        step.error(
            f"--catalog is for a sink that writes an Iceberg table: sink {sink.store.sink_id} writes {what} (its "
            f"recorded table format: {kind}). Leave --catalog out"
        )
    options = table_options(kind, catalog or None, str(table) if table else None)  # its library is installed
    if kind == TableFormat.ICEBERG.value and not catalog:
        missing = _missing_catalog(sink, str(table))
        if missing is not None:
            step.error(missing)
    return open_destination(
        options, output=sink.output, sink_id=sink.store.sink_id, partition_by=list(sink.config["partition_by"])
    )


def _missing_catalog(sink: OpenSink, table: str) -> str | None:
    """Why the Iceberg table ``table`` of ``sink`` needs ``--catalog`` (its catalog is not the embedded one), or
    None (a local output that holds the embedded catalog)."""
    advice = (
        "give the catalog properties the sink was given, with --catalog KEY=VALUE (repeatable, e.g. --catalog "
        "uri=postgresql+psycopg2://user@host/db); the state does not record them, as they may hold secrets"
    )
    where = f"sink {sink.store.sink_id} writes the Iceberg table {table} at {sink.output.url}"
    if not sink.output.is_local:
        return f"{where}, on object storage, whose catalog is not the embedded one: {advice}"
    from filesink.destination.iceberg import EMBEDDED_CATALOG

    embedded = sink.output.local_root() / EMBEDDED_CATALOG
    if not embedded.is_file():
        return f"{where}, and the output holds no embedded catalog ({embedded}): the sink was given a catalog: {advice}"
    return None


def _catalog_shown(destination: Destination) -> str:
    """Which catalog an Iceberg destination uses (the keys of the given properties only: values may be secrets)."""
    from filesink.destination.iceberg import EMBEDDED_CATALOG

    given = destination.options.catalog_properties()
    if given:
        return "given with --catalog (" + ", ".join(sorted(given)) + ")"
    return f"the embedded SQLite catalog {destination.output.local_root() / EMBEDDED_CATALOG}"


def destination_status(destination: Destination) -> dict[str, Any]:
    """What ``status``, ``plan`` and ``apply`` show of the destination (an error reading it is shown, not raised:
    the rest of the state is worth seeing)."""
    try:
        shown = destination.status()
    except Exception as e:
        shown = {"format": destination.format.value, "where": destination.name, "error": f"{type(e).__name__}: {e}"}
    if destination.format is TableFormat.ICEBERG:
        shown["catalog"] = _catalog_shown(destination)
    return shown


def _ranges(vnodes: list[int]) -> str:
    if not vnodes:
        return "-"
    spans, start = [], vnodes[0]
    for prev, cur in zip(vnodes, [*vnodes[1:], None], strict=True):
        if cur != prev + 1:
            spans.append(f"{start}" if start == prev else f"{start}-{prev}")
            start = cur  # type: ignore[assignment]
    return ",".join(spans)


def _file_json(f: PlannedFile) -> dict[str, Any]:
    return {
        "name": f.name,
        "vnodes": [f.vnode_lo, f.vnode_hi],
        "start_epochs": {str(v): s for v, s in sorted(f.starts.items())},
        "end_epoch": f.end_epoch,
        "rows": f.rows,
        "reason": f.reason,
    }


def _table(headers: Sequence[str], rows: list[Sequence[Any]]) -> str:
    cells = [list(map(str, headers))] + [[str(c) for c in r] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells]
    return "\n".join([lines[0], "  ".join("-" * w for w in widths), *lines[1:]])


# -- commands ------------------------------------------------------------------------------------------


def _verify_progress(done: int, total: int) -> None:
    if done == total or done % 100 == 0:
        print(f"verified {done}/{total} log segments", file=sys.stderr, flush=True)


def status(
    sink: OpenSink,
    parallelism: int | None,
    verify: bool = True,
    quiet: bool = False,
    destination: Destination | None = None,
) -> dict[str, Any]:
    store = sink.store
    points = store.truncate_points()
    backlog = store.backlog()
    # What the vnodes hold above their truncate points, as the rebuild counts it (_rebuilt_line). Not the sealed
    # epochs still recorded: a state rebuilt from the durable home records every epoch whose record the home still
    # keeps (records of committed epochs go at the next sweep), a state directory's database prunes them sooner.
    held = store.held_totals()
    result: dict[str, Any] = {
        "sink_id": store.sink_id,
        "output": sink.config["output"],
        "log_store": store.location.canonical,
        "vnodes": store.vnodes,
        "key_columns": sink.config["key_columns"],
        "partition_by": sink.config["partition_by"],
        "last_sealed_epoch": store.last_sealed_epoch,
        "state_dir": str(sink.state_dir) if sink.state_dir is not None else None,
        "held_by": lock_holder(sink.state_dir) if sink.state_dir is not None else None,
        "writer_term": sink.ledger.term(),
        "truncate_points": {str(v): e for v, e in points.items()},
        "backlog": {"epochs": held.epochs, "rows": held.rows, "bytes": held.bytes},
        "pending_files": [_file_json(f) for f in sink.ledger.pending()],
        "schema_history": [_schema_json(v) for v in sink.ledger.schema_history()],
    }
    if destination is not None:
        result["destination"] = destination_status(destination)
        if destination.options.is_table:
            _table_files(sink, destination, result)
    if verify:
        damaged = store.damaged(progress=None if quiet else _verify_progress)
        result["damaged_segments"] = [_damaged_json(d) for d in damaged]
        result["damaged_vnodes"] = sorted({v for d in damaged for v in d.vnodes})
    result["given_up"] = [_given_up_json(g) for g in store.given_up()]
    if parallelism is not None:
        by_vnode = {b.vnode: b for b in backlog}
        result["writers"] = [
            {
                "writer": i,
                "vnodes": [r.start, r.stop - 1],
                "rows": sum(by_vnode[v].rows for v in r),
                "bytes": sum(by_vnode[v].bytes for v in r),
            }
            for i, r in enumerate(writer_ranges(store.vnodes, parallelism))
        ]
    return result


def _table_files(sink: OpenSink, destination: Destination, result: dict[str, Any]) -> None:
    """Add to each pending file of ``result`` whether the table holds it (``in_table``) and what recovery will do
    with it (``action``), as ``plan`` decides it; both None when the table cannot be read (``table_error``)."""
    pending = sink.ledger.pending()
    try:
        held = destination.held(pending) if pending else set()
    except COMMAND_ERRORS as e:  # the table unreachable, or disagreeing with the state: shown, not raised
        result["table_error"] = str(e)
        held = None
    recorded = recorded_sizes(list(records(sink.store.storage))) if pending and held is not None else {}
    points = sink.store.truncate_points()
    partitioned = bool(sink.config["partition_by"])
    for f, shown in zip(pending, result["pending_files"], strict=True):
        if held is None:
            shown["in_table"] = shown["action"] = None
            continue
        shown["in_table"] = f.name in held
        shown["action"] = resolution(sink.output, partitioned, f, recorded, points, held).action.value


def _damaged_json(d: DamagedSegment) -> dict[str, Any]:
    return {"segment": d.name, "epoch": d.epoch, "vnodes": d.vnodes, "rows": d.rows, "problem": str(d.error)}


def _given_up_json(g: GivenUp) -> dict[str, Any]:
    return {
        "segment": g.segment,
        "epoch": g.epoch,
        "vnodes": g.vnodes,
        "rows": g.rows,
        "problem": g.problem,
        "term": g.term,
        "given_up_at": g.given_up_at,
    }


def _plan_json(plan: RecoveryPlan) -> dict[str, Any]:
    g, o = plan.log_garbage, plan.output_garbage
    result: dict[str, Any] = {}
    if plan.term is not None:
        result["writer_term"] = plan.term
        result["fenced"] = plan.fenced
    return result | {
        "files": [
            {
                **_file_json(r.file),
                "visible_objects": [k for k, _ in r.visible],
                "size_mismatch": r.mismatched,
                "in_table": r.held,
                "action": r.action.value,
            }
            for r in plan.files
        ],
        "garbage": {
            "staging_temp_files": len(o.staging_temp_files),
            "staging_dirs": len(o.staging_dirs),
            "multipart_uploads": len(o.uploads),
            "writer_records": len(o.records),
            "released_segments": g.released_segments,
            "unsealed_segments": g.orphan_segments,
            "log_temp_files": g.temp_files,
            "bytes": g.bytes_freed,
        },
        "damaged_segments": [_damaged_json(d) for d in plan.damaged],
        "given_up": [_given_up_json(g) for g in plan.given_up],
        "nothing_to_do": plan.empty,
    }


def _schema_json(v: SchemaVersion) -> dict[str, Any]:
    return {
        "version": v.version,
        "first_epoch": v.first_epoch,
        "columns": [[name, kind] for name, kind in json.loads(v.spark_schema)],
        "changes": list(v.changes),
    }


def _print_schema_history(history: list[dict[str, Any]]) -> None:
    if not history:
        print("\nschema: none yet (recorded with the first batch)")
        return
    latest = history[-1]
    columns = ", ".join(f"{name} {kind}" for name, kind in latest["columns"])
    print(f"\nschema: version {latest['version']}, from epoch {latest['first_epoch']}: {columns}")
    if len(history) > 1:
        print(
            _table(
                ["version", "from epoch", "changes"],
                [(v["version"], v["first_epoch"], _changes_shown(v)) for v in history],
            )
        )


def _changes_shown(v: dict[str, Any]) -> str:
    if v["version"] == 1:
        return "(the first schema)"
    return "; ".join(v["changes"]) or "the columns' order changed"


def _print_status(s: dict[str, Any]) -> None:
    print(f"sink {s['sink_id']}")
    for key in ("output", "log_store", "vnodes", "key_columns", "partition_by", "last_sealed_epoch"):
        print(f"  {key.replace('_', ' ')}: {_shown(key, s[key])}")
    if s.get("state_dir") is None:
        print("  held by: unknown (no state directory: a query running elsewhere does not show here)")
    else:
        print(f"  held by: {s['held_by'] or 'nobody (no live query)'}")
    print(f"  writer term: {s['writer_term']}")
    if "destination" in s:
        _print_destination(s["destination"])
    _print_schema_history(s["schema_history"])
    by_epoch: dict[int, list[int]] = {}
    for v, e in s["truncate_points"].items():
        by_epoch.setdefault(e, []).append(int(v))
    print("\ntruncate points")
    print(_table(["epoch", "vnodes"], [(e, _ranges(sorted(v))) for e, v in sorted(by_epoch.items())]))
    b = s["backlog"]
    print(f"\nlog backlog: {b['epochs']} epochs, {b['rows']:,} rows, {b['bytes']:,} bytes")
    if "writers" in s:
        print(
            _table(
                ["writer", "vnodes", "rows", "bytes"],
                [
                    (w["writer"], f"{w['vnodes'][0]}-{w['vnodes'][1]}", f"{w['rows']:,}", f"{w['bytes']:,}")
                    for w in s["writers"]
                ],
            )
        )
    if "damaged_segments" in s:
        damaged = s["damaged_segments"]
        if damaged:
            vnodes = _ranges(s["damaged_vnodes"])
            print(f"\nDAMAGED log segments: {len(damaged)}; vnodes whose data cannot be read: {vnodes}")
            print(
                _table(
                    ["segment", "epoch", "vnodes", "rows", "problem"],
                    [(d["segment"], d["epoch"], _ranges(d["vnodes"]), f"{d['rows']:,}", d["problem"]) for d in damaged],
                )
            )
            print(DAMAGE_WAY_OUT)
        else:
            print("\nlog segments: all verified")
    _print_given_up(s["given_up"], "given up so far")
    files = s["pending_files"]
    print(f"\npending files: {len(files)}")
    table = "destination" in s and s["destination"]["format"] != TableFormat.DIRECTORY.value
    if files and table:
        print(
            _table(
                ["file", "vnodes", "end epoch", "rows", "in the table", "recovery will"],
                [
                    (
                        f["name"],
                        f"{f['vnodes'][0]}-{f['vnodes'][1]}",
                        f["end_epoch"],
                        f["rows"],
                        _yes_no(f["in_table"]),
                        _table_action(f["action"], f["in_table"]),
                    )
                    for f in files
                ],
            )
        )
    elif files:
        print(
            _table(
                ["file", "vnodes", "end epoch", "rows"],
                [(f["name"], f"{f['vnodes'][0]}-{f['vnodes'][1]}", f["end_epoch"], f["rows"]) for f in files],
            )
        )
    if "table_error" in s:
        print(f"in the table: unknown, the table could not be read: {s['table_error']}")


def _print_destination(d: dict[str, Any]) -> None:
    print(f"\ndestination: {d['where']} ({d['format']})")
    for key, value in d.items():
        if key not in ("format", "where"):
            shown = "none yet (the first commit creates the table)" if value is None else value
            print(f"  {key.replace('_', ' ')}: {shown}")


def _yes_no(held: bool | None) -> str:
    return "unknown" if held is None else "yes" if held else "no"


def _table_action(action: str | None, held: bool | None) -> str:
    """What recovery does with a pending file of a table, in words (the action first, as ``plan --json`` has it)."""
    if action is None:
        return "unknown (the table could not be read)"
    if action == Action.COMMIT.value:
        return "commit (the table holds it)" if held else "commit (added to the table first, once)"
    if action == Action.REWRITE.value:
        return "rewrite (then added to the table, once)"
    if action == Action.DROP.value:
        return "drop (its rows are written again)"
    return action


def _shown(key: str, value: Any) -> str:
    """A value of ``recover status`` as a person reads it (the JSON keeps the values as they are)."""
    if isinstance(value, list):
        return ", ".join(map(str, value)) if value else "none"
    if value is None:
        return {"key_columns": "all columns", "partition_by": "none"}.get(key, "none")
    return str(value)


DAMAGE_WAY_OUT = (
    "The sink cannot write these rows, nor anything after them for these vnodes, so it stops at start and `recover "
    "apply` exits 5. Either restore each segment file (the same name and bytes) from a backup; or stop the query and "
    "give exactly these rows up for good with `filesink recover apply --drop-damaged`, which writes every other row "
    "and records what it gave up."
)


def _print_damaged(damaged: list[dict[str, Any]], done: bool) -> None:
    if not damaged:
        return
    rows = sum(d["rows"] for d in damaged)
    print(f"\nDAMAGED log segments the sink still needs: {len(damaged)} ({rows:,} rows)")
    print(
        _table(
            ["segment", "epoch", "vnodes", "rows", "problem"],
            [(d["segment"], d["epoch"], _ranges(d["vnodes"]), f"{d['rows']:,}", d["problem"]) for d in damaged],
        )
    )
    if not done:
        print(DAMAGE_WAY_OUT)


def _print_given_up(given: list[dict[str, Any]], what: str) -> None:
    if not given:
        return
    rows = sum(g["rows"] for g in given)
    print(f"\ndamaged log segments {what} (`--drop-damaged`): {len(given)}; {rows:,} rows not in the output")
    print(
        _table(
            ["segment", "epoch", "vnodes", "rows", "term", "problem"],
            [
                (g["segment"], g["epoch"], _ranges(g["vnodes"]), f"{g['rows']:,}", g["term"], g["problem"])
                for g in given
            ],
        )
    )


def _print_plan(p: dict[str, Any], done: bool) -> None:
    files = p["files"]
    verb = "resolved" if done else "to resolve"
    table = "destination" in p and p["destination"]["format"] != TableFormat.DIRECTORY.value
    print(f"pending files {verb}: {len(files)}")
    if files and table:
        print(
            _table(
                ["file", "vnodes", "end epoch", "visible", "in the table", "action"],
                [
                    (
                        f["name"],
                        f"{f['vnodes'][0]}-{f['vnodes'][1]}",
                        f["end_epoch"],
                        "yes" if f["visible_objects"] else "no",
                        _yes_no(f["in_table"]),
                        _table_action(f["action"], f["in_table"]),
                    )
                    for f in files
                ],
            )
        )
        adding = [f for f in files if f["in_table"] is False and f["action"] in (Action.COMMIT, Action.REWRITE)]
        if adding:
            where = p["destination"]["where"]
            if done:
                print(f"added {plural(len(adding), 'file')} to the {where}")
            else:
                print(
                    f"the {where} does not hold {len(adding)} of them: apply adds them to it (the table's marks "
                    "record them: never twice)"
                )
    elif files:
        print(
            _table(
                ["file", "vnodes", "end epoch", "visible", "action"],
                [
                    (
                        f["name"],
                        f"{f['vnodes'][0]}-{f['vnodes'][1]}",
                        f["end_epoch"],
                        "yes" if f["visible_objects"] else "no",
                        f["action"],
                    )
                    for f in files
                ],
            )
        )
    g = p["garbage"]
    print(
        f"garbage {'removed' if done else 'to remove'}: {g['staging_temp_files']} staging temp files "
        f"({g['staging_dirs']} fenced staging directories), {g['multipart_uploads']} multipart uploads in "
        f"progress, {g['writer_records']} writer records, {g['released_segments']} released and "
        f"{g['unsealed_segments']} unsealed log segments ({g['bytes']:,} bytes of log), {g['log_temp_files']} log "
        "temp files"
    )
    if done:
        print(
            f"writer term is now {p['writer_term']}; fenced {p['fenced']} staging directories or uploads of "
            "earlier writers"
        )
        _print_given_up(p["given_up"], "given up now")
    else:
        _print_damaged(p["damaged_segments"], done)
    if p["nothing_to_do"]:
        print("nothing to do")
    if "destination" in p:
        _print_destination(p["destination"])


def _rebuilt_line(sink: OpenSink) -> str:
    store = sink.store
    held = store.held_totals()
    return (
        f"rebuilt the state of sink {store.sink_id} from its durable home at {store.location.canonical}: "
        f"{plural(held.epochs, 'epoch')} held ({held.rows:,} rows), last sealed epoch {store.last_sealed_epoch}, "
        f"{len(sink.ledger.pending_names())} pending files"
    )


def _progress(done: int, total: int, r: Resolution) -> None:
    print(f"[{done}/{total}] {r.file.name}: {r.action.value}", file=sys.stderr, flush=True)


OWNER_LEASE = 120.0
"""Seconds after its last renewal during which a run of the sink counts as alive (``--owner-lease``)."""


def check_no_live_owner(store: LogStore, lease: float, *, locked: bool) -> None:
    """Refuse to take ownership from a run that showed it was alive less than ``lease`` seconds ago (with
    ``locked``, the caller holds the state directory's lock: a run of that state directory is not alive)."""
    found = store.home.live_owner(lease)
    if found is None:
        return
    term, age, record = found
    if locked and record.get("host") == socket.gethostname() and record.get("state") == store.db_path:
        return
    raise LiveOwnerError(
        f"a run of sink {store.sink_id} holds writer term {term} and was {describe_age(age)} (its record in "
        f"{store.home.storage.display(term_path(term))}): `recover apply` would take the sink from it, and that run "
        "would then stop with FencedError at its next step. Nothing of the sink was changed (a new --state-dir keeps "
        "the state rebuilt into it, and the next apply goes on from it). Stop the query first (a query that "
        f"stops cleanly releases the sink at once), or wait until the run has been silent for {lease:.0f} s (a "
        "killed driver): then run this again. --owner-lease SECONDS sets that wait; --owner-lease 0 takes over at "
        "once, for when you know the run is gone."
    )


def lease_assumption(store: LogStore, lease: float) -> str | None:
    """What ``apply`` assumes with ``--owner-lease 0`` (or less), said before it takes over: nothing is checked,
    so a run that is still working is fenced at its next step (its unsealed batch fails; no row is lost). None
    for a positive lease, or when the newest term's run stopped cleanly (nothing is assumed then)."""
    if lease > 0:
        return None
    term = store.home.newest_term()
    record = store.home.read(term_path(term)) if term is not None else None
    if term is None or not isinstance(record, dict) or record.get("closed"):
        return None
    return (
        f"--owner-lease {lease:g}: taking the sink over from writer term {term} without checking when its run was "
        f"last alive ({store.home.storage.display(term_path(term))}), on your word that it is gone. If it is still "
        "running, it stops with FencedError at its next step and its unfinished batch is retried by the next run: "
        "no row is lost."
    )


def run_recover(args: argparse.Namespace) -> int:
    state_dir = Path(args.state_dir).absolute() if args.state_dir else None
    options = _storage_options(args)
    log_store = args.log_store or (LogStore.recorded_location(state_dir) if state_dir is not None else None)
    if log_store is not None and not is_local(log_store):  # the same checks and messages as `filesink run`'s
        check_s3(log_store, options, "log store")
    sink = open_sink(state_dir, options, readonly=args.command != "apply", log_store=args.log_store)
    if not is_local(sink.output.url):
        try:
            check_s3(sink.output.url, options, "output")
        except BaseException:
            sink.close()
            raise
    if sink.store.rebuilt and not args.json:
        print(_rebuilt_line(sink), file=sys.stderr, flush=True)
    try:
        destination = open_table(sink, dict(args.catalog), args.step_parser)
        table = destination if destination.options.is_table else None
        if args.command == "status":
            result = status(sink, args.parallelism, verify=not args.no_verify, quiet=args.json, destination=destination)
            found = None
            if args.exit_code:
                found = _health_of(sink, args)
                result["health"] = found.to_json()
            print(json.dumps(result, indent=2)) if args.json else _print_status(result)
            if found is None:
                return EXIT_OK
            if not args.json:
                print("\nhealth\n" + "\n".join(found.lines()))
            return found.exit_code
        partitioned = bool(sink.config["partition_by"])
        verify = not args.no_verify
        if args.command == "plan":
            planned = plan_recovery(
                sink.store,
                sink.ledger,
                sink.output,
                partitioned=partitioned,
                verify=verify,
                progress=None if args.json else _verify_progress,
                destination=table,
            )
            out = _plan_json(planned) | {"destination": destination_status(destination)}
            print(json.dumps(out, indent=2)) if args.json else _print_plan(out, done=False)
            return EXIT_OK
        # A copy of the log store (the output names this sink at another location) must not write to the output.
        check_claim(sink.output, sink.store.sink_id, sink.store.location.canonical)
        lock = StateLock(state_dir) if state_dir is not None else None
        try:
            check_no_live_owner(sink.store, args.owner_lease, locked=lock is not None)
            assumed = lease_assumption(sink.store, args.owner_lease)
            if assumed is not None and not args.json:
                print(assumed, file=sys.stderr, flush=True)
            done = apply_recovery(
                sink.store,
                sink.ledger,
                sink.output,
                partitioned=partitioned,
                file_task=sink.file_task,
                progress=None if args.json else _progress,
                verify=verify,
                drop_damaged=args.drop_damaged,
                single_driver=args.single_driver,
                verify_progress=None if args.json else _verify_progress,
                destination=table,
            )
        finally:
            if lock is not None:
                lock.release()
        out = _plan_json(done) | {"destination": destination_status(destination)}
        print(json.dumps(out, indent=2)) if args.json else _print_plan(out, done=True)
        if state_dir is not None and s3options.settings_of(options):  # as a run does: later steps need no flags
            s3options.remember(state_dir, options)
        return EXIT_OK
    finally:
        sink.close()


# -- health ------------------------------------------------------------------------------------------------

HEALTH = "health"
HEALTH_HELP = (
    "check the sink's health, read-only and fast (for a cron job or a probe): exit 0 when healthy, else 8 plus a "
    "bit per reason (9 visibility lag, 10 pending files without an owner, 12 owner silent), one line per reason"
)


def add_health_step(steps: Any) -> None:
    """``recover health``: its own options (no table, no verification: it reads only the state and the newest term
    record)."""
    step = steps.add_parser(HEALTH, help=HEALTH_HELP, description=HEALTH_HELP)
    step.set_defaults(step_parser=step)
    step.add_argument("--state-dir", metavar="DIR", help="the sink's state directory (holds state.sqlite)")
    step.add_argument(
        "--log-store",
        metavar="URL",
        help="the sink's log store location: with no state directory, the state is rebuilt from its durable home "
        "in memory (the state directory's lock is then unknown)",
    )
    step.add_argument("--json", action="store_true", help="print JSON for scripts instead of lines")
    add_health_bounds(step)
    s3options.add_arguments(step)


def add_health_bounds(step: argparse.ArgumentParser) -> None:
    """``--max-lag`` and ``--max-silence``, of ``health`` and ``status --exit-code``."""
    step.add_argument(
        "--max-lag",
        type=_seconds,
        metavar="SECONDS",
        help="unhealthy (bit 1) when the oldest epoch held in the log store was sealed more than SECONDS ago "
        f"(default {health.MAX_LAG:.0f})",
    )
    step.add_argument(
        "--max-silence",
        type=_seconds,
        metavar="SECONDS",
        help="unhealthy (bit 4) when the owning run did not stop and has not renewed its term record for SECONDS; "
        "a run silent that long no longer counts as an owner of pending files (bit 2) "
        f"(default {health.MAX_SILENCE:.0f})",
    )


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, not {text!r}")
    return value


def _health_of(sink: OpenSink, args: argparse.Namespace) -> health.Health:
    max_lag = health.MAX_LAG if args.max_lag is None else args.max_lag
    max_silence = health.MAX_SILENCE if args.max_silence is None else args.max_silence
    return health.check(sink.store, sink.ledger, sink.state_dir, max_lag=max_lag, max_silence=max_silence)


def run_health(args: argparse.Namespace) -> int:
    """``recover health``: the state opened read-only (or rebuilt in memory from the durable home), checked by
    :func:`recovery.health.check`; the exit code says which reasons hold."""
    state_dir = Path(args.state_dir).absolute() if args.state_dir else None
    options = _storage_options(args)
    log_store = args.log_store or (LogStore.recorded_location(state_dir) if state_dir is not None else None)
    if log_store is not None and not is_local(log_store):
        check_s3(log_store, options, "log store")
    sink = open_sink(state_dir, options, readonly=True, log_store=args.log_store)
    try:
        found = _health_of(sink, args)
    finally:
        sink.close()
    if args.json:
        print(json.dumps(found.to_json(), indent=2))
    else:
        print("\n".join(found.lines()))
    return found.exit_code


# -- move-log-store ----------------------------------------------------------------------------------------

MOVE = "move-log-store"
MOVE_HELP = (
    "record that the sink's log store was moved on purpose to --log-store: the output's claim, and the state "
    "directory's database, then name the new location (refused if the old one was used after the copy)"
)


def add_move_step(steps: Any) -> None:
    """``recover move-log-store``: its own options (it moves, it does not resolve anything)."""
    step = steps.add_parser(MOVE, help=MOVE_HELP, description=MOVE_HELP)
    step.set_defaults(step_parser=step)
    step.add_argument(
        "--state-dir",
        metavar="DIR",
        help="the sink's state directory: a database there that records the old location is set aside and rebuilt "
        "from the new one (default --log-store: its log/ subdirectory)",
    )
    step.add_argument(
        "--log-store",
        metavar="URL",
        help="the log store's new location (where it was copied or moved to; it holds the sink's durable home)",
    )
    step.add_argument("--json", action="store_true", help="print JSON for scripts instead of lines")
    s3options.add_arguments(step)


def _options_for(url: str, options: dict[str, Any]) -> dict[str, Any]:
    return {} if is_local(url) else options


def _home_at(url: str, options: dict[str, Any], sink_id: str) -> DurableHome | None:
    """The durable home of sink ``sink_id`` at ``url``, or None if the location holds none (gone, or another's)."""
    storage = LogLocation(url, _options_for(url, options)).open()
    try:
        claim = json.loads(storage.read_all(CLAIM_FILE))
    except (FileNotFoundError, ValueError):
        return None
    return DurableHome(storage) if isinstance(claim, dict) and claim.get("sink_id") == sink_id else None


def _newest(home: DurableHome) -> tuple[int, int]:
    """(newest writer term, last sealed epoch) a durable home records (0 and -1 for none)."""
    return home.newest_term() or 0, max(home.epoch_numbers(), default=-1)


def _live_run(home: DurableHome) -> tuple[int, float] | None:
    """(term, seconds since it was alive) of a run that may still be working on ``home``: renewed within the lease
    and not stopped cleanly, unless it ran on this machine and its state directory's lock is free (it is gone)."""
    found = home.live_owner(OWNER_LEASE)
    if found is None:
        return None
    term, age, record = found
    state = record.get("state")
    if (
        record.get("host") == socket.gethostname()
        and isinstance(state, str)
        and Path(state).is_absolute()
        and Path(state).name == STATE_DB_NAME
        and lock_holder(Path(state).parent) is None
    ):
        return None
    return term, age


def _set_aside(state_dir: Path) -> Path:
    """Move the state database out of the way (its write-ahead log checkpointed into it first, so that the one
    file holds it all); return where it went."""
    path = state_dir / STATE_DB_NAME
    with translated(str(path), "checkpoint the state database before setting it aside"):
        db = connect(path)
        try:
            db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        finally:
            db.close()
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
    aside = state_dir / f"{STATE_DB_NAME}.before-move-{stamp}"
    n = 1
    while aside.exists():
        n += 1
        aside = state_dir / f"{STATE_DB_NAME}.before-move-{stamp}-{n}"
    path.rename(aside)
    for suffix in ("-wal", "-shm"):  # empty after the checkpoint; never to be paired with a new database
        with contextlib.suppress(FileNotFoundError):
            path.with_name(path.name + suffix).unlink()
    return aside


def _rebuild(state_dir: Path, url: str, options: dict[str, Any]) -> None:
    """A state database in ``state_dir`` rebuilt from the durable home at ``url`` (nothing is written there), as
    ``recover apply --state-dir DIR --log-store URL`` rebuilds it; the sink's start goes on from it."""
    store = LogStore.open(state_dir, url, storage_options=_options_for(url, options) or None, require_home=True)
    try:
        ledger = Ledger(store)
        ledger.config_from_home()
        store.sync_from_home(adopt=False)
        ledger.sync_pending()
    finally:
        store.close()


def _not_in_home(state_dir: Path, options: dict[str, Any], home: HomeView, files: set[str]) -> list[str]:
    """What the state database holds that the durable home does not (sealed before the sink had a durable home):
    a rebuild from the home would lose it."""
    store = LogStore.open_existing(state_dir, storage_options=options, readonly=True)
    try:
        held = {epoch for _, epoch, *_ in store.backlog_changes(None).rows}
        pending = set(Ledger(store).pending_names())
    finally:
        store.close()
    epochs = {int(r["epoch"]) for r in home.epochs}
    return [f"sealed epoch {e}" for e in sorted(held - epochs)] + [f"pending file {n}" for n in sorted(pending - files)]


def move_log_store(args: argparse.Namespace) -> int:
    """``recover move-log-store``: check, then rewrite the output's claim, then the state database; each step is
    skipped when it is done already, so a run that was interrupted is finished by running it again."""
    options = _storage_options(args)
    state_dir = Path(args.state_dir).absolute() if args.state_dir else None
    if args.log_store:
        url = str(args.log_store)
    else:
        assert state_dir is not None  # recover() asks for one of the two
        url = str(state_dir / "log")
    try:
        new_store = LogStore.from_home(url, storage_options=_options_for(url, options))
    except NoLogStoreError as e:
        raise NotASinkError(f"{url} is not a sink's log store: {e}") from None
    try:
        sink_id, new, home = new_store.sink_id, new_store.location.canonical, new_store.home
        record = home.read(SINK_RECORD)
        if not isinstance(record, dict) or "output" not in record:
            raise NotASinkError(f"{new} holds no record of the sink's output ({home.storage.display(SINK_RECORD)})")
        view = home.view()
        files = {p.removeprefix(FILES + "/").removesuffix(".json") for p in home.names(FILES)}
        new_term, new_epoch = _newest(home)
    finally:
        new_store.close()
    output_url = str(record["output"])
    output = OutputLocation(output_url, _options_for(output_url, options))
    claim = read_claim(output)
    if claim is not None and claim.sink_id != sink_id:
        move_claim(output, sink_id, None, new)  # raises OutputClaimedError: another sink's output
    recorded = LogStore.recorded_location(state_dir) if state_dir is not None else None
    olds = sorted({x for x in (claim.log_store if claim else None, recorded) if x is not None and x != new})
    if len(olds) > 1:
        raise LogStoreMovedError(
            f"the output {output_url} names the log store of sink {sink_id} at {olds[0]}, and the state database in "
            f"{state_dir} records it at {olds[1]}: it is unclear which one the log store at {new} was moved from. "
            "Nothing was changed. Give the state directory that goes with the output's claim, or none."
        )
    old = olds[0] if olds else None
    old_home = _home_at(old, options, sink_id) if old is not None else None
    if old_home is not None:
        old_term, old_epoch = _newest(old_home)
        if old_term > new_term or old_epoch > new_epoch:
            raise LogStoreMovedError(
                f"the log store at {old} was used after it was copied to {new}: its durable home holds writer term "
                f"{old_term} and sealed epoch {old_epoch}, the copy only term {new_term} and epoch {new_epoch}. "
                f"Moving now would lose what the sink did there since. Nothing was changed. Stop every query that "
                f"uses {old}, then copy it to {new} again (replacing the copy) and run this again; or go on with the "
                f"log store at {old}."
            )
        alive = _live_run(old_home)
        if alive is not None:
            raise SinkLockedError(
                f"a run of sink {sink_id} with its log store at {old} holds writer term {alive[0]} and was "
                f"{describe_age(alive[1])}: it may still write there, and moving the log store now would leave two "
                f"runs that do not fence each other. Nothing was changed. Stop the query, copy {old} to {new} again "
                f"(replacing the copy), and run this again (a run killed without stopping counts as alive for "
                f"{OWNER_LEASE:.0f} s, unless it ran on this machine)."
            )
    if state_dir is not None:
        state_dir.mkdir(parents=True, exist_ok=True)  # a new state directory: rebuilt from the new location
    lock = StateLock(state_dir) if state_dir is not None else None
    try:
        if state_dir is not None and recorded is not None and recorded != new:
            missing = _not_in_home(state_dir, options, view, files)
            if missing:
                raise LogStoreMovedError(
                    f"the state database in {state_dir} holds what the durable home at {new} does not record "
                    f"({', '.join(missing[:5])}{', ...' if len(missing) > 5 else ''}): it was sealed before the sink "
                    f"had a durable home, and a rebuild from the home would lose it. Nothing was changed. Start the "
                    f"sink once with its log store at {recorded} (that makes it durable there), stop it, copy the "
                    "log store again and run this again."
                )
        moved = move_claim(output, sink_id, old, new)
        database = None
        if state_dir is not None:
            aside = _set_aside(state_dir) if recorded is not None and recorded != new else None
            if recorded != new:
                _rebuild(state_dir, url, options)
            database = {"recorded": recorded, "set_aside": str(aside) if aside else None, "rebuilt": recorded != new}
    finally:
        if lock is not None:
            lock.release()
    result = {
        "sink_id": sink_id,
        "output": output_url,
        "from": old,
        "to": new,
        "claim_moved": moved,
        "state_database": database,
        "old_home": None if old_home is None else {"writer_term": old_term, "last_sealed_epoch": old_epoch},
    }
    print(json.dumps(result, indent=2)) if args.json else _print_move(result, state_dir)
    return EXIT_OK


def _print_move(r: dict[str, Any], state_dir: Path | None) -> None:
    new = r["to"]
    print(f"sink {r['sink_id']}: its log store is at {new}" + (f" (moved from {r['from']})" if r["from"] else ""))
    claim = "now names" if r["claim_moved"] else "already named"
    print(f"  output {r['output']}: its claim ({CLAIM_NAME}) {claim} the log store at {new}")
    d = r["state_database"]
    if d is not None:
        if not d["rebuilt"]:
            print(f"  state directory {state_dir}: its database already records the log store at {new}")
        elif d["set_aside"]:
            print(
                f"  state directory {state_dir}: its database recorded the log store at {d['recorded']}; set aside "
                f"as {d['set_aside']}, and rebuilt from the durable home at {new}"
            )
        else:
            print(f"  state directory {state_dir}: its database was rebuilt from the durable home at {new}")
    if r["from"] is not None and r["old_home"] is None:
        print(f"  {r['from']}: holds no durable home of this sink (any more)")
    elif r["from"] is not None:
        print(
            f"  {r['from']}: still holds the durable home it was copied from (not newer than the copy). Do not use it "
            "again: a sink started with its log store there is refused. Delete it once the sink runs from the new "
            "location"
        )
    where = f" and its state directory {state_dir}" if state_dir is not None else ""
    print(f"start the sink with its log store at {new} (log_store=, filesink run --log-store){where}")


DESCRIPTION = (
    "Inspect and resolve a sink's state. Exit codes: 0 done or nothing to do, 1 failed, 2 bad usage, 3 a live "
    "query holds the sink, 4 not a sink's state directory, 5 damaged log segments block the sink; health: 0 "
    "healthy, 9 to 15 unhealthy (8 plus 1 visibility lag, 2 pending files without an owner, 4 owner silent)."
)


def add_parser(commands: Any) -> None:
    """Add ``recover status|plan|apply`` to the ``filesink`` command's sub-commands (:mod:`filesink.cli`)."""
    recover = commands.add_parser(
        "recover",
        help="inspect and resolve a sink's state after a crash or before a rescale (no Spark needed)",
        description=DESCRIPTION,
    )
    add_steps(recover)


def add_steps(recover: argparse.ArgumentParser) -> None:
    steps = recover.add_subparsers(dest="command", required=True, metavar="STEP")
    helps = {
        "status": "show the sink, its truncate points, log backlog, pending files and writer ranges",
        "plan": "dry run: show what apply would do to each pending file and which garbage it would remove",
        "apply": "resolve pending files (commit visible, drop invisible) and remove garbage; idempotent",
    }
    for name, text in helps.items():
        step = steps.add_parser(name, help=text, description=text)
        step.set_defaults(step_parser=step)
        step.add_argument("--state-dir", metavar="DIR", help="the sink's state directory (holds state.sqlite)")
        step.add_argument(
            "--log-store",
            metavar="URL",
            help="the sink's log store location (its durable home): with no state directory, or a new one, the "
            "sink's state is rebuilt from it (in memory for status and plan)",
        )
        step.add_argument("--json", action="store_true", help="print JSON for scripts instead of tables")
        step.add_argument(
            "--catalog",
            action="append",
            default=[],
            type=catalog_property,
            metavar="KEY=VALUE",
            help="a property of the catalog of the sink's Iceberg table, as the sink was given it (repeatable; "
            "not recorded, as it may be a secret); needed unless the catalog is the embedded default",
        )
        s3options.add_arguments(step)
        add_damage_options(step, name)
        if name == "status":
            step.add_argument(
                "--parallelism",
                type=int,
                metavar="N",
                help="also show the vnode range each of N writers would own, and what it holds",
            )
            step.add_argument(
                "--no-verify",
                action="store_true",
                help="skip reading every held log segment to check it (faster on a large backlog)",
            )
            step.add_argument(
                "--exit-code",
                action="store_true",
                help="also check the sink's health as `recover health` does: show its reasons, and exit with its code "
                "(0 healthy, 9 to 15 unhealthy)",
            )
            add_health_bounds(step)
    add_move_step(steps)
    add_health_step(steps)


def add_damage_options(step: argparse.ArgumentParser, name: str) -> None:
    """``plan|apply --no-verify`` and ``apply --drop-damaged``: what the steps do about damaged log segments
    (``status --no-verify`` is with the other status options)."""
    if name in ("plan", "apply"):
        step.add_argument(
            "--no-verify",
            action="store_true",
            help="do not read every log segment the sink still needs to check it, only list them (faster on a "
            "large backlog; finds missing and truncated segments, not changed bytes)",
        )
    if name == "apply":
        step.add_argument(
            "--drop-damaged",
            action="store_true",
            help="give up, for good, the rows of the damaged log segments the sink still needs (only those epochs "
            "and vnodes; every other row is written), record what was given up, and go on; without it, apply "
            "exits 5 while damaged segments block the sink",
        )
        step.add_argument(
            "--single-driver",
            action="store_true",
            help="go on where the log store's S3 server has no conditional create (ignores or refuses PUT with "
            "If-None-Match: *): you promise that no driver or other recover command runs on the sink meanwhile, "
            "since nothing fences a second one",
        )
        step.add_argument(
            "--owner-lease",
            type=float,
            default=OWNER_LEASE,
            metavar="SECONDS",
            help="refuse (exit 3) while a run of the sink renewed its ownership less than SECONDS ago (0: take over "
            f"at once): apply takes ownership, which stops a running query (default {OWNER_LEASE:.0f})",
        )


def recover(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Run ``filesink recover STEP`` from parsed arguments (:func:`filesink.cli.main` turns errors into a message
    and an exit code)."""
    step = getattr(args, "step_parser", parser)  # its usage line, not the top command's
    if getattr(args, "parallelism", None) is not None and args.parallelism < 1:
        step.error("--parallelism must be at least 1")
    if not args.state_dir and not args.log_store:
        step.error("give --state-dir DIR, --log-store URL, or both")
    if args.command == "status" and not args.exit_code and (args.max_lag is not None or args.max_silence is not None):
        step.error("--max-lag and --max-silence are the bounds of the health check: give them with --exit-code")
    database = str(Path(args.state_dir).absolute() / STATE_DB_NAME) if args.state_dir else "(rebuilt in memory)"
    with translated(database, f"filesink recover {args.command}"):  # any SQLite error not translated below
        if args.command == HEALTH:
            return run_health(args)
        return move_log_store(args) if args.command == MOVE else run_recover(args)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m recovery STEP ...``: the steps of ``filesink recover`` on their own."""
    parser = Parser(prog="python -m recovery", description=DESCRIPTION)
    add_steps(parser)
    args = parser.parse_args(argv)
    try:
        return recover(args, parser)
    except COMMAND_ERRORS as e:
        return report(e)


if __name__ == "__main__":
    sys.exit(main())
