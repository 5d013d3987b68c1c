"""A sink refuses, before it writes anything, a state that is behind the query's checkpoint (restored from a
backup: a batch id past the next one), and a take-over of a lost sink's output (``accept_state_loss``) whose
checkpoint was lost too (batch 0 again, over an output that holds the rows already). A refused start of a new
state leaves the state directory as it was; a refusal at the first batch names what the start left there.

Batches are passed to the sink as ``foreachBatch`` passes them: a DataFrame and its batch id.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections import Counter
from pathlib import Path

import pytest
import run_server
from sink_helpers import batch_df, batch_rows, input_file, parquet_files, read_pyarrow

from filesink import ExactlyOnceParquetSink, OutputClaimedError, Rollover
from filesink.errors import OutputHasRowsError, StateBehindError
from filesink.output import CLAIM_NAME, MARK_NAME
from logstore import LogStoreClaimedError

EVERY_EPOCH = Rollover(target_file_size=None, max_age_seconds=None, max_epochs=1)
"""Each batch is written to files at once: the output holds every batch taken."""


def _sink(root: Path, state: str = "state", **kwargs) -> ExactlyOnceParquetSink:
    options = {"vnodes": 8, "parallelism": 2, "rollover": EVERY_EPOCH, **kwargs}
    return ExactlyOnceParquetSink(str(root / "out"), root / state, **options)


def _claimed(root: Path) -> str:
    return json.loads((root / "out" / CLAIM_NAME).read_text())["sink_id"]


def _feed(spark, sink: ExactlyOnceParquetSink, batch: int, rows: int = 50, seed: int = 0) -> Counter:
    data = batch_rows(batch, rows, seed=seed)
    sink(batch_df(spark, data), batch)
    return Counter(data)


def test_a_state_restored_from_a_backup_is_refused_unless_the_loss_is_accepted(spark, tmp_path):
    """The state directory (with its local log store) is copied after batch 1, the query goes on to batch 3, then
    the copy is restored: batch 4 arrives at a state whose last epoch is 1. Taking it would lose the rows of
    batches 2 and 3 held but not written, and write again what was written after the copy."""
    expected = Counter()
    sink = _sink(tmp_path)
    for batch in (0, 1):
        expected += _feed(spark, sink, batch)
    sink.close()
    shutil.copytree(tmp_path / "state", tmp_path / "backup")
    sink = _sink(tmp_path)
    for batch in (2, 3):
        expected += _feed(spark, sink, batch)
    sink.close()
    assert read_pyarrow(str(tmp_path / "out")) == expected
    files = parquet_files(str(tmp_path / "out"))

    shutil.rmtree(tmp_path / "state")
    shutil.copytree(tmp_path / "backup", tmp_path / "state")
    # Files were committed after the copy: the output's commit mark is ahead of the restored state, and the start
    # is refused before the first batch.
    with pytest.raises(StateBehindError, match="committed through epoch 3"):
        _sink(tmp_path)
    assert parquet_files(str(tmp_path / "out")) == files, "nothing written"
    # A mark that lags (lost in a crash between a commit and its write) leaves the batch's gap to tell.
    (tmp_path / "out" / MARK_NAME).unlink()
    restored = _sink(tmp_path)
    assert restored.log_store.last_sealed_epoch == 1
    with pytest.raises(StateBehindError) as refused:
        _feed(spark, restored, 4)
    message = str(refused.value)
    for part in ("batch 4 arrived", "last epoch this sink sealed is 1", str(tmp_path / "state"), "batches 2 to 3"):
        assert part in message, (part, message)
    assert "restored from a backup" in message and "accept_state_loss=True" in message, message
    assert restored.log_store.last_sealed_epoch == 1, "nothing sealed"
    restored.close()
    assert parquet_files(str(tmp_path / "out")) == files, "nothing written"
    assert read_pyarrow(str(tmp_path / "out")) == expected

    accepted = _sink(tmp_path, accept_state_loss=True)
    expected += _feed(spark, accepted, 4)
    assert accepted.log_store.last_sealed_epoch == 4
    accepted.flush()
    accepted.close()
    # Everything up to batch 1 was in files when the copy was made, and batches 2 and 3 were written before the
    # restore: here nothing is lost or written twice.
    assert read_pyarrow(str(tmp_path / "out")) == expected


def test_taking_over_a_lost_sinks_output_with_a_new_checkpoint_is_refused_unless_duplicates_are_accepted(
    spark, tmp_path
):
    """The state directory is lost, and with it the query's checkpoint: the new sink gets batch 0, the input read
    again from the start. Taken, every row the output holds would be there twice."""
    old = _sink(tmp_path)
    first = _feed(spark, old, 0, rows=120)
    old_id = old.log_store.sink_id
    old.close()
    files = parquet_files(str(tmp_path / "out"))
    assert files and read_pyarrow(str(tmp_path / "out")) == first
    shutil.rmtree(tmp_path / "state")

    replacing = _sink(tmp_path, accept_state_loss=True)
    assert _claimed(tmp_path) == old_id, "the output is taken over at the first batch, not at the start"
    with pytest.raises(OutputHasRowsError) as refused:
        _feed(spark, replacing, 0, rows=120)
    message = str(refused.value)
    assert f"holds 120 rows in {len(files)} Parquet files" in message, message
    assert f"still names sink {old_id}" in message and "accept_duplicates=True" in message, message
    assert "old checkpoint" in message and "new output" in message, message
    # The state directory holds exactly what the message says the start left.
    left = re.search(r"state in (\S+) \(([^)]*)\) holds nothing sealed", message)
    assert left is not None, message
    assert left.group(1) == str(tmp_path / "state")
    assert sorted(left.group(2).split(", ")) == sorted(os.listdir(tmp_path / "state"))
    assert replacing.log_store.last_sealed_epoch == -1, "nothing sealed"
    replacing.close()
    assert parquet_files(str(tmp_path / "out")) == files, "nothing written"
    assert read_pyarrow(str(tmp_path / "out")) == first
    assert _claimed(tmp_path) == old_id

    duplicating = _sink(tmp_path, accept_state_loss=True, accept_duplicates=True)
    assert _feed(spark, duplicating, 0, rows=120) == first
    duplicating.flush()
    assert _claimed(tmp_path) == duplicating.log_store.sink_id
    duplicating.close()
    assert read_pyarrow(str(tmp_path / "out")) == first + first, "accepted: every row twice"


def test_a_refused_start_of_a_new_state_leaves_the_state_directory_as_it_was(spark, tmp_path):
    """The output's claim is checked before the state is created; a refusal after it (the log store is another
    sink's) removes what the start created."""
    owner = _sink(tmp_path, log_store=str(tmp_path / "shared-log"))
    rows = _feed(spark, owner, 0)
    owner.close()
    shutil.rmtree(tmp_path / "state")
    home = sorted(p.relative_to(tmp_path).as_posix() for p in (tmp_path / "shared-log").rglob("*"))

    with pytest.raises(OutputClaimedError, match=r"belongs to sink .*nothing was created in the state directory"):
        _sink(tmp_path)
    assert not (tmp_path / "state").exists()
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "notes.txt").write_text("kept")
    with pytest.raises(OutputClaimedError):
        _sink(tmp_path)
    assert os.listdir(tmp_path / "state") == ["notes.txt"]

    # A new state on the log store of a sink that writes to another output: refused after the state database
    # was created, which is removed again, with the output directory the start created.
    with pytest.raises(LogStoreClaimedError, match="Nothing was written or deleted"):
        ExactlyOnceParquetSink(
            str(tmp_path / "out-b"), tmp_path / "state-b", log_store=str(tmp_path / "shared-log"), vnodes=8
        )
    assert not (tmp_path / "state-b").exists() and not (tmp_path / "out-b").exists()
    assert sorted(p.relative_to(tmp_path).as_posix() for p in (tmp_path / "shared-log").rglob("*")) == home
    assert read_pyarrow(str(tmp_path / "out")) == rows


@pytest.mark.slow
def test_filesink_run_refuses_a_take_over_that_would_read_the_input_again(spark, tmp_path):
    """``filesink run`` keeps the checkpoint in the state directory: when that is lost, a run is refused before
    its state is created, and one with ``--accept-state-loss`` at its batch 0, with the rows the output holds."""
    source = tmp_path / "in"
    rows = input_file(source, 0, rows=200)
    old = _sink(tmp_path)
    assert _feed(spark, old, 0, rows=200, seed=7) == rows  # the same rows as the input file: what its batch 0 was
    old_id = old.log_store.sink_id
    old.close()
    files = parquet_files(str(tmp_path / "out"))
    shutil.rmtree(tmp_path / "state")

    def filesink(*extra: str):
        args = ["run", "--input", str(source), "--output", str(tmp_path / "out")]
        args += ["--state-dir", str(tmp_path / "state"), "--available-now"]
        args += ["--conf", "spark.driver.extraJavaOptions=-XX:TieredStopAtLevel=1", *extra]
        return run_server.filesink(args, 240)

    refused = filesink()
    assert refused.returncode == 1, refused.stderr[-3000:]
    assert f"belongs to sink {old_id}" in refused.stderr, refused.stderr[-3000:]
    assert not (tmp_path / "state").exists(), "nothing created"

    refused = filesink("--accept-state-loss")
    assert refused.returncode == 1, refused.stderr[-3000:]
    error = refused.stderr[refused.stderr.index("error: batch 0 arrived") :]
    assert "holds 200 rows in" in error and "--accept-duplicates" in error, error
    assert parquet_files(str(tmp_path / "out")) == files
    assert read_pyarrow(str(tmp_path / "out")) == rows
    assert _claimed(tmp_path) == old_id
