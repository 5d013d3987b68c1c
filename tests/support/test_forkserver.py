"""The fork server of tests/support/forkserver.py: a forked child behaves as a fresh ``python script.py`` (exit
code, signal death, environment, working directory, both pipes, its own session, fresh failpoint counts and
seed), and the waits of tests/helpers.py work on it unchanged."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import forkserver
import pytest
from helpers import communicate, process_state, wait_for_line, wait_until

from logstore.failpoints import ENV_VAR

PROBE = """
import json, os, random, sys
print(json.dumps({"argv": sys.argv, "cwd": os.getcwd(), "env": dict(os.environ), "path0": sys.path[0],
                  "main": __name__, "seed": random.random()}))
print("to stderr", file=sys.stderr)
sys.exit(int(sys.argv[1]))
"""


@pytest.fixture(autouse=True)
def _on(monkeypatch):
    monkeypatch.setenv(forkserver.ENABLE_VAR, "1")


def _script(tmp_path: Path, code: str, name: str = "probe.py") -> Path:
    path = tmp_path / name
    path.write_text(code)
    return path


def _start(script: Path, *argv: str, env: dict[str, str] | None = None, **kwargs) -> subprocess.Popen[str]:
    proc = forkserver.popen(
        [sys.executable, str(script), *argv],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kwargs,
    )
    assert isinstance(proc, forkserver.ForkedProcess), "the fork server did not run the script"
    return proc


def test_exit_code_argv_env_cwd_and_both_pipes(tmp_path):
    script = _script(tmp_path, PROBE)
    work = tmp_path / "work"
    work.mkdir()
    env = dict(os.environ, FILESINK_PROBE="value")
    env.pop("PYTHONPATH", None)
    proc = _start(script, "7", "two words", env=env, cwd=work)
    out, err = communicate(proc, 60, "the probe to exit")
    assert proc.returncode == 7 and err == "to stderr\n"
    seen = json.loads(out)
    assert seen["argv"] == [str(script), "7", "two words"]
    assert seen["cwd"] == str(work)
    assert seen["env"] == env, "the environment is the requested one, wholesale"
    assert seen["path0"] == str(tmp_path) and seen["main"] == "__main__"


def test_each_child_has_its_own_seed_and_fresh_failpoint_counts(tmp_path):
    code = PROBE.replace("sys.exit(", "from logstore.failpoints import failpoint; failpoint('test.probe'); sys.exit(")
    script = _script(tmp_path, code)
    seeds = []
    for _ in range(2):
        proc = _start(script, "0")
        out, err = communicate(proc, 60, "the probe to exit")
        assert proc.returncode == 0, err
        seeds.append(json.loads(out)["seed"])
    assert seeds[0] != seeds[1]
    for _ in range(2):  # the first hit in each child: a count left from another child would skip it
        proc = _start(script, "0", env=dict(os.environ, **{ENV_VAR: "test.probe=kill@1"}))
        _, err = communicate(proc, 60, "the probe to be killed")
        assert proc.returncode == -signal.SIGKILL, err


def test_an_exception_exits_1_with_the_scripts_traceback(tmp_path):
    script = _script(tmp_path, "def f():\n    raise ValueError('boom')\n\nf()\n")
    proc = _start(script)
    _, err = communicate(proc, 60, "the script to fail")
    assert proc.returncode == 1
    lines = err.splitlines()
    assert lines[0] == "Traceback (most recent call last):" and lines[-1] == "ValueError: boom", err
    assert str(script) in lines[1] and "forkserver" not in err and "runpy" not in err, err


def test_killpg_ends_the_childs_session_with_what_it_started(tmp_path):
    code = (
        "import subprocess, sys, time\n"
        "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
        "print(p.pid, flush=True)\n"
        "time.sleep(600)\n"
    )
    proc = _start(_script(tmp_path, code))
    grandchild = int(wait_for_line(proc, lambda line: line.strip().isdigit(), 60, "the grandchild's pid"))
    assert os.getsid(proc.pid) == proc.pid and os.getpgid(grandchild) == proc.pid
    os.killpg(proc.pid, signal.SIGKILL)
    communicate(proc, 60, "the killed child")
    assert proc.returncode == -signal.SIGKILL
    wait_until(lambda: process_state(grandchild) in ("gone", "Z"), 30, "the grandchild to die")


def test_a_hang_is_killed_by_the_deadline(tmp_path):
    proc = _start(
        _script(tmp_path, "import sys, time\nprint('hanging', file=sys.stderr, flush=True)\ntime.sleep(600)\n")
    )
    began = time.monotonic()
    with pytest.raises(pytest.fail.Exception, match=r"(?s)timed out after 1 s waiting for the hang.*hanging"):
        communicate(proc, 1, "the hang")
    assert time.monotonic() - began < 30
    assert proc.returncode == -signal.SIGKILL
    assert process_state(proc.pid) in ("gone", "Z")


def test_wait_poll_and_signals_as_popen(tmp_path):
    proc = _start(_script(tmp_path, "import time\ntime.sleep(600)\n"))
    assert proc.poll() is None
    with pytest.raises(subprocess.TimeoutExpired):
        proc.wait(timeout=0.2)
    proc.terminate()
    assert proc.wait(timeout=30) == -signal.SIGTERM and proc.poll() == -signal.SIGTERM
    proc.kill()  # a no-op once it ended, as with Popen


def test_run_a_module_and_the_server_can_be_turned_off(tmp_path, monkeypatch):
    data = tmp_path / "data.json"
    data.write_text('{"b": 1, "a": [2]}')
    done = forkserver.run(
        [sys.executable, "-m", "json.tool", "--sort-keys", str(data)], 60, capture_output=True, text=True
    )
    assert done.returncode == 0 and json.loads(done.stdout) == {"a": [2], "b": 1}, done.stderr
    monkeypatch.setenv(forkserver.ENABLE_VAR, "0")
    proc = forkserver.popen([sys.executable, str(_script(tmp_path, PROBE)), "3"], stdout=subprocess.PIPE, text=True)
    assert not isinstance(proc, forkserver.ForkedProcess)
    communicate(proc, 60, "the plain subprocess")
    assert proc.returncode == 3
