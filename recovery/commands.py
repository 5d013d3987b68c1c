"""``recover status|plan|apply`` and ``recover health``: what each step computes from the sink it opens, printed
as JSON (:mod:`recovery.render_json`) or text (:mod:`recovery.render_text`)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from filesink import s3options
from filesink.destination import Destination, TableFormat
from filesink.errors import COMMAND_ERRORS, EXIT_OK
from filesink.lock import StateLock, lock_holder
from filesink.output import records
from filesink.output.claim import check_claim
from filesink.output.probe import check_s3
from filesink.rolling.planner import writer_ranges
from filesink.words import plural
from logstore.storage import is_local

from . import health
from .lease import check_no_live_owner, lease_assumption
from .opening import OpenSink, open_step, open_table
from .render_json import damaged_json, file_json, given_up_json, plan_json, schema_json
from .render_text import file_progress, print_plan, print_status, verify_progress
from .resolve import apply_recovery, plan_recovery, recorded_sizes, resolution


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
        "pending_files": [file_json(f) for f in sink.ledger.pending()],
        "schema_history": [schema_json(v) for v in sink.ledger.schema_history()],
    }
    if destination is not None:
        result["destination"] = destination_status(destination)
        if destination.options.is_table:
            _table_files(sink, destination, result)
    if verify:
        damaged = store.damaged(progress=None if quiet else verify_progress)
        result["damaged_segments"] = [damaged_json(d) for d in damaged]
        result["damaged_vnodes"] = sorted({v for d in damaged for v in d.vnodes})
    result["given_up"] = [given_up_json(g) for g in store.given_up()]
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


def _rebuilt_line(sink: OpenSink) -> str:
    store = sink.store
    held = store.held_totals()
    return (
        f"rebuilt the state of sink {store.sink_id} from its durable home at {store.location.canonical}: "
        f"{plural(held.epochs, 'epoch')} held ({held.rows:,} rows), last sealed epoch {store.last_sealed_epoch}, "
        f"{len(sink.ledger.pending_names())} pending files"
    )


def run_recover(args: argparse.Namespace) -> int:
    sink, options = open_step(args, readonly=args.command != "apply")
    state_dir = sink.state_dir
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
            print(json.dumps(result, indent=2)) if args.json else print_status(result)
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
                progress=None if args.json else verify_progress,
                destination=table,
            )
            out = plan_json(planned) | {"destination": destination_status(destination)}
            print(json.dumps(out, indent=2)) if args.json else print_plan(out, done=False)
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
                progress=None if args.json else file_progress,
                verify=verify,
                drop_damaged=args.drop_damaged,
                single_driver=args.single_driver,
                verify_progress=None if args.json else verify_progress,
                destination=table,
            )
        finally:
            if lock is not None:
                lock.release()
        out = plan_json(done) | {"destination": destination_status(destination)}
        print(json.dumps(out, indent=2)) if args.json else print_plan(out, done=True)
        if state_dir is not None and s3options.settings_of(options):  # as a run does: later steps need no flags
            s3options.remember(state_dir, options)
        return EXIT_OK
    finally:
        sink.close()


def _health_of(sink: OpenSink, args: argparse.Namespace) -> health.Health:
    max_lag = health.MAX_LAG if args.max_lag is None else args.max_lag
    max_silence = health.MAX_SILENCE if args.max_silence is None else args.max_silence
    return health.check(sink.store, sink.ledger, sink.state_dir, max_lag=max_lag, max_silence=max_silence)


def run_health(args: argparse.Namespace) -> int:
    """``recover health``: the state opened read-only (or rebuilt in memory from the durable home), checked by
    :func:`recovery.health.check`; the exit code says which reasons hold."""
    sink, _ = open_step(args, readonly=True)
    try:
        found = _health_of(sink, args)
    finally:
        sink.close()
    if args.json:
        print(json.dumps(found.to_json(), indent=2))
    else:
        print("\n".join(found.lines()))
    return found.exit_code
