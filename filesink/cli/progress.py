"""Progress of a running sink for ``filesink run``: what it took in, what the log store holds, what it wrote.

:func:`held` reads the state database through a read-only log store of its own
(:meth:`logstore.LogStore.open_existing`; the database is in WAL mode, so this never waits for the sink's
transactions). :class:`Progress` shows a live panel on a terminal
and one line per new epoch otherwise (logs, CI); either way, a line for each new schema the sink takes.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from logstore import LogStore, LogStoreError
from recovery.resolve import Action, RecoveryPlan

from ..sink.face import SinkStats
from ..words import plural, size


@dataclass(frozen=True)
class Held:
    """What the log store holds that is not yet in committed files."""

    rows: int
    bytes: int
    epochs: int
    first_epoch: int | None
    last_epoch: int | None

    def describe(self) -> str:
        if not self.rows:
            return "nothing"
        span = (
            f"epoch {self.first_epoch}"
            if self.first_epoch == self.last_epoch
            else (f"epochs {self.first_epoch}-{self.last_epoch}")
        )
        return f"{self.rows:,} rows ({size(self.bytes)} of log) from {span}"


def held(state_dir: Path) -> Held:
    """Rows, bytes and epochs held above the vnodes' truncate points (sealed, not yet in committed files)."""
    store = LogStore.open_existing(state_dir, readonly=True)
    try:
        return Held(*store.held_totals())
    finally:
        store.close()


def files_line(sizes: list[int], objects: int | None = None) -> str:
    """The files committed: how many, as how many Parquet objects where that differs (a file of a partitioned
    output is an object per partition directory), their size, the median and the last file's."""
    if not sizes:
        return "none yet"
    median = statistics.median(sizes)
    parts = f", as {plural(objects, 'Parquet object')}" if objects is not None and objects != len(sizes) else ""
    return f"{len(sizes)}{parts} ({size(sum(sizes))}; median file {size(median)}, last {size(sizes[-1])})"


def recovered_commits(plan: RecoveryPlan | None) -> int:
    """The files recovery at start committed (as they were, or written again): files the last run left pending,
    which this run's own counts (:class:`SinkStats`) do not hold."""
    if plan is None:
        return 0
    return sum(1 for r in plan.files if r.action in (Action.COMMIT, Action.REWRITE))


def committed_line(sizes: list[int], objects: int | None = None, recovered: int = 0) -> str:
    """The files committed (:func:`files_line`), and the ``recovered`` ones recovery at start committed: ``none
    yet`` is never said of a run whose recovery committed files."""
    mine = files_line(sizes, objects)
    if not recovered:
        return mine
    theirs = f"{recovered:,} by recovery at start (left pending by the last run)"
    return f"{theirs}, none yet from this run's batches" if not sizes else f"{mine} and {theirs}"


def rows_line(stats: SinkStats) -> str:
    """``12,000 rows in (3 batches)``, and the batches Spark ran again whose rows the log store already held."""
    return f"{plural(stats.rows_in, 'row')} in ({batches_line(stats)})"


def batches_line(stats: SinkStats) -> str:
    again = f"; {plural(stats.replayed, 'batch')} run again, already in the log store" if stats.replayed else ""
    return f"{plural(stats.batches, 'batch')}{again}"


class Progress:
    """Shows a sink's progress on ``console``: a live panel when it is a terminal, else a line per epoch."""

    def __init__(self, console: Any, stats: SinkStats, state_dir: Path, title: str, recovered: int = 0) -> None:
        self.console = console
        self.recovered = recovered
        """Files recovery at start committed (:func:`recovered_commits`), shown with this run's."""
        self.stats = stats
        self.state_dir = state_dir
        self.title = title
        self.started = time.monotonic()
        self._live: Any = None
        self._printed_epoch = stats.last_epoch
        self._printed_files = 0
        self._printed_schemas = 0

    def __enter__(self) -> Progress:
        if self.console.is_terminal:
            from rich.live import Live

            self._live = Live(self._panel(), console=self.console, refresh_per_second=2, transient=False)
            self._live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._live is not None:
            self._live.update(self._panel())
            self._live.__exit__(*exc)

    def update(self) -> None:
        """Print a line for each schema the sink took since the last update; refresh the panel, or print a line if
        an epoch or a file was added since the last line."""
        taken = self.stats.schema_changes[self._printed_schemas :]
        self._printed_schemas += len(taken)
        for change in taken:
            self.console.print(change.line(), highlight=False, soft_wrap=True)
        if self._live is not None:
            self._live.update(self._panel())
            return
        s = self.stats
        if s.last_epoch != self._printed_epoch or s.files_committed != self._printed_files:
            self._printed_epoch, self._printed_files = s.last_epoch, s.files_committed
            self.console.print(self.line(), highlight=False, soft_wrap=True)

    def line(self) -> str:
        s = self.stats
        return (
            f"epoch {s.last_epoch}: {rows_line(s)}, log backlog {self._held().describe()}, files committed "
            f"{committed_line(s.file_sizes, s.objects, self.recovered)}"
        )

    def _held(self) -> Held:
        try:
            return held(self.state_dir)
        except LogStoreError:  # the database is busy or not there yet: show nothing rather than fail the job
            return Held(0, 0, 0, None, None)

    def _panel(self) -> Any:
        from rich.panel import Panel
        from rich.table import Table

        s = self.stats
        h = self._held()
        table = Table.grid(padding=(0, 2))
        table.add_column(style="bold")
        table.add_column()
        table.add_row("epoch", str(s.last_epoch) if s.last_epoch >= 0 else "-")
        table.add_row("rows in", f"{s.rows_in:,} ({batches_line(s)})")
        table.add_row("log backlog", h.describe())
        table.add_row("files committed", committed_line(s.file_sizes, s.objects, self.recovered))
        table.add_row("running", f"{time.monotonic() - self.started:,.0f} s")
        return Panel(table, title=self.title, expand=False)
