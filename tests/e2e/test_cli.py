"""``filesink recover status|plan|apply`` against real sink state directories, without Spark."""

from __future__ import annotations

import json
import random
import re
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest
from sink_helpers import COLUMNS, batch_rows, read_pyarrow

from filesink import ExactlyOnceParquetSink, Rollover
from filesink.schema.conform import file_schema_bytes
from logstore.failpoints import ENV_VAR, FailpointError


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "filesink", *args], capture_output=True, text=True, timeout=120)


def cli_json(*args: str) -> dict:
    proc = cli(*args, "--json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def _sink(tmp_path, partition_by=None):
    return ExactlyOnceParquetSink(
        str(tmp_path / "out"),
        tmp_path / "state",
        vnodes=8,
        parallelism=2,
        partition_by=partition_by,
        rollover=Rollover(target_file_size=None, max_epochs=1000, max_age_seconds=None),
    )


def _crashed_sink(tmp_path, monkeypatch, point, partition_by=None):
    """Three epochs appended in-process (no Spark), then a flush that fails at ``point``: files stay pending."""
    sink = _sink(tmp_path, partition_by)
    rng = random.Random(1)
    expected = []
    for epoch in range(3):
        rows = batch_rows(epoch, 50)
        expected += rows
        table = pa.table(dict(zip(COLUMNS, zip(*rows, strict=True), strict=True)))
        table = table.append_column("__vnode", pa.array([rng.randrange(8) for _ in rows], pa.int32()))
        desc = sink.log_store.append(epoch, table)
        sink.log_store.seal(epoch, [desc])
        if epoch == 0:
            sink.ledger.record_schema("[]", file_schema_bytes(desc.schema_bytes))
    monkeypatch.setenv(ENV_VAR, f"{point}=raise")
    with pytest.raises(FailpointError):
        sink.flush()
    monkeypatch.delenv(ENV_VAR)
    sink.close()
    return sorted(expected)


def test_invisible_files_are_planned_as_drop_and_applied_once(tmp_path, monkeypatch):
    expected = _crashed_sink(tmp_path, monkeypatch, "filesink.precommit.after")
    state = str(tmp_path / "state")
    status = cli_json("recover", "status", "--state-dir", state, "--parallelism", "4")
    assert status["last_sealed_epoch"] == 2 and status["held_by"] is None
    assert len(status["pending_files"]) == 2
    assert [w["vnodes"] for w in status["writers"]] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert sum(w["rows"] for w in status["writers"]) == status["backlog"]["rows"] == 150

    plan = cli_json("recover", "plan", "--state-dir", state)
    assert [f["action"] for f in plan["files"]] == ["drop", "drop"]
    assert not plan["nothing_to_do"]
    assert cli_json("recover", "status", "--state-dir", state) == {k: v for k, v in status.items() if k != "writers"}

    done = cli_json("recover", "apply", "--state-dir", state)
    assert [f["action"] for f in done["files"]] == ["drop", "drop"]
    after = cli_json("recover", "status", "--state-dir", state)
    assert after["pending_files"] == [] and set(after["truncate_points"].values()) == {-1}

    again = cli_json("recover", "apply", "--state-dir", state)
    assert again["files"] == [] and again["nothing_to_do"] and again["fenced"] == 0
    assert again["writer_term"] == after["writer_term"] + 1, "each apply takes the next writer term"
    assert cli_json("recover", "status", "--state-dir", state) == {**after, "writer_term": after["writer_term"] + 1}

    sink = _sink(tmp_path)  # the data was rewound: a flush writes it, once
    sink.flush()
    sink.close()
    assert sorted(read_pyarrow(str(tmp_path / "out")).elements()) == expected


@pytest.mark.parametrize("partition_by", [None, ["event_date"]])
def test_visible_files_are_committed(tmp_path, monkeypatch, partition_by):
    expected = _crashed_sink(tmp_path, monkeypatch, "filesink.write.after", partition_by)
    state = str(tmp_path / "state")
    plan = cli_json("recover", "plan", "--state-dir", state)
    action = "commit"  # partitioned too: the writer's records show that every object is visible
    assert [f["action"] for f in plan["files"]] == [action, action]
    assert all(f["visible_objects"] for f in plan["files"])
    proc = cli("recover", "apply", "--state-dir", state)
    assert proc.returncode == 0, proc.stderr
    assert re.search(rf"\[2/2\] part-\S+: {action}", proc.stderr), "progress is shown"
    assert "pending files resolved: 2" in proc.stdout
    status = cli_json("recover", "status", "--state-dir", state)
    assert status["pending_files"] == [] and set(status["truncate_points"].values()) == {2}
    parts = ("event_date",) if partition_by else ()
    assert sorted(read_pyarrow(str(tmp_path / "out"), None, parts).elements()) == expected


def test_apply_refuses_while_a_live_query_holds_the_sink(tmp_path, monkeypatch):
    _crashed_sink(tmp_path, monkeypatch, "filesink.precommit.after")
    sink = _sink(tmp_path)  # a live sink (its own start-up already resolved the files)
    try:
        proc = cli("recover", "apply", "--state-dir", str(tmp_path / "state"))
        assert proc.returncode == 3
        assert "in use by another live sink" in proc.stderr and "OS file lock" in proc.stderr
        status = cli_json("recover", "status", "--state-dir", str(tmp_path / "state"))
        assert status["held_by"].startswith("pid ")
    finally:
        sink.close()


def test_human_output_and_exit_codes(tmp_path, monkeypatch):
    _crashed_sink(tmp_path, monkeypatch, "filesink.precommit.after")
    proc = cli("recover", "status", "--state-dir", str(tmp_path / "state"))
    assert proc.returncode == 0
    assert "truncate points" in proc.stdout and "pending files: 2" in proc.stdout
    assert re.search(r"-1\s+0-7", proc.stdout), proc.stdout
    proc = cli("recover", "plan", "--state-dir", str(tmp_path / "state"))
    assert "pending files to resolve: 2" in proc.stdout and "drop" in proc.stdout
    missing = cli("recover", "status", "--state-dir", str(tmp_path / "nowhere"))
    assert missing.returncode == 4 and "not a sink's state directory" in missing.stderr
    assert cli("recover", "status").returncode == 2
    assert cli("recover", "status", "--state-dir", str(tmp_path / "state"), "--parallelism", "0").returncode == 2


def test_console_script_is_installed():
    script = Path(sys.executable).with_name("filesink")
    proc = subprocess.run([str(script), "recover", "--help"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "status" in proc.stdout and "apply" in proc.stdout
