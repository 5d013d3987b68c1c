"""The fault-injecting proxy itself: requests reach the S3 server intact, and each fault kind reaches a client.

The clients here are plain botocore clients without retries, so every injected fault surfaces as an error;
a second client talks to the server directly to see what the server applied.
"""

from __future__ import annotations

import http.client
import time
import uuid
from urllib.parse import urlsplit

import botocore.session
import pytest
import s3fs
from botocore.config import Config
from botocore.exceptions import ClientError, ConnectionClosedError, HTTPClientError, ReadTimeoutError
from faultproxy import PROXY_READ_TIMEOUT, FaultProxy, FaultRule, classify

from filesink.demo.s3server import S3Settings

MIB = 2**20


def client(settings: S3Settings, endpoint: str, attempts: int = 1, read_timeout: float = 30.0):
    config = Config(
        retries={"mode": "standard", "total_max_attempts": attempts},
        read_timeout=read_timeout,
        connect_timeout=PROXY_READ_TIMEOUT,
        s3={"addressing_style": "path"},
    )
    return botocore.session.get_session().create_client(
        "s3",
        endpoint_url=endpoint,
        region_name=settings.region,
        aws_access_key_id=settings.access_key,
        aws_secret_access_key=settings.secret_key,
        config=config,
    )


@pytest.fixture
def clients(s3_server, fault_proxy):
    """(client through the proxy without retries, client straight to the server, a fresh key prefix)."""
    return client(s3_server, fault_proxy.endpoint), client(s3_server, s3_server.endpoint), f"proxy-{uuid.uuid4().hex}"


def exists(direct, bucket: str, key: str) -> bool:
    try:
        direct.head_object(Bucket=bucket, Key=key)
    except ClientError as e:
        assert e.response["ResponseMetadata"]["HTTPStatusCode"] == 404
        return False
    return True


@pytest.mark.parametrize(
    ("method", "target", "operation"),
    [
        ("POST", "/b/k/x.parquet?uploads", "CreateMultipartUpload"),
        ("PUT", "/b/k?partNumber=3&uploadId=u1", "UploadPart"),
        ("POST", "/b/k?uploadId=u1", "CompleteMultipartUpload"),
        ("DELETE", "/b/k?uploadId=u1", "AbortMultipartUpload"),
        ("GET", "/b/k?uploadId=u1", "ListParts"),
        ("PUT", "/b/k/seg", "PutObject"),
        ("GET", "/b/k/seg", "GetObject"),
        ("HEAD", "/b/k/seg", "HeadObject"),
        ("DELETE", "/b/k/seg", "DeleteObject"),
        ("POST", "/b/?delete", "DeleteObjects"),
        ("GET", "/b?list-type=2&prefix=k%2F", "ListObjectsV2"),
        ("GET", "/b/?prefix=k", "ListObjects"),
        ("GET", "/b?uploads&prefix=k%2F", "ListMultipartUploads"),
        ("HEAD", "/b", "HeadBucket"),
        ("GET", "/", "ListBuckets"),
    ],
)
def test_classify(method, target, operation):
    assert classify(method, target) == operation


def test_requests_and_answers_pass_intact(s3_server, fault_proxy, clients):
    proxied, direct, prefix = clients
    bucket = s3_server.bucket
    body = bytes(range(256)) * (6 * MIB // 256 + 3)  # not a multiple of anything
    proxied.put_object(Bucket=bucket, Key=f"{prefix}/big", Body=body)
    assert direct.get_object(Bucket=bucket, Key=f"{prefix}/big")["Body"].read() == body
    assert (
        proxied.get_object(Bucket=bucket, Key=f"{prefix}/big", Range="bytes=5-1000004")["Body"].read()
        == body[5:1000005]
    )
    upload = proxied.create_multipart_upload(Bucket=bucket, Key=f"{prefix}/mp")["UploadId"]
    parts = []
    for number, chunk in enumerate((body[: 5 * MIB], body[5 * MIB :]), 1):
        etag = proxied.upload_part(Bucket=bucket, Key=f"{prefix}/mp", UploadId=upload, PartNumber=number, Body=chunk)
        parts.append({"PartNumber": number, "ETag": etag["ETag"]})
    proxied.complete_multipart_upload(
        Bucket=bucket, Key=f"{prefix}/mp", UploadId=upload, MultipartUpload={"Parts": parts}
    )
    assert direct.get_object(Bucket=bucket, Key=f"{prefix}/mp")["Body"].read() == body
    assert proxied.head_object(Bucket=bucket, Key=f"{prefix}/mp")["ContentLength"] == len(body)
    listed = proxied.list_objects_v2(Bucket=bucket, Prefix=f"{prefix}/")["Contents"]
    assert sorted(o["Key"] for o in listed) == [f"{prefix}/big", f"{prefix}/mp"]
    proxied.delete_object(Bucket=bucket, Key=f"{prefix}/big")
    assert not exists(direct, bucket, f"{prefix}/big")
    assert fault_proxy.total_faults() == 0
    assert fault_proxy.requests["UploadPart"] == 2 and fault_proxy.requests["CompleteMultipartUpload"] == 1
    assert fault_proxy.connections == 1, "one kept-alive client connection served every request"


def test_chunked_request_body(s3_server, fault_proxy):
    """A body sent with ``Transfer-Encoding: chunked`` (here to a presigned URL) arrives whole."""
    direct = client(s3_server, s3_server.endpoint)
    key = f"proxy-{uuid.uuid4().hex}/chunked"
    url = client(s3_server, fault_proxy.endpoint).generate_presigned_url(
        "put_object", Params={"Bucket": s3_server.bucket, "Key": key}
    )
    parts = [b"a" * 70_000, b"b" * 3, b"c" * 100_000]
    target = urlsplit(url)
    conn = http.client.HTTPConnection(target.hostname, target.port, timeout=10)
    conn.request("PUT", f"{target.path}?{target.query}", body=iter(parts), encode_chunked=True)
    answer = conn.getresponse()
    answer.read()
    conn.close()
    assert answer.status == 200
    assert direct.get_object(Bucket=s3_server.bucket, Key=key)["Body"].read() == b"".join(parts)


@pytest.mark.parametrize("operation", ["PutObject", "HeadObject"])
def test_5xx(s3_server, fault_proxy, clients, operation):
    proxied, direct, prefix = clients
    key = f"{prefix}/obj"
    direct.put_object(Bucket=s3_server.bucket, Key=key, Body=b"old")
    seen = set()
    for _ in range(12):  # 500 or 503, at random
        fault_proxy.inject("5xx", operation)
        with pytest.raises(ClientError) as caught:
            if operation == "PutObject":
                proxied.put_object(Bucket=s3_server.bucket, Key=key, Body=b"new")
            else:
                proxied.head_object(Bucket=s3_server.bucket, Key=key)
        status = caught.value.response["ResponseMetadata"]["HTTPStatusCode"]
        code = caught.value.response["Error"]["Code"]
        if operation == "PutObject":  # the XML body is parsed; HEAD answers have none
            assert (status, code) in {(500, "InternalError"), (503, "SlowDown")}
        seen.add(status)
    assert seen == {500, 503}
    assert direct.get_object(Bucket=s3_server.bucket, Key=key)["Body"].read() == b"old", "nothing was forwarded"
    assert fault_proxy.faults_by_kind() == {"5xx": 12}
    assert fault_proxy.faults_by_operation() == {operation: 12}


def test_timeout(s3_server, fault_proxy, clients):
    _, direct, prefix = clients
    proxied = client(s3_server, fault_proxy.endpoint, read_timeout=PROXY_READ_TIMEOUT)
    fault_proxy.inject("timeout", "PutObject")
    began = time.monotonic()
    with pytest.raises(ReadTimeoutError):
        proxied.put_object(Bucket=s3_server.bucket, Key=f"{prefix}/slow", Body=b"x")
    waited = time.monotonic() - began
    assert PROXY_READ_TIMEOUT <= waited < fault_proxy.hold_seconds
    assert not exists(direct, s3_server.bucket, f"{prefix}/slow"), "a timed-out request is not forwarded"
    proxied.put_object(Bucket=s3_server.bucket, Key=f"{prefix}/slow", Body=b"x")  # the next one goes through
    assert exists(direct, s3_server.bucket, f"{prefix}/slow")


def test_drop(s3_server, fault_proxy, clients):
    proxied, direct, prefix = clients
    fault_proxy.inject("drop", "PutObject")
    with pytest.raises((ConnectionClosedError, HTTPClientError)):
        proxied.put_object(Bucket=s3_server.bucket, Key=f"{prefix}/dropped", Body=b"x")
    assert not exists(direct, s3_server.bucket, f"{prefix}/dropped")
    assert fault_proxy.faults == {("drop", "PutObject"): 1}


def test_lost_response_put_is_applied(s3_server, fault_proxy, clients):
    proxied, direct, prefix = clients
    fault_proxy.inject("lost_response", "PutObject")
    with pytest.raises((ConnectionClosedError, HTTPClientError)):
        proxied.put_object(Bucket=s3_server.bucket, Key=f"{prefix}/lost", Body=b"applied")
    assert direct.get_object(Bucket=s3_server.bucket, Key=f"{prefix}/lost")["Body"].read() == b"applied"


@pytest.mark.parametrize("forget_completed", [False, True])
def test_lost_response_complete(s3_server, fault_proxy, clients, forget_completed):
    """The client sees an error, the object is visible; the retry is answered as the server (or the stricter
    servers the proxy emulates) answers it."""
    proxied, direct, prefix = clients
    fault_proxy.forget_completed = forget_completed
    bucket, key = s3_server.bucket, f"{prefix}/mp"
    upload = proxied.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"]
    etag = proxied.upload_part(Bucket=bucket, Key=key, UploadId=upload, PartNumber=1, Body=b"data")["ETag"]
    done = {"Parts": [{"PartNumber": 1, "ETag": etag}]}
    fault_proxy.inject("lost_response", "CompleteMultipartUpload")
    with pytest.raises((ConnectionClosedError, HTTPClientError)):
        proxied.complete_multipart_upload(Bucket=bucket, Key=key, UploadId=upload, MultipartUpload=done)
    assert direct.get_object(Bucket=bucket, Key=key)["Body"].read() == b"data"
    if forget_completed:
        with pytest.raises(ClientError) as caught:
            proxied.complete_multipart_upload(Bucket=bucket, Key=key, UploadId=upload, MultipartUpload=done)
        assert caught.value.response["Error"]["Code"] == "NoSuchUpload"
        assert fault_proxy.emulated == {"NoSuchUpload": 1}
    else:
        proxied.complete_multipart_upload(Bucket=bucket, Key=key, UploadId=upload, MultipartUpload=done)
        assert fault_proxy.emulated == {}


def test_lost_response_create_leaves_an_upload(s3_server, fault_proxy, clients):
    proxied, direct, prefix = clients
    fault_proxy.inject("lost_response", "CreateMultipartUpload")
    with pytest.raises((ConnectionClosedError, HTTPClientError)):
        proxied.create_multipart_upload(Bucket=s3_server.bucket, Key=f"{prefix}/orphan")
    uploads = direct.list_multipart_uploads(Bucket=s3_server.bucket, Prefix=f"{prefix}/").get("Uploads", [])
    assert [u["Key"] for u in uploads] == [f"{prefix}/orphan"]
    direct.abort_multipart_upload(Bucket=s3_server.bucket, Key=f"{prefix}/orphan", UploadId=uploads[0]["UploadId"])


def test_rules_are_seeded_and_filtered(s3_server):
    """The same seed and requests give the same faults; a rule limited to an operation spares the others."""
    outcomes = []
    for _ in range(2):
        with FaultProxy(s3_server.endpoint, seed=7, rules=[FaultRule("5xx", 0.4, frozenset({"HeadObject"}))]) as proxy:
            proxied, prefix = client(s3_server, proxy.endpoint), f"proxy-{uuid.uuid4().hex}"
            proxied.put_object(Bucket=s3_server.bucket, Key=f"{prefix}/k", Body=b"x")
            run = []
            for _ in range(40):
                try:
                    proxied.head_object(Bucket=s3_server.bucket, Key=f"{prefix}/k")
                    run.append("ok")
                except ClientError as e:
                    run.append(str(e.response["ResponseMetadata"]["HTTPStatusCode"]))
                proxied.put_object(Bucket=s3_server.bucket, Key=f"{prefix}/k", Body=b"x")  # never faulted
            assert proxy.faults_by_operation() == {"HeadObject": 40 - run.count("ok")}
            assert proxy.requests["PutObject"] == 41
            outcomes.append(run)
    assert outcomes[0] == outcomes[1]
    assert 5 < 40 - outcomes[0].count("ok") < 30


def test_s3fs_retries_through_every_fault_kind(s3_server, fault_proxy, proxy_options):
    """With botocore's retries (and s3fs's), each fault is absorbed: the writes and reads succeed."""
    options = dict(proxy_options)
    options["config_kwargs"] = {**options["config_kwargs"], "retries": {"mode": "standard", "max_attempts": 4}}
    fs = s3fs.S3FileSystem(skip_instance_cache=True, **options)
    root = f"{s3_server.bucket}/proxy-{uuid.uuid4().hex}"
    for kind in ("5xx", "timeout", "drop", "lost_response"):
        fault_proxy.inject(kind, "PutObject")
        fault_proxy.inject(kind, "GetObject")
        fs.pipe_file(f"{root}/{kind}", kind.encode())
        assert fs.cat_file(f"{root}/{kind}") == kind.encode()
    assert fault_proxy.faults_by_kind() == {"5xx": 2, "timeout": 2, "drop": 2, "lost_response": 2}
