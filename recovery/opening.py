"""Opening the sink a ``recover`` step works on: its state (the state directory's database, or rebuilt from the
durable home), its output, and its destination (a table's format and catalog, :func:`open_table`)."""

from __future__ import annotations

import argparse
import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from filesink.committer.ledger import Ledger, PlannedFile
from filesink.destination import Destination, TableFormat, open_destination, table_options
from filesink.output import OutputLocation
from filesink.output.probe import check_s3
from filesink.rolling.planner import file_task
from filesink.s3options import from_args, with_remembered
from filesink.tasks.writer import FileTask
from logstore import LogLocation, LogStore, NoLogStoreError
from logstore.statedb import STATE_DB_NAME
from logstore.storage import is_local

from .errors import NotASinkError


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


def storage_options_of(args: argparse.Namespace) -> dict[str, Any]:
    """S3 settings from the flags (:mod:`filesink.s3options`, the same as ``filesink run``'s); credentials from the
    standard AWS variables or profile (never flags). The endpoint and region the state directory remembers (the
    ones its sink last ran with) fill in what neither the flags nor the AWS variables give."""
    state_dir = Path(args.state_dir).absolute() if getattr(args, "state_dir", None) else None
    return with_remembered(from_args(args), state_dir)


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


def open_step(args: argparse.Namespace, *, readonly: bool) -> tuple[OpenSink, dict[str, Any]]:
    """The sink a step's ``--state-dir`` and ``--log-store`` name, and the S3 settings it was opened with
    (:func:`storage_options_of`); a log store on S3 is checked first, with the same checks and messages as
    ``filesink run``'s."""
    state_dir = Path(args.state_dir).absolute() if args.state_dir else None
    options = storage_options_of(args)
    log_store = args.log_store or (LogStore.recorded_location(state_dir) if state_dir is not None else None)
    if log_store is not None and not is_local(log_store):
        check_s3(log_store, options, "log store")
    return open_sink(state_dir, options, readonly=readonly, log_store=args.log_store), options


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
