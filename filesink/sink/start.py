"""The sink's start: the state directory's lock, the claims (the output's, the log store's), the refusals of a start
that is not this sink's to make, the owner lease (a new writer term) and recovery.

A start refused before it wrote anything outside what it can remove leaves a new state directory as it found it
(:class:`_NewState`). Recovery (:func:`recovery.startup.recover_at_start`) runs here, at start-up only: the per-epoch
path (:mod:`filesink.sink.roll`) never imports it.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from logstore import NOTHING, STATE_DB_NAME, GivenUp, LogLocation, LogStore
from logstore.conditional import probe_conditional_create, require_conditional_create
from logstore.diagnosis import diagnose
from logstore.home import CLAIM_FILE
from logstore.storage import is_local
from recovery.startup import RecoveryPlan, recover_at_start

from ..committer.damage import given_up_line
from ..committer.ledger import Ledger
from ..destination import TableFormat, open_destination
from ..errors import OutputClaimedError, SinkOptionError, TableFormatError
from ..localdirs import make_local_dir
from ..lock import StateLock
from ..metrics import figures as metrics_hooks
from ..metrics.figures import MetricsBook
from ..metrics.prometheus import serve
from ..output import CLAIM_NAME, OutputLocation, claim_output, prepare_staging
from ..output.location import OUTPUT_STAGING
from ..rolling.backlog import BacklogTracker
from ..s3options import remember
from ..tasks.shared import shared_dirs
from .core import START_NOTICE, STATE_NAMES, SinkCore, SinkStats, listdir, log


class SinkStart(SinkCore):
    """Opening a sink in this process: lock, log store, output, claims, recovery."""

    recovered: RecoveryPlan | None
    """What start-up recovery carried out."""
    given_up: list[GivenUp]
    """The damaged segments given up so far (``filesink recover apply --drop-damaged``), said once at start."""

    def _open(self, serve_at: tuple[str, int] | None = None) -> None:
        """Take the state directory's lock, open the log store and the output, and run recovery; first, start
        serving metrics at ``serve_at`` (address, port), if given."""
        d = self._description
        self._describe()
        self._metrics = MetricsBook()  # before recovery: its requests and commits are this run's
        self._metrics_server = (
            None if serve_at is None else serve(self._metrics.snapshot, *serve_at, f"the sink of {d.path}")
        )
        try:
            self._open_state()
        except BaseException:
            if self._metrics_server is not None:
                self._metrics_server.close()
            raise

    def _open_state(self) -> None:
        """What :meth:`_open` does once the metrics are served: lock, log store, output, recovery."""
        d = self._description
        self._is_open = True
        path = d.path
        state = self.state_dir
        options = dict(d.storage_options)
        log_store = d.log_store
        vnodes = d.vnodes
        made = [(Path(path), "the output path")] if is_local(path) else []
        made.append((state, "state_dir"))
        local_log = LogLocation(log_store).canonical if log_store else str(state / "log")
        log_dir = [(Path(local_log), "the log store")] if log_store is None or is_local(log_store) else []
        for directory, what in made + log_dir:  # all checked before any is created
            make_local_dir(directory, what, create=False)
        new_state = None
        if not (state / STATE_DB_NAME).exists():  # a new state: refused starts leave nothing in it
            self._refuse_claimed_output(options)  # reads only, before anything is created
            staging = [Path(path) / OUTPUT_STAGING] if is_local(path) else []
            new_state = _NewState.before(state, [p for p, _ in made + log_dir] + staging, log_store, options)
        for directory, what in made:
            make_local_dir(directory, what)
        row_group_rows, compression, accept_state_loss = d.row_group_rows, d.compression, d.accept_state_loss
        self._row_group_rows = row_group_rows
        self._sample = None
        self._compression = compression
        self._accept_state_loss = bool(accept_state_loss)
        self._accept_duplicates = bool(d.accept_duplicates)
        self._take_over_from = None
        """The sink whose output this one takes over at its first batch (accept_state_loss; see _defer_take_over)."""
        self._created_claim = False
        """Whether this start created the output's claim (it had none)."""
        self._lock = threading.RLock()
        try:
            self._state_lock = StateLock(state)
        except OSError as e:
            found = diagnose(e, str(state))
            raise SinkOptionError(
                f"state_dir {state} cannot be written ({found.cause}): the sink keeps its lock and state database "
                f"there (filesink recover status reads it as it is). {found.advise('start again', first=True)}"
            ) from e
        try:
            self._output = OutputLocation.of_sink(self.path, options, state).checked()  # before any state is made
            log_options = options if log_store and not is_local(log_store) else None
            # Before anything of the sink is written (the log store's records, the output's claim): a store that
            # cannot create only if absent stops the start here, unless single_driver.
            log_location = LogLocation(local_log if log_store is None else log_store, log_options or {})
            require_conditional_create(log_location.open(), single_driver=d.single_driver)
            self._store = LogStore.open(state, log_store, vnodes=vnodes, storage_options=log_options)
            if new_state is not None:
                new_state.log_opened()
            self._ledger = Ledger(self._store)
            self._destination = open_destination(
                d.table, output=self._output, sink_id=self._store.sink_id, partition_by=self.partition_by
            )
            self._destination.check(self._files_schema())  # a table this sink cannot commit to: refused first
            if d.table.format is TableFormat.DELTA and not self._output.is_local:
                _probe_delta_store(self._output, d.single_driver)

            def claim(defer: bool = True) -> None:
                where = f"state directory {state}"
                if defer and self._defer_take_over():
                    return
                claim_output(
                    self._output,
                    self._store.sink_id,
                    state=where,
                    take_over=self._accept_state_loss,
                    log_store=self._store.location.canonical,
                )
                if new_state is not None:
                    new_state.kept = True  # the output's claim names this sink now

            self._claim = claim
            self._ledger.check_config(
                self.path,
                self.key_columns,
                self.partition_by,
                table_format=d.table.format.value,
                table=d.table.table,
                before_record=claim,
            )
            claim()
            if new_state is not None:
                new_state.kept = True  # recovery writes the sink's first term, in the log store and the output
            self._epochs_since_sweep = 0
            self._term = 0
            self.recovered = None
            self._recover()
            self._shared = shared_dirs(self._store, self._output, self._term)
            """What the executors' tasks of this run look for to tell they see the driver's local log store and
            output (:mod:`filesink.tasks.shared`); None when neither is local."""
            self._probed = False
            """Whether this run checked every executor (:meth:`_probe_executors`)."""
            self.stats = SinkStats(last_epoch=self._store.last_sealed_epoch)
            self._backlog = BacklogTracker(self._store)
            recovered: list[tuple[int, int]] = self.recovered.committed_files() if self.recovered else []
            metrics_hooks.opened(self._metrics, self._store, self._term, recovered, self._backlog)
            self._remember_s3_settings(options)
        except BaseException:
            store = getattr(self, "_store", None)
            if store is not None:
                if store.term is not None:  # this run took a term and stops: not a live owner
                    with contextlib.suppress(Exception):
                        store.home.close_term(store.term)
                store.close()
            if new_state is not None:
                new_state.remove_created()  # a refused start of a new state leaves it as it was
            self._state_lock.release()
            raise
        self._closed = False
        self._stop = threading.Event()
        self._timer = None
        self._timer_error = None

    def _remember_s3_settings(self, options: Mapping[str, Any]) -> None:
        """Record the S3 endpoint and region in the state directory, for ``filesink recover`` (a convenience: a
        failure is logged, never fatal)."""
        on_s3 = not is_local(self.path) or not is_local(self._description.log_store or "")
        try:
            remember(self.state_dir, options if on_s3 else {})
        except OSError as e:
            log.warning("could not record the S3 endpoint and region in %s: %s", self.state_dir, e)

    def _defer_take_over(self) -> bool:
        """Whether the start of a sink that replaces a lost one (accept_state_loss) leaves the output's claim for
        its first batch: a new sink that holds nothing does, when another sink claimed the output. Only the batch id
        says whether the query's checkpoint is new too (batch 0), in which case the output keeps its claim
        (:meth:`_refuse_output_with_rows`). Records whether the output had a claim."""
        if not self._accept_state_loss:
            return False
        claimed, _ = _claim_of(self._output.url, self._output.storage_options, CLAIM_NAME)
        self._created_claim = self._created_claim or claimed is None  # claim() runs twice at a first start
        if claimed is None or claimed == self._store.sink_id:
            return False
        if self._store.rebuilt or self._store.last_sealed_epoch != NOTHING:
            return False  # a sink that holds rows takes the output over at its start: recovery may write files
        self._take_over_from = claimed
        return True

    def _refuse_claimed_output(self, options: Mapping[str, Any]) -> None:
        """Refuse, before anything is created, a new state (no state database yet) for an output another sink
        claimed, unless its log store is that sink's durable home (the sink is rebuilt from it) or
        accept_state_loss. Reads only; a store that cannot be read fails here, as the start would."""
        d = self._description
        if d.accept_state_loss:
            return
        location = d.log_store or str(self.state_dir / "log")
        # A store that cannot be read fails here as it would at the start's own read (nothing is created yet).
        claimed, where = _claim_of(d.path, options, CLAIM_NAME)
        if claimed is None:
            return
        home, _ = _claim_of(location, options, CLAIM_FILE)
        if home == claimed:
            return
        this = f"sink {home}, whose log store is {location}" if home else "sink"
        raise OutputClaimedError(
            f"the output {d.path} belongs to sink {claimed} (its {where}), not to this {this} "
            f"(state directory {self.state_dir}, which holds no state yet). Two sinks writing to one output would "
            "both write their rows there, and readers would see both. Nothing was written or deleted, and nothing "
            "was created in the state directory. Give this sink an output of its own, or start the sink that owns "
            "the output with its state directory or its log store (log_store=, filesink run --log-store: a sink "
            "whose log store outlived it rebuilds from there). If that sink's state is lost for good (its state "
            "directory held its log store), this sink can replace it with accept_state_loss=True (filesink run "
            "--accept-state-loss): the rows that state held and had not written yet are then not in the output. "
            "That needs the query's checkpoint to have survived: a query that starts again at batch 0 would write "
            "the rows the output holds a second time, and is refused (OutputHasRowsError)."
        )

    def _recover(self) -> None:
        """Take a new writer term (fencing earlier writers), resolve files left pending by an earlier run,
        remove garbage, and prepare this term's staging directory."""
        done = recover_at_start(  # the log store was probed for conditional create by _open, before any write
            self._store,
            self._ledger,
            self._output,
            partitioned=bool(self.partition_by),
            file_task=self._file_task,
            single_driver=self._description.single_driver,
            accept_duplicates=self._description.accept_duplicates,
            destination=self._destination if self._destination.options.is_table else None,
        )
        assert done.term is not None
        self._term = done.term
        self.recovered = done
        self.given_up = self._store.given_up()
        if self.given_up:
            log.warning("sink %s: %s", self._store.sink_id, given_up_line(self.given_up), extra={START_NOTICE: True})
        if self._store.rebuilt:
            held = self._store.held_totals()
            log.warning(
                "sink %s: the state directory %s was new, so its state was rebuilt from the durable home at %s: "
                "last sealed epoch %d, epochs held: %d (%d rows), %d pending files resolved",
                self._store.sink_id,
                self.state_dir,
                self._store.location.canonical,
                self._store.last_sealed_epoch,
                held.epochs,
                held.rows,
                len(done.from_home),
                extra={START_NOTICE: True},
            )
        prepare_staging(self._output, self._term)


def _probe_delta_store(output: OutputLocation, single_driver: bool) -> None:
    """The sink (and delta-rs) writes each log entry of a Delta table on S3 with a conditional PUT
    (``If-None-Match: *``): a server that ignores it lets two drivers both write the same version, and one
    acknowledged commit is lost. Probed like the log store's location (:mod:`logstore.conditional`), under
    ``<table>/_filesink_probe/``."""
    storage = LogLocation(f"{output.url}/_filesink_probe", dict(output.storage_options)).open()
    probe = probe_conditional_create(storage)
    if probe.honoured:
        return
    if single_driver:
        log.warning(
            "the Delta table %s is on a server that does not support conditional create (%s): going on in "
            "single-driver operation (single_driver=True), never run two drivers of this sink at a time",
            output.url,
            probe.saw(),
        )
        return
    raise TableFormatError(
        f"the Delta table {output.url} is on a server that does not support conditional create, PUT with "
        f"If-None-Match: * ({probe.saw()}). Each log entry of the table is written that way: without it two "
        "drivers of this sink (a restart that overlaps the old driver) could both write the same table version, and "
        "a commit the sink recorded as done would be lost. Nothing was written. Use a server that honours it (AWS S3, "
        "MinIO, SeaweedFS), or promise single-driver operation with single_driver=True (filesink run "
        "--single-driver)."
    )


def _claim_of(url: str, options: Mapping[str, Any], name: str) -> tuple[str | None, str]:
    """The sink the claim ``name`` at ``url`` names (an output's ``_filesink.json``, a log store's ``sink.json``;
    None if there is none), and the claim's full path. Reads only."""
    storage = LogLocation(url, dict(options) if not is_local(url) else {}).open()
    try:
        data = storage.read_all(name)
    except FileNotFoundError:
        return None, storage.display(name)
    try:
        return str(json.loads(data)["sink_id"]), storage.display(name)
    except (ValueError, KeyError, TypeError):
        return f"unreadable ({data[:80]!r})", storage.display(name)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


@dataclass
class _NewState:
    """A new state directory (no state database yet) as a start found it, before it created anything: a start
    refused before it wrote outside what it can remove (the output's claim, recovery's first term) removes what it
    created, so that the refusal's "nothing was written" holds, and a later start is new again."""

    state: Path
    entries: frozenset[str]
    """The names in the state directory before the start."""
    absent: list[Path]
    """Directories the start may create that did not exist (the state directory, a local output and its
    staging directory, a local log store, and their parents), deepest first: removed if empty."""
    log_dir: Path | None
    """A local log store that held no sink's claim (so nothing else writes there)."""
    log_entries: frozenset[str]
    """The names in ``log_dir`` before the start."""
    kept: bool = False
    """Set once the start wrote what it does not remove: then it removes nothing."""
    claims_log: bool = False
    """Whether opening the log store claims a new remote location (its ``sink.json``, which is not removed): the
    start keeps what it made once the log store is open (:meth:`log_opened`)."""

    def log_opened(self) -> None:
        if self.claims_log:
            self.kept = True

    @classmethod
    def before(
        cls, state: Path, directories: list[Path], log_store: str | None, options: Mapping[str, Any]
    ) -> _NewState:
        absent: set[Path] = set()
        for directory in directories:
            for place in (directory, *directory.parents):
                if place.exists():
                    break
                absent.add(place)
        location = log_store or str(state / "log")
        claims_log = False
        log_dir = None
        if is_local(location):
            log_dir = Path(LogLocation(location).canonical)
            if (log_dir / CLAIM_FILE).exists():
                log_dir = None  # a sink's log store (rebuilt from): the start does not add to it before it claims
        else:
            # the start claims a new log store's location (its sink.json), which is not removed
            claims_log = _claim_of(location, options, CLAIM_FILE)[0] is None
        return cls(
            state=state,
            entries=frozenset(listdir(state)),
            absent=sorted(absent, key=lambda p: len(p.parts), reverse=True),
            log_dir=log_dir,
            log_entries=frozenset(listdir(log_dir)) if log_dir is not None else frozenset(),
            claims_log=claims_log,
        )

    def remove_created(self) -> None:
        """Remove what the start created (under the state directory's lock), unless it wrote elsewhere too."""
        if self.kept:
            return
        for name in set(listdir(self.state)) - self.entries:
            if name in STATE_NAMES:
                _remove(self.state / name)
        if self.log_dir is not None:
            for name in set(listdir(self.log_dir)) - self.log_entries:
                _remove(self.log_dir / name)
        for directory in self.absent:
            with contextlib.suppress(OSError):
                directory.rmdir()
