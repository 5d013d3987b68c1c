"""DuckDB, in its pinned environment, reads the sink's Delta and Iceberg tables: exactly the input rows, the
partition column filled from the table's metadata (the data files do not hold it), and a filter on the partition
column reads exactly that partition's rows from exactly that partition's files.

The tables are written through the sink without Spark, partitioned by ``event_date``, over several epochs and rolls
(one table commit per roll). DuckDB is ``duckdb_env.PINS`` in a virtual environment of its own (``duckdb_env.py``:
built once per user, about 10-20 s, then reused), reading with ``delta_scan`` and ``iceberg_scan`` (the current
metadata file, as pyiceberg's catalog names it) through ``duckdb_reader.py``. Where that environment cannot be built
(no network to the package index, pip fails), the test is skipped with the reason.

What DuckDB 1.4.4 reads (measured): the same columns in the same order with the same types as the sink's schema
(``BIGINT``, ``BIGINT``, ``VARCHAR``, ``DOUBLE``), the string partition column from the Delta log's partition values
and from Iceberg's manifests, and only the filtered partition's files (``EXPLAIN ANALYZE``'s files read).
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
from duckdb_env import pinned_duckdb
from helpers import SUPPORT, run
from sink_helpers import COLUMNS, append_epoch, batch_rows

from filesink import ExactlyOnceParquetSink, Rollover

pytestmark = pytest.mark.timeout(540)  # a cold build of the environment waits at most duckdb_env.LOCK_DEADLINE

ROLLOVER = Rollover(target_file_size=None, max_age_seconds=None, max_epochs=2)
EPOCHS = 6
TYPES = ["BIGINT", "BIGINT", "VARCHAR", "DOUBLE"]
"""DuckDB's types of ``COLUMNS`` (int64, int64, string, float64 in the sink's schema)."""
READ_DEADLINE = 120.0


@pytest.fixture(scope="session")
def duckdb_python() -> Path:
    python, reason = pinned_duckdb()
    if python is None:
        pytest.skip(f"no pinned DuckDB environment: {reason}")
    return python


def _write(tmp_path: Path, table_format: str) -> tuple[Path, Counter]:
    """A table partitioned by ``event_date``, written over :data:`EPOCHS` epochs and a roll every two."""
    table = tmp_path / "table"
    options = {"table": "db.events"} if table_format == "iceberg" else {}
    sink = ExactlyOnceParquetSink(
        str(table),
        str(tmp_path / "state"),
        vnodes=8,
        parallelism=2,
        rollover=ROLLOVER,
        table_format=table_format,
        partition_by=["event_date"],
        **options,
    )
    expected: Counter = Counter()
    for epoch in range(EPOCHS):
        rows = batch_rows(epoch, 30 + 7 * epoch)
        append_epoch(sink, epoch, rows)
        expected.update(rows)
        sink._roll(force=False)
    sink.flush()
    sink.close()
    return table, expected


def _location(table: Path, table_format: str) -> tuple[str, int]:
    """What DuckDB is given (a Delta table's directory, an Iceberg table's current metadata file) and how many
    commits the table has had since its creation."""
    if table_format == "delta":
        import deltalake

        return str(table), deltalake.DeltaTable(str(table)).version()
    from pyiceberg.catalog.sql import SqlCatalog

    from filesink.destination.iceberg import CATALOG_NAME, EMBEDDED_CATALOG

    catalog = SqlCatalog(CATALOG_NAME, uri=f"sqlite:///{table / EMBEDDED_CATALOG}", warehouse=f"file://{table}")
    loaded = catalog.load_table("db.events")
    return loaded.metadata_location.removeprefix("file://"), len(loaded.snapshots())


def _read(python: Path, scans: list[dict]) -> list[dict]:
    done = run(
        [str(python), str(SUPPORT / "duckdb_reader.py"), json.dumps(scans)],
        READ_DEADLINE,
        "DuckDB reading the tables",
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, f"the DuckDB reader failed (exit {done.returncode}):\n{done.stderr[-3000:]}"
    return json.loads(done.stdout)


@pytest.mark.parametrize("table_format", ["delta", "iceberg"])
def test_duckdb_reads_exactly_the_rows_of_a_partitioned_table(tmp_path, table_format, duckdb_python):
    pytest.importorskip("deltalake" if table_format == "delta" else "pyiceberg")
    table, expected = _write(tmp_path, table_format)
    location, commits = _location(table, table_format)
    assert commits == EPOCHS // ROLLOVER.max_epochs, "one table commit per roll"
    files = Counter(p.parent.name for p in table.glob("event_date=*/*.parquet"))
    days = sorted({row[2] for row in expected})
    assert sorted(d.removeprefix("event_date=") for d in files) == days
    scans = [{"format": table_format, "location": location}]
    scans += [{"format": table_format, "location": location, "where": {"event_date": day}} for day in days]
    whole, *by_day = _read(duckdb_python, scans)
    for answer in (whole, *by_day):
        assert (answer["columns"], answer["types"]) == (COLUMNS, TYPES)
    assert Counter(tuple(row) for row in whole["rows"]) == expected
    assert whole["files_read"] == sum(files.values())
    for day, answer in zip(days, by_day, strict=True):
        assert Counter(tuple(row) for row in answer["rows"]) == Counter(r for r in expected.elements() if r[2] == day)
        assert answer["files_read"] == files[f"event_date={day}"], f"the filter on {day} read other partitions"


@pytest.mark.parametrize("table_format", ["delta", "iceberg"])
def test_duckdb_reads_a_table_whose_schema_evolved(tmp_path, table_format, duckdb_python):
    """New columns and struct fields (and on Iceberg a widened type) while older rows were held: DuckDB reads the
    newest schema, older rows with nulls and widened values."""
    pytest.importorskip("deltalake" if table_format == "delta" else "pyiceberg")
    from evolve_tables import write_evolving

    widen = table_format == "iceberg"
    expected = write_evolving(tmp_path, table_format, widen)
    location, _ = _location(tmp_path / "table", table_format)
    [answer] = _read(duckdb_python, [{"format": table_format, "location": location}])
    assert answer["columns"] == ["id", "n", "p", "extra"]
    assert answer["types"][:2] == ["BIGINT", "BIGINT" if widen else "INTEGER"]
    got = Counter((r[0], r[1], r[2]["x"], r[2]["y"], r[3]) for r in answer["rows"])
    assert got == expected


def test_duckdb_reads_a_delta_table_whose_sinks_restarted_after_checkpoints(tmp_path, duckdb_python):
    """A sink restarted after a checkpoint (its own, or delta-rs's after another writer's appends and compaction)
    takes a new column each time (``delta_restarts.py``): DuckDB reads every row, the newest columns, and the empty
    string's partition as null."""
    pytest.importorskip("deltalake")
    from delta_restarts import COLUMNS as RESTART_COLUMNS
    from delta_restarts import write_restarted_table

    written = write_restarted_table(tmp_path)
    [answer] = _read(duckdb_python, [{"format": "delta", "location": str(tmp_path / "table")}])
    assert answer["columns"] == RESTART_COLUMNS
    assert answer["types"] == ["BIGINT", "BIGINT", "VARCHAR", "BIGINT", "VARCHAR", "DOUBLE"]
    assert Counter(tuple(row) for row in answer["rows"]) == written.rows
