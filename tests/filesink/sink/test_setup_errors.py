"""Setup errors are refusals that name the path and say what to do, before anything is written: an output, state
or log store path that is a file; a state database that is not one, is damaged or is locked elsewhere. ``filesink
recover status`` and ``plan`` read a state directory that cannot be written. After the user's fix, the sink goes
on and its output is exact."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import run_server
from helpers import run, support_env, wait_for_line
from mounts import bind, without_dac
from sink_helpers import append_epoch, batch_rows, read_duckdb, read_pyarrow

from filesink import ExactlyOnceParquetSink, Rollover, SinkOptionError, StateDatabaseError
from logstore.statedb import STATE_DB_NAME

HOLD = Rollover(target_file_size=None, max_age_seconds=None, max_epochs=1000)
"""Nothing is written before a flush: what the state holds stays in the log store."""
CLI_WAIT = 120.0


def filesink(*args: str | Path, prefix: list[str] | None = None) -> subprocess.CompletedProcess[str]:
    if not prefix:
        return run_server.filesink([str(a) for a in args], CLI_WAIT)
    command = [*prefix, sys.executable, "-m", "filesink", *map(str, args)]
    return run(command, CLI_WAIT, f"filesink {args[0]} {args[1]}", capture_output=True, text=True)


def assert_error_line(done: subprocess.CompletedProcess[str], *names: str, code: int = 1) -> str:
    """The command failed with exit ``code`` and one ``error:`` line naming ``names``, without a traceback."""
    assert done.returncode == code, (done.returncode, done.stdout, done.stderr)
    assert "Traceback" not in done.stderr, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1, done.stderr
    for name in names:
        assert name in lines[0], (name, lines[0])
    return lines[0]


def open_sink(tmp_path: Path, **kwargs) -> ExactlyOnceParquetSink:
    options = {"path": str(tmp_path / "out"), "state_dir": tmp_path / "state", "vnodes": 8, "rollover": HOLD}
    return ExactlyOnceParquetSink(**(options | kwargs))


def sink_with_held_rows(tmp_path: Path) -> Counter:
    """A closed sink with epochs 0-1 in files and epoch 2 held in the log store; returns every row."""
    expected: Counter = Counter()
    with open_sink(tmp_path) as sink:
        for epoch in range(3):
            rows = batch_rows(epoch, 60, seed=3)
            expected.update(rows)
            append_epoch(sink, epoch, rows)
            if epoch == 1:
                sink.flush()
    return expected


def flush_and_read(tmp_path: Path) -> Counter:
    """Start the sink again (the user's fix done), write what it holds, and read the output."""
    with open_sink(tmp_path) as sink:
        sink.flush()
    got = read_pyarrow(str(tmp_path / "out"))
    assert read_duckdb(str(tmp_path / "out")) == got
    return got


# -- a path that is a file -------------------------------------------------------------------------------------


PATHS = {
    "output": ("out", {}),
    "below the output": ("out", {"path": "out/table"}),
    "state directory": ("state", {}),
    "below the state directory": ("state", {"state_dir": "state/sub"}),
    "log store": ("log", {"log_store": "log"}),
    "default log store": ("state/log", {}),
}


@pytest.mark.parametrize("case", PATHS, ids=list(PATHS))
def test_a_path_that_is_a_file_is_refused_naming_it_before_anything_is_created(tmp_path, case):
    name, overrides = PATHS[case]
    blocker = tmp_path / name
    blocker.parent.mkdir(parents=True, exist_ok=True)
    blocker.write_bytes(b"not a directory")
    before = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*"))
    options = {k: str(tmp_path / v) if k != "state_dir" else tmp_path / v for k, v in overrides.items()}

    with pytest.raises(SinkOptionError) as refused:
        open_sink(tmp_path, **options)
    message = str(refused.value)
    assert str(blocker) in message and "is a file" in message, message
    assert "Nothing was written" in message
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*")) == before, "nothing was created"

    blocker.unlink()  # the user's fix
    rows = batch_rows(0, 80, seed=5)
    with open_sink(tmp_path, **options) as sink:
        append_epoch(sink, 0, rows)
        sink.flush()
    out = options.get("path", str(tmp_path / "out"))
    assert read_pyarrow(out) == Counter(rows)


@pytest.mark.parametrize("flag", ["--output", "--state-dir", "--checkpoint"])
def test_filesink_run_refuses_a_path_that_is_a_file_with_an_error_line(tmp_path, flag):
    """Before Spark starts: an error line naming the path, exit code 1, nothing created."""
    (tmp_path / "in").mkdir()
    blocker = tmp_path / "blocker"
    blocker.write_bytes(b"x")
    paths = {"--output": tmp_path / "out", "--state-dir": tmp_path / "state", "--checkpoint": tmp_path / "ck"}
    paths[flag] = blocker
    args = [f for flag_, path in paths.items() for f in (flag_, path)]
    done = filesink("run", "--input", tmp_path / "in", *args, "--available-now")
    line = assert_error_line(done, str(blocker))
    assert "is a file, not a directory" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["blocker", "in"], "nothing was created"


# -- a state database SQLite cannot use ----------------------------------------------------------------------


def damage(db: Path, how: str) -> None:
    if how == "not a database":
        db.write_bytes(b"these bytes were never a SQLite database\n" * 100)
        return
    data = bytearray(db.read_bytes())
    page = 4096
    assert len(data) > 4 * page
    for offset in range(page, len(data), page):  # every page but the header's
        data[offset : offset + page] = b"\xde\xad" * (page // 2)
    db.write_bytes(bytes(data))


@pytest.mark.parametrize("how", ["not a database", "damaged"])
def test_a_state_database_sqlite_cannot_read_is_an_error_naming_it(tmp_path, how):
    expected = sink_with_held_rows(tmp_path)
    db = tmp_path / "state" / STATE_DB_NAME
    files_before = sorted(p.name for p in (tmp_path / "out").iterdir())
    home_before = sorted(p.relative_to(tmp_path).as_posix() for p in (tmp_path / "state" / "log").rglob("*"))
    damage(db, how)
    words = "not a SQLite database" if how == "not a database" else "damaged"

    with pytest.raises(StateDatabaseError) as refused:
        open_sink(tmp_path)
    assert str(db) in str(refused.value) and words in str(refused.value), refused.value
    for step in ("status", "plan", "apply"):
        line = assert_error_line(filesink("recover", step, "--state-dir", tmp_path / "state"), str(db))
        assert words in line and "durable home" in line, line
    (tmp_path / "in").mkdir()
    line = assert_error_line(
        filesink("run", "--input", tmp_path / "in", "--output", tmp_path / "out", "--state-dir", tmp_path / "state"),
        str(db),
    )
    assert words in line
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == files_before
    home_after = sorted(p.relative_to(tmp_path).as_posix() for p in (tmp_path / "state" / "log").rglob("*"))
    assert home_after == home_before, "nothing in the log store changed"

    # The fix the message gives: move the database away; the sink rebuilds its state from the durable home.
    (tmp_path / "kept").mkdir()
    for found in (tmp_path / "state").glob(f"{STATE_DB_NAME}*"):
        found.rename(tmp_path / "kept" / found.name)
    assert flush_and_read(tmp_path) == expected


@pytest.mark.timeout(180)
def test_a_state_database_locked_elsewhere_is_an_error_naming_it(tmp_path):
    """A process holding a write transaction on the database for longer than the busy timeout (30 s)."""
    expected = sink_with_held_rows(tmp_path)
    db = tmp_path / "state" / STATE_DB_NAME
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sqlite3, sys, time\n"
            f"c = sqlite3.connect({str(db)!r}, isolation_level=None)\n"
            "c.execute('BEGIN EXCLUSIVE')\nprint('locked', flush=True)\ntime.sleep(600)\n",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=support_env(),
    )
    try:
        wait_for_line(holder, "locked\n", 30, "the process holding the lock")
        line = assert_error_line(filesink("recover", "apply", "--state-dir", tmp_path / "state"), str(db))
        assert "locked" in line and "Another process holds a lock" in line, line
    finally:
        holder.kill()
        holder.wait(30)
    assert flush_and_read(tmp_path) == expected  # the lock is gone: the sink goes on


# -- a state directory that cannot be written ----------------------------------------------------------------


def check_readonly_status(tmp_path: Path, prefix: list[str]) -> None:
    state = tmp_path / "state"
    done = filesink("recover", "status", "--state-dir", state, "--json", prefix=prefix)
    assert done.returncode == 0, done.stderr
    status = json.loads(done.stdout)
    assert status["last_sealed_epoch"] == 2 and status["backlog"]["rows"] == 60, status
    assert status["damaged_segments"] == [] and status["pending_files"] == []
    done = filesink("recover", "plan", "--state-dir", state, "--json", prefix=prefix)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["nothing_to_do"] is True
    line = assert_error_line(filesink("recover", "apply", "--state-dir", state, prefix=prefix), str(state))
    assert "read-only" in line or "Permission denied" in line, line


def test_recover_status_and_plan_read_a_read_only_mounted_state_directory(tmp_path):
    expected = sink_with_held_rows(tmp_path)
    state = tmp_path / "state"
    with bind(state, state, readonly=True):
        check_readonly_status(tmp_path, [])
        with pytest.raises(SinkOptionError, match=rf"state_dir {state} cannot be written \(Read-only file system\)"):
            open_sink(tmp_path)
    assert flush_and_read(tmp_path) == expected  # writable again


def test_recover_status_and_plan_read_a_state_directory_the_user_cannot_write(tmp_path):
    expected = sink_with_held_rows(tmp_path)
    state = tmp_path / "state"
    modes = {p: p.stat().st_mode for p in [state, *state.rglob("*")]}
    for path in modes:
        path.chmod(path.stat().st_mode & ~0o222)  # chmod -R a-w
    try:
        check_readonly_status(tmp_path, without_dac(state))
    finally:
        for path, mode in modes.items():
            path.chmod(mode)
    assert flush_and_read(tmp_path) == expected


KILLED_SINK = """
import os, sys
from pathlib import Path
from sink_helpers import append_epoch, batch_rows
from filesink import ExactlyOnceParquetSink, Rollover
base = Path(sys.argv[1])
hold = Rollover(target_file_size=None, max_age_seconds=None, max_epochs=1000)
sink = ExactlyOnceParquetSink(str(base / "out"), base / "state", vnodes=8, rollover=hold)
for epoch in range(3):
    append_epoch(sink, epoch, batch_rows(epoch, 60, seed=3))
os._exit(0)  # killed: its write-ahead log is not checkpointed
"""


def test_recover_status_reads_a_live_sinks_state_directory_the_user_cannot_write(tmp_path):
    """Another user looking at a running sink: its write-ahead log and index file are there, readable only."""
    live = KILLED_SINK.replace("os._exit(0)", "print('running', flush=True)\nimport time\ntime.sleep(600)")
    sink = subprocess.Popen(
        [sys.executable, "-c", live, str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=support_env(),
    )
    state = tmp_path / "state"
    modes: dict[Path, int] = {}
    try:
        wait_for_line(sink, "running\n", CLI_WAIT, "the sink to seal its epochs")
        assert (state / f"{STATE_DB_NAME}-wal").stat().st_size > 0
        modes = {p: p.stat().st_mode for p in [state, *state.rglob("*")]}
        for path in modes:
            path.chmod(path.stat().st_mode & ~0o222)
        done = filesink("recover", "status", "--state-dir", state, "--json", prefix=without_dac(state))
        assert done.returncode == 0, done.stderr
        status = json.loads(done.stdout)
        assert status["last_sealed_epoch"] == 2 and f"pid {sink.pid} " in status["held_by"], status
    finally:
        for path, mode in modes.items():
            path.chmod(mode)
        sink.kill()
        sink.wait(30)
    expected = Counter(r for epoch in range(3) for r in batch_rows(epoch, 60, seed=3))
    assert flush_and_read(tmp_path) == expected


def test_a_read_only_state_directory_with_a_write_ahead_log(tmp_path):
    """A sink killed with its transactions in ``state.sqlite-wal``: status reads them through the index file
    (``-shm``) it left; without that file (it cannot be created read-only) the error says what to do."""
    done = run([sys.executable, "-c", KILLED_SINK, str(tmp_path)], CLI_WAIT, "a sink killed", env=support_env())
    assert done.returncode == 0
    state = tmp_path / "state"
    wal = state / f"{STATE_DB_NAME}-wal"
    assert wal.stat().st_size > 0 and (state / f"{STATE_DB_NAME}-shm").exists()
    with bind(state, state, readonly=True):
        done = filesink("recover", "status", "--state-dir", state, "--json")
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["last_sealed_epoch"] == 2
    (state / f"{STATE_DB_NAME}-shm").unlink()
    with bind(state, state, readonly=True):
        line = assert_error_line(filesink("recover", "status", "--state-dir", state), str(state / STATE_DB_NAME))
        assert wal.name in line and "writable" in line, line
    expected = Counter(r for epoch in range(3) for r in batch_rows(epoch, 60, seed=3))
    assert flush_and_read(tmp_path) == expected


def test_a_sqlite_error_reading_the_database_is_not_a_traceback(tmp_path):
    """A database that opens but whose tables are not a sink's: ``filesink recover`` says which file."""
    (tmp_path / "state").mkdir()
    db = tmp_path / "state" / STATE_DB_NAME
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE log_store (unrelated TEXT)")
        conn.execute("INSERT INTO log_store VALUES ('x')")
    conn.close()
    done = filesink("recover", "status", "--state-dir", tmp_path / "state")
    line = assert_error_line(done, str(db))
    assert "no such column" in line, line
    assert os.path.getsize(db) > 0
