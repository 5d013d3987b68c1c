"""``filesink run`` over a landing directory whose newer files add columns or widen types: the files' schemas are
merged by the sink's rules, the sink takes the new schema at the next batch and the run says so; a change the sink
would refuse is refused before Spark starts, in the sink's words, naming the file and the column."""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
from pyspark.sql import types as T
from run_helpers import filesink, refused, run_args
from sink_helpers import batch_rows

from filesink import ExactlyOnceParquetSink

NO_JAVA = {"JAVA_HOME": "/nonexistent-java"}
"""A run that starts Spark with this fails at once ([JAVA_GATEWAY_EXITED]): one that stops before does not."""

BASE = ["id", "user_id", "event_date", "amount", "n", "f"]


def _land(directory: Path, name: str, columns: dict[str, pa.Array], at: float) -> list[tuple]:
    """A Parquet file of ``columns`` that landed at modification time ``at``; returns its rows (by column name, in
    ``BASE`` order then ``x``; None where the file has no such column)."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    pq.write_table(pa.table(columns), path)
    os.utime(path, (at, at))
    values = [columns[c].to_pylist() if c in columns else [None] * len(columns["id"]) for c in [*BASE, "x"]]
    return list(zip(*values, strict=True))


def _columns(batch: int, rows: int, n: pa.DataType, f: pa.DataType, x: bool) -> dict[str, pa.Array]:
    """``batch_rows`` with ``n`` (past the int range once bigint), ``f`` (quarters, exact in a float), maybe ``x``."""
    data = list(zip(*batch_rows(batch, rows), strict=True))
    big = 2**40 if n == pa.int64() else 0
    columns = {
        "id": pa.array(data[0], pa.int64()),
        "user_id": pa.array(data[1], pa.int64()),
        "event_date": pa.array(data[2], pa.string()),
        "amount": pa.array(data[3], pa.float64()),
        "n": pa.array([big + i for i in range(rows)], n),
        "f": pa.array([i / 4 for i in range(rows)], f),
    }
    if x:
        columns["x"] = pa.array([batch * 10_000 + i for i in range(rows)], pa.int64())
    return columns


def _output(path: Path) -> Counter:
    """The output's rows, read with pyarrow over the union of the files' schemas (event_date from the paths)."""
    hive = ds.partitioning(pa.schema([("event_date", pa.string())]), flavor="hive")
    found = ds.dataset(path, format="parquet", partitioning=hive)
    schemas = [fragment.physical_schema for fragment in found.get_fragments()]
    union = pa.unify_schemas([*schemas, pa.schema([("event_date", pa.string())])], promote_options="permissive")
    table = ds.dataset(path, schema=union, format="parquet", partitioning=hive).to_table()
    none = [None] * table.num_rows
    return Counter(zip(*(table[c].to_pylist() if c in union.names else none for c in [*BASE, "x"]), strict=True))


# -- refused before Spark starts ----------------------------------------------------------------------------------


def test_a_file_that_narrows_a_type_after_the_others_is_refused_before_spark(tmp_path):
    _land(tmp_path / "in", "b-first.parquet", _columns(0, 5, pa.int64(), pa.float32(), False), 1_000)
    _land(tmp_path / "in", "a-later.parquet", _columns(1, 5, pa.int32(), pa.float32(), False), 2_000)
    proc = filesink(*run_args(tmp_path, "--available-now"), env=NO_JAVA)
    refused(
        tmp_path,
        proc,
        f"the file {tmp_path / 'in' / 'a-later.parquet'} changes the schema of the files that landed before it "
        "(b-first.parquet)",
        "n narrowed from bigint to int: values already written may not fit",
        "Nothing has been read or written yet",
    )
    assert "JAVA_GATEWAY" not in proc.stderr + proc.stdout


def test_files_that_change_the_recorded_type_are_refused_before_spark(tmp_path):
    """The sink recorded ``amount double`` (and sealed an epoch); a file with ``amount string`` is refused in the
    sink's words, naming it, before Spark starts: the same command with a file the sink takes gets as far as
    starting Spark, which fails without Java."""
    spark_schema = T.StructType(
        [T.StructField(c, t) for c, t in zip(BASE, [T.LongType(), T.LongType(), T.StringType(), T.DoubleType(),
                                                   T.IntegerType(), T.FloatType()], strict=True)]
    )  # fmt: skip
    with ExactlyOnceParquetSink(
        str(tmp_path / "out"), tmp_path / "state", key_columns=["user_id"], partition_by=["event_date"]
    ) as sink:
        sink.check_schema(spark_schema)
        sink.log_store.seal(0, [])
    odd = _columns(1, 5, pa.int32(), pa.float32(), True)
    odd["amount"] = pa.array([str(v) for v in odd["amount"].to_pylist()])
    _land(tmp_path / "in", "odd.parquet", odd, 1_000)
    proc = filesink(*run_args(tmp_path, "--available-now"), env=NO_JAVA)
    refused(
        tmp_path,
        proc,
        f"the files in {tmp_path / 'in'} change the sink's schema (version 1) in a way the sink does not take",
        "amount changed from double to string, which is not a widening the sink takes",
        f"(in {tmp_path / 'in' / 'odd.parquet'}, the newest file with amount)",
        new=False,
    )
    assert "JAVA_GATEWAY" not in proc.stderr + proc.stdout
    (tmp_path / "in" / "odd.parquet").unlink()
    _land(tmp_path / "in", "good.parquet", _columns(1, 5, pa.int64(), pa.float32(), True), 2_000)
    proc = filesink(*run_args(tmp_path, "--available-now"), env=NO_JAVA)
    assert proc.returncode == 1 and "JAVA_GATEWAY_EXITED" in proc.stderr, proc.stderr[-2000:]
    with ExactlyOnceParquetSink(
        str(tmp_path / "out"), tmp_path / "state", key_columns=["user_id"], partition_by=["event_date"]
    ) as sink:
        assert [v.version for v in sink.ledger.schema_history()] == [1], "nothing recorded before a batch"


# -- taken ---------------------------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_new_columns_and_wider_types_are_taken_at_the_next_batch(tmp_path):
    """Files of schema A are landed; then one more of schema A, a file that adds ``x`` and a later one that widens
    ``n`` (int to bigint) and ``f`` (float to double): the next run reads the new files with the union (Spark's
    streaming file source gives nulls where a file lacks a column, and widens a narrower one), the sink takes it at
    its batch and the run says so; a restart reads the directory the same way (no new schema) and takes a newer
    file."""
    landing = tmp_path / "in"
    now = time.time() - 3600
    expected = Counter(_land(landing, "in-000.parquet", _columns(0, 200, pa.int32(), pa.float32(), False), now))
    expected.update(_land(landing, "in-001.parquet", _columns(1, 200, pa.int32(), pa.float32(), False), now + 1))
    proc = filesink(*run_args(tmp_path, "--available-now"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "done: 400 rows in (1 batch)" in proc.stdout
    assert "schema:" not in proc.stderr, "the first schema is no change"
    assert _output(tmp_path / "out") == expected

    # One batch reads all three: the file of schema A with nulls for x and its ints and floats widened.
    expected.update(_land(landing, "in-002.parquet", _columns(2, 100, pa.int32(), pa.float32(), False), now + 2))
    expected.update(_land(landing, "in-003.parquet", _columns(3, 150, pa.int32(), pa.float32(), True), now + 3))
    expected.update(_land(landing, "in-004.parquet", _columns(4, 150, pa.int64(), pa.float64(), True), now + 4))
    proc = filesink(*run_args(tmp_path, "--available-now"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "done: 400 rows in (1 batch)" in proc.stdout
    said = [line for line in proc.stderr.splitlines() if line.startswith("schema:")]
    assert said == [
        "schema: the sink took `n` widened from int to bigint, `f` widened from float to double, new column `x` "
        "(bigint) at batch 1 (schema version 2)"
    ], proc.stderr[-3000:]
    assert _output(tmp_path / "out") == expected
    assert sum(1 for row in expected.elements() if row[-1] is None) == 500, "the rows of schema A have no x"

    status = filesink("recover", "status", "--state-dir", str(tmp_path / "state"), "--json")
    assert status.returncode == 0, status.stderr[-2000:]
    history = json.loads(status.stdout)["schema_history"]
    assert [v["version"] for v in history] == [1, 2]
    assert [c for c, _ in history[-1]["columns"]] == [*BASE, "x"], "the sink's order, then x"

    expected.update(_land(landing, "in-005.parquet", _columns(5, 100, pa.int64(), pa.float64(), True), now + 5))
    proc = filesink(*run_args(tmp_path, "--available-now"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "done: 100 rows in (1 batch)" in proc.stdout
    assert "schema:" not in proc.stderr, proc.stderr[-3000:]
    assert _output(tmp_path / "out") == expected


@pytest.mark.chaos  # the default tier's time; the default tier keeps a test of the same check
@pytest.mark.timeout(600)
def test_a_json_schema_with_a_new_column_in_another_order_keeps_the_sinks_order(tmp_path):
    """JSON read with ``--schema``: a later ``--schema`` that adds a column and lists the columns in another order
    is taken with the sink's columns first, in its order (no version for the order alone)."""
    landing = tmp_path / "in"
    landing.mkdir()
    first = batch_rows(0, 100)
    names = ["id", "user_id", "event_date", "amount"]
    (landing / "in-000.json").write_text("".join(json.dumps(dict(zip(names, r, strict=True))) + "\n" for r in first))
    schema = "id bigint, user_id bigint, event_date string, amount double"
    proc = filesink(*run_args(tmp_path, "--format", "json", "--schema", schema, "--available-now"))
    assert proc.returncode == 0, proc.stderr[-3000:]

    second = [(*r, f"tag-{r[0]}") for r in batch_rows(1, 100)]
    lines = [json.dumps(dict(zip([*names, "tag"], r, strict=True))) + "\n" for r in second]
    (landing / "in-001.json").write_text("".join(lines))
    schema = "tag string, amount double, id bigint, event_date string, user_id bigint"
    proc = filesink(*run_args(tmp_path, "--format", "json", "--schema", schema, "--available-now"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    said = [line for line in proc.stderr.splitlines() if line.startswith("schema:")]
    assert said == ["schema: the sink took new column `tag` (string) at batch 1 (schema version 2)"], proc.stderr
    hive = ds.partitioning(pa.schema([("event_date", pa.string())]), flavor="hive")
    found = ds.dataset(tmp_path / "out", format="parquet", partitioning=hive)
    newest = max(found.get_fragments(), key=lambda f: f.physical_schema.names.count("tag"))
    assert newest.physical_schema.names == ["id", "user_id", "amount", "tag"], "the sink's order, then tag"
    union = pa.unify_schemas(
        [f.physical_schema for f in found.get_fragments()] + [pa.schema([("event_date", pa.string())])]
    )
    table = ds.dataset(tmp_path / "out", schema=union, format="parquet", partitioning=hive).to_table()
    got = Counter(zip(*(table[c].to_pylist() for c in [*names, "tag"]), strict=True))
    assert got == Counter([(*r, None) for r in first] + second)
