"""Recovery's garbage collection touches nothing but the sink's own: uploads and temp files are checked against
the output prefix and the sink's file names before anything is aborted or deleted."""

from __future__ import annotations

import json

from sink_helpers import append_epoch, batch_rows

from filesink import ExactlyOnceParquetSink, Rollover
from filesink.cli.main import main
from filesink.output import file_name
from filesink.output.fencing import Fence, ObjectRecord
from filesink.output.multipart import list_uploads

RULES = Rollover(target_file_size=None, max_epochs=1000, max_age_seconds=None)


def _uploads(fs, bucket: str, prefix: str) -> set[str]:
    return {key for key, _ in list_uploads(fs, bucket, prefix)}


def test_only_this_sinks_uploads_under_its_prefix_are_aborted(
    tmp_path, any_s3_server, any_s3_prefix, monkeypatch, capsys
):
    s3_server, path = any_s3_server, any_s3_prefix + "/table"
    sink = ExactlyOnceParquetSink(
        path, tmp_path / "state", vnodes=4, rollover=RULES, storage_options=s3_server.storage_options()
    )
    append_epoch(sink, 0, batch_rows(0, 20))
    sink_id, term, log = sink.log_store.sink_id, sink.term, sink.log_store.target.location
    sink.close()

    fs = s3_server.filesystem()
    bucket, root, _ = fs.split_path(path)
    ours = file_name(sink_id, range(0, 4), {0: 0}, 0) + ".parquet"
    other_sink = file_name("0123456789abcdef", range(0, 4), {0: 0}, 0) + ".parquet"
    keys = {
        "ours": f"{root}/date=1/{ours}",
        "foreign name": f"{root}/notes.parquet",
        "other sink": f"{root}/{other_sink}",
        "sibling prefix": f"{root}-backup/{ours}",
        "recorded outside": f"{root.rsplit('/', 1)[0]}/evil/{ours}",
    }
    ids = {}
    for what, key in keys.items():
        ids[what] = fs.call_s3("create_multipart_upload", Bucket=bucket, Key=key)["UploadId"]
    # a record (as a writer of the old term would leave it) that points outside the output: never followed
    Fence(log, term).record(
        ObjectRecord(term, ours.removesuffix(".parquet"), 0, f"../evil/{ours}", ids["recorded outside"])
    )

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", s3_server.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3_server.secret_key)
    flags = ["--state-dir", str(tmp_path / "state"), "--endpoint-url", s3_server.endpoint, "--json"]
    assert main(["recover", "plan", *flags]) == 0
    assert json.loads(capsys.readouterr().out)["garbage"]["multipart_uploads"] == 1
    assert main(["recover", "apply", *flags]) == 0
    assert json.loads(capsys.readouterr().out)["garbage"]["multipart_uploads"] == 1

    left = _uploads(fs, bucket, root.rsplit("/", 1)[0] + "/")
    assert left == {keys[w] for w in ("foreign name", "other sink", "sibling prefix", "recorded outside")}
    for what in ("foreign name", "other sink", "sibling prefix", "recorded outside"):
        fs.call_s3("abort_multipart_upload", Bucket=bucket, Key=keys[what], UploadId=ids[what])


def test_only_the_sinks_temp_files_leave_the_staging_directory(tmp_path, capsys):
    out = tmp_path / "out"
    sink = ExactlyOnceParquetSink(str(out), tmp_path / "state", vnodes=4, rollover=RULES)
    term = sink.term
    sink.close()
    staging = tmp_path / "state" / "staging"
    old = staging / f"term-{term:010d}"
    old.mkdir()
    (old / ".part-x.00000.abc.tmp").write_bytes(b"temp")
    (old / "keep-me.txt").write_text("not the sink's")
    (staging / "notes.txt").write_text("not the sink's either")
    (staging / ".part-y.00000.abc.tmp").write_bytes(b"temp, from before writer terms")

    assert main(["recover", "apply", "--state-dir", str(tmp_path / "state"), "--json"]) == 0
    done = json.loads(capsys.readouterr().out)
    assert done["fenced"] == 1 and done["garbage"]["staging_temp_files"] == 2
    left = sorted(p.relative_to(staging).as_posix() for p in staging.rglob("*"))
    fenced_dir = [p for p in left if p.startswith("fenced-term-")]
    assert len(fenced_dir) == 2 and fenced_dir[1].endswith("/keep-me.txt"), left
    assert "notes.txt" in left and not any(p.endswith(".tmp") for p in left), left


def test_a_sink_that_fails_to_start_leaves_its_state_database_closed(tmp_path):
    import os

    import pytest

    from filesink import SinkOptionError

    def open_files() -> list[str]:
        found = []
        for fd in os.listdir("/proc/self/fd"):
            try:
                found.append(os.readlink(f"/proc/self/fd/{fd}"))
            except OSError:
                continue
        return [f for f in found if str(tmp_path / "state") in f]

    with ExactlyOnceParquetSink(str(tmp_path / "out"), tmp_path / "state", key_columns=["a"], rollover=RULES) as sink:
        sink.log_store.seal(0, [])  # once an epoch is sealed, the key columns are the sink's for life
    assert open_files() == []
    with pytest.raises(SinkOptionError, match="key_columns"):
        ExactlyOnceParquetSink(str(tmp_path / "out"), tmp_path / "state", key_columns=["b"], rollover=RULES)
    assert open_files() == [], "the failed start closed the database and released the lock"
