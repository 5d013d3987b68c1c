"""The sink on each S3 server the tests start (SeaweedFS, moto's server, rclone's ``serve s3``), and on S3 endpoints
that lack a feature or never answer: the user gets a clear error before anything is sealed, naming the path, the
endpoint or the missing feature, and once the cause is fixed the query resumes and the output is exact.

The matrix of what each server supports is in docs/testing.md.
"""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections import Counter
from typing import Any

import pytest
from faultproxy import FaultRule
from s3servers import SilentServer
from sink_helpers import append_epoch, batch_df, batch_rows, needs_single_driver, read_duckdb, read_pyarrow

from filesink import ExactlyOnceParquetSink, Rollover
from filesink.cli.main import main
from filesink.output import CLAIM_NAME, OutputLocation, file_name
from filesink.output.location import filesystem as output_filesystem
from filesink.output.multipart import MultipartObject, list_uploads
from filesink.s3options import build, parse_option, parse_options
from logstore.storage import FsspecStorage, open_filesystem

RULES = Rollover(target_file_size=None, max_epochs=2, max_age_seconds=None)
PARTS = ("event_date",)


def _sink(
    output: str, state, log_store: str, options: dict[str, Any], *, probe: bool = False
) -> ExactlyOnceParquetSink:
    """With ``probe``, single-driver operation where the server fails the probe of conditional create."""
    return ExactlyOnceParquetSink(
        output, state, log_store=log_store, vnodes=8, parallelism=2, partition_by=list(PARTS), rollover=RULES,
        storage_options=options, single_driver=probe and needs_single_driver(log_store, options),
    )  # fmt: skip


def _spark_batches(sink: ExactlyOnceParquetSink, spark, batches: range) -> Counter:
    expected: Counter = Counter()
    for b in batches:
        rows = batch_rows(b, 150)
        sink(batch_df(spark, rows), b)
        expected.update(rows)
    return expected


def _objects(settings, url: str) -> list[str]:
    """Keys under ``url`` (relative to it), straight from the server."""
    fs = settings.filesystem()
    root = url.removeprefix("s3://").rstrip("/")
    return sorted(p[len(root) + 1 :] for p in fs.find(root))


def _uploads(settings, url: str) -> list[str]:
    bucket, _, prefix = url.removeprefix("s3://").partition("/")
    return sorted(key for key, _ in list_uploads(settings.filesystem(), bucket, f"{prefix}/" if prefix else ""))


def _creds(monkeypatch, settings) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", settings.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", settings.secret_key)


# -- a real run on each server -------------------------------------------------------------------------------


@pytest.mark.timeout(240)
def test_a_sink_on_each_server_writes_every_row_once_and_recover_reads_it(
    spark, tmp_path, any_s3_server, any_s3_prefix, monkeypatch, capsys
):
    """Log store and output on the server; Spark in local mode. Then ``filesink recover`` with the same S3 options
    reads the sink from its durable home alone (ranged reads of every segment: rclone's checksums)."""
    server, output, log = any_s3_server, any_s3_prefix + "/table", any_s3_prefix + "/log"
    options = server.storage_options()
    sink = _sink(output, tmp_path / "state", log, options, probe=True)
    expected = _spark_batches(sink, spark, range(3))
    sink.close()  # epoch 2 stays in the log store: its file is not due yet
    assert read_pyarrow(output, options, PARTS) + Counter(batch_rows(2, 150)) == expected
    assert _uploads(server, output) == [], "no multipart upload is left in progress"

    _creds(monkeypatch, server)
    flags = ["--log-store", log, "--json", "--s3-endpoint", server.endpoint]
    flags += ["--storage-option", "config_kwargs.read_timeout=30", "--region", "us-east-1"]
    assert main(["recover", "status", *flags]) == 0
    status = json.loads(capsys.readouterr().out)
    assert status["last_sealed_epoch"] == 2 and status["damaged_segments"] == []
    assert status["backlog"]["rows"] == 150

    sink = _sink(output, tmp_path / "state", log, options, probe=True)  # the same state directory: the query resumes
    expected += _spark_batches(sink, spark, range(3, 4))
    sink.flush()
    sink.close()
    assert read_pyarrow(output, options, PARTS) == expected
    assert read_duckdb(output, options, PARTS) == expected
    assert _uploads(server, output) == []


# -- bucket root ---------------------------------------------------------------------------------------------


def test_an_output_at_a_bucket_root_finds_and_aborts_its_abandoned_uploads(tmp_path, any_s3_server, any_s3_prefix):
    """``s3://bucket`` as the output: the uploads a killed writer left at the bucket's root are found (listing
    prefix ``""``, not ``/``) and aborted at the next start; uploads that are not the sink's stay."""
    server = any_s3_server
    bucket = f"root-{uuid.uuid4().hex[:16]}"
    fs = server.filesystem()
    fs.call_s3("create_bucket", Bucket=bucket)
    output, log, options = f"s3://{bucket}", any_s3_prefix + "/log", server.storage_options()

    sink = _sink(output, tmp_path / "state", log, options, probe=True)
    expected: Counter = Counter()
    for epoch in range(2):
        rows = batch_rows(epoch, 100)
        append_epoch(sink, epoch, rows)
        expected.update(rows)
    sink.flush()
    sink_id = sink.log_store.sink_id
    sink.close()
    ours = file_name(sink_id, range(0, 8), {0: 0}, 5) + ".parquet"
    other = file_name("0123456789abcdef", range(0, 8), {0: 0}, 5) + ".parquet"
    left = {key: fs.call_s3("create_multipart_upload", Bucket=bucket, Key=key)["UploadId"] for key in (ours, other)}
    left[f"event_date=2024-01-01/{ours}"] = fs.call_s3(
        "create_multipart_upload", Bucket=bucket, Key=f"event_date=2024-01-01/{ours}"
    )["UploadId"]
    assert _uploads(server, output) == sorted(left)

    sink = _sink(output, tmp_path / "state", log, options, probe=True)  # start-up recovery removes the sink's garbage
    sink.close()
    assert _uploads(server, output) == [other], "the sink's uploads are aborted, the other sink's stays"
    assert read_pyarrow(output, options, PARTS) == expected
    assert CLAIM_NAME in _objects(server, output)
    fs.call_s3("abort_multipart_upload", Bucket=bucket, Key=other, UploadId=left[other])


# -- a server that lacks a feature ---------------------------------------------------------------------------


@pytest.mark.timeout(240)
def test_a_server_without_multipart_upload_listing_is_refused_before_anything_is_sealed(
    spark, tmp_path, s3_server, s3_prefix, fault_proxy, proxy_options
):
    output, log = s3_prefix + "/table", s3_prefix + "/log"
    fault_proxy.set_rules([FaultRule("unsupported", 1.0, frozenset({"ListMultipartUploads"}))])
    with pytest.raises(OSError) as refused:
        _sink(output, tmp_path / "state", log, proxy_options)
    message = str(refused.value)
    assert "this S3 server does not support listing multipart uploads" in message, message
    assert f"s3://{s3_server.bucket}/{output.removeprefix(f's3://{s3_server.bucket}/')}/" in message, message
    assert not any(key.startswith("epochs/") for key in _objects(s3_server, log)), "no segment in the log store"
    assert [k for k in _objects(s3_server, log) if k.startswith("home/epochs/")] == [], "nothing sealed"
    assert not any(k.endswith(".parquet") for k in _objects(s3_server, output)), "no file in the output"

    fault_proxy.set_rules([])  # the user moves to a server that supports it
    sink = _sink(output, tmp_path / "state", log, proxy_options)
    expected = _spark_batches(sink, spark, range(2))
    sink.flush()
    sink.close()
    assert read_pyarrow(output, s3_server.storage_options(), PARTS) == expected


def test_a_server_without_multipart_uploads_says_so(s3_server, s3_prefix, fault_proxy, proxy_options):
    fault_proxy.set_rules([FaultRule("unsupported", 1.0, frozenset({"CreateMultipartUpload"}))])
    fs, root = output_filesystem(OutputLocation(s3_prefix + "/table", proxy_options))
    upload = MultipartObject(fs, f"{root}/a.parquet")
    upload.write(b"x")
    with pytest.raises(OSError) as refused:
        upload.close()
    message = str(refused.value)
    assert f"cannot start the upload of {s3_prefix}/table/a.parquet" in message, message
    assert "this S3 server does not support multipart uploads" in message, message
    assert fault_proxy.requests["UploadPart"] == 0


def test_rclone_ranged_reads_fail_the_checksum_check_that_the_default_leaves_off(rclone_server, tmp_path):
    """rclone's server sends the whole object's checksum with a ranged read: botocore's check (its default,
    ``when_supported``) fails it. The sink checks checksums only when required; a user who turns the check on
    gets a message naming the server feature and the option."""
    url = rclone_server.url(f"test-{uuid.uuid4().hex}", "log")
    strict = rclone_server.storage_options()  # botocore's defaults: a CRC32 sent with each PUT, and checked
    strict["config_kwargs"] = {"response_checksum_validation": "when_supported"}
    strict["config_kwargs"]["request_checksum_calculation"] = "when_supported"
    FsspecStorage(url, strict).write("segment", [b"0123456789" * 100])  # rclone keeps the checksum sent
    default = FsspecStorage(url, rclone_server.storage_options())
    assert default.read_range("segment", 5, 10) == b"5678901234"
    with pytest.raises(OSError) as failed:
        FsspecStorage(url, strict).read_range("segment", 5, 10)
    message = str(failed.value)
    assert f"cannot read 10 bytes at 5 of {url}/segment" in message, message
    assert "does not support response checksums" in message and "response_checksum_validation=when_required" in message


def test_rclone_ignores_if_none_match_so_creates_check_first(rclone_server, moto_server):
    """rclone's server replaces an object on a PUT with ``If-None-Match: *``; the log store's create checks first,
    so a record that exists is never replaced (moto, like AWS, refuses the PUT itself)."""
    for server in (rclone_server, moto_server):
        url = server.url(f"test-{uuid.uuid4().hex}")
        fs = server.filesystem()
        bucket, key = url.removeprefix("s3://").split("/", 1)
        fs.call_s3("put_object", Bucket=bucket, Key=f"{key}/raw", Body=b"first", IfNoneMatch="*")
        with contextlib.suppress(FileExistsError):
            fs.call_s3("put_object", Bucket=bucket, Key=f"{key}/raw", Body=b"second", IfNoneMatch="*")
        honoured = fs.cat_file(f"{bucket}/{key}/raw") == b"first"
        assert honoured == (server is moto_server), "the servers behave as docs/testing.md says"
        storage = FsspecStorage(url, server.storage_options())
        assert storage.create("claim.json", b"first") is True
        assert storage.create("claim.json", b"second") is False
        assert storage.read_all("claim.json") == b"first"


# -- an endpoint that never answers --------------------------------------------------------------------------


@pytest.mark.timeout(240)
def test_an_endpoint_that_never_answers_fails_the_sink_within_the_limits_and_the_fixed_one_runs(
    spark, tmp_path, s3_server, s3_prefix
):
    """Each call is bounded by botocore's attempts alone (s3fs's own loop adds none), so the limits the storage
    options set are what the user waits: 2 attempts of 1 s here, against 4 of 15 s by default."""
    output, log = s3_prefix + "/table", s3_prefix + "/log"
    quick = {"read_timeout": 1, "connect_timeout": 1, "retries": {"mode": "standard", "max_attempts": 1}}
    with SilentServer() as silent:
        options = build(endpoint=silent.endpoint, json_options={"key": "k", "secret": "s", "config_kwargs": quick})
        fs, _ = open_filesystem(log, options)
        assert fs.retries == 1
        started = time.monotonic()
        with pytest.raises(TimeoutError) as failed:
            _sink(output, tmp_path / "state", log, options)
        took = time.monotonic() - started
    message = str(failed.value)
    assert silent.endpoint in message and (output in message or log in message), message  # the first read
    assert "read_timeout" in message and "retries max_attempts" in message, message
    assert silent.connections == 2, f"2 attempts of one call, not {silent.connections}"
    assert took < 10, f"{took:.1f} s"
    assert _objects(s3_server, log) == [], "nothing reached the real server"

    sink = _sink(output, tmp_path / "state", log, s3_server.storage_options())  # the right endpoint
    expected = _spark_batches(sink, spark, range(2))
    sink.flush()
    sink.close()
    assert read_pyarrow(output, s3_server.storage_options(), PARTS) == expected


def test_default_limits_bound_a_call_to_about_a_minute():
    """The defaults, as the clients see them: 15 s per read, 4 attempts, one s3fs attempt."""
    fs, _ = open_filesystem("s3://bucket/x", {"key": "k", "secret": "s"})
    config = fs.s3.meta.config
    assert (config.read_timeout, config.connect_timeout) == (15.0, 10.0)
    assert config.retries == {"mode": "standard", "total_max_attempts": 4}
    assert fs.retries == 1
    assert config.response_checksum_validation == "when_required"
    assert config.request_checksum_calculation == "when_required"
    mine, _ = open_filesystem("s3://bucket/x", {"key": "k", "secret": "s", "retries": 3})
    assert mine.retries == 3 and fs.retries == 1
    with pytest.raises(ValueError, match="retries"):
        open_filesystem("s3://bucket/x", {"retries": 0})


# -- the S3 options of the commands --------------------------------------------------------------------------


def test_storage_options_from_flags_merge_in_order_and_refuse_credentials(tmp_path, capsys):
    env = {"AWS_ACCESS_KEY_ID": "AKIAEXAMPLE", "AWS_SECRET_ACCESS_KEY": "secret"}
    options = build(
        endpoint="http://127.0.0.1:9000",
        region="eu-west-1",
        json_options=parse_options('{"config_kwargs": {"read_timeout": 30, "connect_timeout": 5}}'),
        options=[parse_option("config_kwargs.read_timeout=45"), parse_option("config_kwargs.retries.mode=adaptive")],
        environ=env,
    )
    assert options == {
        "key": "AKIAEXAMPLE",
        "secret": "secret",
        "client_kwargs": {"endpoint_url": "http://127.0.0.1:9000", "region_name": "eu-west-1"},
        "config_kwargs": {"read_timeout": 45, "connect_timeout": 5, "retries": {"mode": "adaptive"}},
    }
    for bad in ("secret=x", "noequals", "config_kwargs.=1"):
        with pytest.raises(Exception, match=r"credential|KEY=VALUE"):
            parse_option(bad)
    with pytest.raises(SystemExit) as usage:
        main(["recover", "status", "--state-dir", str(tmp_path), "--storage-option", "key=AKIA"])
    assert usage.value.code == 2
    assert "never taken from the command line" in capsys.readouterr().err


def test_missing_credentials_are_a_storage_error_saying_what_to_set(s3_server, s3_prefix, monkeypatch, tmp_path):
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    options = {"client_kwargs": {"endpoint_url": s3_server.endpoint}, "skip_instance_cache": True}
    with pytest.raises(PermissionError) as refused:
        FsspecStorage(s3_prefix + "/log", options).read_all("sink.json")
    message = str(refused.value)
    assert f"cannot read {s3_prefix}/log/sink.json" in message and "AWS_ACCESS_KEY_ID" in message, message
