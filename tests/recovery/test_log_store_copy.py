"""A copy of a sink's log store at another location carries the sink's id, but not its fencing: its writer terms are
taken in its own durable home. The output's claim binds the log store's location, so a start (or ``recover apply``)
on a copy is refused before anything is written; a move on purpose is recorded with ``filesink recover
move-log-store``, which refuses when the old location was used after the copy was made.

The batches come from real Spark streaming queries; the command runs through its entry point."""

from __future__ import annotations

import json
import re
import shutil
import sys

import fsspec
import pytest
from helpers import run
from sink_helpers import input_file, parquet_files, read_pyarrow, run_query

from filesink import ExactlyOnceParquetSink, Rollover
from filesink.errors import LogStoreMovedError
from filesink.output import CLAIM_NAME
from logstore.storage import LogLocation
from recovery.cli import main

HOLD = Rollover(target_file_size=None, max_age_seconds=None, max_epochs=1000)
"""Files are written only by flush(): every sealed row is held in the log store until then."""


def _claim(output: str, options: dict) -> dict:
    return json.loads(LogLocation(output, options).open().read_all(CLAIM_NAME))


def test_a_copy_of_the_log_store_is_refused_and_the_original_goes_on(
    spark, tmp_path, s3_server, s3_prefix, s3_options, capsys, monkeypatch
):
    out, log, copy = s3_prefix + "/out", s3_prefix + "/log", s3_prefix + "/log-copy"

    def sink(state: str, log_store: str) -> ExactlyOnceParquetSink:
        return ExactlyOnceParquetSink(
            out,
            tmp_path / state,
            log_store=log_store,
            vnodes=8,
            parallelism=2,
            rollover=HOLD,
            storage_options=s3_options,
        )

    source, checkpoint = tmp_path / "input", tmp_path / "checkpoint"
    expected = input_file(source, 0) + input_file(source, 1)
    a = sink("state-a", log)
    sink_id = a.log_store.sink_id
    assert run_query(spark, a, source, checkpoint) is None
    a.flush()
    a.close()
    assert _claim(out, s3_options) == {"sink_id": sink_id, "log_store": log}

    fs, root = fsspec.core.url_to_fs(s3_prefix, **s3_options)
    fs.copy(f"{root}/log", f"{root}/log-copy", recursive=True)  # the prefix copied (aws s3 cp --recursive)
    fs.invalidate_cache()
    files = parquet_files(out, s3_options)
    with pytest.raises(LogStoreMovedError) as refused:
        sink("state-b", copy)  # a new state directory: rebuilt from the copy's durable home
    message = str(refused.value)
    assert f"belongs to sink {sink_id} with its log store at {log}" in message, message
    assert f"this run of sink {sink_id} has its log store at {copy}" in message
    assert "Nothing was written or deleted" in message and f"move-log-store --log-store {copy}" in message
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", s3_server.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3_server.secret_key)
    flags = ["--endpoint-url", s3_server.endpoint, "--region", s3_server.region]
    assert main(["apply", "--log-store", copy, *flags]) == 1  # nor does recovery run on the copy
    assert "belongs to sink" in capsys.readouterr().err
    assert parquet_files(out, s3_options) == files, "nothing was written to the output"
    assert _claim(out, s3_options)["log_store"] == log

    # A claim of an earlier version (no location) is taken as the location of the run that starts.
    LogLocation(out, s3_options).open().put(CLAIM_NAME, json.dumps({"sink_id": sink_id}).encode())
    again = sink("state-a", log)
    assert _claim(out, s3_options) == {"sink_id": sink_id, "log_store": log}
    again.close()
    assert read_pyarrow(out, s3_options) == expected, "every row once"


def test_a_state_directory_moved_on_purpose_is_recorded_by_move_log_store(spark, tmp_path):
    """The default log store is ``<state_dir>/log``: a state directory copied to another path is a copy of its log
    store. The move is refused while the old one is newer than the copy, then recorded; the old one is refused."""
    out, old, new = str(tmp_path / "out"), tmp_path / "state", tmp_path / "state-moved"

    def sink(state) -> ExactlyOnceParquetSink:
        return ExactlyOnceParquetSink(out, state, vnodes=8, parallelism=2, rollover=HOLD)

    def move(*args: str):
        return run(
            [sys.executable, "-m", "filesink", "recover", "move-log-store", *args],
            120,
            "recover move-log-store",
            capture_output=True,
            text=True,
        )

    source, checkpoint = tmp_path / "input", tmp_path / "checkpoint"
    expected = input_file(source, 0) + input_file(source, 1)
    first = sink(old)
    sink_id = first.log_store.sink_id
    assert run_query(spark, first, source, checkpoint) is None  # batches 0 and 1 held in the log store
    first.close()

    shutil.copytree(old, new)
    sink(old).close()  # the old state directory ran again after the copy (a newer writer term there)
    stale = move("--state-dir", str(new))
    assert stale.returncode == 1, stale.stderr
    assert f"{old}/log was used after it was copied to {new}/log" in stale.stderr, stale.stderr
    assert _claim(out, {})["log_store"] == f"{old}/log", "nothing changed"

    shutil.rmtree(new)
    shutil.copytree(old, new)
    done = move("--state-dir", str(new))
    assert done.returncode == 0, done.stderr
    assert f"moved from {old}/log" in done.stdout and "set aside as" in done.stdout, done.stdout
    assert _claim(out, {}) == {"sink_id": sink_id, "log_store": f"{new}/log"}
    again = move("--state-dir", str(new), "--json")  # idempotent: an interrupted move is finished by running again
    assert again.returncode == 0, again.stderr
    result = json.loads(again.stdout)
    assert not result["claim_moved"] and not result["state_database"]["rebuilt"], result

    with pytest.raises(LogStoreMovedError, match=rf"state directory's log/ subdirectory.*{re.escape(str(new))}/log"):
        sink(old)
    expected += input_file(source, 2)
    moved = sink(new)
    assert moved.log_store.sink_id == sink_id
    assert run_query(spark, moved, source, checkpoint) is None  # the query goes on from its checkpoint: batch 2
    moved.flush()
    assert read_pyarrow(out) == expected, "every row once"
    moved.close()
