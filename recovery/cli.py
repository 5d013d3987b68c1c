"""``filesink recover status|plan|apply``: inspects and repairs a sink's state without Spark (SQLite, pyarrow and
the output's owner only). The ``filesink`` command (:mod:`filesink.cli`) adds these steps as its ``recover``
command; ``python -m recovery STEP`` runs them on their own. This module never imports :mod:`filesink.cli`.

``status`` and ``plan`` open the state database read-only; ``apply`` takes the state directory's lock. Without a
state database (``--log-store URL``, the state directory lost), the state is rebuilt from the durable home: in
memory for ``status`` and ``plan``, into the state directory (if one is given) for ``apply``.

Exit codes: 0 done (or nothing to do), 1 failed, 2 bad usage, 3 a live query holds the sink, 4 not a sink's
state directory, 5 damaged log segments block the sink (``apply`` without ``--drop-damaged``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from filesink import s3options
from filesink.errors import COMMAND_ERRORS, EXIT_OK, report
from filesink.ledger import Ledger, PlannedFile
from filesink.lock import StateLock, lock_holder
from filesink.output import OutputLocation
from filesink.planner import file_task, writer_ranges
from filesink.writer import FileTask
from logstore import DamagedSegment, GivenUp, LogLocation, LogStore, NoLogStoreError
from logstore.statedb import STATE_DB_NAME, translated
from logstore.storage import is_local

from .errors import NotASinkError
from .resolve import RecoveryPlan, Resolution, apply_recovery, plan_recovery


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
    standard AWS variables or profile (never flags)."""
    return s3options.from_args(args)


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


def status(sink: OpenSink, parallelism: int | None, verify: bool = True, quiet: bool = False) -> dict[str, Any]:
    store = sink.store
    points = store.truncate_points()
    backlog = store.backlog()
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
        "backlog": {
            "epochs": len(store.sealed_epochs()),
            "rows": sum(b.rows for b in backlog),
            "bytes": sum(b.bytes for b in backlog),
        },
        "pending_files": [_file_json(f) for f in sink.ledger.pending()],
    }
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


def _print_status(s: dict[str, Any]) -> None:
    print(f"sink {s['sink_id']}")
    for key in ("output", "log_store", "vnodes", "key_columns", "partition_by", "last_sealed_epoch"):
        print(f"  {key.replace('_', ' ')}: {s[key]}")
    if s.get("state_dir") is None:
        print("  held by: unknown (no state directory: a query running elsewhere does not show here)")
    else:
        print(f"  held by: {s['held_by'] or 'nobody (no live query)'}")
    print(f"  writer term: {s['writer_term']}")
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
    if files:
        print(
            _table(
                ["file", "vnodes", "end epoch", "rows"],
                [(f["name"], f"{f['vnodes'][0]}-{f['vnodes'][1]}", f["end_epoch"], f["rows"]) for f in files],
            )
        )


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
    print(f"pending files {verb}: {len(files)}")
    if files:
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
        f"{g['unsealed_segments']} unsealed log segments, {g['log_temp_files']} log temp files "
        f"({g['bytes']:,} bytes of log)"
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


def _rebuilt_line(sink: OpenSink) -> str:
    store = sink.store
    held = store.held_totals()
    return (
        f"rebuilt the state of sink {store.sink_id} from its durable home at {store.location.canonical}: "
        f"{held.epochs} epochs held ({held.rows:,} rows), last sealed epoch {store.last_sealed_epoch}, "
        f"{len(sink.ledger.pending_names())} pending files"
    )


def _progress(done: int, total: int, r: Resolution) -> None:
    print(f"[{done}/{total}] {r.file.name}: {r.action.value}", file=sys.stderr, flush=True)


def run_recover(args: argparse.Namespace) -> int:
    state_dir = Path(args.state_dir).absolute() if args.state_dir else None
    sink = open_sink(state_dir, _storage_options(args), readonly=args.command != "apply", log_store=args.log_store)
    if sink.store.rebuilt and not args.json:
        print(_rebuilt_line(sink), file=sys.stderr, flush=True)
    try:
        if args.command == "status":
            result = status(sink, args.parallelism, verify=not args.no_verify, quiet=args.json)
            print(json.dumps(result, indent=2)) if args.json else _print_status(result)
            return EXIT_OK
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
            )
            out = _plan_json(planned)
            print(json.dumps(out, indent=2)) if args.json else _print_plan(out, done=False)
            return EXIT_OK
        lock = StateLock(state_dir) if state_dir is not None else None
        try:
            done = apply_recovery(
                sink.store,
                sink.ledger,
                sink.output,
                partitioned=partitioned,
                file_task=sink.file_task,
                progress=None if args.json else _progress,
                verify=verify,
                drop_damaged=args.drop_damaged,
                verify_progress=None if args.json else _verify_progress,
            )
        finally:
            if lock is not None:
                lock.release()
        out = _plan_json(done)
        print(json.dumps(out, indent=2)) if args.json else _print_plan(out, done=True)
        return EXIT_OK
    finally:
        sink.close()


DESCRIPTION = (
    "Inspect and resolve a sink's state. Exit codes: 0 done or nothing to do, 1 failed, 2 bad usage, 3 a live "
    "query holds the sink, 4 not a sink's state directory, 5 damaged log segments block the sink."
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
        step.add_argument("--state-dir", metavar="DIR", help="the sink's state directory (holds state.sqlite)")
        step.add_argument(
            "--log-store",
            metavar="URL",
            help="the sink's log store location (its durable home): with no state directory, or a new one, the "
            "sink's state is rebuilt from it (in memory for status and plan)",
        )
        step.add_argument("--json", action="store_true", help="print JSON for scripts instead of tables")
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


def recover(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Run ``filesink recover STEP`` from parsed arguments (:func:`filesink.cli.main` turns errors into a message
    and an exit code)."""
    if getattr(args, "parallelism", None) is not None and args.parallelism < 1:
        parser.error("--parallelism must be at least 1")
    if not args.state_dir and not args.log_store:
        parser.error("give --state-dir DIR, --log-store URL, or both")
    database = str(Path(args.state_dir).absolute() / STATE_DB_NAME) if args.state_dir else "(rebuilt in memory)"
    with translated(database, f"filesink recover {args.command}"):  # any SQLite error not translated below
        return run_recover(args)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m recovery STEP ...``: the steps of ``filesink recover`` on their own."""
    parser = argparse.ArgumentParser(prog="python -m recovery", description=DESCRIPTION)
    add_steps(parser)
    args = parser.parse_args(argv)
    try:
        return recover(args, parser)
    except COMMAND_ERRORS as e:
        return report(e)


if __name__ == "__main__":
    sys.exit(main())
