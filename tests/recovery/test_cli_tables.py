"""``filesink recover status|plan|apply`` on a sink that writes a Delta or an Iceberg table, without Spark: the step
opens the table from the sink's recorded table format and table (and ``--catalog``), shows whether the table holds
each pending file, and apply adds a file it lacks once; and ``filesink run``'s refusal of an Iceberg table on S3
without a catalog, in the command line's terms."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from sink_helpers import COLUMNS, append_epoch, batch_rows

from filesink import ExactlyOnceParquetSink, Rollover
from logstore.failpoints import ENV_VAR, FailpointError

deltalake = pytest.importorskip("deltalake")
pytest.importorskip("pyiceberg")

from pyiceberg.catalog.sql import SqlCatalog  # noqa: E402

from filesink.destination.iceberg import CATALOG_NAME, EMBEDDED_CATALOG  # noqa: E402

pytestmark = pytest.mark.timeout(180)

HOLD = Rollover(target_file_size=None, max_age_seconds=None, max_epochs=1000)
TABLE = "db.events"


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "filesink", *args], capture_output=True, text=True, timeout=120)


def cli_json(*args: str) -> dict:
    proc = cli(*args, "--json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def _open(tmp_path: Path, table_format: str, catalog: dict | None = None) -> ExactlyOnceParquetSink:
    return ExactlyOnceParquetSink(
        str(tmp_path / "table"),
        str(tmp_path / "state"),
        vnodes=8,
        parallelism=2,
        partition_by=["event_date"],
        rollover=HOLD,
        table_format=table_format,
        table=TABLE if table_format == "iceberg" else None,
        catalog=catalog,
    )


def _epochs(sink: ExactlyOnceParquetSink, epochs: range) -> Counter:
    expected: Counter = Counter()
    for epoch in epochs:
        rows = batch_rows(epoch, 30)
        append_epoch(sink, epoch, rows)
        expected.update(rows)
    return expected


def _pending_sink(tmp_path: Path, monkeypatch, table_format: str, point: str, catalog: dict | None = None) -> Counter:
    """A sink whose first roll is in its table, and whose second roll stopped at ``point`` (a failpoint around the
    table's commit): two files pending. Returns every row appended."""
    sink = _open(tmp_path, table_format, catalog)
    expected = _epochs(sink, range(2))
    sink.flush()
    expected += _epochs(sink, range(2, 4))
    monkeypatch.setenv(ENV_VAR, f"{point}=raise")
    with pytest.raises(FailpointError):
        sink.flush()
    monkeypatch.delenv(ENV_VAR)
    sink.close()
    return expected


def _rows(data) -> Counter:
    return Counter(zip(*(data[c].to_pylist() for c in COLUMNS), strict=True))


def _delta_rows(tmp_path: Path) -> Counter:
    return _rows(deltalake.DeltaTable(str(tmp_path / "table")).to_pyarrow_table(columns=COLUMNS))


def _iceberg_table(uri: str, warehouse: Path):
    return SqlCatalog(CATALOG_NAME, uri=uri, warehouse=str(warehouse)).load_table(TABLE)


def test_delta_status_plan_apply_say_what_the_table_holds_and_apply_adds_it_once(tmp_path, monkeypatch):
    expected = _pending_sink(tmp_path, monkeypatch, "delta", "filesink.table.before")
    state = str(tmp_path / "state")
    assert deltalake.DeltaTable(str(tmp_path / "table")).version() == 1  # created, then the first roll

    status = cli("recover", "status", "--state-dir", state, "--no-verify")
    assert status.returncode == 0, status.stderr
    out = status.stdout
    assert f"destination: Delta table {tmp_path / 'table'} (delta)" in out, out
    assert "  version: 1" in out and "transaction: in the driver" in out, out
    assert "in the table" in out and "recovery will" in out, out
    pending = [line for line in out.splitlines() if line.startswith("part-")]
    assert len(pending) == 2 and all(" no " in line for line in pending), out
    assert all(line.endswith("commit (added to the table first, once)") for line in pending), out

    plan = cli_json("recover", "plan", "--state-dir", state, "--no-verify")
    assert plan["destination"]["format"] == "delta" and plan["destination"]["version"] == 1
    assert [(f["in_table"], f["action"]) for f in plan["files"]] == [(False, "commit"), (False, "commit")]

    applied = cli("recover", "apply", "--state-dir", state)
    assert applied.returncode == 0, applied.stderr
    assert "pending files resolved: 2" in applied.stdout and "added 2 files to the Delta table" in applied.stdout
    assert "  version: 2" in applied.stdout, applied.stdout
    assert deltalake.DeltaTable(str(tmp_path / "table")).version() == 2, "both files in one commit"
    assert _delta_rows(tmp_path) == expected

    again = cli_json("recover", "apply", "--state-dir", state)
    assert again["files"] == [] and again["nothing_to_do"] and again["destination"]["version"] == 2
    assert _delta_rows(tmp_path) == expected, "committed once"


def test_a_file_the_delta_table_holds_is_only_marked_committed(tmp_path, monkeypatch):
    expected = _pending_sink(tmp_path, monkeypatch, "delta", "filesink.table.after")
    state = str(tmp_path / "state")
    status = cli_json("recover", "status", "--state-dir", state, "--no-verify")
    assert status["destination"]["version"] == 2
    assert [(f["in_table"], f["action"]) for f in status["pending_files"]] == [(True, "commit"), (True, "commit")]
    plan = cli("recover", "plan", "--state-dir", state, "--no-verify")
    pending = [line for line in plan.stdout.splitlines() if line.startswith("part-")]
    assert len(pending) == 2 and all(line.endswith("commit (the table holds it)") for line in pending), plan.stdout
    assert "does not hold" not in plan.stdout
    done = cli_json("recover", "apply", "--state-dir", state)
    assert [f["in_table"] for f in done["files"]] == [True, True]
    assert deltalake.DeltaTable(str(tmp_path / "table")).version() == 2, "no commit added"
    assert _delta_rows(tmp_path) == expected


def test_iceberg_in_the_embedded_catalog(tmp_path, monkeypatch):
    expected = _pending_sink(tmp_path, monkeypatch, "iceberg", "filesink.table.before")
    state = str(tmp_path / "state")
    embedded = tmp_path / "table" / EMBEDDED_CATALOG
    before = _iceberg_table(f"sqlite:///{embedded}", tmp_path / "table")
    first = before.current_snapshot().snapshot_id

    status = cli("recover", "status", "--state-dir", state, "--no-verify")
    assert status.returncode == 0, status.stderr
    assert f"destination: Iceberg table {TABLE} at file://{tmp_path / 'table'} (iceberg)" in status.stdout
    assert f"catalog: the embedded SQLite catalog {embedded}" in status.stdout, status.stdout
    assert f"snapshot: {first}" in status.stdout, status.stdout
    pending = [line for line in status.stdout.splitlines() if line.startswith("part-")]
    assert len(pending) == 2 and all(" no " in line for line in pending), status.stdout

    plan = cli("recover", "plan", "--state-dir", state, "--no-verify")
    assert "does not hold 2 of them: apply adds them" in plan.stdout, plan.stdout

    done = cli_json("recover", "apply", "--state-dir", state)
    assert [(f["in_table"], f["action"]) for f in done["files"]] == [(False, "commit"), (False, "commit")]
    table = _iceberg_table(f"sqlite:///{embedded}", tmp_path / "table")
    assert done["destination"]["snapshot"] == table.current_snapshot().snapshot_id != first
    assert len(table.metadata.snapshots) == 2, "the first roll, then both files in one snapshot"
    assert _rows(table.scan().to_arrow()) == expected


def test_iceberg_in_a_given_catalog_needs_catalog_and_other_formats_refuse_it(tmp_path, monkeypatch):
    uri = f"sqlite:///{tmp_path / 'catalog.db'}"
    catalog = {"type": "sql", "uri": uri, "warehouse": f"file://{tmp_path / 'warehouse'}"}
    expected = _pending_sink(tmp_path, monkeypatch, "iceberg", "filesink.table.before", catalog)
    state = str(tmp_path / "state")
    assert not (tmp_path / "table" / EMBEDDED_CATALOG).exists()

    missing = cli("recover", "plan", "--state-dir", state, "--no-verify")
    assert missing.returncode == 2, missing.stderr
    assert "holds no embedded catalog" in missing.stderr and "--catalog KEY=VALUE" in missing.stderr
    assert not (tmp_path / "table" / EMBEDDED_CATALOG).exists(), "no catalog made where there was none"

    given = [arg for key, value in catalog.items() for arg in ("--catalog", f"{key}={value}")]
    status = cli_json("recover", "status", "--state-dir", state, "--no-verify", *given)
    assert status["destination"]["catalog"] == "given with --catalog (type, uri, warehouse)"
    assert [f["in_table"] for f in status["pending_files"]] == [False, False]
    done = cli("recover", "apply", "--state-dir", state, *given)
    assert done.returncode == 0, done.stderr
    assert _rows(_iceberg_table(uri, tmp_path / "warehouse").scan().to_arrow()) == expected

    delta = tmp_path / "delta"
    _open(delta, "delta").close()
    refused = cli("recover", "status", "--state-dir", str(delta / "state"), "--catalog", "uri=x")
    assert refused.returncode == 2
    assert "--catalog is for a sink that writes an Iceberg table" in refused.stderr, refused.stderr


def test_run_refuses_an_iceberg_table_on_s3_without_a_catalog_in_its_own_terms(tmp_path, s3_server, s3_prefix):
    """`filesink run` says what to give as its options (`--catalog KEY=VALUE`), not as the Python API's
    `catalog={...}`, before the state directory or the log store is made."""
    (tmp_path / "in").mkdir()
    output = s3_prefix + "/table"
    keys = {"AWS_ACCESS_KEY_ID": s3_server.access_key, "AWS_SECRET_ACCESS_KEY": s3_server.secret_key}
    args = ["run", "--input", str(tmp_path / "in"), "--output", output, "--state-dir", str(tmp_path / "state")]
    args += ["--log-store", s3_prefix + "/log", "--table-format", "iceberg", "--table", TABLE]
    for extra in ([], ["--catalog", "name=prod"]):  # a name gives no catalog
        proc = subprocess.run(
            [sys.executable, "-m", "filesink", *args, *extra, "--s3-endpoint", s3_server.endpoint],
            capture_output=True,
            text=True,
            timeout=120,
            env=dict(os.environ, **keys),
        )
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr.splitlines()[-1] == (
            f"filesink: error: --table-format iceberg with --output {output} (object storage) needs a catalog that "
            "outlives this machine: the embedded SQLite catalog lives beside a local --output only. Give the "
            "catalog's properties with --catalog KEY=VALUE (repeatable), e.g. --catalog "
            "uri=postgresql+psycopg2://user@host/db --catalog warehouse=s3://bucket/warehouse (a SQL catalog; a "
            "SQLite file on a durable disk works too: --catalog uri=sqlite:////srv/iceberg/catalog.db), or a REST "
            "catalog's: --catalog type=rest --catalog uri=https://catalog.example.com. Nothing was written"
        )
        assert "catalog={" not in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "state").exists(), "no state directory, no lock, no state database"
    assert s3_server.filesystem().find(s3_prefix) == [], "no claim of the log store or the output"
