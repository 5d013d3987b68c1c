"""``filesink recover health``: one exit code per reason (9 visibility lag, 10 pending files without an owner, 12
owner silent, their sums when several hold, 0 healthy), the reasons one per line and in the JSON, read-only (the
state directory's lock is never taken). Real states without Spark: the sink's own append and seal per epoch
(``append_epoch``), a roll that dies between pre-commit and commit (a failpoint), a driver killed (its lock released
and its store closed without stopping) or stopped cleanly (``close``)."""

from __future__ import annotations

import json
import re
import sys
import time

import pytest
from helpers import run
from sink_helpers import append_epoch, batch_rows

from filesink import ExactlyOnceParquetSink, Rollover
from filesink.errors import EXIT_NOT_A_SINK, EXIT_USAGE
from filesink.lock import StateLock
from logstore.failpoints import ENV_VAR, FailpointError
from recovery import health
from recovery.cli import main
from recovery.health import lock_holder_unlocked

HOLD = Rollover(target_file_size=None, max_age_seconds=None, max_epochs=1000)
"""Files are written only by flush(): every sealed row is held in the log store until then."""


def _sink(tmp_path) -> ExactlyOnceParquetSink:
    return ExactlyOnceParquetSink(
        str(tmp_path / "out"), tmp_path / "state", log_store=str(tmp_path / "log"), vnodes=4, rollover=HOLD
    )


def _health(capsys, tmp_path, *args: str) -> tuple[int, str]:
    capsys.readouterr()
    code = main(["health", "--state-dir", str(tmp_path / "state"), *args])
    return code, capsys.readouterr().out


def _health_json(capsys, tmp_path, *args: str) -> tuple[int, dict]:
    code, out = _health(capsys, tmp_path, "--json", *args)
    return code, json.loads(out)


def _fail_flush(sink, monkeypatch) -> None:
    """A roll that dies between the pre-commit and the commit: its files stay pending."""
    monkeypatch.setenv(ENV_VAR, "filesink.commit.before=raise")
    with pytest.raises(FailpointError):
        sink.flush()
    monkeypatch.delenv(ENV_VAR)


def _kill(sink) -> None:
    """What a killed driver leaves: its lock released by the OS, its term record not closed."""
    sink._state_lock.release()
    sink.log_store.close()


def test_healthy_then_lagging_while_a_live_sink_holds_the_state(tmp_path, capsys, monkeypatch):
    sink = _sink(tmp_path)
    try:
        for epoch in range(2):
            append_epoch(sink, epoch, batch_rows(epoch, 50, seed=3))
        lock = tmp_path / "state" / "sink.lock"
        before = lock.read_bytes()
        code, out = _health(capsys, tmp_path)
        assert code == 0, out
        [line] = out.splitlines()
        assert line.startswith(f"healthy: sink {sink.log_store.sink_id}, visibility lag "), line
        assert "0 pending files" in line and "writer term 1 alive" in line and "state directory held by pid" in line

        code, report = _health_json(capsys, tmp_path)
        assert code == 0 and report["healthy"] is True and report["reasons"] == [], report
        assert report["held_rows"] == 100 and report["oldest_held_epoch"] == 0, report
        assert report["owner"]["writer_term"] == 1 and report["owner"]["held_by"].startswith("pid "), report

        time.sleep(0.3)
        code, out = _health(capsys, tmp_path, "--max-lag", "0.2")
        assert code == 9, out
        [line] = out.splitlines()
        assert line.startswith("visibility_lag: the oldest epoch held in the log store, epoch 0, was sealed "), line
        assert "(bound 0.2 s, --max-lag): 100 held rows are not yet in committed files" in line, line
        code, report = _health_json(capsys, tmp_path, "--max-lag", "0.2")
        assert code == 9 and [r["reason"] for r in report["reasons"]] == ["visibility_lag"], report
        assert report["visibility_lag_seconds"] >= 0.3, report

        assert lock.read_bytes() == before, "health never writes the lock file"
        assert lock_holder_unlocked(tmp_path / "state") == before.decode().strip()
        monkeypatch.setattr(health, "PROC_LOCKS", tmp_path / "no-lock-table")  # not Linux: the pid is checked
        assert lock_holder_unlocked(tmp_path / "state") == before.decode().strip()
        monkeypatch.undo()
        sink.flush()  # the rows become visible: no lag, whatever the bound
        code, report = _health_json(capsys, tmp_path, "--max-lag", "0.2")
        assert code == 0 and report["held_rows"] == 0 and report["visibility_lag_seconds"] == 0, report
    finally:
        sink.close()
    assert lock_holder_unlocked(tmp_path / "state") is None
    StateLock(tmp_path / "state").release()  # nothing was left holding it


def test_pending_files_of_a_run_that_stopped(tmp_path, capsys, monkeypatch):
    """The roll failed and the query stopped cleanly: its pending files have no owner (10), no run is silent."""
    sink = _sink(tmp_path)
    for epoch in range(2):
        append_epoch(sink, epoch, batch_rows(epoch, 50, seed=3))
    _fail_flush(sink, monkeypatch)
    pending = sorted(sink.ledger.pending_names())
    assert pending, "the failpoint left pending files"
    sink.close()

    code, out = _health(capsys, tmp_path, "--max-silence", "0.1")
    assert code == 10, out
    [line] = out.splitlines()
    assert line.startswith(f"pending_without_owner: {len(pending)} files pre-committed and not finished ("), line
    assert pending[0] in line and "writer term 1 stopped cleanly" in line and "lock free" in line, line
    assert "`filesink recover apply`" in line, line
    code, report = _health_json(capsys, tmp_path)
    assert code == 10 and [r["reason"] for r in report["reasons"]] == ["pending_without_owner"], report
    assert sorted(report["pending_files"]) == pending and report["owner"]["stopped_cleanly"] is True, report

    # status --exit-code: the same check and exit code, beside the whole status.
    capsys.readouterr()
    assert main(["status", "--state-dir", str(tmp_path / "state"), "--no-verify", "--exit-code", "--json"]) == 10
    status = json.loads(capsys.readouterr().out)
    assert status["health"]["reasons"] == report["reasons"] and len(status["pending_files"]) == len(pending), status
    assert main(["status", "--state-dir", str(tmp_path / "state"), "--no-verify", "--exit-code"]) == 10
    shown = capsys.readouterr().out
    assert shown.endswith("\nhealth\n" + report["reasons"][0]["reason"] + ": " + report["reasons"][0]["message"] + "\n")
    assert main(["status", "--state-dir", str(tmp_path / "state"), "--no-verify", "--json"]) == 0
    assert "health" not in json.loads(capsys.readouterr().out), "without --exit-code, status is as it was"

    # The same from the durable home alone (the state directory lost): the state rebuilt in memory.
    capsys.readouterr()
    assert main(["health", "--log-store", str(tmp_path / "log"), "--json"]) == 10
    rebuilt = json.loads(capsys.readouterr().out)
    assert sorted(rebuilt["pending_files"]) == pending and rebuilt["owner"]["held_by"] is None, rebuilt
    assert "state directory not given" in rebuilt["reasons"][0]["message"], rebuilt


def test_a_killed_driver_is_silent_and_leaves_its_pending_files_without_an_owner(tmp_path, capsys, monkeypatch):
    sink = _sink(tmp_path)
    append_epoch(sink, 0, batch_rows(0, 50, seed=3))
    _fail_flush(sink, monkeypatch)
    pending = sorted(sink.ledger.pending_names())
    _kill(sink)

    code, out = _health(capsys, tmp_path)  # just killed: the run counts as alive for --max-silence
    assert code == 0 and f"{len(pending)} pending files" in out, out
    time.sleep(0.3)
    code, out = _health(capsys, tmp_path, "--max-silence", "0.2")
    assert code == 2 + 4 + 8, out
    lines = out.splitlines()
    assert [x.split(":", 1)[0] for x in lines] == ["pending_without_owner", "owner_silent"], out
    assert re.search(r"\(writer term 1 alive \d+ s ago \(on [^)]+\); state directory lock free\)", lines[0]), lines[0]
    assert lines[1].startswith("owner_silent: the run of writer term 1 on "), lines[1]
    assert "did not stop cleanly and last renewed its record" in lines[1], lines[1]
    assert "(bound 0.2 s, --max-silence; " in lines[1] and "terms/" in lines[1], lines[1]


def test_a_silent_owner_with_nothing_pending(tmp_path, capsys):
    """A driver killed between batches (nothing pending): only its silence is reported (12); through the real
    command, which prints no traceback."""
    sink = _sink(tmp_path)
    append_epoch(sink, 0, batch_rows(0, 50, seed=3))
    _kill(sink)
    time.sleep(0.3)
    done = run(
        [sys.executable, "-m", "recovery", "health", "--state-dir", str(tmp_path / "state"), "--max-silence", "0.2"],
        120,
        "recover health",
        capture_output=True,
        text=True,
    )
    assert done.returncode == 12, (done.stdout, done.stderr)
    [line] = done.stdout.splitlines()
    assert line.startswith("owner_silent: the run of writer term 1 on "), line
    assert "Traceback" not in done.stderr, done.stderr


def test_usage_and_not_a_sink(tmp_path, capsys):
    for bad in ("0", "-5", "soon", "inf"):
        with pytest.raises(SystemExit) as e:
            main(["health", "--state-dir", str(tmp_path), "--max-lag", bad])
        assert e.value.code == EXIT_USAGE
        assert f"--max-lag: must be a positive number of seconds, not '{bad}'" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main(["health"])
    assert e.value.code == EXIT_USAGE and "give --state-dir DIR, --log-store URL, or both" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main(["status", "--state-dir", str(tmp_path), "--max-lag", "60"])
    assert e.value.code == EXIT_USAGE and "give them with --exit-code" in capsys.readouterr().err
    assert main(["health", "--state-dir", str(tmp_path)]) == EXIT_NOT_A_SINK
    assert f"{tmp_path} is not a sink's state directory" in capsys.readouterr().err
