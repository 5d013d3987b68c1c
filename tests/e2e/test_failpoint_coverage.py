"""Every failpoint in the source is exercised by the suite: it fired in some process of this test session
(conftest.py moves this test to the end of the session)."""

from __future__ import annotations

import os
import time

import pytest
from failpoint_job import REGISTERED, SINGLE
from session import finished_workers, session_root

from logstore.failpoints import FIRED_LOG, fired

WAIT_FOR_WORKERS = 3600.0
"""Seconds to wait for the other pytest-xdist workers' last tests (a kill campaign takes minutes)."""
MATRIX_TEST = "test_failpoint_matrix.py::test_fail_at_a_failpoint_then_restart_and_finish"


def test_every_registered_failpoint_fired_in_this_session(request, tmp_path_factory):
    matrix = [i for i in request.session.items if i.nodeid.split("[")[0].endswith(MATRIX_TEST)]
    if len(matrix) < len(SINGLE):
        pytest.skip("only meaningful in a run of the whole suite (the failpoint matrix was not all collected)")
    root = session_root(tmp_path_factory)
    others = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) - 1
    deadline = time.monotonic() + WAIT_FOR_WORKERS
    while len(finished_workers(root)) < others:  # this test runs last on its worker; the others may not be done
        assert time.monotonic() < deadline, f"other workers did not finish (finished: {finished_workers(root)})"
        time.sleep(1)
    seen = {name for log in root.rglob(FIRED_LOG) for name, _pid, _detail in fired(str(log.parent))}
    missing = [name for name in REGISTERED if name not in seen]
    assert missing == [], f"failpoints no test made fire: {missing}"
