"""Every failpoint in the source is exercised by the suite: it fired in some process of this test session
(conftest.py moves this test to the end of the session)."""

from __future__ import annotations

import os

import pytest
from failpoint_job import REGISTERED, SINGLE
from helpers import wait_until
from session import finished_workers, session_root

from logstore.failpoints import FIRED_LOG, fired

WAIT_FOR_WORKERS = 1800.0
"""Seconds to wait for the other pytest-xdist workers' last tests (a kill campaign takes minutes; each test has
its own timeout, and the whole run must fit in CI's 90 minutes)."""
MATRIX_TEST = "test_failpoint_matrix.py::test_fail_at_a_failpoint_then_restart_and_finish"


@pytest.mark.timeout(WAIT_FOR_WORKERS + 300)
def test_every_registered_failpoint_fired_in_this_session(request, tmp_path_factory):
    matrix = [i for i in request.session.items if i.nodeid.split("[")[0].endswith(MATRIX_TEST)]
    if len(matrix) < len(SINGLE):
        pytest.skip("only meaningful in a run of the whole suite (the failpoint matrix was not all collected)")
    root = session_root(tmp_path_factory)
    others = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) - 1
    wait_until(  # this test runs last on its worker; the others may not be done
        lambda: len(finished_workers(root)) >= others,
        WAIT_FOR_WORKERS,
        f"{others} other workers to finish",
        describe=lambda: f"finished: {finished_workers(root)}",
        interval=1,
    )
    seen = {name for log in root.rglob(FIRED_LOG) for name, _pid, _detail in fired(str(log.parent))}
    missing = [name for name in REGISTERED if name not in seen]
    assert missing == [], f"failpoints no test made fire: {missing}"
