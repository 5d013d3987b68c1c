"""A failed task attempt: on a cluster, the executor of a file writer dies (or stalls) in the middle of its
file, and Spark runs the task again elsewhere, in the same writer term. The retry publishes the file; what
the failed attempt left (an S3 multipart upload in progress, a local temp file) must not outlive the roll,
and an attempt that was only stalled must not change the output when it carries on. If the driver dies
before the retry publishes, the restarted sink must fence every attempt, the stalled one too.

No Spark here: the attempts are writer processes running exactly what a Spark task runs (``write_file``),
SIGKILLed or paused at a failpoint; the retry is the sink's own write of the same file.
"""

from __future__ import annotations

import pickle
import signal
import subprocess
import sys
import time
from collections import Counter

import pytest
import zombie_writer
from helpers import SUPPORT, communicate, kill, process_state, support_env, wait_for_exit, wait_until
from sink_helpers import _fs, append_epoch, batch_rows, needs_single_driver, read_duckdb, read_pyarrow

from filesink import ExactlyOnceParquetSink, Rollover
from filesink.output.fencing import PREFIX, term_dir
from filesink.output.location import SHARED_PREFIX
from filesink.output.multipart import list_uploads
from filesink.rolling.planner import plan
from filesink.tasks.writer import write_file
from logstore.failpoints import ENV_VAR, FailpointError
from logstore.home import TERM_FILE

WRITER = SUPPORT / "zombie_writer.py"
RULES = Rollover(target_file_size=None, max_epochs=1000, max_age_seconds=None)


def _leftovers(sink: ExactlyOnceParquetSink) -> list[str]:
    """Temp files in the sink's staging directory (local), or multipart uploads in progress under it (S3)."""
    output = sink.output
    if output.is_local:
        staging = output.local_staging() / term_dir(sink.term)
        found = staging.iterdir() if staging.is_dir() else []
        return sorted(p.name for p in found if not p.name.startswith(SHARED_PREFIX))  # the run's marker stays
    fs = sink.log_store.storage.fs  # type: ignore[attr-defined]
    bucket, key, _ = fs.split_path(output.url)
    return sorted(k for k, _ in list_uploads(fs, bucket, key + "/"))


@pytest.mark.parametrize("partitioned", [False, True], ids=["plain", "partitioned"])
@pytest.mark.parametrize("fate", ["killed", "stalled"])
@pytest.mark.parametrize("where", ["local", "s3"])
def test_leftovers_of_a_failed_attempt_go_when_its_retry_commits(tmp_path, request, where, fate, partitioned):
    if where == "local":
        path, options, log_store = str(tmp_path / "out"), None, None
    else:
        prefix = request.getfixturevalue("s3_prefix")
        path, options, log_store = prefix + "/table", request.getfixturevalue("s3_options"), prefix + "/log"
    sink = ExactlyOnceParquetSink(
        path,
        tmp_path / "state",
        log_store=log_store,
        vnodes=8,
        parallelism=1,
        partition_by=["event_date"] if partitioned else None,
        rollover=RULES,
        storage_options=options,
    )
    expected: Counter = Counter()
    for epoch in range(2):
        rows = batch_rows(epoch, 200, seed=5)
        expected.update(rows)
        append_epoch(sink, epoch, rows)
    # The file the sink's next flush writes (the plan is a function of the state database).
    [planned], _ = plan(sink.log_store, RULES, 1, now=time.time(), bytes_per_log_byte=1.0, force=True)
    task = sink._file_task(planned, sink.term)

    # The first attempt: every object complete, none published, when its executor dies (or stalls).
    action = "kill" if fate == "killed" else "stop"
    failpoints = f"filesink.write.publish.before={action}@1"
    attempt = zombie_writer.start(tmp_path / "task.pickle", sink.output, task, failpoints)
    try:
        wait_until(
            lambda: attempt.poll() is not None or process_state(attempt.pid) == "T",
            60,
            "the first attempt to reach its failpoint",
            proc=attempt,
        )
        assert attempt.returncode == (-9 if fate == "killed" else None)
        left = _leftovers(sink)
        assert len(left) == (3 if partitioned else 1), left  # the three event dates, or the one object
        assert all(planned.name in name for name in left), left

        sink.flush()  # the retry: writes, publishes and commits the same file

        assert _leftovers(sink) == [], "the failed attempt's temp files / uploads are removed"
        if fate == "stalled":  # it carries on, and cannot publish anything
            attempt.send_signal(signal.SIGCONT)
            before = _sizes(path, options)
            out, err = communicate(attempt, 60, "the resumed attempt to exit")
            if where == "s3":
                # Its upload was aborted. Its Complete then finds the object there at the size it uploaded
                # (the retry published the same bytes), which is also what a Complete whose answer was lost
                # finds: it may take that for its own success, or be fenced; either way nothing changes.
                assert (attempt.returncode, out.split(":")[0].strip()) in {(3, "fenced"), (0, "published")}, (
                    out,
                    err[-3000:],
                )
                assert _sizes(path, options) == before
            else:  # its temp file is gone: the rename fails
                assert "published" not in out.splitlines(), (out, err[-3000:])
                assert attempt.returncode == 1 and "FileWriteError" in err and "publish" in err, err[-3000:]
    finally:
        kill(attempt)

    for epoch in range(2, 4):  # the sink goes on
        rows = batch_rows(epoch, 200, seed=5)
        expected.update(rows)
        append_epoch(sink, epoch, rows)
    sink.flush()
    sink.close()
    parts = ("event_date",) if partitioned else ()
    assert read_pyarrow(path, options, parts) == expected
    assert read_duckdb(path, options, parts) == expected
    records = [r for r, _ in sink.log_store.storage.list_files(PREFIX) if r != TERM_FILE]
    assert records == [], "writer records are removed"
    assert _leftovers(sink) == []


def test_stalled_attempt_is_fenced_after_restart_although_its_retry_recorded_the_same_objects(
    tmp_path, any_s3_server, any_s3_prefix, monkeypatch
):
    """Attempt A stalls just before completing its upload; Spark retries the task and attempt B records the
    same object (another upload) before it dies too; then the driver dies. The restarted sink must fence A as
    well as B: A completing its upload after recovery dropped the file would leave a file nobody committed,
    whose rows are written again into other files."""
    path, log_store = any_s3_prefix + "/table", any_s3_prefix + "/log"
    s3_options = any_s3_server.storage_options()

    def open_sink(parallelism: int) -> ExactlyOnceParquetSink:
        return ExactlyOnceParquetSink(
            path, tmp_path / "state", log_store=log_store, vnodes=8, parallelism=parallelism, rollover=RULES,
            storage_options=s3_options, single_driver=needs_single_driver(log_store, s3_options),
        )  # fmt: skip

    expected: Counter = Counter()
    old = open_sink(2)
    for epoch in range(2):
        rows = batch_rows(epoch, 200, seed=7)
        expected.update(rows)
        append_epoch(old, epoch, rows)
    files, _ = plan(old.log_store, RULES, 2, now=time.time(), bytes_per_log_byte=1.0, force=True)
    old.ledger.precommit(files, old.term)
    victim, other = (old._file_task(f, old.term) for f in files)
    write_file(old.output, other)  # published; the old run dies before committing it

    task_file = tmp_path / "task.pickle"
    task_file.write_bytes(pickle.dumps((old.output, victim)))
    env = support_env()

    def attempt(failpoint: str) -> subprocess.Popen[str]:
        command = [sys.executable, str(WRITER), str(task_file)]
        return subprocess.Popen(command, env=dict(env, **{ENV_VAR: failpoint}), stdout=subprocess.PIPE, text=True)

    a = attempt("filesink.upload.complete.before=stop")
    try:
        wait_until(lambda: process_state(a.pid) == "T", 60, "attempt A to reach its pause point", proc=a)
        b = attempt("filesink.write.publish.before=kill")
        assert wait_for_exit(b, 60, "attempt B to die at its failpoint") == -9
        b.stdout.close()  # type: ignore[union-attr]
        old._state_lock.release()  # the old driver dies: the OS releases its lock and files
        old.log_store.close()

        # The restarted sink's recovery drops the victim (nothing visible) and dies before its garbage step;
        # attempt A carries on.
        monkeypatch.setenv(ENV_VAR, f"recovery.resolve.after#{victim.name}=raise")
        with pytest.raises(FailpointError):
            open_sink(1)
        monkeypatch.delenv(ENV_VAR)
        a.send_signal(signal.SIGCONT)
        out, _ = communicate(a, 120, "attempt A to exit once resumed")
    finally:
        kill(a)
    assert a.returncode == 3 and out.startswith("fenced:"), f"attempt A was not fenced: {out}"

    new = open_sink(1)
    new.flush()
    new.close()
    got = read_pyarrow(path, s3_options)
    lost, duplicated = expected - got, got - expected
    assert (sum(lost.values()), sum(duplicated.values())) == (0, 0)
    assert read_duckdb(path, s3_options) == expected
    assert _leftovers(new) == []


def _sizes(path: str, options: dict | None) -> dict[str, int]:
    fs, root = _fs(path, options)
    return {p[len(root.rstrip("/")) + 1 :]: int(i["size"]) for p, i in fs.find(root, detail=True).items()}
