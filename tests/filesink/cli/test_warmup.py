"""The Python workers' warm-up (:mod:`filesink.cli.warmup`): the workers it starts are the ones the next Python job
runs in, so a query's first append does not start them."""

from __future__ import annotations

import json
import sys

import pytest
from helpers import run, support_env


@pytest.mark.slow
def test_the_next_python_job_runs_in_the_workers_the_warm_up_started() -> None:
    done = run(
        [sys.executable, "-m", "warmup_job", "120"], timeout=240, capture_output=True, text=True, env=support_env()
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["warmed"], "the warm-up job did not end within 120 s"
    assert len(result["started"]) == 2
    # both tasks ran in workers that existed before the job was submitted: the warm-up's, reused
    assert all(started < result["submitted"] for started in result["started"]), result
