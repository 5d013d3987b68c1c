from __future__ import annotations

import subprocess
import sys

import pytest
from helpers import process_state

from logstore.failpoints import ENV_VAR, FailpointError, failpoint


def test_unset_or_other_failpoints_do_nothing(monkeypatch):
    from logstore import failpoints

    monkeypatch.delenv(ENV_VAR, raising=False)
    assert failpoint("anything") is None
    monkeypatch.setenv(ENV_VAR, "something.else=raise")
    assert failpoint("anything") is None
    assert "anything" not in failpoints._hits, "a failpoint that is not configured is not even counted"


def test_raise_action_and_nth_hit(monkeypatch):
    monkeypatch.setenv(ENV_VAR, "a.b=raise@2, other=raise")
    failpoint("a.b")
    with pytest.raises(FailpointError, match=r"a\.b"):
        failpoint("a.b")
    failpoint("a.b")
    with pytest.raises(FailpointError, match="other"):
        failpoint("other")


def test_bad_configuration_is_an_error(monkeypatch):
    monkeypatch.setenv(ENV_VAR, "x=explode")
    with pytest.raises(ValueError, match="bad entry 'x=explode'"):
        failpoint("x")


def test_kill_action_kills_the_process():
    code = "from logstore.failpoints import failpoint; failpoint('p'); print('survived')"
    proc = subprocess.run(
        [sys.executable, "-c", code], env={ENV_VAR: "p=kill"}, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == -9 and "survived" not in proc.stdout


def test_detail_filter_counts_only_matching_places(monkeypatch):
    monkeypatch.setenv(ENV_VAR, "w.publish#-00016-=raise@2")
    failpoint("w.publish", "part-x-00000-00007")
    failpoint("w.publish", "part-x-00016-00023")  # first match
    failpoint("w.publish", "part-x-00008-00015")
    with pytest.raises(FailpointError, match="part-x-00016-00031"):
        failpoint("w.publish", "part-x-00016-00031")


def test_stop_action_pauses_until_continued():
    import signal
    import time

    code = "from logstore.failpoints import failpoint; print('before', flush=True); failpoint('p'); print('after')"
    proc = subprocess.Popen([sys.executable, "-c", code], env={ENV_VAR: "p=stop"}, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "before\n"
        deadline = time.monotonic() + 30
        while process_state(proc.pid) != "T":
            assert time.monotonic() < deadline, "the process did not stop itself"
            time.sleep(0.02)
        proc.send_signal(signal.SIGCONT)
        out, _ = proc.communicate(timeout=30)
        assert proc.returncode == 0 and out == "after\n"
    finally:
        proc.kill()
