"""Spark's own Delta and Iceberg connectors read the sink's tables: exactly the rows (multisets), a filter on the
partition column, time travel to an earlier commit, the history of the sink's commits, and tables whose schema
evolved (new columns and struct fields; on Iceberg a widened type) or whose Delta log was checkpointed by the sink
and by delta-rs.

The tables are written through the sink without Spark (``engine_tables.py``, ``evolve_tables.py``,
``delta_restarts.py``); Spark is the pinned one of ``engines_env.py`` (pyspark 4.1 with delta-spark 4.2 and
Iceberg's Spark 4.1 runtime, in an environment of its own, built once per user), asked through ``spark_sql_job.py``:
one Spark start per test serves all of its checks. Where the environment cannot be built (no Maven, no network),
the tests are skipped with the command that failed and its answer.

Iceberg is read through Iceberg's ``JdbcCatalog`` on the sink's embedded SQLite catalog: pyiceberg's SqlCatalog and
the Java catalog keep the same tables (``iceberg_tables``, ``iceberg_namespace_properties``), and the Spark catalog
is named ``filesink``, the catalog name the sink's pyiceberg catalog writes in them.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from engine_tables import TABLE, write_partitioned
from sink_helpers import COLUMNS
from spark_engines import SparkSQL, embedded_catalog, engines_or_skip, jdbc_catalog, s3_setup

from filesink.demo.s3server import S3Settings

pytestmark = pytest.mark.timeout(1500)  # a cold build waits at most engines_env.LOCK_DEADLINE (1290 s)

SELECT = ", ".join(COLUMNS)
DAY = "2024-01-02"


def _rows(rows: list[list]) -> Counter:
    return Counter(tuple(r) for r in rows)


def _day(rows: Counter, day: str) -> Counter:
    return Counter({r: n for r, n in rows.items() if r[2] == day})


def _operations(history: dict) -> dict[int, str]:
    """Version -> operation, from ``DESCRIBE HISTORY``'s answer."""
    columns = history["columns"]
    return {row[columns.index("version")]: row[columns.index("operation")] for row in history["rows"]}


@pytest.mark.slow
def test_spark_reads_the_sinks_delta_tables(tmp_path: Path) -> None:
    pytest.importorskip("deltalake")
    from delta_restarts import COLUMNS as RESTART_COLUMNS
    from delta_restarts import write_restarted_table
    from evolve_tables import write_evolving

    engines = engines_or_skip()
    table = write_partitioned(str(tmp_path / "table"), tmp_path / "state", "delta")
    evolved = write_evolving(tmp_path / "evolved", "delta", widen=False)
    restarted = write_restarted_table(tmp_path / "restarted")
    source = f"delta.`{table.path}`"
    first, second, _ = table.versions
    with SparkSQL(engines, tmp_path / "spark.log") as spark:
        whole, by_day, files, at_first, at_second, history, detail, evolving, restart = spark.ask(
            [
                f"SELECT {SELECT} FROM {source}",
                f"SELECT {SELECT} FROM {source} WHERE event_date = '{DAY}'",
                f"SELECT DISTINCT input_file_name() FROM {source} WHERE event_date = '{DAY}'",
                f"SELECT {SELECT} FROM {source} VERSION AS OF {first}",
                f"SELECT {SELECT} FROM {source} VERSION AS OF {second}",
                f"DESCRIBE HISTORY {source}",
                f"DESCRIBE DETAIL {source}",
                f"SELECT id, n, p.x, p.y, extra FROM delta.`{tmp_path / 'evolved' / 'table'}`",
                f"SELECT * FROM delta.`{tmp_path / 'restarted' / 'table'}`",
            ]
        )
    for answer in (whole, by_day, files, at_first, at_second, history, detail, evolving, restart):
        assert "error" not in answer, answer["error"]
    assert _rows(whole["rows"]) == table.final
    assert _rows(by_day["rows"]) == _day(table.final, DAY)
    assert {f"event_date={DAY}" in row[0] for row in files["rows"]} == {True}, files["rows"]
    assert _rows(at_first["rows"]) == table.rows[0]
    assert _rows(at_second["rows"]) == table.rows[1]
    versions = sorted(row[history["columns"].index("version")] for row in history["rows"])
    assert versions == list(range(table.versions[-1] + 1)), "the history holds the creation and each commit"
    assert _operations(history)[0] == "CREATE TABLE", _operations(history)
    detail_row = dict(zip(detail["columns"], detail["rows"][0], strict=True))
    assert detail_row["partitionColumns"] == ["event_date"]
    assert _rows(evolving["rows"]) == evolved
    assert restart["columns"] == RESTART_COLUMNS
    assert _rows(restart["rows"]) == restarted.rows


@pytest.mark.slow
def test_spark_reads_the_sinks_iceberg_tables(tmp_path: Path) -> None:
    pytest.importorskip("pyiceberg")
    from evolve_tables import write_evolving

    engines = engines_or_skip()
    table = write_partitioned(str(tmp_path / "table"), tmp_path / "state", "iceberg")
    evolved = write_evolving(tmp_path / "evolved", "iceberg", widen=True)
    source = f"filesink.{TABLE}"
    first, second, _ = table.versions
    with SparkSQL(engines, tmp_path / "spark.log") as spark:
        whole, by_day, files, at_first, at_second, snapshots = spark.ask(
            [
                f"SELECT {SELECT} FROM {source}",
                f"SELECT {SELECT} FROM {source} WHERE event_date = '{DAY}'",
                f"SELECT DISTINCT input_file_name() FROM {source} WHERE event_date = '{DAY}'",
                f"SELECT {SELECT} FROM {source} VERSION AS OF {first}",
                f"SELECT {SELECT} FROM {source} VERSION AS OF {second}",
                f"SELECT snapshot_id, operation, summary FROM {source}.snapshots ORDER BY committed_at",
            ],
            embedded_catalog(tmp_path / "table"),
        )
        evolving, types = spark.ask(
            [f"SELECT id, n, p.x, p.y, extra FROM {source}", f"DESCRIBE TABLE {source}"],
            embedded_catalog(tmp_path / "evolved" / "table"),
        )
    for answer in (whole, by_day, files, at_first, at_second, snapshots, evolving, types):
        assert "error" not in answer, answer["error"]
    assert _rows(whole["rows"]) == table.final
    assert _rows(by_day["rows"]) == _day(table.final, DAY)
    assert {f"event_date={DAY}" in row[0] for row in files["rows"]} == {True}, files["rows"]
    assert _rows(at_first["rows"]) == table.rows[0]
    assert _rows(at_second["rows"]) == table.rows[1]
    assert [row[0] for row in snapshots["rows"]] == list(table.versions), "one snapshot per commit of the sink"
    assert {row[1] for row in snapshots["rows"]} == {"append"}
    assert all("filesink.files" in row[2] for row in snapshots["rows"]), snapshots["rows"]
    assert _rows(evolving["rows"]) == evolved
    assert dict((row[0], row[1]) for row in types["rows"][:4]) == {
        "id": "bigint",
        "n": "bigint",
        "p": "struct<x:int,y:string>",
        "extra": "string",
    }


@pytest.mark.chaos
def test_spark_reads_the_sinks_tables_on_s3_with_a_postgresql_catalog(
    tmp_path: Path, s3_server: S3Settings, s3_prefix: str, postgres_uri: str
) -> None:
    """A Delta table on S3 (SeaweedFS), read through Hadoop's S3A, and an Iceberg table on S3 whose catalog is
    PostgreSQL, read through Iceberg's JdbcCatalog on the same database: the rows, a partition filter, time travel
    and the history, one Spark start for both."""
    pytest.importorskip("deltalake")
    pytest.importorskip("pyiceberg")
    import uuid

    engines = engines_or_skip()
    options = s3_server.storage_options()
    name = f"c{uuid.uuid4().hex[:8]}"  # a catalog of its own in the session's database
    catalog = {"type": "sql", "uri": postgres_uri, "name": name}
    delta = write_partitioned(s3_prefix + "/delta", tmp_path / "delta-state", "delta", options=options)
    iceberg = write_partitioned(
        s3_prefix + "/iceberg", tmp_path / "iceberg-state", "iceberg", options=options, catalog=catalog
    )
    source = f"delta.`{delta.path}`"
    with SparkSQL(engines, tmp_path / "spark.log", s3=s3_setup(s3_server)) as spark:
        delta_answers = spark.ask(
            [
                f"SELECT {SELECT} FROM {source}",
                f"SELECT {SELECT} FROM {source} WHERE event_date = '{DAY}'",
                f"SELECT {SELECT} FROM {source} VERSION AS OF {delta.versions[0]}",
                f"DESCRIBE HISTORY {source}",
            ]
        )
        table = f"{name}.{TABLE}"
        iceberg_answers = spark.ask(
            [
                f"SELECT {SELECT} FROM {table}",
                f"SELECT {SELECT} FROM {table} WHERE event_date = '{DAY}'",
                f"SELECT {SELECT} FROM {table} VERSION AS OF {iceberg.versions[0]}",
                f"SELECT snapshot_id FROM {table}.snapshots ORDER BY committed_at",
            ],
            jdbc_catalog(postgres_uri, s3_prefix, name),
        )
    for answer in delta_answers + iceberg_answers:
        assert "error" not in answer, answer["error"]
    for written, (whole, by_day, at_first, _) in ((delta, delta_answers), (iceberg, iceberg_answers)):
        assert _rows(whole["rows"]) == written.final
        assert _rows(by_day["rows"]) == _day(written.final, DAY)
        assert _rows(at_first["rows"]) == written.rows[0]
    assert sorted(_operations(delta_answers[3])) == list(range(delta.versions[-1] + 1))
    assert [row[0] for row in iceberg_answers[3]["rows"]] == list(iceberg.versions)
