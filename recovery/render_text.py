"""What ``recover status|plan|apply`` prints for a person: tables and lines made from the JSON shapes
(:mod:`recovery.render_json`), and the progress lines on stderr."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

from filesink.destination import TableFormat
from filesink.words import plural

from .resolve import Action, Resolution


def _ranges(vnodes: list[int]) -> str:
    if not vnodes:
        return "-"
    spans, start = [], vnodes[0]
    for prev, cur in zip(vnodes, [*vnodes[1:], None], strict=True):
        if cur != prev + 1:
            spans.append(f"{start}" if start == prev else f"{start}-{prev}")
            start = cur  # type: ignore[assignment]
    return ",".join(spans)


def _table(headers: Sequence[str], rows: list[Sequence[Any]]) -> str:
    cells = [list(map(str, headers))] + [[str(c) for c in r] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells]
    return "\n".join([lines[0], "  ".join("-" * w for w in widths), *lines[1:]])


def verify_progress(done: int, total: int) -> None:
    """On stderr: how many of the log segments the sink still needs were read and checked (each 100th, the last)."""
    if done == total or done % 100 == 0:
        print(f"verified {done}/{total} log segments", file=sys.stderr, flush=True)


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


def print_status(s: dict[str, Any]) -> None:
    print(f"sink {s['sink_id']}")
    for key in ("output", "log_store", "vnodes", "key_columns", "partition_by", "last_sealed_epoch"):
        print(f"  {key.replace('_', ' ')}: {shown(key, s[key])}")
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


def shown(key: str, value: Any) -> str:
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


def print_plan(p: dict[str, Any], done: bool) -> None:
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


def file_progress(done: int, total: int, r: Resolution) -> None:
    """On stderr: which pending file ``apply`` resolved, and how."""
    print(f"[{done}/{total}] {r.file.name}: {r.action.value}", file=sys.stderr, flush=True)
