"""A real cluster: a streaming job on a Spark standalone master with two workers, log store and output on S3.
One executor's JVM is SIGKILLed while its Python worker is in the middle of writing a file (complete, not yet
published); exactly-once holds: the output equals the input as multisets and only committed files are there."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from cluster import SparkCluster, SparkClusterError, executor_of
from helpers import SUPPORT, kill, run, support_env, wait_until
from sink_helpers import COLUMNS, batch_rows, parquet_files, read_duckdb, read_pyarrow

from filesink.output import is_file_name
from filesink.output.multipart import list_uploads
from logstore import STATE_DB_NAME
from logstore.failpoints import DIR_VAR, ENV_VAR, fired

JOB = SUPPORT / "cluster_job.py"
PARALLELISM = 2
"""File writers: vnodes 0-15 and 16-31 (the job has 32 vnodes), one task on each executor."""
HUNG_WRITER = "-00016-00031-"
"""In the name of every file of the second writer: its first file hangs before it is published."""
INPUTS, ROWS = 6, 300
TIMEOUT = 300


def _job(cluster: SparkCluster, tmp_path: Path, run: int, out: str, log: str, options: dict) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k not in (ENV_VAR, DIR_VAR)}  # failpoints: executors only
    env = support_env(env)
    env["SINK_JOB_S3"] = json.dumps(options)
    env["SINK_JOB_EXECUTOR_ENV"] = json.dumps(
        {ENV_VAR: f"filesink.write.publish.before#{HUNG_WRITER}=hang@once", DIR_VAR: str(tmp_path / "failpoints")}
    )
    args = [sys.executable, str(JOB), cluster.master_url, str(tmp_path / "input"), out]
    args += [str(tmp_path / "state"), str(tmp_path / "checkpoint"), str(PARALLELISM), log]
    with (tmp_path / f"job-{run}.out").open("w") as stdout, (tmp_path / f"job-{run}.err").open("w") as stderr:
        return subprocess.Popen(args, env=env, stdout=stdout, stderr=stderr, text=True, start_new_session=True)


def _finish(proc: subprocess.Popen, tmp_path: Path, run: int) -> int:
    """Wait for the job to end; then (or on a timeout) kill what is left of it, the driver's JVM included."""
    try:
        return proc.wait(TIMEOUT)
    except subprocess.TimeoutExpired:
        pytest.fail(f"job run {run} did not end within {TIMEOUT} s:{_text(tmp_path, run)}")
    finally:
        _kill(proc)


def _kill(proc: subprocess.Popen) -> None:
    kill(proc, group=True)


def _uploads(out: str, options: dict[str, Any]) -> list[str]:
    """Keys (relative to the output) of the multipart uploads in progress under the output."""
    fs, root = fsspec.core.url_to_fs(out, **options)
    bucket, prefix, _ = fs.split_path(root + "/")
    prefix = prefix.rstrip("/") + "/"
    return sorted(key.removeprefix(prefix) for key, _ in list_uploads(fs, bucket, prefix))


def _wait_for_hang(proc: subprocess.Popen, shared: Path, cluster: SparkCluster, tmp_path: Path) -> tuple[int, str]:
    wait_until(
        lambda: fired(str(shared)),
        TIMEOUT,
        "a file writer to hang",
        proc=proc,
        describe=lambda: cluster.describe("--- the cluster:") + _text(tmp_path, 1),
        interval=0.2,
    )
    [(name, pid, key)] = fired(str(shared))
    assert name == "filesink.write.publish.before" and HUNG_WRITER in key, (name, key)
    return pid, key


def _retries(cluster: SparkCluster) -> list[str]:
    """Where Spark ran task attempts after the first (from the executors' logs; for the report only)."""
    found = []
    for log in sorted(cluster.workdir.glob("worker-*/app-*/*/stderr")):
        for line in log.read_text(errors="replace").splitlines():
            if re.search(r"Running task \d+\.[1-9]", line):
                found.append(f"{log.parent.parent.parent.name}, executor {log.parent.name}: {line}")
    return found or ["(none found in the executors' logs)"]


def _text(tmp_path: Path, run: int) -> str:
    out, err = (tmp_path / f"job-{run}.out").read_text(), (tmp_path / f"job-{run}.err").read_text()
    return f"\n--- job run {run} stdout:\n{out}\n--- stderr (end):\n{err[-4000:]}"


@pytest.mark.slow
@pytest.mark.timeout(620)  # 205 s measured (cluster start included) on a busy 2-core machine
def test_executor_killed_while_writing_a_file(spark_cluster, tmp_path, s3_prefix, s3_options):
    cluster = spark_cluster
    (tmp_path / "input").mkdir()
    (tmp_path / "failpoints").mkdir()
    expected: Counter = Counter()
    for b in range(INPUTS):
        rows = batch_rows(b, ROWS, seed=31)
        expected.update(rows)
        table = pa.table(dict(zip(COLUMNS, zip(*rows, strict=True), strict=True)))
        pq.write_table(table, tmp_path / "input" / f"in-{b:03d}.parquet")
    out, log = s3_prefix + "/table", s3_prefix + "/log"

    began = time.monotonic()
    proc = _job(cluster, tmp_path, 1, out, log, s3_options)
    try:
        pid, key = _wait_for_hang(proc, tmp_path / "failpoints", cluster, tmp_path)
        # The writer is in the middle of its file: complete and uploaded, not published.
        assert key not in parquet_files(out, s3_options), parquet_files(out, s3_options)
        assert key in _uploads(out, s3_options), _uploads(out, s3_options)
        executor = executor_of(pid)
        executors = cluster.executor_pids()
        assert executor is not None and executor in executors, (pid, executor, executors)
        assert len(executors) == 2, "one executor per worker"
        os.kill(executor, signal.SIGKILL)
        killed_at = time.monotonic() - began
        code = _finish(proc, tmp_path, 1)
    finally:
        _kill(proc)
    runs = 1
    if code != 0:  # the job died of it: restart it, as a user would; recovery resolves the pending files
        runs = 2
        code = _finish(_job(cluster, tmp_path, 2, out, log, s3_options), tmp_path, 2)
    elapsed = time.monotonic() - began
    report = _text(tmp_path, 1) + (_text(tmp_path, 2) if runs == 2 else "")
    assert code == 0 and (tmp_path / f"job-{runs}.out").read_text().endswith("done\n"), report
    print(f"\nexecutor JVM {executor} of writer {pid} killed {killed_at:.0f} s after the job started; job runs: {runs}")
    print(f"job done {elapsed:.0f} s after it started; hung Python worker still alive: {Path(f'/proc/{pid}').exists()}")
    print("task retries:", *_retries(cluster), sep="\n    ")
    print(report)

    # Only committed files: every object is named like one of this sink's files, readable whole.
    with contextlib.closing(sqlite3.connect(tmp_path / "state" / STATE_DB_NAME)) as db:
        sink_id = db.execute("SELECT sink_id FROM log_store").fetchone()[0]
    objects = parquet_files(out, s3_options)
    assert objects and all("/" not in o and is_file_name(sink_id, o) for o in objects), objects
    fs, root = fsspec.core.url_to_fs(out, **s3_options)
    for o in objects:
        with fs.open(f"{root}/{o}", "rb") as f:
            assert pq.ParquetFile(f).metadata.num_rows > 0
    assert _uploads(out, s3_options) == [], "multipart uploads left in progress under the output"
    if runs == 1:
        assert key in objects, "the retried task published the file whose writer was killed"

    got = read_pyarrow(out, s3_options)
    lost, duplicated = expected - got, Counter({r: n - 1 for r, n in got.items() if n > 1})
    unexpected = got - expected - duplicated
    assert (sum(lost.values()), sum(duplicated.values()), sum(unexpected.values())) == (0, 0, 0), (
        f"lost {sum(lost.values())}, duplicated {sum(duplicated.values())}, unexpected {sum(unexpected.values())}"
    )
    assert read_duckdb(out, s3_options) == expected


def test_a_cluster_that_does_not_come_up_reports_its_logs(tmp_path):
    cluster = SparkCluster(tmp_path, memory="lots")  # not a memory size: the workers exit at once
    with pytest.raises(SparkClusterError, match=r"worker-\d exited with code 1") as failure:
        cluster.start()
    message = str(failure.value)
    assert "--memory lots" in message, "the command line"
    assert "Usage: Worker" in message and "Starting Spark master" in message, "the daemons' logs"
    assert cluster.pids() == [], "the master and the other worker are stopped"


@pytest.mark.slow
@pytest.mark.timeout(480)  # 160 s measured (cluster start included) on a busy 2-core machine
def test_filesink_run_on_the_cluster(spark_cluster, tmp_path, s3_server, s3_prefix, s3_options):
    """``filesink run --master spark://...``: the executors append to the log store on S3 and write the files;
    credentials reach them with the storage options (the executors' environment has none)."""
    cluster = spark_cluster
    (tmp_path / "input").mkdir()
    expected: Counter = Counter()
    for b in range(3):
        rows = batch_rows(b, ROWS, seed=37)
        expected.update(rows)
        pq.write_table(
            pa.table(dict(zip(COLUMNS, zip(*rows, strict=True), strict=True))), tmp_path / "input" / f"{b}.parquet"
        )
    out, log = s3_prefix + "/table", s3_prefix + "/log"
    env = {k: v for k, v in os.environ.items() if k not in (ENV_VAR, DIR_VAR)}
    env.update(AWS_ACCESS_KEY_ID=s3_server.access_key, AWS_SECRET_ACCESS_KEY=s3_server.secret_key)
    args = ["run", "--master", cluster.master_url, "--input", str(tmp_path / "input"), "--output", out]
    args += ["--log-store", log, "--state-dir", str(tmp_path / "state"), "--s3-endpoint", s3_server.endpoint]
    args += ["--key", "user_id", "--parallelism", "2", "--available-now", "--max-files-per-trigger", "1"]
    for conf in ("spark.driver.host=127.0.0.1", "spark.driver.bindAddress=127.0.0.1", "spark.ui.enabled=false"):
        args += ["--conf", conf]
    args += ["--conf", "spark.executor.cores=1", "--conf", "spark.executor.memory=512m"]
    proc = run(
        [sys.executable, "-m", "filesink", *args], TIMEOUT, "filesink run", env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
    assert "done: 900 rows in (3 batches)" in proc.stdout, proc.stdout
    assert read_pyarrow(out, s3_options) == expected
    assert read_duckdb(out, s3_options) == expected
    logs = [p.read_text(errors="replace") for p in cluster.workdir.glob("worker-*/app-*/*/stderr")]
    ran = [text for text in logs if re.search(r"Running task \d+\.\d+", text)]
    assert len(ran) == 2, "both workers' executors ran tasks of the job"
