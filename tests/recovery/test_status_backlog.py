"""``filesink recover status --log-store URL`` (the state rebuilt in memory from the durable home) reports the backlog
the state directory's database reports: the epochs and rows held above the truncate points and the pending files,
not the records of epochs already committed that the home keeps until its next sweep."""

from __future__ import annotations

import json

from sink_helpers import input_file, run_query

from filesink import ExactlyOnceParquetSink, Rollover
from logstore.failpoints import ENV_VAR, FailpointError
from recovery.cli import main

HOLD = Rollover(target_file_size=None, max_age_seconds=None, max_epochs=1000)
"""Files are written only by flush(): every sealed row is held in the log store until then."""


def _status(capsys, *args: str) -> dict:
    capsys.readouterr()
    assert main(["status", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_status_from_the_log_store_counts_the_backlog_as_the_state_directory_does(spark, tmp_path, capsys, monkeypatch):
    source, checkpoint = tmp_path / "input", tmp_path / "checkpoint"
    sink = ExactlyOnceParquetSink(
        str(tmp_path / "out"),
        tmp_path / "state",
        log_store=str(tmp_path / "log"),
        vnodes=8,
        parallelism=2,
        rollover=HOLD,
    )
    for batch in range(2):
        input_file(source, batch)
    assert run_query(spark, sink, source, checkpoint) is None
    sink.flush()  # epochs 0 and 1 committed: the home keeps their records until its next sweep
    for batch in range(2, 4):
        input_file(source, batch)
    assert run_query(spark, sink, source, checkpoint) is None  # epochs 2 and 3 held
    monkeypatch.setenv(ENV_VAR, "filesink.commit.before=raise")  # the driver dies between pre-commit and commit
    try:
        sink.flush()
    except FailpointError:
        pass
    else:
        raise AssertionError("the failpoint did not fire")
    monkeypatch.delenv(ENV_VAR)
    sink._state_lock.release()
    sink.log_store.close()

    local = _status(capsys, "--state-dir", str(tmp_path / "state"))
    rebuilt = _status(capsys, "--log-store", str(tmp_path / "log"))
    assert local["last_sealed_epoch"] == rebuilt["last_sealed_epoch"] == 3
    assert local["backlog"]["epochs"] == 2 and local["backlog"]["rows"] == 600, local["backlog"]
    assert rebuilt["backlog"] == local["backlog"], "the rebuilt state holds what the state directory holds"
    assert rebuilt["truncate_points"] == local["truncate_points"]
    names = sorted(f["name"] for f in local["pending_files"])
    assert len(names) == 2 and sorted(f["name"] for f in rebuilt["pending_files"]) == names
    assert rebuilt["damaged_segments"] == local["damaged_segments"] == []

    assert main(["plan", "--log-store", str(tmp_path / "log")]) == 0
    line = next(x for x in capsys.readouterr().err.splitlines() if x.startswith("rebuilt the state of sink"))
    assert "2 epochs held (600 rows)" in line and "2 pending files" in line, line

    # The table form names what it shows as a person reads it, not as Python prints it.
    capsys.readouterr()
    assert main(["status", "--state-dir", str(tmp_path / "state"), "--no-verify"]) == 0
    shown = capsys.readouterr().out
    assert "\n  key columns: all columns\n" in shown and "\n  partition by: none\n" in shown, shown
    assert "None" not in shown and "[" not in shown, shown


def test_status_shows_column_lists_as_words():
    from recovery.cli import _shown

    assert _shown("partition_by", ["event_date", "hour"]) == "event_date, hour"
    assert _shown("key_columns", ["user_id"]) == "user_id"
    assert _shown("key_columns", None) == "all columns" and _shown("partition_by", []) == "none"
