"""Tables the sink writes without Spark's jobs (``sink_helpers.append_epoch``) for another engine to read: a
partitioned table over several rolls, and what each of its commits holds."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sink_helpers import append_epoch, batch_rows

from filesink import ExactlyOnceParquetSink, Rollover

ROLLOVER = Rollover(target_file_size=None, max_age_seconds=None, max_epochs=2)
EPOCHS = 6
TABLE = "db.events"


@dataclass(frozen=True)
class Commits:
    """A table and, per commit of the sink, oldest first, the table's version (Delta) or snapshot id (Iceberg)
    after it and every row the table holds then."""

    path: str
    versions: tuple[int, ...]
    rows: tuple[Counter, ...]

    @property
    def final(self) -> Counter:
        return self.rows[-1]


def _version(path: str, table_format: str, options: dict[str, Any] | None, catalog: dict[str, Any] | None) -> int:
    if table_format == "delta":
        import deltalake

        from filesink.destination.delta import storage_options

        return deltalake.DeltaTable(path, storage_options=storage_options(options or {}) or None).version()
    from pyiceberg.catalog import load_catalog

    from filesink.destination.iceberg import CATALOG_NAME, EMBEDDED_CATALOG, file_io_properties

    if catalog:
        properties = {**(file_io_properties(options) if options else {}), **catalog}
    else:
        properties = {"type": "sql", "uri": f"sqlite:///{path}/{EMBEDDED_CATALOG}", "warehouse": f"file://{path}"}
    name = properties.pop("name", CATALOG_NAME)
    snapshot = load_catalog(name, **properties).load_table(TABLE).current_snapshot()
    assert snapshot is not None
    return snapshot.snapshot_id


def write_partitioned(
    path: str,
    state: Path,
    table_format: str,
    *,
    options: dict[str, Any] | None = None,
    catalog: dict[str, Any] | None = None,
) -> Commits:
    """A table partitioned by ``event_date`` at ``path``: :data:`EPOCHS` epochs, a roll (a table commit) every two."""
    extra: dict[str, Any] = {"table": TABLE, "catalog": catalog} if table_format == "iceberg" else {}
    sink = ExactlyOnceParquetSink(
        path,
        str(state),
        vnodes=8,
        parallelism=2,
        rollover=ROLLOVER,
        table_format=table_format,
        partition_by=["event_date"],
        storage_options=options,
        **extra,
    )
    held: Counter = Counter()
    versions: list[int] = []
    rows: list[Counter] = []
    with sink:
        for epoch in range(EPOCHS):
            batch = batch_rows(epoch, 30 + 7 * epoch)
            append_epoch(sink, epoch, batch)
            held.update(batch)
            sink._roll(force=False)
            if (epoch + 1) % ROLLOVER.max_epochs == 0:
                versions.append(_version(path, table_format, options, catalog))
                rows.append(Counter(held))
    assert len(set(versions)) == EPOCHS // ROLLOVER.max_epochs, f"one commit per roll: {versions}"
    return Commits(path, tuple(versions), tuple(rows))
