"""Recovery is itself crash-safe: ``filesink recover apply`` is killed (SIGKILL) at each of its steps, run
again, and ends in the same state as a recovery that was never interrupted; the sink then finishes with
every row exactly once.

The state to recover: a run at parallelism 3, partitioned, died after pre-committing three files, of which
one is fully visible (commit), one has one of its partition objects visible (rewrite) and one has nothing
visible (drop); with garbage: an unsealed log segment, a temp file in the staging directory (local) or an
unrecorded multipart upload in progress (S3).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from forkserver import run
from sink_helpers import append_epoch, batch_rows, parquet_files, read_duckdb, read_pyarrow

from filesink import ExactlyOnceParquetSink, Rollover
from filesink.rolling.planner import plan
from filesink.tasks.writer import write_file
from logstore import VNODE_COLUMN
from logstore.failpoints import ENV_VAR, FailpointError
from logstore.home import CLAIM_FILE, TERM_FILE, is_home_record
from recovery.cli import open_sink

HOME_FILES = (TERM_FILE, CLAIM_FILE)
RULES = Rollover(target_file_size=None, max_epochs=1000, max_age_seconds=None)
PARTS = ("event_date",)
KILL_POINTS = [
    "recovery.term.after",
    "recovery.sync.after",
    "recovery.fence.after",
    "recovery.resolve.after@1",
    "filesink.write.publish.before@2",  # in the middle of rewriting the partly visible file
    "recovery.resolve.after@3",
    "recovery.output_garbage.after",
    "logstore.gc.after_metadata",
]


class Case:
    def __init__(self, root: Path, where: str, request: pytest.FixtureRequest) -> None:
        self.state = root / "state"
        if where == "local":
            self.path, self.options, self.log_store = str(root / "out"), None, None
            self.env: dict[str, str] = {}
            self.flags: list[str] = []
        else:
            s3 = request.getfixturevalue("s3_server")
            prefix = request.getfixturevalue("s3_prefix") + "/" + root.name
            self.path, self.options, self.log_store = prefix + "/table", s3.storage_options(), prefix + "/log"
            self.env = {"AWS_ACCESS_KEY_ID": s3.access_key, "AWS_SECRET_ACCESS_KEY": s3.secret_key}
            self.flags = ["--endpoint-url", s3.endpoint, "--region", s3.region]
        self.expected: Counter = Counter()
        self.sink_id = ""

    def open(self, parallelism: int = 3) -> ExactlyOnceParquetSink:
        return ExactlyOnceParquetSink(
            self.path,
            self.state,
            log_store=self.log_store,
            vnodes=9,
            parallelism=parallelism,
            partition_by=list(PARTS),
            rollover=RULES,
            storage_options=self.options,
        )

    def build(self) -> None:
        """The state a run leaves when it dies during a rollover (see the module docstring)."""
        sink = self.open()
        self.sink_id = sink.log_store.sink_id
        for epoch in range(3):
            rows = batch_rows(epoch, 150, seed=7)
            self.expected.update(rows)
            append_epoch(sink, epoch, rows)
        files, _ = plan(sink.log_store, RULES, 3, now=time.time(), bytes_per_log_byte=1.0, force=True)
        assert len(files) == 3
        sink.ledger.precommit(files, sink.term)
        visible, partial, invisible = (sink._file_task(f, sink.term) for f in files)
        write_file(sink.output, visible)
        os.environ[ENV_VAR] = f"filesink.write.publish.before#{partial.name}=raise@2"
        try:
            with pytest.raises(FailpointError):
                write_file(sink.output, partial)  # its first partition object is published, then it fails
        finally:
            del os.environ[ENV_VAR]
        unsealed = pa.table({"id": pa.array([1], pa.int64()), VNODE_COLUMN: pa.array([0], pa.int32())})
        sink.log_store.append(3, unsealed, writer_id="unsealed")  # epoch 3 was being appended
        if sink.output.is_local:
            staging = sink.output.local_staging() / f"term-{sink.term:010d}"
            (staging / f".{invisible.name}.00000.dead.tmp").write_bytes(b"half a file")
        else:
            fs = sink.log_store.storage.fs  # type: ignore[attr-defined]
            bucket, key, _ = fs.split_path(f"{self.path}/event_date=2024-01-01/{invisible.name}.parquet")
            upload = fs.call_s3("create_multipart_upload", Bucket=bucket, Key=key)
            fs.call_s3("upload_part", Bucket=bucket, Key=key, UploadId=upload["UploadId"], PartNumber=1, Body=b"x")
        sink._state_lock.release()  # the run dies
        sink.log_store.close()

    def recover(self, failpoints: str = "", *, from_home: bool = False) -> subprocess.CompletedProcess[str]:
        """``recover apply`` on the state directory; ``from_home``: with ``--log-store`` too (a lost state
        directory is rebuilt from the durable home)."""
        env = dict(os.environ, **self.env, **{ENV_VAR: failpoints})
        home = ["--log-store", self.log_store] if from_home and self.log_store else []
        return run(
            [
                sys.executable,
                "-m",
                "recovery",
                "apply",
                "--state-dir",
                str(self.state),
                "--json",
                *home,
                *self.flags,
            ],
            240,
            f"recover apply (failpoints {failpoints!r})",
            env=env,
            capture_output=True,
            text=True,
        )

    def snapshot(self) -> dict[str, Any]:
        """Everything recovery decides, with this case's sink id taken out of the object names."""
        sink = open_sink(self.state, self.options or {})  # looks without running recovery
        try:
            store = sink.store
            result: dict[str, Any] = {
                "pending": [f.name for f in sink.ledger.pending()],
                "truncate_points": store.truncate_points(),
                "objects": sorted(  # the claim and the mark name this case's locations: their names only
                    (key.replace(self.sink_id[:8], "SINK"), size if key.endswith(".parquet") else None)
                    for key, size in _sizes(self.path, self.options)
                ),
                "log_files": sorted(
                    name.split("/")[0]
                    for name, _ in store.storage.list_files()
                    if name != TERM_FILE and not is_home_record(name)
                ),
            }
            if sink.output.is_local:
                staging = sink.output.local_staging()
                result["staging"] = sorted(p.relative_to(staging).as_posix() for p in staging.rglob("*"))
            else:
                fs = store.storage.fs  # type: ignore[attr-defined]
                bucket, key, _ = fs.split_path(self.path)
                uploads = fs.call_s3("list_multipart_uploads", Bucket=bucket, Prefix=key + "/").get("Uploads")
                result["uploads"] = [u["Key"] for u in uploads or []]
            return result
        finally:
            store.close()


def _sizes(path: str, options: dict | None) -> list[tuple[str, int]]:
    if "://" not in path:
        return [(p, (Path(path) / p).stat().st_size) for p in parquet_files(path)]
    import fsspec

    fs, root = fsspec.core.url_to_fs(path, **(options or {}))
    fs.invalidate_cache()
    return [(p[len(root) + 1 :], int(info["size"])) for p, info in fs.find(root, detail=True).items()]


_references: dict[str, dict[str, Any]] = {}


def _reference(tmp_path: Path, where: str, request: pytest.FixtureRequest) -> dict[str, Any]:
    if where not in _references:
        case = Case(tmp_path / "reference", where, request)
        case.build()
        run = case.recover()
        assert run.returncode == 0, run.stderr[-3000:]
        actions = sorted(f["action"] for f in json.loads(run.stdout)["files"])
        assert actions == ["commit", "drop", "rewrite"], actions
        _references[where] = case.snapshot()
    return _references[where]


@pytest.mark.parametrize("where", ["local", "s3"])
@pytest.mark.parametrize("point", KILL_POINTS)
def test_recovery_killed_at_each_step_then_rerun(tmp_path, request, where, point):
    reference = _reference(tmp_path, where, request)
    assert reference["pending"] == [] and reference["log_files"] == [
        "00000000000000000000",
        "00000000000000000001",
        "00000000000000000002",
    ], reference
    assert reference.get("staging", []) == [] and reference.get("uploads", []) == [], reference

    case = Case(tmp_path / "crashed", where, request)
    case.build()
    killed = case.recover(f"{point.split('@')[0]}=kill" + (f"@{point.split('@')[1]}" if "@" in point else ""))
    assert killed.returncode == -9, f"recovery was not killed at {point}: {killed.stderr[-3000:]}"
    again = case.recover()
    assert again.returncode == 0, again.stderr[-3000:]
    assert case.snapshot() == reference

    noop = case.recover()
    assert noop.returncode == 0 and json.loads(noop.stdout)["nothing_to_do"], noop.stdout

    sink = case.open(parallelism=2)  # the job restarts and finishes
    sink.flush()
    sink.close()
    assert read_pyarrow(case.path, case.options, PARTS) == case.expected
    assert read_duckdb(case.path, case.options, PARTS) == case.expected


REBUILD_POINTS = [
    "recovery.term.after",
    "recovery.sync.after",
    "recovery.fence.after",
    "recovery.resolve.after@2",
    "logstore.gc.after_metadata",
]


@pytest.mark.parametrize("point", REBUILD_POINTS)
def test_rebuild_killed_at_each_step_then_rerun(tmp_path, request, point):
    """The state directory is lost with the same crashed run behind it: ``recover apply --log-store`` rebuilds it
    from the durable home; killed at each step, run again (the half-rebuilt directory kept, or lost again), it
    ends in the same state as an uninterrupted recovery."""
    import shutil

    reference = _reference(tmp_path, "s3", request)
    case = Case(tmp_path / "rebuilt", "s3", request)
    case.build()
    shutil.rmtree(case.state)
    killed = case.recover(
        f"{point.split('@')[0]}=kill" + (f"@{point.split('@')[1]}" if "@" in point else ""), from_home=True
    )
    assert killed.returncode == -9, f"the rebuild was not killed at {point}: {killed.stderr[-3000:]}"
    if point.endswith("fence.after"):
        shutil.rmtree(case.state)  # lost again, half rebuilt
    again = case.recover(from_home=True)
    assert again.returncode == 0, again.stderr[-3000:]
    assert case.snapshot() == reference

    sink = case.open(parallelism=2)
    sink.flush()
    sink.close()
    assert read_pyarrow(case.path, case.options, PARTS) == case.expected
