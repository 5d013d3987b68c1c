"""Schema evolution into a Delta and an Iceberg table, without Spark's jobs: the table's schema changes in the same
commit as the first file that needs it, rows written before read back with nulls (and, on Iceberg, widened values),
a restart between the change and the table's commit, and what a format cannot take refused before the batch."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pytest
from conformance import check_table
from evolve_tables import V1, batch, expected, open_sink, v2, write_evolving
from sink_helpers import append_evolving

from filesink import SchemaMismatchError
from logstore.failpoints import ENV_VAR, FailpointError


def _read(tmp_path: Path, table_format: str) -> tuple[pa.Table, Counter]:
    root = tmp_path / "table"
    if table_format == "delta":
        from deltalake import DeltaTable

        table = DeltaTable(str(root)).to_pyarrow_table()
    else:
        from pyiceberg.catalog.sql import SqlCatalog

        from filesink.destination.iceberg import CATALOG_NAME, EMBEDDED_CATALOG

        catalog = SqlCatalog(CATALOG_NAME, uri=f"sqlite:///{root / EMBEDDED_CATALOG}", warehouse=f"file://{root}")
        table = catalog.load_table("db.events").scan().to_arrow()
    rows = Counter((r["id"], r["n"], r["p"]["x"], r["p"].get("y"), r.get("extra")) for r in table.to_pylist())
    return table, rows


@pytest.mark.parametrize("table_format", ["delta", "iceberg"])
def test_the_table_evolves_with_the_first_file_that_needs_it(tmp_path, table_format):
    pytest.importorskip("deltalake" if table_format == "delta" else "pyiceberg")
    widen = table_format == "iceberg"  # Delta's type widening is a table feature delta-rs does not write
    expected = write_evolving(tmp_path, table_format, widen)
    table, rows = _read(tmp_path, table_format)
    assert rows == expected
    assert table.schema.names == ["id", "n", "p", "extra"]
    assert table.schema.field("n").type == (pa.int64() if widen else pa.int32())
    if table_format == "delta":
        log = sorted((tmp_path / "table" / "_delta_log").glob("*.json"))
        entries = [[json.loads(line) for line in p.read_text().splitlines()] for p in log]
        changed = [e for e in entries if any("metaData" in a for a in e)]
        assert len(changed) == 2, "the creation, and the commit of the first files with the new columns"
        assert any("add" in a for a in changed[1]), "the schema changes in the same entry as the files"
        metadata = next(a["metaData"] for a in changed[1] if "metaData" in a)
        assert "extra" in metadata["schemaString"]
    else:
        from pyiceberg.catalog.sql import SqlCatalog

        from filesink.destination.iceberg import CATALOG_NAME, EMBEDDED_CATALOG

        root = tmp_path / "table"
        catalog = SqlCatalog(CATALOG_NAME, uri=f"sqlite:///{root / EMBEDDED_CATALOG}", warehouse=f"file://{root}")
        loaded = catalog.load_table("db.events")
        snapshots = loaded.snapshots()
        assert len(snapshots) == 2, "one snapshot per roll"
        assert snapshots[0].schema_id != snapshots[1].schema_id == loaded.schema().schema_id
    check_table(table_format, str(tmp_path / "table"))  # conforms to its format; DuckDB reads the same rows


def test_delta_refuses_a_wider_type_before_the_batch(tmp_path):
    pytest.importorskip("deltalake")
    with open_sink(tmp_path, "delta") as sink:
        append_evolving(sink, 0, batch(0, 1, False), V1)
        with pytest.raises(SchemaMismatchError, match=r"n widened from int to bigint.*Delta.*Nothing of this batch"):
            append_evolving(sink, 1, batch(1, 2, True), v2(True))
        assert sink.log_store.last_sealed_epoch == 0
        assert [v.version for v in sink.ledger.schema_history()] == [1]


@pytest.mark.parametrize("point", ["filesink.table.before", "filesink.table.after"])
@pytest.mark.parametrize("table_format", ["delta", "iceberg"])
def test_a_crash_at_the_commit_that_evolves_the_table_is_finished_once(tmp_path, monkeypatch, table_format, point):
    """The roll's files are written under the new schema and pre-committed; the run dies just before (or just after)
    the table's commit that changes its schema. The next start decides from the table alone, and commits them once."""
    pytest.importorskip("deltalake" if table_format == "delta" else "pyiceberg")
    widen = table_format == "iceberg"
    with open_sink(tmp_path, table_format) as sink:
        append_evolving(sink, 0, batch(0, 1, widen), V1)
        sink.flush()
        append_evolving(sink, 1, batch(1, 1, widen), V1)
        append_evolving(sink, 2, batch(2, 2, widen), v2(widen))
        monkeypatch.setenv(ENV_VAR, f"{point}=raise")
        with pytest.raises(FailpointError):
            sink.flush()
        monkeypatch.delenv(ENV_VAR)
    with open_sink(tmp_path, table_format) as sink:  # recovery at start commits the pending files, or finds them
        assert sink.ledger.pending_names() == []
        sink.flush()
    table, rows = _read(tmp_path, table_format)
    assert rows == expected(3, 2, widen)
    assert table.schema.names == ["id", "n", "p", "extra"]
    check_table(table_format, str(tmp_path / "table"), duckdb=False)
