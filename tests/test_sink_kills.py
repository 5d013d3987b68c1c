"""SIGKILL a streaming job at random moments (seeded), restart it, sometimes with another parallelism; the
final output equals the input exactly and nothing but committed Parquet files is ever under the output."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from sink_helpers import COLUMNS, batch_rows, parquet_files, read_duckdb, read_pyarrow

JOB = Path(__file__).with_name("sink_job.py")


def _start(tmp_path: Path, out: str, options: dict | None, parallelism: int) -> subprocess.Popen[str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(JOB.parent), os.environ.get("PYTHONPATH")])))
    env["SINK_JOB_S3"] = json.dumps(options or {})
    args = [
        sys.executable,
        str(JOB),
        str(tmp_path / "input"),
        out,
        str(tmp_path / "state"),
        str(tmp_path / "checkpoint"),
        str(parallelism),
    ]
    return subprocess.Popen(
        args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )


def _only_committed_files(path: str, options: dict | None) -> None:
    fs, root = fsspec.core.url_to_fs(path, **(options or {}))
    for name in parquet_files(path, options):
        assert name.endswith(".parquet") and not Path(name).name.startswith((".", "_")), name
        with fs.open(f"{root}/{name}", "rb") as f:
            pq.ParquetFile(f).metadata  # noqa: B018  (whole and readable)


def _campaign(
    tmp_path: Path, seed: int, kills: int, out: str | None = None, options: dict | None = None, inputs: int = 24
) -> None:
    rng = random.Random(seed)
    (tmp_path / "input").mkdir()
    expected: Counter = Counter()
    for b in range(inputs):  # enough micro-batches that every kill lands before the input runs out
        rows = batch_rows(b, 400, seed)
        expected.update(rows)
        pq.write_table(
            pa.table(dict(zip(COLUMNS, zip(*rows, strict=True), strict=True))),
            tmp_path / "input" / f"in-{b:03d}.parquet",
        )
    out = out or str(tmp_path / "out")
    landed = 0
    for kill in range(kills):
        proc = _start(tmp_path, out, options, parallelism=rng.choice([1, 2, 3, 4]))
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
        _only_committed_files(out, options)
        print(f"seed {seed}: kill {kill + 1}/{kills} after {batches} batches, {len(parquet_files(out, options))} files")
    proc = _start(tmp_path, out, options, parallelism=rng.choice([1, 2, 3, 4]))
    out_text, err = proc.communicate(timeout=600)
    assert proc.returncode == 0 and out_text.endswith("done\n"), err[-3000:]
    _only_committed_files(out, options)
    got = read_pyarrow(out, options)
    lost, duplicated, unexpected = expected - got, Counter({r: n - 1 for r, n in got.items() if n > 1}), got - expected
    unexpected -= duplicated
    assert (sum(lost.values()), sum(duplicated.values()), sum(unexpected.values())) == (0, 0, 0), (
        f"seed {seed}: lost {sum(lost.values())}, duplicated {sum(duplicated.values())}, "
        f"unexpected {sum(unexpected.values())}"
    )
    assert read_duckdb(out, options) == expected
    assert landed == kills, "every kill must land while the job runs"


@pytest.mark.slow
def test_sigkill_at_random_moments_with_rescale(tmp_path):
    _campaign(tmp_path, seed=11, kills=10, inputs=40)


@pytest.mark.slow
def test_sigkill_at_random_moments_on_s3(tmp_path, s3_prefix, s3_options):
    _campaign(tmp_path, seed=12, kills=5, out=s3_prefix + "/table", options=s3_options)
