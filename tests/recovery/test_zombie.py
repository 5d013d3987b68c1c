"""Zombie writers: a file writer of a run that died is paused (SIGSTOP) while it writes; the sink restarts
(at another parallelism) and recovers; the writer is resumed and tries to finish. It must be fenced, and the
output must hold every row exactly once.

The old run is driven step by step in this process (append, seal, plan, pre-commit; one file written here,
one handed to a writer process that stops itself at a failpoint), then "dies" without cleaning up: its lock
is released and its database closed, as the OS would. No Spark: the writer process runs exactly what a Spark
task runs, ``write_file(output, task)``.
"""

from __future__ import annotations

import signal
import subprocess
import time
from collections import Counter

import pytest
import zombie_writer
from helpers import SUPPORT, communicate, kill, process_state, wait_until
from sink_helpers import append_epoch, batch_rows, parquet_files, read_duckdb, read_pyarrow

from filesink import ExactlyOnceParquetSink, Rollover
from filesink.output import is_file_name
from filesink.output.fencing import PREFIX
from filesink.rolling.planner import plan
from filesink.tasks.writer import write_file
from logstore.home import TERM_FILE

WRITER = SUPPORT / "zombie_writer.py"
RULES = Rollover(target_file_size=None, max_epochs=1000, max_age_seconds=None)

# (where the writer pauses, partitioned by event_date): every step between "started" and "published".
LOCAL_PAUSES = [
    ("filesink.write.open.before=stop", False),
    ("filesink.write.open.after=stop", False),
    ("filesink.write.publish.before=stop", False),
    ("filesink.write.publish.before=stop@2", True),  # one partition object already published
    ("filesink.write.open.after=stop@3", True),
]
S3_PAUSES = [
    ("filesink.write.open.before=stop", False),
    ("filesink.upload.create.after=stop", False),  # upload created, its id not yet recorded
    ("filesink.upload.part.before=stop", False),  # id recorded, no part sent
    ("filesink.upload.complete.before=stop", False),
    ("filesink.upload.complete.before=stop@2", True),  # one partition object already completed
]
TRIALS = [("local", i, *LOCAL_PAUSES[i % 5]) for i in range(10)] + [("s3", i, *S3_PAUSES[i % 5]) for i in range(10)]


def _wait_stopped(proc: subprocess.Popen[str]) -> None:
    wait_until(lambda: process_state(proc.pid) == "T", 60, "the writer to reach its pause point", proc=proc)


@pytest.mark.parametrize(("where", "trial", "pause", "partitioned"), TRIALS, ids=[f"{t[0]}-{t[1]}" for t in TRIALS])
def test_paused_writer_is_fenced_after_restart(tmp_path, request, where, trial, pause, partitioned):
    if where == "local":
        path, options, log_store = str(tmp_path / "out"), None, None
    else:
        prefix = request.getfixturevalue("s3_prefix")
        path, options, log_store = prefix + "/table", request.getfixturevalue("s3_options"), prefix + "/log"

    def open_sink(parallelism: int) -> ExactlyOnceParquetSink:
        return ExactlyOnceParquetSink(
            path,
            tmp_path / "state",
            log_store=log_store,
            vnodes=8,
            parallelism=parallelism,
            partition_by=["event_date"] if partitioned else None,
            rollover=RULES,
            storage_options=options,
        )

    expected: Counter = Counter()
    old = open_sink(2)
    for epoch in range(2):
        rows = batch_rows(epoch, 200, seed=trial)
        expected.update(rows)
        append_epoch(old, epoch, rows)
    files, _idle = plan(old.log_store, RULES, 2, now=time.time(), bytes_per_log_byte=1.0, force=True)
    assert len(files) == 2
    old.ledger.precommit(files, old.term)
    victim, other = (old._file_task(f, old.term) for f in files)
    write_file(old.output, other)  # published; the old run dies before committing it

    failpoints = f"{pause.split('=')[0]}#{victim.name}={pause.split('=')[1]}"
    zombie = zombie_writer.start(tmp_path / "task.pickle", old.output, victim, failpoints)
    try:
        _wait_stopped(zombie)
        old._state_lock.release()  # the old driver dies: the OS releases its lock and files
        old.log_store.close()

        new = open_sink(1 if trial % 2 else 4)  # restart at another parallelism: recovery runs
        assert new.term == old.term + 1
        assert new.ledger.pending() == []

        zombie.send_signal(signal.SIGCONT)
        out, err = communicate(zombie, 120, "the resumed writer to exit")
    finally:
        kill(zombie)
    assert zombie.returncode == 3 and out.startswith("fenced:"), f"the zombie was not fenced: {out} {err[-3000:]}"
    assert f"term {old.term}" in out

    for epoch in range(2, 4):  # the new run goes on
        rows = batch_rows(epoch, 200, seed=trial)
        expected.update(rows)
        append_epoch(new, epoch, rows)
    new.flush()
    new.close()

    parts = ("event_date",) if partitioned else ()
    assert read_pyarrow(path, options, parts) == expected
    assert read_duckdb(path, options, parts) == expected
    objects = parquet_files(path, options)
    assert all(is_file_name(new.log_store.sink_id, o.rsplit("/", 1)[-1]) for o in objects), objects
    records = [r for r, _ in new.log_store.storage.list_files(PREFIX) if r != TERM_FILE]
    assert records == [], "writer records are removed"
    if where == "local":
        staging = tmp_path / "state" / "staging"
        assert list(staging.rglob("*")) == [], "no temp files or staging directories are left"
    else:
        fs = new.log_store.storage.fs  # type: ignore[attr-defined]
        bucket, key, _ = fs.split_path(path)
        uploads = fs.call_s3("list_multipart_uploads", Bucket=bucket, Prefix=key + "/").get("Uploads") or []
        assert uploads == [], "no multipart upload is left in progress"
