"""The sink under Spark Connect, for real: a Connect server (pyspark's own) on loopback, clients in processes of
their own (a process that made a Connect session stays in Connect mode), the sink opening on the server.

Each client runs a scenario of ``tests/support/connect_api_job.py``; ``filesink run --remote`` runs the main job.
Outputs are compared with the input as exact multisets of rows."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from connect_server import ConnectServer, connect_client_env
from helpers import SUPPORT, run
from sink_helpers import input_file, parquet_files, read_pyarrow

pytestmark = pytest.mark.timeout(900)

CLIENT_TIMEOUT = 600.0
"""Seconds a client may take: a Connect query's batches each start Spark jobs on a busy 2-core server."""


@pytest.fixture(scope="module")
def connect_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    server = ConnectServer(tmp_path_factory.mktemp("connect-server"), master="local[2]")
    try:
        yield server.start()
    finally:
        server.stop()


def _input(work: Path, files: int, rows: int = 200) -> Counter:
    """``files`` Parquet files of ``rows`` rows in ``work/in``; returns their rows."""
    expected: Counter = Counter()
    for batch in range(files):
        expected += input_file(work / "in", batch, rows)
    return expected


SPARK_WORKER_START = "Python worker failed to connect back"
"""Spark waits a fixed 10 s for a new Python worker of its own to connect (``PythonWorkerFactory``; no setting
changes it), and a busy 2-core machine sometimes takes longer to start one. A client that failed of that alone is
run once more: every scenario is safe to repeat (the sink is exactly-once across failed attempts, which is what the
assertions check)."""


def _client(
    args: list[str], what: str, env: dict[str, str] | None = None, work: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """Run a client; once more if Spark's Python worker did not start in time. With ``work``, what the first attempt
    created there (its state, checkpoint, output) is removed before the second, which so starts as the first did."""
    before = {p.name for p in work.iterdir()} if work is not None else set()
    for attempt in (1, 2):
        proc = run(args, CLIENT_TIMEOUT, what, capture_output=True, text=True, env=env or connect_client_env())
        if proc.returncode == 0 or SPARK_WORKER_START not in proc.stdout + proc.stderr or attempt == 2:
            return proc
        print(f"{what}: Spark's Python worker did not start within Spark's 10 s; running the client again")
        made = [p for p in work.iterdir() if p.name not in before] if work is not None else []
        for path in made:
            if path.is_dir():
                shutil.rmtree(path)
            else:
                path.unlink()
    raise AssertionError("unreachable")


def _scenario(name: str, url: str, work: Path) -> dict[str, Any]:
    proc = _client(
        [sys.executable, str(SUPPORT / "connect_api_job.py"), name, url, str(work)],
        f"the Connect client's {name}",
        work=work,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, f"{name} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    result: dict[str, Any] = json.loads(lines[-1].removeprefix("RESULT "))
    return result


def _only_sink_files(out: Path) -> None:
    names = parquet_files(str(out))
    assert names and all(n.endswith(".parquet") and "/." not in f"/{n}" for n in names), names


def test_foreach_batch_then_flush_writes_every_row_once(connect_url, tmp_path):
    expected = _input(tmp_path, files=3)
    result = _scenario("run_and_flush", connect_url, tmp_path)
    assert result["state_before_query"] is False, "the client must not open the sink's state"
    assert result["batches"] == 3
    assert result["files_before_flush"] == [], "no file may roll under these rules before flush()"
    assert "not open in this process" in result["client_state"]
    assert (tmp_path / "state" / "state.sqlite").is_file(), "the server opened the sink in its state directory"
    _only_sink_files(tmp_path / "out")
    assert read_pyarrow(str(tmp_path / "out")) == expected


def test_the_idle_timer_runs_in_the_servers_process(connect_url, tmp_path):
    expected = _input(tmp_path, files=2)
    result = _scenario("idle_timer", connect_url, tmp_path)
    assert result["files"] and result["written"] == result["wanted"] == 400, (
        f"the age rule must put every row in files while the query waits for input: {result}"
    )
    assert read_pyarrow(str(tmp_path / "out")) == expected


def test_a_connect_session_on_local_spark_as_a_new_user_tries_it(tmp_path):
    """``SparkSession.builder.remote("local[2]")`` starts pyspark's bundled Connect server in the client's process;
    the sink opens in the server's foreachBatch process all the same."""
    expected = _input(tmp_path, files=2)
    result = _scenario("run_and_flush", "local[2]", tmp_path)
    assert result["state_before_query"] is False and result["batches"] == 2
    assert read_pyarrow(str(tmp_path / "out")) == expected


def test_a_stopped_query_restarts_and_finishes_exactly_once(connect_url, tmp_path):
    expected = _input(tmp_path, files=5)
    result = _scenario("stop_and_restart", connect_url, tmp_path)
    assert result["first_batches"] >= 2 and result["second_batches"] >= 1, result
    _only_sink_files(tmp_path / "out")
    assert read_pyarrow(str(tmp_path / "out")) == expected


def test_tasks_and_relative_paths_are_refused_on_the_client(connect_url, tmp_path):
    _input(tmp_path, files=1)
    result = _scenario("refusals", connect_url, tmp_path)
    for case in ("pickle", "udf"):
        assert "cannot go into a Spark task" in result[case], result[case]
        assert "foreachBatch(sink)" in result[case], result[case]
    assert "is relative" in result["relative"] and "absolute path the server uses" in result["relative"]
    assert "give checkpoint_location=" in result["no_checkpoint"], result["no_checkpoint"]
    assert "Nothing was created" in result["no_checkpoint"], result["no_checkpoint"]
    assert "names differ only in case: 'A', 'a'" in result["case"], result["case"]
    assert "'iv' (interval): an interval of months, days and microseconds" in result["interval"], result["interval"]
    assert result["state_exists"] is False


def test_another_querys_checkpoint_is_refused_not_taken_for_a_replay(connect_url, tmp_path):
    expected = _input(tmp_path, files=1)
    result = _scenario("other_checkpoint", connect_url, tmp_path)
    assert "CheckpointMismatchError" in result["second"] and "takes the batches of query" in result["second"], result
    assert read_pyarrow(str(tmp_path / "out")) == expected, "query B's batch 0 must not be written, nor A's lost"


# -- filesink run --remote --------------------------------------------------------------------------------------


def _filesink_args(tmp_path: Path, *extra: str) -> list[str]:
    args = [sys.executable, "-m", "filesink", "run", "--input", str(tmp_path / "in"), "--output"]
    args += [str(tmp_path / "out"), "--state-dir", str(tmp_path / "state"), "--key", "user_id", "--parallelism", "2"]
    return [*args, "--available-now", *extra]


def _filesink_run(tmp_path: Path, *extra: str, remote: str | None = None, env: dict[str, str] | None = None) -> Any:
    return _client(
        _filesink_args(tmp_path, *(["--remote", remote] if remote else []), *extra), "filesink run --remote", env
    )


def test_filesink_run_remote_available_now_twice(connect_url, tmp_path):
    expected = _input(tmp_path, files=2)
    proc = _filesink_run(tmp_path, remote=connect_url)
    assert proc.returncode == 0, proc.stderr[-5000:]
    assert "done: 400 rows in 1 batch through the Spark Connect server sc://localhost:" in proc.stdout, proc.stdout
    assert "token" not in proc.stdout + proc.stderr.replace("--remote", "")
    assert read_pyarrow(str(tmp_path / "out")) == expected
    # more input, and the SPARK_REMOTE convention instead of --remote
    expected += input_file(tmp_path / "in", 7, 150)
    proc = _filesink_run(tmp_path, env=dict(connect_client_env(), SPARK_REMOTE=connect_url))
    assert proc.returncode == 0, proc.stderr[-5000:]
    assert "done: 150 rows in 1 batch" in proc.stdout, proc.stdout
    _only_sink_files(tmp_path / "out")
    assert read_pyarrow(str(tmp_path / "out")) == expected


def test_filesink_run_remote_into_an_iceberg_table(connect_url, tmp_path):
    """A table format through Spark Connect: the sink opens on the server with the table's options (the format, the
    table's name and its embedded catalog: what Delta needs is a subset), and the table holds exactly the input's
    rows, each file in one commit of the sink."""
    from table_checker import TableTarget, read_table

    expected = _input(tmp_path, files=2)
    extra = ["--table-format", "iceberg", "--table", "db.events", "--remote", connect_url]
    proc = _client(_filesink_args(tmp_path, *extra), "filesink run --remote into an Iceberg table")
    assert proc.returncode == 0, proc.stderr[-5000:]
    assert "done: 400 rows in 1 batch through the Spark Connect server" in proc.stdout, proc.stdout
    view = read_table(TableTarget("iceberg", table="db.events"), str(tmp_path / "out"), None)
    assert view.rows == expected, "the table's rows differ from the input's"
    names = [f for c in view.commits for f in c]
    assert names and len(names) == len(set(names)), f"a file in two commits, or none: {view.commits}"
    assert (tmp_path / "state" / "state.sqlite").is_file(), "the server opened the sink in its state directory"


def test_filesink_run_remote_refuses_json_without_a_schema_and_master_with_remote(tmp_path):
    _input(tmp_path, files=1)
    proc = _filesink_run(tmp_path, "--format", "json", remote="sc://localhost:1")
    assert proc.returncode == 1 and "needs --schema" in proc.stderr, proc.stderr[-3000:]
    proc = _filesink_run(tmp_path, "--master", "local[2]", remote="sc://localhost:1")
    assert proc.returncode == 2 and "exclude each other" in proc.stderr, proc.stderr[-3000:]
    proc = _filesink_run(tmp_path, remote="localhost:15002")
    assert proc.returncode == 2 and "Spark Connect URL" in proc.stderr, proc.stderr[-3000:]
    assert not (tmp_path / "state").exists() and not (tmp_path / "out").exists()
    assert "SPARK_REMOTE" not in os.environ


@pytest.mark.chaos  # the default tier's time; the default tier keeps a test of the same check
def test_filesink_run_remote_takes_a_new_column_and_asks_for_a_schema_for_another_type(connect_url, tmp_path):
    """Parquet input through Spark Connect is read with Spark's ``mergeSchema``: a file with a new column is taken
    at the next run's batch (older rows null there); a column whose type differs between files (a float beside
    the double), which Spark does not merge, stops the run before its query, saying to give --schema."""
    import pyarrow as pa
    import pyarrow.dataset as ds
    import pyarrow.parquet as pq

    expected = _input(tmp_path, files=1)
    proc = _filesink_run(tmp_path, remote=connect_url)
    assert proc.returncode == 0, proc.stderr[-5000:]
    new = {"id": [9_000_000 + i for i in range(50)], "user_id": list(range(50)), "event_date": ["2024-02-01"] * 50}
    new |= {"amount": [i / 4 for i in range(50)], "x": [f"x{i}" for i in range(50)]}
    pq.write_table(pa.table(new), tmp_path / "in" / "with-x.parquet")
    proc = _filesink_run(tmp_path, remote=connect_url)
    assert proc.returncode == 0, proc.stderr[-5000:]
    assert "done: 50 rows in 1 batch" in proc.stdout, proc.stdout
    found = ds.dataset(tmp_path / "out", format="parquet")
    union = pa.unify_schemas([f.physical_schema for f in found.get_fragments()])
    table = ds.dataset(tmp_path / "out", schema=union, format="parquet").to_table()
    columns = ["id", "user_id", "event_date", "amount", "x"]
    got = Counter(zip(*(table[c].to_pylist() for c in columns), strict=True))
    assert got == Counter([(*r, None) for r in expected.elements()] + list(zip(*new.values(), strict=True)))

    pq.write_table(pa.table({**new, "amount": pa.array(new["amount"], pa.float32())}), tmp_path / "in" / "f.parquet")
    proc = _filesink_run(tmp_path, remote=connect_url)
    assert proc.returncode == 1, proc.stderr[-5000:]
    assert "have schemas Spark does not merge" in proc.stderr and "--schema" in proc.stderr, proc.stderr[-5000:]
    assert "Traceback" not in proc.stderr
