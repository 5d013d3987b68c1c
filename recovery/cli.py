"""``filesink recover status|plan|apply``: inspects and repairs a sink's state without Spark (SQLite, pyarrow and
the output's owner only). The ``filesink`` command (:mod:`filesink.cli.main`) adds these steps as its ``recover``
command; ``python -m recovery STEP`` runs them on their own. This module never imports :mod:`filesink.cli.main`.

This module holds the parser and the dispatch; the steps are in :mod:`recovery.commands` and
:mod:`recovery.move`, the sink they open in :mod:`recovery.opening`, what they print in :mod:`recovery.render_text`
and :mod:`recovery.render_json`.

``status`` and ``plan`` open the state database read-only; ``apply`` takes the state directory's lock. Without a
state database (``--log-store URL``, the state directory lost), the state is rebuilt from the durable home: in
memory for ``status`` and ``plan``, into the state directory (if one is given) for ``apply``.

A sink that writes a table (Delta, Iceberg) has its destination opened from its recorded table format and table,
with the catalog properties given as ``--catalog KEY=VALUE`` (never recorded: they may hold secrets); the table
alone says which pending files it holds (:func:`recovery.opening.open_table`).

Exit codes: 0 done (or nothing to do), 1 failed, 2 bad usage, 3 a live query holds the sink, 4 not a sink's
state directory, 5 damaged log segments block the sink (``apply`` without ``--drop-damaged``). ``health``
(:mod:`recovery.health`) exits 0 when the sink is healthy, else 8 plus a bit per reason (9 to 15).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from filesink import s3options
from filesink.argparsing import Parser, catalog_property
from filesink.errors import COMMAND_ERRORS, report
from logstore.statedb import STATE_DB_NAME, translated

from . import health
from .commands import run_health, run_recover
from .lease import OWNER_LEASE
from .lease import check_no_live_owner as check_no_live_owner
from .move import move_log_store
from .opening import open_sink as open_sink
from .render_text import shown as _shown  # noqa: F401 (its test imports it from here)

DESCRIPTION = (
    "Inspect and resolve a sink's state. Exit codes: 0 done or nothing to do, 1 failed, 2 bad usage, 3 a live "
    "query holds the sink, 4 not a sink's state directory, 5 damaged log segments block the sink; health: 0 "
    "healthy, 9 to 15 unhealthy (8 plus 1 visibility lag, 2 pending files without an owner, 4 owner silent)."
)


def add_parser(commands: Any) -> None:
    """Add ``recover status|plan|apply`` to the ``filesink`` command's sub-commands (:mod:`filesink.cli.main`)."""
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
        step = _add_step(
            steps,
            name,
            text,
            log_store="the sink's log store location (its durable home): with no state directory, or a new one, the "
            "sink's state is rebuilt from it (in memory for status and plan)",
            printed="tables",
        )
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


def _add_step(
    steps: Any,
    name: str,
    text: str,
    *,
    log_store: str,
    state_dir: str = "the sink's state directory (holds state.sqlite)",
    printed: str = "lines",
) -> argparse.ArgumentParser:
    """A step's parser with the options every step takes first: ``--state-dir``, ``--log-store`` (their help
    says what the step does with them) and ``--json`` (instead of ``printed``)."""
    step: argparse.ArgumentParser = steps.add_parser(name, help=text, description=text)
    step.set_defaults(step_parser=step)
    step.add_argument("--state-dir", metavar="DIR", help=state_dir)
    step.add_argument("--log-store", metavar="URL", help=log_store)
    step.add_argument("--json", action="store_true", help=f"print JSON for scripts instead of {printed}")
    return step


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


# -- health ------------------------------------------------------------------------------------------------

HEALTH = "health"
HEALTH_HELP = (
    "check the sink's health, read-only and fast (for a cron job or a probe): exit 0 when healthy, else 8 plus a "
    "bit per reason (9 visibility lag, 10 pending files without an owner, 12 owner silent), one line per reason"
)


def add_health_step(steps: Any) -> None:
    """``recover health``: its own options (no table, no verification: it reads only the state and the newest term
    record)."""
    step = _add_step(
        steps,
        HEALTH,
        HEALTH_HELP,
        log_store="the sink's log store location: with no state directory, the state is rebuilt from its durable "
        "home in memory (the state directory's lock is then unknown)",
    )
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


# -- move-log-store ----------------------------------------------------------------------------------------

MOVE = "move-log-store"
MOVE_HELP = (
    "record that the sink's log store was moved on purpose to --log-store: the output's claim, and the state "
    "directory's database, then name the new location (refused if the old one was used after the copy)"
)


def add_move_step(steps: Any) -> None:
    """``recover move-log-store``: its own options (it moves, it does not resolve anything)."""
    step = _add_step(
        steps,
        MOVE,
        MOVE_HELP,
        state_dir="the sink's state directory: a database there that records the old location is set aside and "
        "rebuilt from the new one (default --log-store: its log/ subdirectory)",
        log_store="the log store's new location (where it was copied or moved to; it holds the sink's durable home)",
    )
    s3options.add_arguments(step)


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
