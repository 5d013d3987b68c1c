"""SIGKILL a streaming job at random moments (seeded), restart it, sometimes with another parallelism; the
final output equals the input exactly and nothing but committed Parquet files is ever under the output."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from sink_helpers import COLUMNS, batch_rows, parquet_files, read_duckdb, read_pyarrow

JOB = Path(__file__).with_name("sink_job.py")


def _start(tmp_path: Path, parallelism: int) -> subprocess.Popen[str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(JOB.parent), os.environ.get("PYTHONPATH")])))
    args = [
        sys.executable,
        str(JOB),
        str(tmp_path / "input"),
        str(tmp_path / "out"),
        str(tmp_path / "state"),
        str(tmp_path / "checkpoint"),
        str(parallelism),
    ]
    return subprocess.Popen(
        args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )


def _only_committed_files(path: str) -> None:
    for name in parquet_files(path):
        assert name.endswith(".parquet") and not Path(name).name.startswith((".", "_")), name
        pq.ParquetFile(Path(path) / name).metadata  # noqa: B018  (whole and readable)


def _campaign(tmp_path: Path, seed: int, kills: int) -> None:
    rng = random.Random(seed)
    (tmp_path / "input").mkdir()
    expected: Counter = Counter()
    for b in range(24):
        rows = batch_rows(b, 400, seed)
        expected.update(rows)
        pq.write_table(
            pa.table(dict(zip(COLUMNS, zip(*rows, strict=True), strict=True))),
            tmp_path / "input" / f"in-{b:03d}.parquet",
        )
    out = str(tmp_path / "out")
    landed = 0
    for kill in range(kills):
        proc = _start(tmp_path, parallelism=rng.choice([1, 2, 3, 4]))
        assert proc.stdout is not None
        # Let it run a random number of batches (0: during start-up and recovery), then kill it a random
        # moment later: inside append, seal, planning, file writing or commit.
        batches = rng.randrange(0, 4)
        for _ in range(batches + 1):
            line = proc.stdout.readline()
            if not line:
                break
        time.sleep(rng.uniform(0.0, 1.5))
        if proc.poll() is None:
            landed += 1
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(60)
        _only_committed_files(out)
        print(f"seed {seed}: kill {kill + 1}/{kills} after {batches} batches, {len(parquet_files(out))} files so far")
    proc = _start(tmp_path, parallelism=rng.choice([1, 2, 3, 4]))
    out_text, err = proc.communicate(timeout=600)
    assert proc.returncode == 0 and out_text.endswith("done\n"), err[-3000:]
    _only_committed_files(out)
    got = read_pyarrow(out)
    lost, duplicated, unexpected = expected - got, Counter({r: n - 1 for r, n in got.items() if n > 1}), got - expected
    unexpected -= duplicated
    assert (sum(lost.values()), sum(duplicated.values()), sum(unexpected.values())) == (0, 0, 0), (
        f"seed {seed}: lost {sum(lost.values())}, duplicated {sum(duplicated.values())}, "
        f"unexpected {sum(unexpected.values())}"
    )
    assert read_duckdb(out) == expected
    assert landed == kills, "every kill must land while the job runs"


@pytest.mark.slow
def test_sigkill_at_random_moments_with_rescale(tmp_path):
    _campaign(tmp_path, seed=11, kills=10)
