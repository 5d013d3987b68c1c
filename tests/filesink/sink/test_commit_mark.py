"""A state directory restored from a backup taken before a commit: the output's commit mark is ahead of it, so the
start is refused before anything is written, even when the query's next batch follows the restored state's last
sealed epoch (no gap to see). Earlier, the restored state wrote those rows again in a file of another plan (with
the next batch's rows): silent duplicates."""

from __future__ import annotations

import shutil
from collections import Counter
from pathlib import Path

import pytest
from sink_helpers import append_epoch, batch_rows, parquet_files, read_pyarrow

from filesink import ExactlyOnceParquetSink, Rollover
from filesink.errors import StateBehindError
from filesink.output import MARK_NAME

HOLD = Rollover(target_file_size=None, max_age_seconds=None, max_epochs=1000)


def _open(tmp_path: Path, **kwargs) -> ExactlyOnceParquetSink:
    """The default setup: the log store (and its durable home) inside the state directory."""
    return ExactlyOnceParquetSink(
        str(tmp_path / "out"), tmp_path / "state", vnodes=8, parallelism=2, rollover=HOLD, **kwargs
    )


def test_a_state_restored_from_before_a_commit_is_refused_and_the_override_writes_them_again(tmp_path):
    sink = _open(tmp_path)
    expected: Counter = Counter()
    for epoch in range(3):
        rows = batch_rows(epoch, 100, seed=21)
        expected.update(rows)
        append_epoch(sink, epoch, rows)
    sink.close()
    shutil.copytree(tmp_path / "state", tmp_path / "backup")  # a volume snapshot: state, log store and home

    sink = _open(tmp_path)
    sink.flush()  # an idle rollover commits the held epochs after the snapshot
    sink.close()
    assert (tmp_path / "out" / MARK_NAME).is_file()
    written = parquet_files(str(tmp_path / "out"))
    assert written and read_pyarrow(str(tmp_path / "out")) == expected

    shutil.rmtree(tmp_path / "state")
    shutil.copytree(tmp_path / "backup", tmp_path / "state")  # the restore
    with pytest.raises(StateBehindError) as refused:
        _open(tmp_path)
    message = str(refused.value)
    assert "committed through epoch 2" in message and "has no epoch of that vnode" in message, message
    assert "epoch -1" not in message, message
    assert "backup" in message and "accept_duplicates=True" in message and "Nothing was written" in message, message
    assert parquet_files(str(tmp_path / "out")) == written, "the refused start wrote nothing"

    with pytest.raises(StateBehindError):  # once more: still refused (a refusal moves no mark)
        _open(tmp_path)

    accepted = _open(tmp_path, accept_state_loss=True, accept_duplicates=True)
    rows = batch_rows(3, 100, seed=21)  # the query's next batch follows the restored state's last epoch
    append_epoch(accepted, 3, rows)
    accepted.flush()  # one file of epochs 0 to 3: another name than the file of 0 to 2
    accepted.close()
    assert read_pyarrow(str(tmp_path / "out")) == expected + expected + Counter(rows), "accepted by name: twice"
    _open(tmp_path).close()  # the mark follows the accepted state: the next start goes on
