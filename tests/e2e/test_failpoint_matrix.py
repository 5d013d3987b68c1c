"""Every failpoint, every action: the job fails there, is started again, and finishes; the output equals the
input exactly and nothing but the sink's committed files is visible. Then double faults: the job dies at a
failpoint of normal operation, and its recovery dies again at a failpoint of recovery.

The job is ``support/matrix_job.py`` (the sink's protocol without Spark, so that each run takes about a
second), run by ``support/failpoint_job.py``; the failpoints are found by reading the packages' source, so a new
failpoint joins the matrix by itself.
The full cross product of double faults runs in the ``chaos`` tier; the default tier pairs every failpoint
of normal operation with one recovery failpoint, round robin, so that each of both appears.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from failpoint_job import NORMAL, RECOVERY, REGISTERED, SINGLE, Job, _nth

from logstore.failpoints import fired


@pytest.mark.parametrize(("point", "action", "where"), SINGLE, ids=[f"{p}={a}-{w}" for p, a, w in SINGLE])
def test_fail_at_a_failpoint_then_restart_and_finish(tmp_path, request, point, action, where):
    job = Job(tmp_path, where, request)
    if point.startswith("recovery."):  # recovery only has work after a crash: leave visible pending files
        job.fail("filesink.write.after", "kill", 1)
        assert job.pending()
    job.fail(point, action, _nth(point))
    job.finish()


def test_the_matrix_covers_every_step():
    assert len(REGISTERED) >= 25 and {"recovery.fence.after", "filesink.upload.complete.before"} <= set(REGISTERED)
    steps = [
        "logstore.append.before_write",
        "logstore.append.after_write",
        "logstore.seal.before_commit",
        "logstore.seal.after_commit",
        "filesink.plan.before",
        "filesink.precommit.before",
        "filesink.precommit.after",
        "filesink.upload.create.after",
        "filesink.upload.part.before",
        "filesink.upload.complete.before",
        "filesink.upload.complete.after",
        "filesink.commit.before",
        "filesink.commit.after",
        "logstore.truncate.before_commit",
        "logstore.gc.after_metadata",
        "recovery.term.after",
        "recovery.fence.after",
        "recovery.resolve.after",
        "recovery.output_garbage.after",
    ]
    assert [s for s in steps if s not in REGISTERED] == []


def _double(tmp_path: Path, request: pytest.FixtureRequest, first: str, second: str) -> None:
    job = Job(tmp_path, "local", request)
    job.fail(first, "kill", 2)
    if second == "recovery.resolve.after" and not job.pending():
        # nothing pending (the first kill was outside pre-commit..commit): recovery resolves nothing, so the
        # failpoint cannot fire; the restart must simply work
        run = job.run(f"{second}=kill@1")
        assert run.returncode == 0 and second not in {n for n, _p, _d in fired(str(job.shared))}, run.stderr[-2000:]
    else:
        job.fail(second, "kill", 1, parallelism=1)
    job.finish(parallelism=4)


SAMPLED = [(n, RECOVERY[i % len(RECOVERY)]) for i, n in enumerate(NORMAL)]
ALL_PAIRS = [(n, r) for n in NORMAL for r in RECOVERY if (n, r) not in SAMPLED]


@pytest.mark.parametrize(("first", "second"), SAMPLED, ids=[f"{a}+{b}" for a, b in SAMPLED])
def test_double_fault(tmp_path, request, first, second):
    _double(tmp_path, request, first, second)


@pytest.mark.chaos
@pytest.mark.parametrize(("first", "second"), ALL_PAIRS, ids=[f"{a}+{b}" for a, b in ALL_PAIRS])
def test_double_fault_every_pair(tmp_path, request, first, second):
    _double(tmp_path, request, first, second)
