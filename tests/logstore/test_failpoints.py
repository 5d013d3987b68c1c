from __future__ import annotations

import subprocess
import sys

import pytest
from helpers import communicate, kill, process_state, wait_for_line, wait_until

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

    code = "from logstore.failpoints import failpoint; print('before', flush=True); failpoint('p'); print('after')"
    proc = subprocess.Popen([sys.executable, "-c", code], env={ENV_VAR: "p=stop"}, stdout=subprocess.PIPE, text=True)
    try:
        wait_for_line(proc, "before\n", 30, "the line 'before'")
        wait_until(lambda: process_state(proc.pid) == "T", 30, "the process to stop itself", proc=proc)
        proc.send_signal(signal.SIGCONT)
        out, _ = communicate(proc, 30, "the continued process to exit")
        assert proc.returncode == 0 and out == "after\n"
    finally:
        kill(proc)


def test_once_across_processes_and_the_fired_log(tmp_path, monkeypatch):
    from logstore.failpoints import DIR_VAR, fired

    monkeypatch.setenv(DIR_VAR, str(tmp_path))
    monkeypatch.setenv(ENV_VAR, "p#x=raise@once")
    code = "from logstore.failpoints import failpoint; failpoint('p', 'ax'); failpoint('p', 'bx'); print('ok')"
    first = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert first.returncode == 1 and "FailpointError: failpoint p fired at ax" in first.stderr
    second = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert second.returncode == 0 and second.stdout == "ok\n", "@once fired only in the first process"
    assert [(name, detail) for name, _pid, detail in fired(str(tmp_path))] == [("p", "ax")]
    failpoint("p", "y")  # no match: nothing fires, nothing is logged
    assert len(fired(str(tmp_path))) == 1


def test_once_needs_the_shared_directory(monkeypatch):
    from logstore.failpoints import DIR_VAR

    monkeypatch.delenv(DIR_VAR, raising=False)
    monkeypatch.setenv(ENV_VAR, "p=raise@once")
    with pytest.raises(ValueError, match="FILESINK_FAILPOINT_DIR"):
        failpoint("p")
