"""``filesink recover`` without a state directory: ``--log-store URL`` rebuilds the sink's state from its durable
home, in memory for ``status`` and ``plan`` (nothing written anywhere) and for ``apply`` (which writes only to the
home and the output); a sink started afterwards with a new state directory finds everything resolved."""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections import Counter

import pytest
from helpers import run
from sink_helpers import append_epoch, batch_rows, read_pyarrow

from filesink import ExactlyOnceParquetSink, Rollover
from logstore.failpoints import ENV_VAR, FailpointError

HOLD = Rollover(target_file_size=None, max_age_seconds=None, max_epochs=1000)


@pytest.fixture
def lost(tmp_path, s3_server, s3_prefix, monkeypatch):
    """A sink on S3 whose run died with two files pre-committed (one visible), then lost its state directory."""
    options = s3_server.storage_options()
    out, log = s3_prefix + "/out", s3_prefix + "/log"

    def open_sink(state: str) -> ExactlyOnceParquetSink:
        return ExactlyOnceParquetSink(
            out, tmp_path / state, log_store=log, vnodes=8, parallelism=2, rollover=HOLD, storage_options=options
        )

    sink = open_sink("state")
    expected: Counter = Counter()
    for epoch in range(3):
        rows = batch_rows(epoch, 100, seed=4)
        expected.update(rows)
        append_epoch(sink, epoch, rows)
    monkeypatch.setattr("logstore.failpoints._hits", {})  # count from here: "@2" is this process's 2nd hit
    os.environ[ENV_VAR] = "filesink.write.publish.before=raise@2"
    try:
        with pytest.raises(FailpointError):
            sink.flush()
    finally:
        del os.environ[ENV_VAR]
    sink_id = sink.log_store.sink_id
    sink._state_lock.release()
    sink.log_store.close()
    shutil.rmtree(tmp_path / "state")
    env = dict(os.environ, AWS_ACCESS_KEY_ID=s3_server.access_key, AWS_SECRET_ACCESS_KEY=s3_server.secret_key)
    flags = ["--endpoint-url", s3_server.endpoint, "--region", s3_server.region]
    return {
        "log": log,
        "out": out,
        "options": options,
        "sink_id": sink_id,
        "expected": expected,
        "env": env,
        "flags": flags,
        "open": open_sink,
    }


def _recover(lost, *args: str):
    return run(
        [sys.executable, "-m", "recovery", *args, *lost["flags"]],
        120,
        f"recover {' '.join(args)}",
        env=lost["env"],
        capture_output=True,
        text=True,
    )


def _home(lost) -> list[tuple[str, int]]:
    import fsspec

    fs, root = fsspec.core.url_to_fs(lost["log"], **lost["options"])
    fs.invalidate_cache()
    return sorted((p, int(i["size"])) for p, i in fs.find(root, detail=True).items())


def test_status_and_plan_rebuild_in_memory_and_change_nothing(lost, tmp_path):
    before = _home(lost)
    status = _recover(lost, "status", "--log-store", lost["log"], "--json")
    assert status.returncode == 0, status.stderr
    s = json.loads(status.stdout)
    assert s["sink_id"] == lost["sink_id"] and s["last_sealed_epoch"] == 2
    assert s["backlog"]["rows"] == 300 and len(s["pending_files"]) == 2, s
    assert s["damaged_segments"] == []

    plan = _recover(lost, "plan", "--log-store", lost["log"])
    assert plan.returncode == 0, plan.stderr
    assert f"rebuilt the state of sink {lost['sink_id']}" in plan.stderr
    assert "3 epochs held (300 rows)" in plan.stderr and "2 pending files" in plan.stderr
    assert "in memory" in plan.stderr and ":memory:" not in plan.stderr, plan.stderr
    assert "commit" in plan.stdout and "drop" in plan.stdout, plan.stdout
    assert _home(lost) == before, "status and plan wrote nothing to the durable home"
    assert not (tmp_path / "state").exists()


def test_apply_without_a_state_directory_resolves_in_the_home(lost):
    # The killed run renewed its term record moments ago: apply cannot tell it from a live one and refuses.
    alive = _recover(lost, "apply", "--log-store", lost["log"], "--json")
    assert alive.returncode == 3 and "--owner-lease" in alive.stderr, alive.stderr
    done = _recover(lost, "apply", "--log-store", lost["log"], "--json", "--owner-lease", "0")  # it is gone
    assert done.returncode == 0, done.stderr
    actions = sorted(f["action"] for f in json.loads(done.stdout)["files"])
    assert actions == ["commit", "drop"], done.stdout
    again = _recover(lost, "plan", "--log-store", lost["log"], "--json")
    assert json.loads(again.stdout)["files"] == [], "nothing pending any more"

    sink = lost["open"]("state-new")  # a new machine
    assert sink.log_store.rebuilt and sink.ledger.pending_names() == []
    sink.flush()
    assert read_pyarrow(lost["out"], lost["options"]) == lost["expected"]
    sink.close()


def test_what_to_give_when_there_is_no_state(lost, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    missing = _recover(lost, "status", "--state-dir", str(empty))
    assert missing.returncode == 4, missing.stderr
    assert "--log-store" in missing.stderr, missing.stderr
    neither = _recover(lost, "status")
    assert neither.returncode == 2 and "--log-store" in neither.stderr, neither.stderr
    assert neither.stderr.startswith("usage: python -m recovery status"), "the step's usage, not the command's"
    nothing = _recover(lost, "status", "--log-store", lost["log"] + "-nothing-here")
    assert nothing.returncode == 4 and "no sink's durable home" in nothing.stderr, nothing.stderr


def test_apply_into_a_new_state_directory_records_the_s3_endpoint_for_the_next_steps(lost, tmp_path):
    new = tmp_path / "state-new"
    done = _recover(lost, "apply", "--log-store", lost["log"], "--state-dir", str(new), "--owner-lease", "0")
    assert done.returncode == 0, done.stderr
    recorded = json.loads((new / "s3-settings.json").read_text())
    assert recorded == {"endpoint_url": lost["flags"][1], "region_name": lost["flags"][3]}, recorded
    env = {k: v for k, v in lost["env"].items() if not k.startswith("AWS_ENDPOINT_URL")}
    status = run(
        [sys.executable, "-m", "recovery", "status", "--state-dir", str(new), "--json"],
        120,
        "recover status without the S3 flags",
        env=env,
        capture_output=True,
        text=True,
    )
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["pending_files"] == []
