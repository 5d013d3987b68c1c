"""Disk faults: the disk fills up or fails under the log store or the state database. The job stops with an
error that says what failed and where (it never goes on having lost data); once the cause is gone it
resumes, and the output is exactly the input.

Two ways: errors injected at the N-th write or fsync of a log segment (always), and a real, small file system
(a tmpfs mounted for the test, which needs the privilege to mount; without it those tests are skipped and
say so) that fills up under the log store or under SQLite and is then grown.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from failpoint_job import Job

from logstore.failpoints import fired

INJECTED = [(p, a) for p in ("logstore.storage.write", "logstore.storage.fsync") for a in ("enospc", "eio")]
MESSAGES = {"enospc": "No space left on device", "eio": "Input/output error"}


@pytest.mark.parametrize(("point", "action"), INJECTED, ids=[f"{p}={a}" for p, a in INJECTED])
def test_injected_disk_error_in_a_log_segment_write(tmp_path, request, point, action):
    job = Job(tmp_path, "local", request)
    run = job.run(f"{point}#.seg={action}@3")
    assert [n for n, _pid, _d in fired(str(job.shared))] == [point]
    assert run.returncode == 1, run.stderr[-3000:]
    last = run.stderr.strip().splitlines()[-1]
    assert last.startswith("logstore.errors.LogWriteError:") and MESSAGES[action] in last, last
    assert "append to epoch 2" in last and ".seg" in last and "Nothing of this epoch is sealed" in last, last
    assert "epoch 2" not in run.stdout, "the job stopped at the failed epoch"
    job.finish()


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    mount_point = tmp_path / "small"
    mount_point.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mount_point)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small file system here: {mounted.stderr.strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False, timeout=60)


def _grow(mount_point: Path) -> None:
    subprocess.run(["mount", "-o", "remount,size=256m", str(mount_point)], check=True, timeout=60)


def test_log_store_disk_full_then_space_is_back(tmp_path, request, monkeypatch, small_fs):
    monkeypatch.setenv("MATRIX_JOB_ROWS", "3000")
    monkeypatch.setenv("MATRIX_JOB_LOG", str(small_fs / "log"))
    job = Job(tmp_path / "job", "local", request)
    job.epochs = 12
    run = job.run()
    assert run.returncode == 1, f"the log store never filled up: {run.stdout} {run.stderr[-2000:]}"
    last = run.stderr.strip().splitlines()[-1]
    # the segment of an epoch, a file writer's record or a record of the durable home: whichever the disk refused first
    assert "LogWriteError" in last or "cannot record" in last, last
    assert "No space left on device" in last and str(small_fs) in last, last
    _grow(small_fs)
    job.finish()


def test_state_database_disk_full_then_space_is_back(tmp_path, request, monkeypatch, small_fs):
    monkeypatch.setenv("MATRIX_JOB_LOG", str(tmp_path / "log"))
    job = Job(tmp_path / "job", "local", request)
    job.state = small_fs / "state"
    job.epochs = 200
    run = job.run()
    assert run.returncode == 1, f"the state database never filled up: {run.stdout[-500:]} {run.stderr[-2000:]}"
    last = run.stderr.strip().splitlines()[-1]
    assert "StateDatabaseError" in last and "database or disk is full" in last and str(small_fs) in last, last
    _grow(small_fs)
    job.finish()
