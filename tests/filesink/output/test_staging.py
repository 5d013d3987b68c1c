"""Where a local output's temp files wait before they are renamed into it: on the output's own file system.
``<state dir>/staging`` when the state directory shares it, otherwise ``<output>/_filesink_staging`` (readers
skip it), kept once made. Temp files in the place earlier versions used, ``.<dir>.filesink-staging`` next to
the output, are fenced and removed by recovery like any others."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

from helpers import run
from sink_helpers import append_epoch, batch_rows, read_duckdb, read_pyarrow

from filesink import ExactlyOnceParquetSink, Rollover
from filesink.output import OutputLocation, list_objects
from filesink.output.location import OUTPUT_STAGING, STAGING_SUFFIX

HOLD = Rollover(target_file_size=None, max_age_seconds=None, max_epochs=1000)


def _sink(tmp_path: Path) -> ExactlyOnceParquetSink:
    return ExactlyOnceParquetSink(str(tmp_path / "out"), tmp_path / "state", vnodes=8, rollover=HOLD)


def _recover(step: str, state: Path) -> dict:
    done: subprocess.CompletedProcess[str] = run(
        [sys.executable, "-m", "filesink", "recover", step, "--state-dir", str(state), "--json"],
        120,
        f"filesink recover {step}",
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    result: dict = json.loads(done.stdout)
    return result


def test_the_staging_place_is_on_the_outputs_file_system_and_kept_once_made(tmp_path):
    out, state = tmp_path / "out", tmp_path / "state"
    out.mkdir()
    state.mkdir()
    assert OutputLocation.of_sink(str(out), {}, state).local_staging() == state / "staging"  # one file system
    assert OutputLocation(str(out)).local_staging() == out / OUTPUT_STAGING  # no state directory known
    (out / OUTPUT_STAGING).mkdir()  # made by a sink whose renames from the state directory failed
    assert OutputLocation.of_sink(str(out), {}, state).local_staging() == out / OUTPUT_STAGING
    legacy = tmp_path / f".out{STAGING_SUFFIX}"
    legacy.mkdir()
    assert OutputLocation.of_sink(str(out), {}, state).staging_places() == [out / OUTPUT_STAGING, legacy]


def test_temp_files_in_the_output_staging_directory_are_invisible_to_readers(tmp_path):
    rows = batch_rows(0, 70, seed=2)
    with _sink(tmp_path) as sink:
        append_epoch(sink, 0, rows)
        sink.flush()
    out = tmp_path / "out"
    [written] = [p for p in out.iterdir() if p.suffix == ".parquet"]
    staged = out / OUTPUT_STAGING / "term-0000000009"
    staged.mkdir(parents=True)
    # A whole file, just before its rename: dataset readers (pyarrow, Spark, Trino) skip the directory, and glob
    # readers (DuckDB's and Polars' **/*.parquet) the name, which ends in .tmp.
    shutil.copy(written, staged / f".{written.stem}.00000.attempt.tmp")
    assert read_pyarrow(str(out)) == Counter(rows)
    assert read_duckdb(str(out)) == Counter(rows)
    listed = [key for key, _ in list_objects(OutputLocation(str(out)))]
    assert listed == ["_filesink.json", "_filesink_mark.json", written.name]


def test_recovery_fences_and_removes_what_writers_left_where_earlier_versions_staged(tmp_path):
    """A writer of an earlier version staged next to the output. After it was killed (or while it stalls),
    recovery renames its term's directory away, so that it can never publish, and removes its temp files, the
    loose ones, and a start-up probe's file a crash left in the output; the emptied directory goes too."""
    expected = Counter(batch_rows(0, 50, seed=1))
    with _sink(tmp_path) as sink:
        append_epoch(sink, 0, batch_rows(0, 50, seed=1))
        sink.flush()
        term = sink.term
    out = tmp_path / "out"
    legacy = tmp_path / f".out{STAGING_SUFFIX}"
    stalled = legacy / f"term-{term:010d}"
    stalled.mkdir(parents=True)
    (stalled / ".part-stalled.00000.a1.tmp").write_bytes(b"half a file")
    (legacy / ".part-older.00000.b2.tmp").write_bytes(b"from before writer terms")
    (out / ".filesink-probe-0123456789ab.tmp").touch()
    assert read_pyarrow(str(out)) == expected  # none of it is visible

    plan = _recover("plan", tmp_path / "state")
    assert plan["garbage"]["staging_temp_files"] == 3 and plan["garbage"]["staging_dirs"] == 1, plan
    assert stalled.is_dir(), "plan changes nothing"

    with _sink(tmp_path) as sink:
        assert sink.recovered is not None and sink.recovered.fenced == 1
        assert not legacy.exists() and not (out / ".filesink-probe-0123456789ab.tmp").exists()
        rows = batch_rows(1, 50, seed=1)
        expected.update(rows)
        append_epoch(sink, 1, rows)
        sink.flush()
    assert read_pyarrow(str(out)) == expected
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith("part-")) == [
        "_filesink.json",
        "_filesink_mark.json",
    ]
