"""Schema evolution with real Spark: a query restarted with a new column, a new struct field and a widened type
while rows of the old schema are still held; kills between the schema change and the next file; a batch without
a column, filled with nulls when the sink is told to. Readers get exactly the input rows (``support/evolve_job.py``).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import duckdb
import polars as pl
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
from evolve_job import EPOCHS, FIRST_V2, HOLD, ICEBERG_TABLE, expected, open_sink, run
from helpers import SUPPORT, communicate, support_env

from filesink import ExactlyOnceParquetSink, SchemaMismatchError
from filesink.cli.main import main as filesink_main
from logstore.failpoints import ENV_VAR

JOB = SUPPORT / "evolve_job.py"
JOB_DEADLINE = 240.0


def _unified(output: Path) -> pa.Schema:
    files = sorted(output.rglob("*.parquet"))
    return pa.unify_schemas([pq.read_schema(f) for f in files], promote_options="permissive")


def _rows(table: pa.Table) -> Counter:
    return Counter((r["id"], r["n"], r["p"]["x"], r["p"].get("y"), r.get("extra")) for r in table.to_pylist())


def test_a_restarted_query_adds_a_column_a_field_and_widens_a_type_while_old_rows_are_held(spark, tmp_path, capsys):
    state, output = tmp_path / "state", tmp_path / "out"
    run(spark, str(state), str(output))
    schemas = {str(s): s for s in (pq.read_schema(f) for f in output.rglob("*.parquet"))}
    assert len(schemas) == 2, schemas  # the flush after batch 0, and the one at the end (2 writers each)
    old, new = sorted(schemas.values(), key=len)
    assert old.names == ["id", "n", "p"] and old.field("n").type == pa.int32()  # written before the change
    assert new.names == ["id", "n", "p", "extra"] and new.field("n").type == pa.int64()
    assert new.field("p").type == pa.struct([("x", pa.int32()), ("y", pa.string())])

    unified = _unified(output)
    assert _rows(ds.dataset(str(output), schema=unified, format="parquet").to_table()) == expected()
    polars = pl.scan_parquet(
        str(output / "*.parquet"),
        schema=pl.DataFrame(unified.empty_table()).schema,  # the newest schema (Polars takes the first file's)
        missing_columns="insert",
        cast_options=pl.ScanCastOptions(integer_cast="upcast", missing_struct_fields="insert"),
    ).collect()
    assert _rows(polars.to_arrow()) == expected()
    con = duckdb.connect()
    glob = str(output / "*.parquet")
    duck = con.execute(f"SELECT id, n, p.x, p.y, extra FROM read_parquet('{glob}', union_by_name = true)").fetchall()
    assert Counter(duck) == expected()
    newest = "id bigint, n bigint, p struct<x:int,y:string>, extra string"  # mergeSchema refuses int with bigint
    spark_rows = spark.read.schema(newest).parquet(str(output)).collect()
    assert Counter((r.id, r.n, r.p.x, r.p.y, r.extra) for r in spark_rows) == expected()

    with open_sink(str(state), str(output)) as sink:
        history = sink.ledger.schema_history()
    assert [(v.version, v.first_epoch) for v in history] == [(1, 0), (2, FIRST_V2)]
    assert history[1].changes == ("n widened from int to bigint", "p.y (string) added", "extra (string) added")
    capsys.readouterr()  # the job's progress lines
    assert filesink_main(["recover", "status", "--state-dir", str(state), "--json", "--no-verify"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert [v["version"] for v in shown["schema_history"]] == [1, 2]
    assert shown["schema_history"][1]["columns"][-1] == ["extra", "string"]


def _job(state: Path, output: Path, failpoint: str | None) -> subprocess.CompletedProcess[str]:
    env = support_env()
    env.pop(ENV_VAR, None)
    if failpoint:
        env[ENV_VAR] = failpoint
    proc = subprocess.Popen(
        [sys.executable, str(JOB), str(state), str(output)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    out, err = communicate(proc, JOB_DEADLINE, f"the evolving job ({failpoint or 'to the end'})")
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


@pytest.mark.parametrize(
    "kills",
    [
        ("logstore.seal.before_commit=kill@3",),
        pytest.param(
            ("logstore.seal.before_commit=kill@3", "filesink.precommit.after=kill@1"), marks=pytest.mark.chaos
        ),
    ],
    ids=["after-recording", "after-recording-then-at-precommit"],
)
def test_kills_between_the_schema_change_and_the_next_file(tmp_path, kills):
    """Killed after the new schema is recorded and before its batch is sealed (the third seal), then (chaos tier)
    while the first file under the new schema is pre-committed; each start finishes what the last left."""
    state, output = tmp_path / "state", tmp_path / "out"
    first = _job(state, output, kills[0])
    assert first.returncode == -9, first.stderr[-3000:]
    assert "batch 1" in first.stdout and "batch 2" not in first.stdout
    for kill in kills[1:]:
        again = _job(state, output, kill)
        assert again.returncode == -9, again.stderr[-3000:]
        assert f"batch {EPOCHS - 1}" in again.stdout and "done" not in again.stdout
    last = _job(state, output, None)
    assert last.returncode == 0 and "done" in last.stdout, last.stderr[-3000:]
    assert _rows(ds.dataset(str(output), schema=_unified(output), format="parquet").to_table()) == expected()
    with open_sink(str(state), str(output)) as sink:
        assert [(v.version, v.first_epoch) for v in sink.ledger.schema_history()] == [(1, 0), (2, FIRST_V2)]


def test_a_batch_without_a_column_is_refused_or_filled_with_nulls(spark, tmp_path):
    full = "SELECT id, concat('n', id) AS name, named_struct('x', id) AS p FROM range({}, {})"
    without = "SELECT named_struct('x', id) AS p, id FROM range({}, {})"
    with open_sink(str(tmp_path / "refusing"), str(tmp_path / "refused")) as sink:
        sink(spark.sql(full.format(0, 5)), 0)
        with pytest.raises(SchemaMismatchError, match=r"name \(string\) is gone.*fill_missing_columns=True"):
            sink(spark.sql(without.format(5, 10)), 1)
        assert sink.log_store.last_sealed_epoch == 0
    output = tmp_path / "out"
    with ExactlyOnceParquetSink(
        str(output), tmp_path / "state", vnodes=8, parallelism=2, rollover=HOLD, fill_missing_columns=True
    ) as sink:
        sink(spark.sql(full.format(0, 5)), 0)
        sink(spark.sql(without.format(5, 10)), 1)
        assert [v.version for v in sink.ledger.schema_history()] == [1]  # the same schema: nothing evolved
        sink.flush()
    table = ds.dataset(str(output), format="parquet").to_table()
    assert table.schema.names == ["id", "name", "p"]
    got = Counter((r["id"], r["name"], r["p"]["x"]) for r in table.to_pylist())
    assert got == Counter([(i, f"n{i}", i) for i in range(5)] + [(i, None, i) for i in range(5, 10)])


@pytest.mark.chaos  # the default tier evolves both tables without Spark's jobs (test_table_evolution.py)
@pytest.mark.parametrize("table_format", ["delta", "iceberg"])
def test_a_restarted_query_evolves_a_table(spark, tmp_path, table_format):
    """The same query into a Delta table (new column and field) and an Iceberg table (a widened type too), read back
    with Polars' table readers."""
    pytest.importorskip("deltalake" if table_format == "delta" else "pyiceberg")
    state, output = tmp_path / "state", tmp_path / "table"
    run(spark, str(state), str(output), table_format)
    if table_format == "delta":
        frame = pl.read_delta(str(output))
    else:
        from pyiceberg.catalog.sql import SqlCatalog

        from filesink.destination.iceberg import CATALOG_NAME, EMBEDDED_CATALOG

        catalog = SqlCatalog(CATALOG_NAME, uri=f"sqlite:///{output / EMBEDDED_CATALOG}", warehouse=f"file://{output}")
        frame = pl.scan_iceberg(catalog.load_table(ICEBERG_TABLE)).collect()
    assert frame.columns == ["id", "n", "p", "extra"]
    assert _rows(frame.to_arrow()) == expected(table_format=table_format)
