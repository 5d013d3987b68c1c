"""The README's first command runs ``filesink demo``: it must kill and restart the job, check its own output,
and fail when the output is not exactly the input. ``python -m logstore demo`` runs the log store alone."""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys

import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from helpers import run

from filesink.cli.main import build_parser
from filesink.demo import verify, write_events


def _run(module: str, tmp_path, *args: str) -> subprocess.CompletedProcess[str]:
    return run(
        [sys.executable, "-m", module, "demo", "--dir", str(tmp_path / "demo"), *args],
        300,
        f"{module} demo",
        capture_output=True,
        text=True,
    )


@pytest.mark.slow
@pytest.mark.timeout(360)  # 80-100 s measured on a busy 2-core machine
# The demo on S3 runs with the chaos tier: the default tier keeps the demo the README runs (local) and kills on S3
# in tests/e2e/test_sink_kills.py.
@pytest.mark.parametrize("s3", [False, pytest.param(True, marks=pytest.mark.chaos)], ids=["local", "s3"])
def test_demo_kills_restarts_and_verifies(tmp_path, s3):
    proc = _run("filesink", tmp_path, "--files", "6", "--rows", "20000", *(["--s3"] if s3 else []))
    out = proc.stdout
    assert proc.returncode == 0, out[-3000:] + proc.stderr[-3000:]
    assert "-- SIGKILL (driver, JVM and Python workers) --" in out
    assert "run 2: the same command" in out
    shown = next(line for line in out.splitlines() if line.startswith("run 1: "))
    words = shlex.split(shown.removeprefix("run 1: "))  # the command as shown can be pasted and runs as is
    assert words[0] == "filesink" and build_parser().parse_args(words[1:]).available_now, shown
    assert "check:  DuckDB, input vs output as multisets: 0 missing, 0 duplicated, 0 unexpected" in out
    assert "ok: every one of the 120,000 input rows is in the output exactly once" in out
    assert ("SeaweedFS started for the demo" in out) == s3
    if not s3:
        files = list((tmp_path / "demo" / "output").rglob("*.parquet"))
        assert files and sum(pq.read_metadata(f).num_rows for f in files) == 120_000
        # The summary counts what is there: the sink's files, and the Parquet objects (one per partition of a file).
        names = {f.name.rsplit("-", 1)[0] for f in files if f.name.count("-") == 7}
        dirs = {f.parent.name for f in files}
        assert len(names) < len(files) and len(dirs) == 2, "the test needs files with an object per partition"
        summary = f"files:  {len(names)} files, as {len(files)} Parquet objects in {len(dirs)} event_date partitions"
        assert summary in out, out


def test_verify_counts_missing_duplicated_and_unexpected_rows(tmp_path):
    landing, output = tmp_path / "landing", tmp_path / "output"
    write_events(landing, 3, 500)
    for f in sorted(landing.glob("*.parquet")):  # the input as Hive partitions, one file per input file and date
        table = pq.read_table(f)
        for date in set(table["event_date"].to_pylist()):
            rows = table.filter(pc.equal(table["event_date"], date)).drop_columns(["event_date"])
            (output / f"event_date={date}").mkdir(parents=True, exist_ok=True)
            pq.write_table(rows, output / f"event_date={date}" / f.name)
    assert verify(landing, str(output)).exact
    part = output / "event_date=2026-11-01"
    assert pq.read_metadata(part / "events-0000.parquet").num_rows == 500
    assert pq.read_metadata(output / "event_date=2026-11-02" / "events-0002.parquet").num_rows == 500
    shutil.copy(part / "events-0000.parquet", part / "copy.parquet")  # 500 rows twice
    (output / "event_date=2026-11-02" / "events-0002.parquet").unlink()  # 500 rows lost
    table = pq.read_table(part / "events-0000.parquet").slice(0, 7)
    pq.write_table(table.set_column(0, "event_id", [list(range(10**9, 10**9 + 7))]), part / "made-up.parquet")
    v = verify(landing, str(output))
    assert (v.missing, v.duplicated, v.unexpected, v.exact) == (500, 500, 7, False)
    assert (v.input_rows, v.output_rows) == (1500, 1507)


def test_log_store_example(tmp_path):
    proc = _run("logstore", tmp_path, "--epochs", "2", "--tasks", "2", "--rows", "1000")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "ok: the 4,000 appended rows were read back exactly once each" in proc.stdout
