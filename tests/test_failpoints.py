from __future__ import annotations

import subprocess
import sys

import pytest

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
