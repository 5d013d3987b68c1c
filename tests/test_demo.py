"""The README's first command runs these examples: they must work and check their own output."""

from __future__ import annotations

import subprocess
import sys


def _run(module: str, tmp_path, *args: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", module, "demo", "--dir", str(tmp_path / "demo"), *args],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def test_streaming_example_is_exactly_once_and_idempotent(tmp_path):
    out = _run("filesink", tmp_path, "--files", "3", "--rows", "2000")
    assert "ok: every one of the 6,000 input rows is in the output exactly once" in out
    assert str(tmp_path / "demo" / "output") in out
    again = _run("filesink", tmp_path, "--files", "3", "--rows", "2000")
    assert "ok: every one of the 6,000 input rows" in again


def test_log_store_example(tmp_path):
    out = _run("logstore", tmp_path, "--epochs", "2", "--tasks", "2", "--rows", "1000")
    assert "ok: the 4,000 appended rows were read back exactly once each" in out
