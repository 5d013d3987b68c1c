"""A cluster whose executors do not share the driver's disk: ``filesink run --master`` with a local log store or a
local output is refused before anything is sealed or committed, saying what to do (filesink.tasks.shared).

One standalone cluster on loopback, two workers: worker 0 sees the driver's files, worker 1 runs in a mount namespace
of its own where a private tmpfs covers the directory that holds the tests' state directories and outputs (the input,
elsewhere, is seen by both), as a machine that does not share the driver's disk. With one executor on the driver's
disk, a check that missed the other would let it commit rows there: the probe at the first batch reaches both. The
same cluster, with the state and output outside the private directory (both workers see them), runs through.
"""

from __future__ import annotations

import contextlib
import os
import re
import sqlite3
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from cluster import SparkCluster, private_dirs_unavailable
from helpers import run
from sink_helpers import COLUMNS, batch_rows, parquet_files, read_duckdb, read_pyarrow

from filesink.errors import EXIT_FAILED
from logstore import STATE_DB_NAME
from logstore.failpoints import DIR_VAR, ENV_VAR

INPUTS, ROWS = 3, 300
TIMEOUT = 240
ISOLATED = 1
"""The worker that does not share the driver's disk (worker 0 does)."""
OUTCOME = (
    "Nothing of batch 0 was appended or sealed, and Spark keeps it in the query's checkpoint. Fix the cause and start "
    "the query again"
)
"""How a refusal at the first batch's probe ends."""
SPARK_CONF = [
    "spark.driver.host=127.0.0.1",
    "spark.driver.bindAddress=127.0.0.1",
    "spark.ui.enabled=false",
    "spark.executor.cores=1",
    "spark.executor.memory=512m",
    # Both executors registered before the first job, so that the probe's two tasks go one to each.
    "spark.cores.max=2",
    "spark.scheduler.minRegisteredResourcesRatio=1.0",
    "spark.scheduler.maxRegisteredResourcesWaitingTime=120s",
]


@pytest.fixture(scope="module")
def split_cluster(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """(the cluster, the directory only worker 0 shares with the driver)."""
    reason = private_dirs_unavailable()
    if reason is not None:
        pytest.skip(f"workers cannot get a disk of their own here: {reason}")
    private = tmp_path_factory.mktemp("driver-disk")
    cluster = SparkCluster(
        tmp_path_factory.mktemp("spark-cluster"), workers=2, private_dirs=(private,), shared_workers=1
    )
    cluster.start()
    try:
        yield cluster, private
    finally:
        cluster.stop()


@pytest.fixture(scope="module")
def input_dir(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Counter]:
    directory = tmp_path_factory.mktemp("input")
    expected: Counter = Counter()
    for b in range(INPUTS):
        rows = batch_rows(b, ROWS, seed=41)
        expected.update(rows)
        table = pa.table(dict(zip(COLUMNS, zip(*rows, strict=True), strict=True)))
        pq.write_table(table, directory / f"{b}.parquet")
    return directory, expected


def _run(cluster: SparkCluster, source: Path, output: str, state: Path, *extra: str, env: dict | None = None) -> Any:
    args = ["run", "--master", cluster.master_url, "--input", str(source), "--output", output]
    args += ["--state-dir", str(state), "--key", "user_id", "--parallelism", "2"]
    args += ["--available-now", "--max-files-per-trigger", "1", *extra]
    for conf in SPARK_CONF:
        args += ["--conf", conf]
    environ = {k: v for k, v in os.environ.items() if k not in (ENV_VAR, DIR_VAR)}
    environ.update(env or {})
    began = time.monotonic()
    command = [sys.executable, "-m", "filesink", *args]
    done = run(command, TIMEOUT, "filesink run", env=environ, capture_output=True, text=True)
    print(f"\nfilesink run ended with {done.returncode} after {time.monotonic() - began:.0f} s")
    return done


def _refusal(done: Any) -> str:
    """The one error line of a refused run (the message, without Spark's traceback)."""
    said = done.stdout + done.stderr
    assert done.returncode == EXIT_FAILED, said[-4000:]
    assert "Traceback" not in said, said[-4000:]
    errors = [line for line in said.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, said[-4000:]
    print(errors[0])
    return errors[0]


def _sealed(state: Path) -> int:
    with contextlib.closing(sqlite3.connect(f"file:{state / STATE_DB_NAME}?mode=ro", uri=True)) as db:
        return int(db.execute("SELECT COUNT(*) FROM log_epochs").fetchone()[0])


def _isolated_view(cluster: SparkCluster, private: Path) -> list[str]:
    """What the isolated worker's namespace holds in the private directory: what its executor wrote there."""
    view = cluster.private_view(ISOLATED, private)
    return sorted(str(p.relative_to(view)) for p in view.rglob("*"))


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_local_log_store_the_executors_do_not_share_is_refused_before_the_first_seal(split_cluster, input_dir):
    cluster, private = split_cluster
    source, _ = input_dir
    state, out = private / "default" / "state", private / "default" / "out"
    message = _refusal(_run(cluster, source, str(out), state))
    log = state / "log"
    assert message.startswith(f"error: the log store {log} is a local directory, and what executor host "), message
    assert f"this run's writer term record {log}/home/terms/0000000001.json, which the driver created, is not " in (
        message
    )
    assert "must be shared storage, such as s3://bucket/prefix (log_store=, filesink run --log-store)" in message
    assert message.endswith(OUTCOME), message
    assert _sealed(state) == 0, "no epoch sealed"
    assert sorted(p.name for p in log.rglob("*.seg")) == [], "no segment in the driver's log store"
    assert parquet_files(str(out)) == [], "no file in the driver's output"
    assert _isolated_view(cluster, private) == [], "the executor that does not share the disk wrote nothing"


@pytest.mark.chaos  # the default tier's time; the default tier keeps a test of the same check
@pytest.mark.timeout(600)
def test_a_local_output_the_executors_do_not_share_is_refused_before_any_file(
    split_cluster, input_dir, s3_server, s3_prefix, s3_options
):
    cluster, private = split_cluster
    source, _ = input_dir
    state, out = private / "output" / "state", private / "output" / "out"
    log = s3_prefix + "/log"
    credentials = {"AWS_ACCESS_KEY_ID": s3_server.access_key, "AWS_SECRET_ACCESS_KEY": s3_server.secret_key}
    done = _run(
        cluster, source, str(out), state, "--log-store", log, "--s3-endpoint", s3_server.endpoint, env=credentials
    )
    message = _refusal(done)
    assert message.startswith(f"error: the output {out} is a local directory, and what executor host "), message
    staging = state / "staging" / "term-0000000001"
    assert re.search(
        rf"the marker \.filesink-shared-[0-9a-f]{{32}}\.tmp, which the driver created in this run's "
        rf"staging directory {re.escape(str(staging))} \(",
        message,
    ), message
    assert "a local output and its staging directory must be one shared file system mounted at the same path" in message
    assert message.endswith(OUTCOME), message
    assert _sealed(state) == 0, "no epoch sealed"
    fs, root = fsspec.core.url_to_fs(log, **s3_options)
    fs.invalidate_cache()
    stored = sorted(p[len(root) + 1 :] for p in fs.find(root))
    assert [p for p in stored if p.endswith(".seg") or p.startswith(("home/epochs/", "home/files/"))] == [], stored
    assert parquet_files(str(out)) == [], "no file in the driver's output"
    assert _isolated_view(cluster, private) == [], "the executor that does not share the disk wrote nothing"


@pytest.mark.chaos  # the default tier's time; the default tier keeps a test of the same check
@pytest.mark.timeout(600)
def test_local_directories_both_executors_share_pass_the_check(split_cluster, input_dir, tmp_path):
    """The same cluster, the state and output where both workers see the driver's files: every row once."""
    cluster, _ = split_cluster
    source, expected = input_dir
    out = tmp_path / "out"
    done = _run(cluster, source, str(out), tmp_path / "state")
    assert done.returncode == 0, done.stdout + done.stderr[-4000:]
    assert f"done: {INPUTS * ROWS:,} rows in ({INPUTS} batches)" in done.stdout, done.stdout
    assert read_pyarrow(str(out)) == expected
    assert read_duckdb(str(out)) == expected
    for worker in (0, ISOLATED):
        apps = sorted(cluster.workdir.glob(f"worker-{worker}/app-*"), key=lambda p: p.stat().st_mtime)
        logs = [p.read_text(errors="replace") for p in apps[-1].glob("*/stderr")]
        assert any(re.search(r"Running task \d+\.\d+", t) for t in logs), f"worker {worker}'s executor ran tasks"
