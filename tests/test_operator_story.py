"""The operator story: a job with parallelism 4 dies during a rollover; ``recover plan`` shows what is
pending and whether it is visible; ``recover apply`` resolves it; the job restarts with parallelism 2, dies
again after writing files but before committing them, is recovered, and finishes with parallelism 8. The
output equals the input exactly."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from sink_helpers import COLUMNS, batch_rows, read_duckdb, read_pyarrow

from logstore.failpoints import ENV_VAR

JOB = Path(__file__).with_name("sink_job.py")


def _add_input(tmp_path: Path, first: int, count: int, expected: Counter) -> None:
    (tmp_path / "input").mkdir(exist_ok=True)
    for b in range(first, first + count):
        rows = batch_rows(b, 300, seed=21)
        expected.update(rows)
        table = pa.table(dict(zip(COLUMNS, zip(*rows, strict=True), strict=True)))
        pq.write_table(table, tmp_path / "input" / f"in-{b:03d}.parquet")


def _job(tmp_path: Path, parallelism: int, failpoints: str = "") -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, **{ENV_VAR: failpoints})
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(JOB.parent), env.get("PYTHONPATH")]))
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
    out, err = proc.communicate(timeout=600)
    if proc.returncode != 0:  # the driver was killed: make sure its JVM and workers go with it
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    return subprocess.CompletedProcess(args, proc.returncode, out, err)


def _recover(tmp_path: Path, step: str) -> dict:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "recovery",
            "recover",
            step,
            "--state-dir",
            str(tmp_path / "state"),
            "--json",
            *(["--parallelism", "2"] if step == "status" else []),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.mark.slow
def test_killed_during_rollover_then_recovered_and_rescaled(tmp_path):
    expected: Counter = Counter()
    _add_input(tmp_path, 0, 6, expected)

    # 1. Parallelism 4, killed right after its first files were pre-committed: pending, nothing visible.
    run = _job(tmp_path, 4, "filesink.precommit.after=kill@1")
    assert run.returncode == -9, run.stderr[-2000:]
    status = _recover(tmp_path, "status")
    assert status["held_by"] is None and len(status["pending_files"]) == 4
    assert [w["vnodes"] for w in status["writers"]] == [[0, 15], [16, 31]]
    plan = _recover(tmp_path, "plan")
    assert [f["action"] for f in plan["files"]] == ["drop"] * 4
    assert all(not f["visible_objects"] for f in plan["files"])
    done = _recover(tmp_path, "apply")
    assert [f["action"] for f in done["files"]] == ["drop"] * 4
    assert _recover(tmp_path, "plan")["nothing_to_do"]

    # 2. Parallelism 2, killed after writing files but before committing them: pending and visible.
    _add_input(tmp_path, 6, 4, expected)
    run = _job(tmp_path, 2, "filesink.write.after=kill@1")
    assert run.returncode == -9, run.stderr[-2000:]
    plan = _recover(tmp_path, "plan")
    assert [f["action"] for f in plan["files"]] == ["commit"] * 2
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
