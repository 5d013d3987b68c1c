"""The waits of tests/helpers.py: each ends by its deadline, fails naming what it waited for with the end of the
subprocess's output, and kills the subprocess."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
from cluster import processes_in_sessions
from helpers import communicate, readline_with_deadline, run, wait_for_exit, wait_for_line, wait_until


def _python(code: str, **kwargs) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs
    )


SILENT = "import sys, time; print('diagnostics', file=sys.stderr, flush=True); time.sleep(600)"
"""A process that says something on stderr, then nothing for ten minutes."""


def test_lines_that_arrive_together_are_read_one_by_one_and_the_rest_stays_in_the_pipe():
    code = "import sys; sys.stderr.write('epoch 0: a\\nepoch 2: b\\nepoch 3: c\\n'); sys.stderr.flush(); print('out')"
    proc = _python(code)
    line = wait_for_line(
        proc, lambda line: line.startswith(("epoch 1:", "epoch 2:")), 30, "epoch 1+", stream=proc.stderr, skip=True
    )
    assert line == "epoch 2: b\n"
    assert readline_with_deadline(proc, 30, "the next line", stream=proc.stderr) == "epoch 3: c\n"
    out, err = communicate(proc, 30, "the end")
    assert (out, err, proc.returncode) == ("out\n", "", 0)


def test_a_line_that_does_not_come_fails_with_the_output_and_kills_the_process():
    proc = _python(SILENT)
    began = time.monotonic()
    with pytest.raises(pytest.fail.Exception, match=r"(?s)timed out after 0.5 s waiting for a line.*diagnostics"):
        readline_with_deadline(proc, 0.5, "a line")
    assert time.monotonic() - began < 20
    assert proc.returncode == -9


def test_another_line_or_the_end_of_the_output_fails():
    proc = _python("print('hello'); print('world')")
    assert wait_for_line(proc, "hello\n", 30, "the first line") == "hello\n"
    with pytest.raises(pytest.fail.Exception, match=r"(?s)waiting for the greeting, read 'world\\n'"):
        wait_for_line(proc, "hi\n", 30, "the greeting")
    proc = _python("import sys; sys.exit(3)")
    with pytest.raises(pytest.fail.Exception, match=r"the output ended \(exit 3\) before the greeting"):
        wait_for_line(proc, "hi\n", 30, "the greeting", skip=True)


def test_communicate_and_wait_kill_the_process_group_on_timeout():
    proc = _python(f"import subprocess; subprocess.Popen(['sleep', '600']); {SILENT}", start_new_session=True)
    began = time.monotonic()
    with pytest.raises(pytest.fail.Exception, match=r"(?s)timed out after 0.5 s waiting for the end.*diagnostics"):
        communicate(proc, 0.5, "the end")
    assert proc.returncode == -9
    assert processes_in_sessions({proc.pid}) == [], "its child, which held the pipes open, is killed too"
    assert time.monotonic() - began < 9, "no wait for pipes held open (helpers.DRAIN_WAIT)"
    proc = _python(SILENT)
    with pytest.raises(pytest.fail.Exception, match=r"(?s)timed out after 0.5 s waiting for the exit.*diagnostics"):
        wait_for_exit(proc, 0.5, "the exit")
    assert proc.returncode == -9


def test_wait_until_fails_on_its_deadline_or_when_the_process_ends():
    with pytest.raises(pytest.fail.Exception, match=r"timed out after 0.2 s waiting for nothing\n\(see: here\)"):
        wait_until(lambda: False, 0.2, "nothing", describe=lambda: "(see: here)")
    proc = _python("import sys; print('bye', file=sys.stderr); sys.exit(3)")
    with pytest.raises(pytest.fail.Exception, match=r"(?s)the process ended \(exit 3\) while waiting for Godot.*bye"):
        wait_until(lambda: False, 30, "Godot", proc=proc)
    wait_until(lambda: True, 0, "what is there")


def test_run_fails_on_timeout():
    with pytest.raises(pytest.fail.Exception, match=r"(?s)timed out after 0.5 s waiting for silence.*diagnostics"):
        run([sys.executable, "-c", SILENT], 0.5, "silence", capture_output=True, text=True)
