"""The operator story: a job with parallelism 4 dies during a rollover, with three of its four files
published and one writer still at work; ``recover plan`` shows which files are visible; ``recover apply``
resolves them; the job restarts with parallelism 2, dies
again after writing files but before committing them, is recovered, and finishes with parallelism 8. The
output equals the input exactly."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import SUPPORT, communicate, kill, run, support_env, wait_until
from sink_helpers import COLUMNS, batch_rows, read_duckdb, read_pyarrow

from logstore.failpoints import ENV_VAR

JOB = SUPPORT / "sink_job.py"


def _add_input(tmp_path: Path, first: int, count: int, expected: Counter) -> None:
    (tmp_path / "input").mkdir(exist_ok=True)
    for b in range(first, first + count):
        rows = batch_rows(b, 300, seed=21)
        expected.update(rows)
        table = pa.table(dict(zip(COLUMNS, zip(*rows, strict=True), strict=True)))
        pq.write_table(table, tmp_path / "input" / f"in-{b:03d}.parquet")


def _job(tmp_path: Path, parallelism: int, failpoints: str = "") -> subprocess.CompletedProcess[str]:
    env = support_env(**{ENV_VAR: failpoints})
    args = [
        sys.executable,
        str(JOB),
        str(tmp_path / "input"),
        str(tmp_path / "out"),
        str(tmp_path / "state"),
        str(tmp_path / "checkpoint"),
        str(parallelism),
    ]
    proc = subprocess.Popen(
        args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    out, err = communicate(proc, 300, f"the job (parallelism {parallelism}) to end")
    if proc.returncode != 0:  # the driver was killed: make sure its JVM and workers go with it
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    return subprocess.CompletedProcess(args, proc.returncode, out, err)


def _job_killed_when(tmp_path: Path, parallelism: int, failpoints: str, visible: int) -> None:
    """Run the job until ``visible`` Parquet files are in the output, then SIGKILL it (and its workers)."""
    env = support_env(**{ENV_VAR: failpoints})
    args = [sys.executable, str(JOB), *(str(tmp_path / d) for d in ("input", "out", "state", "checkpoint"))]
    proc = subprocess.Popen(
        [*args, str(parallelism)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        wait_until(
            lambda: len(list((tmp_path / "out").glob("*.parquet"))) >= visible,
            300,
            f"the job to publish {visible} files",
            proc=proc,
            interval=0.1,
        )
        time.sleep(0.5)  # the hung writer stays hung
        assert len(list((tmp_path / "out").glob("*.parquet"))) == visible
    finally:
        kill(proc, group=True)
        proc.stderr.close()


def _recover(tmp_path: Path, step: str) -> dict:
    proc = run(
        [
            sys.executable,
            "-m",
            "recovery",
            step,
            "--state-dir",
            str(tmp_path / "state"),
            "--json",
            *(["--parallelism", "2"] if step == "status" else []),
        ],
        120,
        f"recover {step}",
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.mark.slow
@pytest.mark.timeout(400)  # 130 s measured on a busy 2-core machine
def test_killed_during_rollover_then_recovered_and_rescaled(tmp_path):
    expected: Counter = Counter()
    _add_input(tmp_path, 0, 6, expected)

    # 1. Parallelism 4, killed during its first rollover: the writer of vnodes 16-23 hangs before it
    #    publishes, the other three publish their files; all four are pending.
    _job_killed_when(tmp_path, 4, "filesink.write.publish.before#-00016-00023-=hang", visible=3)
    status = _recover(tmp_path, "status")
    assert status["held_by"] is None and len(status["pending_files"]) == 4
    assert [w["vnodes"] for w in status["writers"]] == [[0, 15], [16, 31]]
    plan = _recover(tmp_path, "plan")
    by_vnodes = {tuple(f["vnodes"]): f for f in plan["files"]}
    assert sorted(by_vnodes) == [(0, 7), (8, 15), (16, 23), (24, 31)]
    assert {v: f["action"] for v, f in by_vnodes.items()} == {
        (0, 7): "commit",
        (8, 15): "commit",
        (16, 23): "drop",
        (24, 31): "commit",
    }
    assert [bool(f["visible_objects"]) for f in by_vnodes.values()] == [True, True, False, True]
    done = _recover(tmp_path, "apply")
    assert sorted(f["action"] for f in done["files"]) == ["commit", "commit", "commit", "drop"]
    assert _recover(tmp_path, "plan")["nothing_to_do"]
    status = _recover(tmp_path, "status")
    points = {int(v): e for v, e in status["truncate_points"].items()}
    assert {points[v] for v in range(16, 24)} == {-1}, "the dropped file's vnodes rewind"
    assert {points[v] for v in [*range(16), *range(24, 32)]} == {1}, "committed files' vnodes are truncated"

    # 2. Parallelism 2, killed after writing files but before committing them: pending and visible.
    _add_input(tmp_path, 6, 4, expected)
    run = _job(tmp_path, 2, "filesink.write.after=kill@1")
    assert run.returncode == -9, run.stderr[-2000:]
    plan = _recover(tmp_path, "plan")
    # its first rollover: the rewound vnodes 16-23 hold two epochs at once, so writer 1 (16-31) rolls first
    assert [(f["vnodes"], f["action"]) for f in plan["files"]] == [([16, 31], "commit")]
    assert all(f["visible_objects"] for f in plan["files"])
    _recover(tmp_path, "apply")
    status = _recover(tmp_path, "status")
    assert status["pending_files"] == []

    # 3. Parallelism 8: runs to the end.
    _add_input(tmp_path, 10, 4, expected)
    run = _job(tmp_path, 8)
    assert run.returncode == 0 and run.stdout.endswith("done\n"), run.stderr[-2000:]
    out = str(tmp_path / "out")
    got = read_pyarrow(out)
    lost, extra = expected - got, got - expected
    assert (sum(lost.values()), sum(extra.values())) == (0, 0)
    assert read_duckdb(out) == expected
