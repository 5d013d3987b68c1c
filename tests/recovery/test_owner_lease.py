"""The owner lease of ``filesink recover apply`` when clocks disagree: a term record renewed by a driver whose
clock ran ahead (its record is from this machine's future) is reported as such, never as a negative age, and
``--owner-lease 0`` always takes over, saying what it assumes. A run so taken over is fenced at its next step."""

from __future__ import annotations

import json
import shutil
import sys
import time
from collections import Counter

import pytest
from helpers import run
from sink_helpers import append_epoch, batch_rows, read_pyarrow

from filesink import ExactlyOnceParquetSink, Rollover
from logstore.errors import FencedError
from logstore.home import describe_age, term_path

HOLD = Rollover(target_file_size=None, max_age_seconds=None, max_epochs=1000)
AHEAD = 3600.0


def _skew(log, term: int, seconds: float) -> None:
    """Move term ``term``'s renewal by ``seconds`` (positive: its driver's clock was ahead of this machine's)."""
    path = log / term_path(term)
    record = json.loads(path.read_text())
    record["alive_at"] = time.time() + seconds
    path.write_text(json.dumps(record))


def _apply(log, *args: str):
    return run(
        [sys.executable, "-m", "recovery", "apply", "--log-store", str(log), *args],
        120,
        "recover apply",
        capture_output=True,
        text=True,
    )


def test_describe_age_names_a_clock_ahead():
    assert describe_age(4.2) == "alive 4 s ago"
    ahead = describe_age(-3594.4)
    assert "its clock is ahead of this one by 3594 s" in ahead and "-" not in ahead, ahead


@pytest.mark.timeout(300)
def test_a_killed_driver_whose_clock_ran_ahead(tmp_path):
    """The driver was killed (its state directory lost with its machine) while its clock ran an hour ahead."""
    out, log = tmp_path / "out", tmp_path / "log"
    sink = ExactlyOnceParquetSink(str(out), tmp_path / "state", log_store=str(log), vnodes=4, rollover=HOLD)
    expected: Counter = Counter()
    for epoch in range(2):
        rows = batch_rows(epoch, 50, seed=7)
        expected.update(rows)
        append_epoch(sink, epoch, rows)
    term = sink.log_store.term
    sink._state_lock.release()
    sink.log_store.close()  # killed: its term record is not closed
    shutil.rmtree(tmp_path / "state")
    _skew(log, term, AHEAD)

    refused = _apply(log, "--json")
    assert refused.returncode == 3, refused.stderr
    assert "its clock is ahead of this one by 3" in refused.stderr and " -3" not in refused.stderr, refused.stderr
    assert "--owner-lease 0" in refused.stderr, refused.stderr
    assert sorted(p.name for p in (log / "home" / "terms").iterdir()) == [term_path(term).rsplit("/", 1)[1]], (
        "refused: no term was taken"
    )

    done = _apply(log, "--owner-lease", "0")
    assert done.returncode == 0, done.stderr
    assert f"--owner-lease 0: taking the sink over from writer term {term}" in done.stderr, done.stderr
    assert "no row is lost" in done.stderr, done.stderr

    after = ExactlyOnceParquetSink(str(out), tmp_path / "state-new", log_store=str(log), vnodes=4, rollover=HOLD)
    after.flush()
    after.close()
    assert Counter(read_pyarrow(str(out), {})) == expected


@pytest.mark.timeout(300)
def test_a_live_owner_taken_over_with_lease_0_is_fenced_and_loses_nothing(tmp_path):
    """The owner's clock is behind (its renewal looks old) or the operator gives ``--owner-lease 0``: apply takes
    over from a run that is still alive; that run is fenced at its next step, and every row is written once."""
    out, log = tmp_path / "out", tmp_path / "log"
    sink = ExactlyOnceParquetSink(str(out), tmp_path / "state", log_store=str(log), vnodes=4, rollover=HOLD)
    expected: Counter = Counter()
    rows = batch_rows(0, 50, seed=8)
    expected.update(rows)
    append_epoch(sink, 0, rows)

    done = _apply(log, "--owner-lease", "0", "--state-dir", str(tmp_path / "state-op"))
    assert done.returncode == 0, done.stderr
    assert "--owner-lease 0: taking the sink over" in done.stderr, done.stderr
    with pytest.raises(FencedError):
        append_epoch(sink, 1, batch_rows(1, 50, seed=8))
    sink._state_lock.release()
    sink.log_store.close()

    after = ExactlyOnceParquetSink(str(out), tmp_path / "state", log_store=str(log), vnodes=4, rollover=HOLD)
    rows = batch_rows(1, 50, seed=8)  # Spark runs the batch the fenced run failed again
    expected.update(rows)
    append_epoch(after, 1, rows)
    after.flush()
    after.close()
    assert Counter(read_pyarrow(str(out), {})) == expected
