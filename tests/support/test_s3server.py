"""The S3 test server itself: the session fixture's server, starting and stopping SeaweedFS, the env settings."""

from __future__ import annotations

import dataclasses
import os
import re
import socket
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import s3fs

from filesink.demo.s3server import (
    ENV_ACCESS_KEY,
    ENV_BUCKET,
    ENV_ENDPOINT,
    ENV_REGION,
    ENV_SECRET_KEY,
    S3Settings,
    SeaweedServer,
    SeaweedStartError,
    settings_from_env,
)

MIB = 2**20


def _process_gone(pid: int | None) -> bool:
    assert pid is not None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def _keys_under(fs: s3fs.S3FileSystem, bucket: str, url: str) -> list[str]:
    """Keys of the objects under ``url``, from one undelimited ListObjectsV2 call."""
    prefix = url.removeprefix(f"s3://{bucket}/") + "/"
    answer = fs.call_s3("list_objects_v2", Bucket=bucket, Prefix=prefix)
    assert not answer.get("IsTruncated")
    return sorted(item["Key"] for item in answer.get("Contents", []))


def test_prefix_and_options_fixtures(s3_server: S3Settings, s3_prefix: str, s3_options: dict) -> None:
    assert re.fullmatch(rf"s3://{re.escape(s3_server.bucket)}/test-[0-9a-f]{{32}}", s3_prefix)
    assert s3_options == s3_server.storage_options()
    assert s3_options["client_kwargs"]["endpoint_url"] == s3_server.endpoint


def test_round_trip_small_and_multipart_objects(s3_server: S3Settings, s3_prefix: str) -> None:
    fs = s3_server.filesystem()
    small, big = f"{s3_prefix}/dir/small.bin", f"{s3_prefix}/big.bin"
    small_data = b"hello \x00 world\n" * 100
    big_data = os.urandom(6 * MIB + 12345)

    fs.pipe(small, small_data)
    with fs.open(big, "wb", block_size=5 * MIB) as f:
        for start in range(0, len(big_data), MIB):
            f.write(big_data[start : start + MIB])

    # A second filesystem instance has no listing cache: what it sees is what the server holds.
    fresh = s3_server.filesystem()
    assert sorted(fresh.ls(s3_prefix, detail=False)) == sorted(
        [s3_prefix.removeprefix("s3://") + "/big.bin", s3_prefix.removeprefix("s3://") + "/dir"]
    )
    assert fresh.find(s3_prefix) == sorted(p.removeprefix("s3://") for p in (big, small))
    assert _keys_under(fresh, s3_server.bucket, s3_prefix) == sorted(
        p.removeprefix(f"s3://{s3_server.bucket}/") for p in (big, small)
    )
    assert fresh.cat(small) == small_data
    info = fresh.info(big)
    assert info["size"] == len(big_data)
    # 1 MiB writes into 5 MiB blocks: a 5 MiB part, then the rest on close. S3 servers give multipart
    # objects the ETag "<md5 of the part md5s>-<part count>".
    assert info["ETag"].strip('"').endswith("-2"), info["ETag"]
    assert fresh.cat(big) == big_data
    assert fresh.cat_file(big, start=5 * MIB - 3, end=5 * MIB + 3) == big_data[5 * MIB - 3 : 5 * MIB + 3]

    fs.rm([small, big])
    gone = s3_server.filesystem()
    assert not gone.exists(small)
    assert not gone.exists(big)
    with pytest.raises(FileNotFoundError):
        gone.cat(big)
    # Not `find`/`ls`: SeaweedFS keeps emptied "directories" as common prefixes of delimited listings
    # until its empty-folder cleaner runs (see docs/testing.md); the objects themselves are gone.
    assert _keys_under(gone, s3_server.bucket, s3_prefix) == []


def test_wrong_secret_is_refused(s3_server: S3Settings, s3_prefix: str) -> None:
    s3_server.filesystem().pipe(f"{s3_prefix}/x", b"x")
    wrong = dataclasses.replace(s3_server, secret_key=s3_server.secret_key + "-wrong").filesystem()
    with pytest.raises(PermissionError):
        wrong.cat(f"{s3_prefix}/x")
    with pytest.raises(PermissionError):
        wrong.pipe(f"{s3_prefix}/y", b"y")
    assert not s3_server.filesystem().exists(f"{s3_prefix}/y")


def test_own_server_starts_serves_and_stops(tmp_path) -> None:
    server = SeaweedServer(tmp_path, bucket="own-bucket")
    with server as settings:
        assert settings.bucket == "own-bucket"
        assert settings.endpoint.startswith("http://127.0.0.1:")
        fs = settings.filesystem()
        assert fs.exists("own-bucket")
        fs.pipe(settings.url("a", "b.txt"), b"payload")
        assert settings.filesystem().cat(settings.url("a", "b.txt")) == b"payload"
        pid = server.pid
        assert pid is not None and not _process_gone(pid)
    assert _process_gone(pid)
    grpc_ports = re.findall(r"-(\w+)\.port\.grpc=(\d+)", " ".join(server.command))
    assert len(grpc_ports) == 5
    leftovers = [Path(f"/tmp/seaweedfs-{name}-grpc-{port}.sock") for name, port in grpc_ports]
    assert [path for path in leftovers if path.exists()] == []
    with pytest.raises(urllib.error.URLError):
        urllib.request.build_opener(urllib.request.ProxyHandler({})).open(settings.endpoint, timeout=2)


def test_occupied_s3_port_is_a_start_error_with_the_log(tmp_path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        server = SeaweedServer(tmp_path, s3_port=port, start_timeout=30)
        with pytest.raises(SeaweedStartError) as caught:
            server.start()
    message = str(caught.value)
    assert f"-s3.port={port}" in message  # the command line
    assert re.search(rf"port {port} .*not available", message)  # weed's own log line
    assert "1 attempt(s)" in message  # a pinned port is not retried
    assert _process_gone(server.last_pid)


def test_bogus_argument_is_a_start_error_with_the_log(tmp_path) -> None:
    server = SeaweedServer(tmp_path, extra_args=["-no-such-flag=1"], start_timeout=30)
    with pytest.raises(SeaweedStartError, match="exited early with code") as caught:
        server.start()
    message = str(caught.value)
    assert "-no-such-flag=1" in message
    assert "flag provided but not defined: -no-such-flag" in message
    assert _process_gone(server.last_pid)


def test_deadline_is_a_start_error_and_the_server_is_stopped(tmp_path) -> None:
    server = SeaweedServer(tmp_path, start_timeout=0)
    with pytest.raises(SeaweedStartError, match="did not answer within the deadline"):
        server.start()
    assert _process_gone(server.last_pid)
    assert server.pid is None


def test_settings_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (ENV_ENDPOINT, ENV_ACCESS_KEY, ENV_SECRET_KEY, ENV_BUCKET, ENV_REGION):
        monkeypatch.delenv(name, raising=False)
    assert settings_from_env() is None

    monkeypatch.setenv(ENV_ENDPOINT, "http://minio.example:9000")
    with pytest.raises(RuntimeError) as caught:
        settings_from_env()
    for name in (ENV_ACCESS_KEY, ENV_SECRET_KEY, ENV_BUCKET):
        assert name in str(caught.value)

    monkeypatch.setenv(ENV_ACCESS_KEY, "AK")
    monkeypatch.setenv(ENV_BUCKET, "")
    with pytest.raises(RuntimeError) as caught:
        settings_from_env()
    assert ENV_ACCESS_KEY not in str(caught.value)
    assert ENV_SECRET_KEY in str(caught.value) and ENV_BUCKET in str(caught.value)

    monkeypatch.setenv(ENV_SECRET_KEY, "SK")
    monkeypatch.setenv(ENV_BUCKET, "sink-tests")
    settings = settings_from_env()
    assert settings == S3Settings("http://minio.example:9000", "AK", "SK", "sink-tests", "us-east-1")
    assert settings.storage_options() == {
        "key": "AK",
        "secret": "SK",
        "client_kwargs": {"endpoint_url": "http://minio.example:9000", "region_name": "us-east-1"},
    }
    assert settings.url("a", "b") == "s3://sink-tests/a/b"

    monkeypatch.setenv(ENV_REGION, "eu-west-3")
    assert settings_from_env() == S3Settings("http://minio.example:9000", "AK", "SK", "sink-tests", "eu-west-3")
