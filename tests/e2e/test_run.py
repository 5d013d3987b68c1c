"""``filesink run``: the streaming job from the command line, on local Spark, into local directories and S3.

Bad input fails before Spark starts, with a message naming the problem and nothing written; a good run's
output equals its input exactly; a stop (SIGTERM) is clean and the next run finishes exactly once."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import communicate, kill, wait_for_line
from run_helpers import FAST_START, filesink
from run_helpers import refused as _refused
from run_helpers import run_args as _args
from s3servers import SilentServer
from sink_helpers import COLUMNS, TYPES, batch_rows, read_pyarrow

from filesink.cli.main import parse_duration, parse_size
from filesink.cli.preflight import input_files
from filesink.cli.run import STOPPING
from filesink.cli.sourcelog import listed_files, pending_batch

PARTS = ("event_date",)


def _write(directory: Path, batch: int, rows: int = 300, fmt: str = "parquet") -> list[tuple]:
    """One input file of ``batch_rows(batch)`` in ``fmt``; returns its rows."""
    directory.mkdir(parents=True, exist_ok=True)
    data = batch_rows(batch, rows)
    table = pa.table({c: pa.array(v, t) for c, v, t in zip(COLUMNS, zip(*data, strict=True), TYPES, strict=True)})
    target = directory / f"in-{batch:03d}.{fmt}"
    if fmt == "parquet":
        pq.write_table(table, target)
    elif fmt == "json":
        target.write_text("".join(json.dumps(dict(zip(COLUMNS, r, strict=True))) + "\n" for r in data))
    else:
        target.write_text(",".join(COLUMNS) + "\n" + "".join(",".join(map(str, r)) + "\n" for r in data))
    return data


# -- options -------------------------------------------------------------------------------------------------


def test_sizes_and_durations():
    assert parse_size("128MiB") == 128 * 2**20
    assert parse_size("1GiB") == 2**30
    assert parse_size("64MB") == 64_000_000
    assert parse_size("1048576") == 2**20
    assert parse_size("off") is None
    assert parse_duration("5s") == 5 and parse_duration("500ms") == 0.5
    assert parse_duration("5m") == 300 and parse_duration("1h") == 3600 and parse_duration("30") == 30
    for bad in ("12 parsecs", "-1MiB", "0", "MiB"):
        with pytest.raises(Exception, match="not a size"):
            parse_size(bad)
    with pytest.raises(Exception, match="not a duration"):
        parse_duration("soon")


def test_bad_options_are_usage_errors(tmp_path):
    proc = filesink(*_args(tmp_path, "--target-file-size", "huge"))
    assert proc.returncode == 2 and "not a size" in proc.stderr
    proc = filesink(*_args(tmp_path, "--target-file-size", "off", "--max-file-age", "off"))
    assert proc.returncode == 2 and "cannot both be off" in proc.stderr
    assert not (tmp_path / "state").exists()


def test_input_files_skip_hidden_and_underscore_names(tmp_path):
    for name in ("a.parquet", ".b.parquet.tmp", "_SUCCESS", "sub/c.parquet", "_spark_metadata/0", ".hidden/d"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("x")
    assert [p.relative_to(tmp_path).as_posix() for p in input_files(tmp_path)] == ["a.parquet", "sub/c.parquet"]


# -- bad input: a clear message, a non-zero exit, nothing written (no Spark is started) ---------------------------


def test_missing_input_directory(tmp_path):
    proc = filesink(*_args(tmp_path))
    _refused(tmp_path, proc, f"the input directory {tmp_path / 'in'} does not exist")


def test_input_that_is_a_file(tmp_path):
    (tmp_path / "in").write_text("not a directory")
    _refused(tmp_path, filesink(*_args(tmp_path)), "is a file, not a directory")


def test_unreadable_parquet_file(tmp_path):
    _write(tmp_path / "in", 0)
    (tmp_path / "in" / "in-001.parquet").write_bytes(b"PAR1 this was cut short")
    _refused(tmp_path, filesink(*_args(tmp_path)), str(tmp_path / "in" / "in-001.parquet"), "not a readable Parquet")


def test_input_files_with_different_schemas(tmp_path):
    """A file that lacks columns of the files that landed before it is a removed column, refused as the sink
    refuses it (tests/e2e/test_run_schema.py: the changes the sink takes)."""
    _write(tmp_path / "in", 0)
    pq.write_table(pa.table({"id": [1], "other": ["x"]}), tmp_path / "in" / "in-001.parquet")
    os.utime(tmp_path / "in" / "in-001.parquet", (time.time() + 60, time.time() + 60))  # it landed after in-000
    proc = filesink(*_args(tmp_path))
    _refused(tmp_path, proc, "schema mismatch", "in-000.parquet", "in-001.parquet", "amount (double) is gone")


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_unreachable_s3_endpoint(tmp_path):
    _write(tmp_path / "in", 0)
    endpoint = f"http://127.0.0.1:{_closed_port()}"
    creds = {"AWS_ACCESS_KEY_ID": "AKIAEXAMPLE", "AWS_SECRET_ACCESS_KEY": "s3cr3t-never-printed"}
    started = time.monotonic()
    proc = filesink(*_args(tmp_path, "--s3-endpoint", endpoint, output="s3://bucket/table"), env=creds)
    _refused(tmp_path, proc, f"cannot reach the S3 endpoint {endpoint}", "--s3-endpoint")
    assert time.monotonic() - started < 60, "an unreachable endpoint must fail fast"
    assert "s3cr3t-never-printed" not in proc.stderr + proc.stdout


@pytest.mark.slow
def test_an_s3_endpoint_that_never_answers_fails_the_preflight_in_about_half_a_minute(tmp_path):
    """A server that accepts connections and never answers: with the default limits (15 s read timeout, and the
    probe's one retry) the run stops before anything is written, naming the endpoint and the options to change."""
    _write(tmp_path / "in", 0)
    creds = {"AWS_ACCESS_KEY_ID": "AKIAEXAMPLE", "AWS_SECRET_ACCESS_KEY": "s3cr3t-never-printed"}
    with SilentServer() as silent:
        started = time.monotonic()
        proc = filesink(*_args(tmp_path, "--s3-endpoint", silent.endpoint, output="s3://bucket/table"), env=creds)
        took = time.monotonic() - started
    _refused(tmp_path, proc, f"cannot reach the S3 endpoint {silent.endpoint}", "read_timeout", "--storage-option")
    assert took < 60, f"the probe took {took:.0f} s"
    assert silent.connections == 2, "the probe's two attempts, and no retry loop on top of them"
    assert "s3cr3t-never-printed" not in proc.stderr + proc.stdout


def test_a_mistyped_key_or_partition_column_is_refused_before_spark(tmp_path):
    """From the Parquet footers, or from --schema: in seconds, naming the column and the nearest one, leaving no
    state directory (and no claim) behind."""
    _write(tmp_path / "in", 0)
    args = _args(tmp_path)
    args[args.index("--partition-by") + 1] = "evnt_date"
    started = time.monotonic()
    proc = filesink(*args)
    _refused(tmp_path, proc, "--partition-by evnt_date: the input has no column evnt_date", "did you mean")
    assert "--partition-by event_date?" in proc.stderr and "the Parquet files' footers" in proc.stderr
    assert time.monotonic() - started < 30, "refused before Spark starts"
    args = _args(tmp_path, "--format", "json", "--schema", "id bigint, `user id` bigint, s struct<a:int, b:int>")
    (tmp_path / "in" / "in-000.parquet").unlink()
    proc = filesink(*args)
    _refused(tmp_path, proc, "--partition-by event_date: the input has no column", "id, user id, s")
    args = _args(tmp_path, "--format", "json", "--schema", "id bigint, user_id bigint, event_date string")
    args[args.index("--key") + 1] = "user"
    proc = filesink(*args)
    _refused(tmp_path, proc, "--key user: the input has no column user", "did you mean --key user_id?")


def test_unreachable_spark_master(tmp_path):
    _write(tmp_path / "in", 0)
    port = _closed_port()
    proc = filesink(*_args(tmp_path, "--master", f"spark://127.0.0.1:{port}"))
    _refused(tmp_path, proc, f"cannot reach the Spark master spark://127.0.0.1:{port}", "--master")


def test_wrong_s3_credentials_and_missing_bucket(tmp_path, s3_server):
    _write(tmp_path / "in", 0)
    wrong = {"AWS_ACCESS_KEY_ID": s3_server.access_key, "AWS_SECRET_ACCESS_KEY": "wrong-secret-never-printed"}
    output = s3_server.url("table")
    proc = filesink(*_args(tmp_path, "--s3-endpoint", s3_server.endpoint, output=output), env=wrong)
    _refused(tmp_path, proc, "refused access", f"access key id {s3_server.access_key[:4]}…", "AWS_SECRET_ACCESS_KEY")
    assert "wrong-secret-never-printed" not in proc.stderr + proc.stdout
    assert s3_server.secret_key not in proc.stderr + proc.stdout
    right = {"AWS_ACCESS_KEY_ID": s3_server.access_key, "AWS_SECRET_ACCESS_KEY": s3_server.secret_key}
    args = _args(tmp_path, "--s3-endpoint", s3_server.endpoint, output="s3://no-such-bucket-here/table")
    _refused(tmp_path, filesink(*args, env=right), "bucket 'no-such-bucket-here' does not exist")


# -- runs ----------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_available_now_then_more_input_then_a_schema_change(tmp_path):
    expected = Counter(_write(tmp_path / "in", 0) + _write(tmp_path / "in", 1))
    proc = filesink(*_args(tmp_path, "--available-now", "--max-files-per-trigger", "1"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "done: 600 rows in (2 batches)" in proc.stdout
    assert "the log store holds nothing" in proc.stdout
    assert "epoch 1:" in proc.stderr, "progress is shown (a line per epoch when not on a terminal)"
    for noise in ("Setting default log level", "NativeCodeLoader", "resolves to a loopback address"):
        assert noise not in proc.stderr, proc.stderr[:3000]
    assert read_pyarrow(str(tmp_path / "out"), None, PARTS) == expected

    expected.update(_write(tmp_path / "in", 2))  # a file lands later: only it is read by the next run
    proc = filesink(*_args(tmp_path, "--available-now"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "done: 300 rows in (1 batch)" in proc.stdout
    assert read_pyarrow(str(tmp_path / "out"), None, PARTS) == expected

    # The same sink fed files of another schema: refused before the query starts, nothing changes.
    (tmp_path / "in2").mkdir()
    odd = {"id": [1, 2], "user_id": [3, 4], "event_date": ["2024-01-01"] * 2, "amount": ["1.5", "2.5"]}
    pq.write_table(pa.table(odd), tmp_path / "in2" / "x.parquet")
    args = _args(tmp_path, "--available-now")
    args[args.index("--input") + 1] = str(tmp_path / "in2")
    args += ["--checkpoint", str(tmp_path / "checkpoint2")]
    proc = filesink(*args)
    assert proc.returncode == 1 and "schema" in proc.stderr and "amount changed from double to string" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert read_pyarrow(str(tmp_path / "out"), None, PARTS) == expected


@pytest.mark.slow
# JSON input runs with the chaos tier: the default tier reads JSON, with and without --schema, in the test of a
# malformed line below.
@pytest.mark.parametrize("fmt", [pytest.param("json", marks=pytest.mark.chaos), "csv"])
def test_json_and_csv_input(tmp_path, fmt):
    expected = Counter(_write(tmp_path / "in", 0, fmt=fmt) + _write(tmp_path / "in", 1, fmt=fmt))
    schema = "id bigint, user_id bigint, event_date string, amount double"
    proc = filesink(*_args(tmp_path, "--format", fmt, "--schema", schema, "--available-now"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert read_pyarrow(str(tmp_path / "out"), None, PARTS) == expected
    # A restart without --schema reads new files with the schema the sink recorded.
    expected.update(_write(tmp_path / "in", 2, fmt=fmt))
    proc = filesink(*_args(tmp_path, "--format", fmt, "--available-now"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert read_pyarrow(str(tmp_path / "out"), None, PARTS) == expected


def _two_epochs_in(line: str) -> bool:
    """Whether ``line`` is a progress line of epoch 1 or later."""
    found = re.match(r"epoch (\d+):", line)
    return found is not None and int(found.group(1)) >= 1


@pytest.mark.slow
@pytest.mark.parametrize("how", ["sigterm-to-the-command", "ctrl-c-to-the-process-group", "ctrl-c-twice"])
def test_a_stop_is_clean_and_the_next_run_finishes_exactly_once(tmp_path, how):
    """SIGTERM to the command (a service manager), or SIGINT to its whole process group (Ctrl-C at a terminal:
    the JVM ignores it, Spark's Python workers do not); or Ctrl-C twice, which stops at once (exit 130) and
    says what it left."""
    expected: Counter = Counter()
    for b in range(8):
        expected.update(_write(tmp_path / "in", b))
    args = _args(tmp_path, "--trigger", "500ms", "--max-files-per-trigger", "1", "--max-file-age", "off")
    proc = subprocess.Popen(
        [sys.executable, "-m", "filesink", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        # Wait until two epochs are in. Progress lines are polled: one may cover several epochs.
        wait_for_line(
            proc, _two_epochs_in, 240, "a progress line 'epoch N:' with N >= 1", stream=proc.stderr, skip=True
        )
        if how == "sigterm-to-the-command":
            proc.send_signal(signal.SIGTERM)
        else:
            os.killpg(proc.pid, signal.SIGINT)
        if how == "ctrl-c-twice":
            time.sleep(0.05)
            os.killpg(proc.pid, signal.SIGINT)
        out, err = communicate(proc, 120, "the stopped run to exit")
    finally:
        kill(proc, group=True)
    if how == "ctrl-c-twice":
        assert proc.returncode == 130, err[-3000:]
        # The local JVM is killed before the line is written, so Spark's shutdown traces do not bury it; a Python
        # worker of Spark's, which had the Ctrl-C too, may still print after it.
        # Between batches the first Ctrl-C can end the query within the 50 ms before the second: then the summary
        # line is out before the stop at once, which comes while Spark stops, and says so without a second
        # "stopped". Nothing after the summary (the held rows).
        assert out == "" or re.fullmatch(r"stopped: [^\n]+\n", out), out
        start = "ended at once (exit 130) while Spark shut down, after the run" if out else "stopped at once (exit 130)"
        said = [line for line in err.splitlines() if line.startswith(start)]
        assert len(said) == 1, err[-3000:]
        stopped = [line for line in (out + err).splitlines() if line.startswith("stopped")]
        assert len(stopped) == 1, err[-3000:]
        held = r"the log store holds ([\d,]+ rows \(.* of log\) from epochs? [\d-]+|nothing) not yet"
        assert re.search(held, said[0]), said[0]
        assert "Nothing is lost." in said[0], said[0]
    else:
        assert proc.returncode == 0, err[-3000:]
        assert f"{STOPPING}\n" in err, "one line, never broken mid-sentence"
        assert out.startswith("stopped: ") and "the log store holds " in out and "not yet in files" in out, out
    proc = filesink(*_args(tmp_path, "--available-now", "--max-files-per-trigger", "3"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert read_pyarrow(str(tmp_path / "out"), None, PARTS) == expected


@pytest.mark.slow
def test_run_to_s3(tmp_path, s3_server, s3_prefix, s3_options):
    expected = Counter(_write(tmp_path / "in", 0) + _write(tmp_path / "in", 1))
    creds = {"AWS_ACCESS_KEY_ID": s3_server.access_key, "AWS_SECRET_ACCESS_KEY": s3_server.secret_key}
    output, log = s3_prefix + "/table", s3_prefix + "/log"
    checkpoint = str(tmp_path / "checkpoint")  # kept apart from the state directory, on durable storage
    s3 = ["--s3-endpoint", s3_server.endpoint, "--storage-option", "config_kwargs.read_timeout=30"]
    args = _args(tmp_path, *s3, "--available-now", "--checkpoint", checkpoint, output=output)
    proc = filesink(*args, "--log-store", log, env=creds)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert read_pyarrow(output, s3_options, PARTS) == expected
    fs = s3_server.filesystem()
    assert fs.find(log.removeprefix("s3://")), "the log store is on S3"
    assert not (tmp_path / "state" / "log").exists()
    # A restart without --log-store uses the one the sink was created with.
    expected.update(_write(tmp_path / "in", 2))
    proc = filesink(*args, env=creds)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert read_pyarrow(output, s3_options, PARTS) == expected
    assert not (tmp_path / "state" / "log").exists()
    # The driver's machine is gone: a new state directory is rebuilt from the durable home, and says so.
    shutil.rmtree(tmp_path / "state")
    expected.update(_write(tmp_path / "in", 3))
    proc = filesink(*args, "--log-store", log, env=creds)
    assert proc.returncode == 0, proc.stderr[-3000:]
    said = proc.stdout + proc.stderr
    assert said.count("rebuilt the state of sink") == 1 and "so its state was rebuilt" not in said, said[-3000:]
    assert "is new: rebuilding it from the durable home" not in said and "sealed epochs (" not in said, said[-3000:]
    assert read_pyarrow(output, s3_options, PARTS) == expected
    # `recover` on the state directory reaches the same S3 server without --s3-endpoint: the state remembers it
    # (never a credential), and a wrong secret gets the same message as `run`'s.
    assert json.loads((tmp_path / "state" / "s3-settings.json").read_text()) == {"endpoint_url": s3_server.endpoint}
    assert s3_server.secret_key not in (tmp_path / "state" / "s3-settings.json").read_text()
    env = {**creds, "AWS_ENDPOINT_URL": "", "AWS_ENDPOINT_URL_S3": ""}
    proc = filesink("recover", "status", "--state-dir", str(tmp_path / "state"), "--no-verify", env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"log store: {log}" in proc.stdout and "pending files: 0" in proc.stdout, proc.stdout
    wrong = {**env, "AWS_SECRET_ACCESS_KEY": "wrong-secret-never-printed"}
    proc = filesink("recover", "plan", "--state-dir", str(tmp_path / "state"), env=wrong)
    assert proc.returncode == 1 and not proc.stdout, proc.stdout + proc.stderr
    message = proc.stderr.strip().splitlines()[-1]
    assert message.startswith(f"error: the log store {log}: {s3_server.endpoint} refused access with access key id")
    assert "Check AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY" in message and "wrong-secret" not in proc.stderr


@pytest.mark.slow
def test_a_malformed_json_line_fails_the_batch_and_a_fixed_file_resumes(tmp_path):
    expected = Counter(_write(tmp_path / "in", 0, fmt="json") + _write(tmp_path / "in", 1, fmt="json"))
    bad = tmp_path / "in" / "in-001.json"
    good = bad.read_text()
    bad.write_text(good.replace("}\n", "}\n{not json\n", 1))
    schema = "id bigint, user_id bigint, event_date string, amount double"
    proc = filesink(*_args(tmp_path, "--format", "json", "--schema", schema, "--available-now"))
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "error: the streaming query failed" in proc.stdout + proc.stderr
    assert "Nothing of the failed batch was committed" in proc.stdout + proc.stderr
    assert f"Encountered error while reading file file://{bad}" in proc.stdout, proc.stdout
    assert "Malformed records" in proc.stdout and "Traceback" not in proc.stdout + proc.stderr
    assert f"replace the file {bad} with a corrected copy under the same name" in proc.stdout, proc.stdout
    out = tmp_path / "out"
    assert not list(out.rglob("*.parquet")), "no row of a failed batch is visible"
    # Moved out, the batch's file would be skipped by Spark and its name never read again: refused before Spark.
    moved = bad.rename(tmp_path / "moved.json")
    proc = filesink(*_args(tmp_path, "--format", "json", "--available-now"))
    assert proc.returncode == 1, proc.stdout + proc.stderr[-3000:]
    message = proc.stderr.replace("\n", " ")
    assert f"is missing: {bad}" in message and f"--drop-missing-input {bad}" in message, message
    assert "put each file back" in message and "Traceback" not in proc.stderr and "epoch" not in proc.stderr
    # --drop-missing-input is only for a file the refusal named.
    other = tmp_path / "in" / "in-000.json"
    proc = filesink(*_args(tmp_path, "--format", "json", "--available-now", "--drop-missing-input", str(other)))
    assert proc.returncode == 1 and f"--drop-missing-input {other}: not a missing file" in proc.stderr, proc.stderr
    assert not list(out.rglob("*.parquet"))
    moved.rename(bad)
    bad.write_text(good)
    proc = filesink(*_args(tmp_path, "--format", "json", "--available-now"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert read_pyarrow(str(out), None, PARTS) == expected


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_run_refuses_what_is_not_its_own_and_deletes_nothing(tmp_path):
    """Through ``filesink run``: another sink's log store, another sink's output, another query's checkpoint. Each
    is refused with a message naming both sides; nothing of the owner's is deleted or written twice."""
    expected = Counter(_write(tmp_path / "in", 0))
    shared = tmp_path / "shared-log"

    def args(state: str, out: str, checkpoint: str, *extra: str) -> list[str]:
        a = _args(tmp_path, "--available-now", "--checkpoint", str(tmp_path / checkpoint), *extra, output=str(out))
        a[a.index("--state-dir") + 1] = str(tmp_path / state)
        return a

    out_a = tmp_path / "out-a"
    proc = filesink(*args("state-a", str(out_a), "cp-a", "--log-store", str(shared)))
    assert proc.returncode == 0, proc.stderr[-3000:]
    sink_id = json.loads((shared / "sink.json").read_text())["sink_id"]
    log_files = sorted(p.relative_to(shared).as_posix() for p in shared.rglob("*"))
    written = sorted(p.name for p in out_a.rglob("*.parquet"))

    other_log = filesink(*args("state-b", str(tmp_path / "out-b"), "cp-b", "--log-store", str(shared)))
    assert other_log.returncode == 1, other_log.stderr[-3000:]
    for part in (f"durable home of sink {sink_id}", str(out_a), "state-b", "Nothing was written or deleted"):
        assert part in other_log.stderr, (part, other_log.stderr[-3000:])

    other_out = filesink(*args("state-c", str(out_a), "cp-c"))
    assert other_out.returncode == 1, other_out.stderr[-3000:]
    for part in (f"belongs to sink {sink_id}", "state-c", "accept_state_loss=True", "Nothing was written or deleted"):
        assert part in other_out.stderr, (part, other_out.stderr[-3000:])

    log_after = sorted(p.relative_to(shared).as_posix() for p in shared.rglob("*"))
    assert log_after == log_files, "the refused sinks wrote or deleted nothing in the owner's log store"

    _write(tmp_path / "in", 1)
    other_query = filesink(*args("state-a", str(out_a), "cp-new"))
    assert other_query.returncode == 1, other_query.stderr[-3000:]
    assert "comes from streaming query" in other_query.stderr and "takes the batches of query" in other_query.stderr

    assert sorted(p.name for p in out_a.rglob("*.parquet")) == written
    assert read_pyarrow(str(out_a), None, PARTS) == expected
    assert not (tmp_path / "out-b").exists() or not list((tmp_path / "out-b").rglob("*.parquet"))


# -- a batch run again: its files, by name ----------------------------------------------------------------------

MTIME = time.time() - 3600


def _land(directory: Path, name: str, batch: int, rows: int = 400) -> list[tuple]:
    """A file of ``batch_rows(batch)``, modified ``batch`` minutes after a fixed time: Spark's file source takes
    files in that order, one per batch here."""
    directory.mkdir(parents=True, exist_ok=True)
    data = batch_rows(batch, rows)
    table = pa.table({c: pa.array(v, t) for c, v, t in zip(COLUMNS, zip(*data, strict=True), TYPES, strict=True)})
    pq.write_table(table, directory / name)
    os.utime(directory / name, (MTIME + 60 * batch, MTIME + 60 * batch))
    return data


def _damage(path: Path) -> None:
    """Overwrite the middle of the largest column chunk: the footer stays valid, the data pages do not."""
    meta = pq.ParquetFile(path).metadata.row_group(0)
    chunk = max((meta.column(i) for i in range(meta.num_columns)), key=lambda c: c.total_compressed_size)
    with open(path, "r+b") as f:
        start = chunk.dictionary_page_offset if chunk.has_dictionary_page else chunk.data_page_offset
        f.seek(start + chunk.total_compressed_size // 3)
        f.write(b"\xff" * (chunk.total_compressed_size // 3))
    pq.read_schema(path)  # the footer reads, so the pre-flight passes and the batch fails in Spark
    with pytest.raises((OSError, pa.ArrowException)):
        pq.read_table(path)


def _replay_args(tmp_path: Path, *extra: str) -> list[str]:
    return [
        "run",
        *("--input", str(tmp_path / "in"), "--output", str(tmp_path / "out"), "--state-dir", str(tmp_path / "state")),
        *("--key", "user_id", "--partition-by", "event_date", "--parallelism", "2", "--available-now"),
        *("--max-files-per-trigger", "1", "--conf", FAST_START),
        # Spark compacts the file source's log every 2 batches here (10 by default): the check reads compactions.
        *("--conf", "spark.sql.streaming.fileSource.log.compactInterval=2"),
        *extra,
    ]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_damaged_file_given_up_by_name_and_a_file_landed_again_are_said(tmp_path):
    landing = tmp_path / "in"
    expected = Counter(_land(landing, "a-000.parquet", 0) + _land(landing, "a-001.parquet", 1))
    damaged = landing / "b-002.parquet"
    lost = _land(landing, damaged.name, 2)
    _damage(damaged)
    os.utime(damaged, (MTIME + 120, MTIME + 120))
    proc = filesink(*_replay_args(tmp_path))
    assert proc.returncode == 1, proc.stdout + proc.stderr[-3000:]
    assert f"Encountered error while reading file file://{damaged}" in proc.stdout, proc.stdout
    assert f"replace the file {damaged} with a corrected copy under the same name" in proc.stdout
    checkpoint = tmp_path / "state" / "checkpoint"
    pending = pending_batch(checkpoint)
    assert pending is not None and pending.batch_id == 2
    assert any(p.name.endswith(".compact") for p in (checkpoint / "sources" / "0").iterdir())
    assert [e.path for e in listed_files(checkpoint)] == [landing / n for n in ("a-000.parquet", "a-001.parquet")] + [
        damaged
    ]

    # The damaged file moved out, and a-000's name used again for other rows: refused while b-002 is missing.
    damaged.unlink()
    again = _land(landing, "a-000.parquet", 3)
    proc = filesink(*_replay_args(tmp_path))
    assert proc.returncode == 1 and f"is missing: {damaged}" in proc.stderr.replace("\n", " "), proc.stderr

    # Given up by name: batch 2 runs without it, and the run says so; a-000's new rows are reported, never read.
    new = Counter(_land(landing, "c-004.parquet", 4))
    proc = filesink(*_replay_args(tmp_path, "--drop-missing-input", str(damaged)))
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    assert f"gave up 1 input file of batch 2 (--drop-missing-input): {damaged}" in proc.stdout, proc.stdout
    assert f"warning: the input file {landing / 'a-000.parquet'} was landed again" in proc.stdout
    assert "the rows of this file are NOT read" in proc.stdout
    expected.update(new)
    got = read_pyarrow(str(tmp_path / "out"), None, PARTS)
    assert got == expected, "every row once, but those of the given-up file and of the name landed again"
    assert not set(lost) & set(got) and not set(again) & set(got)
    assert pending_batch(checkpoint) is None
