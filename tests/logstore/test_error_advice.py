"""The advice an error gives matches its kind (``logstore/diagnosis.py``): a network error of the S3 log store
names the endpoint and says nothing of disks, a full disk says to free space, a read-only one to have it mounted
read-write; and the cause is told once, as one clause (no doubled period).

Real stores fail for real: the SeaweedFS test server behind the fault proxy (stopped, holding a request, answering
5xx), a closed port, a tiny tmpfs, a read-only bind mount, a failpoint's ``EIO``, a directory a process without
root's overrides cannot write. The unit tests of :func:`diagnose` use the exception objects the clients make."""

from __future__ import annotations

import dataclasses
import errno
import os
import re
import sqlite3
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from faultproxy import FaultProxy
from mounts import bind, tmpfs, without_dac
from s3servers import SilentServer, free_port

from filesink.demo.s3server import S3Settings
from filesink.errors import SinkOptionError
from filesink.localdirs import make_local_dir
from logstore import AppendTarget, LogLocation, LogWriteError, StateDatabaseError, append_segment
from logstore.append import VNODE_COLUMN
from logstore.diagnosis import Diagnosis, Kind, clause, diagnose, told
from logstore.home import DurableHome
from logstore.statedb import translated
from logstore.storage import S3_CHECKSUMS, LocalStorage, storage_error


def quick() -> dict[str, Any]:
    """botocore's settings for one attempt, a second to connect or answer: a failure costs about a second, not
    botocore's minute (a new dict each time: botocore rewrites the ``retries`` it is given)."""
    return {"connect_timeout": 1, "read_timeout": 1, "retries": {"mode": "standard", "max_attempts": 0}}


SUBPROCESS_WAIT = 60.0


def rows(n: int = 4, text: str = "x") -> pa.Table:
    return pa.table({"text": [text] * n, VNODE_COLUMN: pa.array([i % 4 for i in range(n)], pa.int32())})


def append_error(url: str, options: dict[str, Any], data: pa.Table | None = None) -> LogWriteError:
    with pytest.raises(LogWriteError) as failed:
        append_segment(AppendTarget(LogLocation(url, options), 4, "sink"), 1, rows() if data is None else data)
    return failed.value


def assert_one_clause_each(message: str) -> None:
    """No sentence ends twice: no ``..`` nor ``. .``, and no ``[Errno None]``."""
    assert not re.search(r"\.\s*\.", message), message
    assert "[Errno None]" not in message, message


def assert_network_advice(message: str, endpoint: str) -> None:
    assert_one_clause_each(message)
    assert f"check that the S3 server at {endpoint} answers" in message, message
    assert "disk" not in message and "free space" not in message, message
    assert "Nothing of this epoch is sealed, so nothing is lost" in message, message
    assert "restart the query; the epoch is appended again" in message, message
    assert "read_timeout" in message and "retries max_attempts" in message, message  # the limits, said once
    assert message.count("cannot write") == 1, message


# -- the S3 log store: the server stopped, silent, failing, refusing ----------------------------------------------


@pytest.fixture
def through_proxy(s3_server: S3Settings, fault_proxy: FaultProxy) -> tuple[str, dict[str, Any]]:
    """(URL, storage options) of a fresh log store on the SeaweedFS test server, through the fault proxy, with
    one attempt per call and 1 s limits."""
    options = dataclasses.replace(s3_server, endpoint=fault_proxy.endpoint).storage_options()
    options["config_kwargs"] = quick()
    return s3_server.url(f"test-{uuid.uuid4().hex}", "log"), options


@pytest.mark.timeout(60)
def test_an_append_to_a_stopped_s3_server_names_the_endpoint_and_says_nothing_of_disks(through_proxy, fault_proxy):
    url, options = through_proxy
    endpoint = fault_proxy.endpoint
    assert append_segment(AppendTarget(LogLocation(url, options), 4, "sink"), 0, rows()) is not None  # it works
    fault_proxy.stop()  # the endpoint now refuses connections, as a stopped server's does
    error = append_error(url, options)
    message = str(error)
    assert_network_advice(message, endpoint)
    assert f'Could not connect to the endpoint URL: "{endpoint}/' in message, message
    assert error.errno is None and isinstance(error, OSError)


def test_an_append_to_a_closed_port_names_the_endpoint_and_says_nothing_of_disks():
    endpoint = f"http://127.0.0.1:{free_port()}"
    options = {"key": "k", "secret": "s", "client_kwargs": {"endpoint_url": endpoint}, "config_kwargs": quick()}
    assert_network_advice(str(append_error("s3://bucket/log", options)), endpoint)


@pytest.mark.timeout(60)
def test_an_append_the_s3_server_never_answers_names_the_endpoint(through_proxy, fault_proxy):
    url, options = through_proxy
    fault_proxy.inject("timeout", "PutObject")  # the proxy takes the request and holds it unanswered
    message = str(append_error(url, options))
    assert_network_advice(message, fault_proxy.endpoint)
    assert "Read timeout on endpoint URL" in message, message


@pytest.mark.timeout(60)
def test_an_append_to_an_endpoint_that_accepts_and_never_answers_ends_at_the_read_timeout():
    """A server that takes the connection and never says a word (no ``100 Continue`` either): the upload is not
    held for ever waiting to be told to send its body (botocore's ``Expect: 100-continue``, which aiohttp waits on
    with no time limit); it is sent, and the read timeout ends the call."""
    with SilentServer() as silent:
        options = {"key": "k", "secret": "s", "client_kwargs": {"endpoint_url": silent.endpoint}}
        options["config_kwargs"] = quick()
        started = time.monotonic()
        message = str(append_error("s3://bucket/log", options, rows(20_000, "y" * 100)))  # a 2 MB body
        assert time.monotonic() - started < 30, message
        assert silent.connections >= 1
    assert_network_advice(message, silent.endpoint)
    assert "Read timeout on endpoint URL" in message, message


@pytest.mark.timeout(60)
def test_an_append_the_s3_server_fails_with_5xx_points_at_the_server_not_a_disk(through_proxy, fault_proxy):
    """s3fs gives an S3 error it has no errno for ``EIO``: on S3 that is never a disk's I/O error."""
    url, options = through_proxy
    fault_proxy.inject("5xx", "PutObject")
    error = append_error(url, options)
    message = str(error)
    assert_one_clause_each(message)
    assert "disk" not in message and "free space" not in message, message
    assert f"check the S3 server of s3://{url.split('/')[2]} (it failed the request after the retries" in message
    assert error.errno is not None and error.errno != errno.ENOSPC


@pytest.mark.timeout(60)
def test_an_append_with_the_wrong_secret_says_to_check_the_keys(s3_server, s3_prefix):
    options = {**s3_server.storage_options(), "secret": "not-the-secret", "config_kwargs": quick()}
    message = str(append_error(s3_prefix + "/log", options))
    assert_one_clause_each(message)
    assert "check the access key and secret the sink uses, and that the bucket's policy lets them write" in message
    assert "disk" not in message, message


def test_a_sink_started_with_an_unknown_key_says_to_check_the_keys(s3_server, s3_prefix, tmp_path):
    """The sink's first read of its output (the claim), refused for a key the server does not know: the error says
    what to check, for a read, before anything is written."""
    from filesink import ExactlyOnceParquetSink

    options = {**s3_server.storage_options(), "key": "AKIAUNKNOWN0", "config_kwargs": quick()}
    with pytest.raises(OSError) as refused:
        ExactlyOnceParquetSink(s3_prefix + "/out", tmp_path / "state", storage_options=options)
    message = str(refused.value)
    assert_one_clause_each(message)
    assert message.startswith(f"cannot read {s3_prefix}/out/_filesink.json: "), message
    assert "Check the access key and secret the sink uses, and that the bucket's policy lets them read" in message
    assert "disk" not in message, message


@pytest.mark.timeout(60)
def test_an_append_to_a_missing_bucket_says_to_create_it(moto_server):
    """On moto's server (SeaweedFS creates a bucket that a PUT names)."""
    bucket = f"missing-{uuid.uuid4().hex[:12]}"
    options = {**moto_server.storage_options(), "config_kwargs": quick()}
    error = append_error(f"s3://{bucket}/log", options)
    message = str(error)
    assert_one_clause_each(message)
    assert f"create the bucket {bucket}, or correct the bucket's name in s3://{bucket}/log" in message, message
    assert error.errno == errno.ENOENT or error.errno is None


# -- a local log store: a full disk, a read-only one, an I/O error, no permission ---------------------------------


@pytest.mark.timeout(60)
def test_an_append_to_a_full_disk_says_to_free_space_there(tmp_path):
    with tmpfs(tmp_path / "small", size="64k") as small:
        error = append_error(str(small / "log"), {}, rows(2000, "y" * 200))
    message = str(error)
    assert error.errno == errno.ENOSPC and "No space left on device" in message, message
    assert f"nothing is lost: free space on the disk holding {small / 'log'}, then restart the query" in message
    assert_one_clause_each(message)


@pytest.mark.timeout(60)
def test_an_append_to_a_read_only_file_system_says_to_mount_it_read_write(tmp_path):
    with bind(tmp_path / "log", tmp_path / "log", readonly=True) as log:
        error = append_error(str(log), {})
        home = DurableHome(LocalStorage(log))
        with pytest.raises(OSError) as recording:
            home.write("home/files/a.json", {"file": "a"})
    for raised in (error, recording.value):
        message = str(raised)
        assert raised.errno == errno.EROFS, message
        assert f"see that the file system holding {log} is mounted read-write" in message, message
        assert "free space" not in message, message
        assert_one_clause_each(message)
    assert "What it records has not taken effect: see that the file system" in str(recording.value)


def test_an_i_o_error_of_the_disk_says_to_check_the_disk(tmp_path, monkeypatch):
    monkeypatch.setenv("FILESINK_FAILPOINTS", "logstore.storage.write=eio")
    error = append_error(str(tmp_path / "log"), {})
    message = str(error)
    assert error.errno == errno.EIO and "Input/output error" in message, message
    assert f"check the disk holding {tmp_path / 'log'}" in message, message
    assert_one_clause_each(message)


APPEND_AS_ANOTHER_USER = """
import sys
import pyarrow as pa
from logstore import AppendTarget, LogLocation, LogWriteError, append_segment
table = pa.table({"text": ["x"], "__vnode": pa.array([0], pa.int32())})
try:
    append_segment(AppendTarget(LogLocation(sys.argv[1]), 4, "sink"), 1, table)
except LogWriteError as e:
    print(e.errno, e)
"""


@pytest.mark.timeout(120)
def test_an_append_without_write_permission_says_to_give_it(tmp_path):
    log = tmp_path / "log"
    log.mkdir()
    log.chmod(0o555)
    prefix = without_dac(log)
    done = subprocess.run(
        [*prefix, sys.executable, "-c", APPEND_AS_ANOTHER_USER, str(log)],
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_WAIT,
        cwd=Path(__file__).parents[2],
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])},
    )
    code, _, message = done.stdout.strip().partition(" ")
    assert code == str(errno.EACCES), done.stdout + done.stderr
    assert f"give the user that runs the sink permission to write to {log}, then restart the query" in message
    assert "free space" not in message, message
    assert_one_clause_each(message)


@pytest.mark.timeout(60)
def test_a_sink_directory_on_a_read_only_file_system_says_so_not_permissions(tmp_path):
    """The sink's own directories get the same advice (filesink.localdirs, once fixed advice on permissions)."""
    with bind(tmp_path / "ro", tmp_path / "ro", readonly=True) as ro, pytest.raises(SinkOptionError) as refused:
        make_local_dir(ro / "state", "state_dir")
    message = str(refused.value)
    assert f"state_dir {ro / 'state'} cannot be created: Read-only file system. Nothing was written." in message
    assert f"See that the file system holding {ro / 'state'} is mounted read-write" in message, message
    assert "then start again." in message and "permission" not in message, message
    assert_one_clause_each(message)


@pytest.mark.timeout(60)
def test_a_full_disk_under_the_state_database_says_to_free_space_there(tmp_path):
    with tmpfs(tmp_path / "small", size="64k") as small:
        conn = sqlite3.connect(small / "state.sqlite")
        conn.execute("CREATE TABLE t (b BLOB)")
        with pytest.raises(StateDatabaseError) as full, translated(str(small / "state.sqlite"), "fill the table"):
            for _ in range(100):
                conn.execute("INSERT INTO t VALUES (?)", (b"z" * 4096,))
                conn.commit()
        conn.close()
    message = str(full.value)
    assert "database or disk is full" in message, message
    assert f"nothing is lost: free space on the disk holding {small}, then restart the query." in message, message
    assert_one_clause_each(message)


# -- diagnose, kind by kind ---------------------------------------------------------------------------------------


def _os_error(code: int) -> OSError:
    return OSError(code, os.strerror(code), "/data/log/x.seg")


@pytest.mark.parametrize(
    ("code", "kind", "remedy"),
    [
        (errno.ENOSPC, Kind.NO_SPACE, "free space on the disk holding /data/log"),
        (errno.EDQUOT, Kind.NO_SPACE, "free space in the disk quota of the user that runs the sink"),
        (errno.EACCES, Kind.PERMISSION, "give the user that runs the sink permission to write to /data/log"),
        (errno.EPERM, Kind.PERMISSION, "give the user that runs the sink permission to write to /data/log"),
        (errno.EROFS, Kind.READ_ONLY, "see that the file system holding /data/log is mounted read-write"),
        (errno.EIO, Kind.DISK, "check the disk holding /data/log"),
        (errno.ESTALE, Kind.UNREACHABLE, "check the network file system holding /data/log"),
        (errno.ENOENT, Kind.OTHER, "fix the cause"),
    ],
)
def test_a_local_error_is_told_by_its_errno(code, kind, remedy):
    found = diagnose(_os_error(code), "/data/log")
    assert found.kind is kind and found.remedy.startswith(remedy), found
    assert found.cause == os.strerror(code)  # the file is the caller's to name
    assert diagnose(_os_error(code), "file:///data/log").remedy == found.remedy


def test_a_refused_read_says_read():
    found = diagnose(PermissionError(errno.EACCES, "Permission denied"), "/in/a.csv", writing=False)
    assert found.remedy == "give the user that runs the sink permission to read /in/a.csv"


def _client_error(code: str, status: int, operation: str = "PutObject") -> Exception:
    """What s3fs raises for an S3 error answer: its translation, raised from botocore's ``ClientError``."""
    from botocore.exceptions import ClientError
    from s3fs.errors import translate_boto_error

    answer = {
        "Error": {"Code": code, "Message": f"the {code} message."},
        "ResponseMetadata": {"HTTPStatusCode": status},
    }
    translated_error: Exception = translate_boto_error(ClientError(answer, operation))  # type: ignore[arg-type]
    return translated_error


def _through_storage(error: BaseException) -> OSError:
    """``error`` as the log store's storage raises it (``raise storage_error(...) from error``)."""
    made = storage_error("cannot write s3://bucket/log/x.seg", error, "s3://bucket/log/x.seg")
    made.__cause__ = error
    return made


@pytest.mark.parametrize(
    ("code", "status", "kind", "remedy"),
    [
        ("SlowDown", 503, Kind.SERVER, "check the S3 server of s3://bucket (it failed the request"),
        ("InternalError", 500, Kind.SERVER, "check the S3 server of s3://bucket"),
        ("SomethingNew", 502, Kind.SERVER, "check the S3 server of s3://bucket"),
        ("AccessDenied", 403, Kind.PERMISSION, "check the access key and secret the sink uses"),
        ("SignatureDoesNotMatch", 403, Kind.PERMISSION, "check the access key and secret the sink uses"),
        ("NoSuchBucket", 404, Kind.NO_BUCKET, "create the bucket bucket, or correct the bucket's name"),
        ("RequestTimeTooSkewed", 403, Kind.CLOCK, "set this host's clock right"),
        ("RequestTimeout", 400, Kind.UNREACHABLE, "check that the S3 server of s3://bucket answers"),
        ("InvalidArgument", 400, Kind.OTHER, "fix the cause"),
    ],
)
def test_an_s3_answer_is_told_by_its_code_never_as_a_disk(code, status, kind, remedy):
    raw = _client_error(code, status)
    for error in (raw, _through_storage(raw)):
        found = diagnose(error, "s3://bucket/log")
        assert found.kind is kind and found.remedy.startswith(remedy), (error, found)
        assert "disk" not in found.remedy and not found.cause.endswith("."), found
        assert found.cause == clause(str(raw.strerror if isinstance(raw, OSError) and raw.strerror else raw))


@pytest.mark.parametrize("name", ["EndpointConnectionError", "ConnectTimeoutError", "ReadTimeoutError"])
def test_a_connection_that_failed_names_the_endpoint_once_wrapped(name):
    import botocore.exceptions as be

    raw = getattr(be, name)(endpoint_url="http://10.1.2.3:8333/bucket/log/x.seg")
    made = _through_storage(raw)
    assert isinstance(made, TimeoutError)
    assert told(made) == f"cannot write s3://bucket/log/x.seg: {raw}"  # for callers that do not name the file
    text = str(made)
    assert text.startswith(
        f"cannot write s3://bucket/log/x.seg: {raw}. Check that the S3 server at http://10.1.2.3:8333"
    )
    assert_one_clause_each(text)
    found = diagnose(made, "s3://bucket/log")
    assert found.kind is Kind.UNREACHABLE and found.cause == str(raw), found
    assert found.remedy.startswith("check that the S3 server at http://10.1.2.3:8333 answers"), found
    assert "read_timeout" in found.note and not found.note.endswith("."), found


def test_an_os_level_connection_error_on_s3_is_a_network_error():
    found = diagnose(ConnectionRefusedError(errno.ECONNREFUSED, "Connection refused"), "s3://bucket/log")
    assert found.kind is Kind.UNREACHABLE and found.remedy.startswith("check that the S3 server of s3://bucket")


def test_missing_credentials_and_a_bad_checksum_keep_their_advice():
    import botocore.exceptions as be

    made = _through_storage(be.NoCredentialsError())
    assert isinstance(made, PermissionError) and "Set AWS_ACCESS_KEY_ID" in str(made)
    assert diagnose(made, "s3://bucket/log").kind is Kind.CREDENTIALS
    made = _through_storage(be.FlexibleChecksumError(error_msg="Expected checksum a did not match calculated b"))
    assert f"response_checksum_validation={S3_CHECKSUMS}" in str(made) and "does not support response" in str(made)
    assert diagnose(made, "s3://bucket/log").kind is Kind.CHECKSUM


def test_a_cause_is_one_clause_and_the_advice_one_sentence():
    assert clause("Could not connect.\n  Try again..") == "Could not connect. Try again"
    assert clause("no stop") == "no stop"
    found = Diagnosis(Kind.OTHER, "x", "fix the cause", note="The limits are options")
    assert found.advise("restart the query") == "fix the cause, then restart the query. The limits are options."
    assert found.advise(first=True) == "Fix the cause. The limits are options."
