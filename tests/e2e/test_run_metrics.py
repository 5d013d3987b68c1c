"""``filesink run --metrics-port --log-format json`` killed with SIGKILL between a roll's write and its commit, and
run again: counters start at 0 in each run, the next run's recovery commits (and counts) the file the killed run
wrote, and over the runs rows, files and bytes committed add up to the output's exactly."""

from __future__ import annotations

import itertools
import json
import os
import socket
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import communicate, kill, run, wait_for_line, wait_until
from metrics_scrape import sink_samples
from run_helpers import FAST_START
from sink_helpers import COLUMNS, TYPES, batch_rows, read_pyarrow

from logstore.failpoints import DIR_VAR, ENV_VAR, FIRED_LOG

FIGURES = ("rows_committed_total", "files_committed_total", "bytes_committed_total")


def _args(tmp_path: Path, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "filesink",
        "run",
        "--input",
        str(tmp_path / "in"),
        "--output",
        str(tmp_path / "out"),
        "--state-dir",
        str(tmp_path / "state"),
        "--key",
        "user_id",
        "--parallelism",
        "2",
        "--max-files-per-trigger",
        "1",
        "--target-file-size",
        "1",  # every roll writes what is held: files at every batch
        "--max-file-age",
        "off",
        "--metrics-port",
        "0",
        "--log-format",
        "json",
        "--conf",
        FAST_START,
        *extra,
    ]


def _records(out: str) -> list[dict]:
    """Every stdout line as JSON: nothing else may be there."""
    return [json.loads(line) for line in out.splitlines()]


def _url(records: list[dict]) -> str:
    [notice] = [r for r in records if r["event"] == "notice" and r["message"].startswith("metrics: serving at ")]
    return str(notice["message"].removeprefix("metrics: serving at "))


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_counters_over_a_kill_and_a_restart_add_up_to_the_output(tmp_path):
    expected: Counter = Counter()
    for b in range(5):
        data = batch_rows(b, 200, seed=9)
        expected.update(data)
        table = pa.table({c: pa.array(v, t) for c, v, t in zip(COLUMNS, zip(*data, strict=True), TYPES, strict=True)})
        (tmp_path / "in").mkdir(exist_ok=True)
        pq.write_table(table, tmp_path / "in" / f"in-{b:03d}.parquet")
    fired = Path(os.environ[DIR_VAR]) / FIRED_LOG
    seen_before = fired.read_text() if fired.exists() else ""

    # Run 1: the second roll that commits files hangs after its files are written, before their commit.
    env = dict(os.environ, **{ENV_VAR: "filesink.commit.before=hang@2"})
    proc = subprocess.Popen(
        _args(tmp_path, "--trigger", "500ms"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
    )
    try:
        line = wait_for_line(proc, lambda text: "metrics: serving at" in text, 120, "the metrics notice", skip=True)
        url = _url(_records(line))
        first = sink_samples(url)
        assert first["rows_appended_total"] == 0 and first["rows_committed_total"] == 0, first
        term = first["writer_term"]

        def hung() -> bool:
            return fired.exists() and "filesink.commit.before" in fired.read_text().removeprefix(seen_before)

        wait_until(hung, 240, "run 1 to reach the hanging commit", proc=proc)
        run1 = sink_samples(url)  # the hung run's last figures: nothing more is committed before the kill
        assert run1["pending_files"] > 0, run1
        assert run1["files_committed_total"] > 0, "the first roll committed files"
        assert run1["rows_appended_total"] > run1["rows_committed_total"], run1
    finally:
        kill(proc, group=True)
    out1, _ = communicate(proc, 30, "the killed run's pipes")
    records1 = _records(out1)
    rolls1 = [r for r in records1 if r["event"] == "roll"]
    assert rolls1 and rolls1[-1]["rows_committed_total"] == run1["rows_committed_total"]

    # Run 2: counters start again at 0; its recovery commits the hung roll's written files, and counts them.
    proc = subprocess.Popen(
        _args(tmp_path, "--available-now"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        line = wait_for_line(proc, lambda text: "metrics: serving at" in text, 120, "the metrics notice", skip=True)
        start2 = sink_samples(_url(_records(line)))  # before Spark has started: the figures at the start
        out2, err2 = communicate(proc, 300, "run 2 to finish")
    finally:
        kill(proc, group=True)
    assert proc.returncode == 0, err2[-3000:]
    assert start2["writer_term"] == term + 1
    assert start2["rows_appended_total"] == 0, "a new run's counters start at 0"
    assert start2["rows_committed_total"] > 0 and start2["pending_files"] == 0, "recovery committed the hung files"
    records2 = _records(line + out2)
    assert {r["event"] for r in records2} <= {"notice", "batch", "roll"}
    batches = [r for r in records2 if r["event"] == "batch"]
    assert batches and all(r["duration_seconds"] >= 0 and "epoch" in r for r in batches)
    assert any(r["replay"] for r in batches), "the batch whose roll hung was sealed: Spark replays it"
    last = [r for r in records2 if r["event"] == "roll"][-1]
    for earlier, later in itertools.pairwise(records2):
        for name in FIGURES:
            if name in earlier and name in later:
                assert later[name] >= earlier[name], (name, earlier, later)
    assert last["rows_held"] == 0 and last["pending_files"] == 0

    # Over the two runs: the output's rows, files and bytes, each counted by exactly one run.
    assert read_pyarrow(str(tmp_path / "out")) == expected
    files = sorted((tmp_path / "out").glob("*.parquet"))
    rows = sum(pq.ParquetFile(f).metadata.num_rows for f in files)
    assert rows == sum(expected.values())
    assert run1["rows_committed_total"] + last["rows_committed_total"] == rows
    assert run1["files_committed_total"] + last["files_committed_total"] == len(files)
    assert run1["bytes_committed_total"] + last["bytes_committed_total"] == sum(f.stat().st_size for f in files)


def test_a_metrics_port_in_use_stops_the_run_before_the_state_is_made(tmp_path):
    (tmp_path / "in").mkdir()
    data = batch_rows(0, 10)
    table = pa.table({c: pa.array(v, t) for c, v, t in zip(COLUMNS, zip(*data, strict=True), TYPES, strict=True)})
    pq.write_table(table, tmp_path / "in" / "in-000.parquet")
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    try:
        args = _args(tmp_path, "--available-now")
        args[args.index("--metrics-port") + 1] = str(port)
        done = run(args, 120, capture_output=True, text=True)
    finally:
        taken.close()
    assert done.returncode == 1, done.stderr[-2000:]
    assert done.stdout == ""
    assert f"error: cannot serve the metrics of the sink of {tmp_path / 'out'} at http://127.0.0.1:{port}/metrics" in (
        done.stderr
    )
    assert "choose another port" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "out").exists() and not (tmp_path / "state").exists(), "nothing may be written"
