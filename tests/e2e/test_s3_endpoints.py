"""S3 endpoints as a user gives them: one that is not an ``http://`` or ``https://`` URL is refused as bad usage
(exit 2) with what to give instead, before anything is opened, whether it comes from ``--s3-endpoint``, a storage
option or ``AWS_ENDPOINT_URL``, by ``filesink run`` and every ``filesink recover`` step; an endpoint that answers HTTP
but not as an S3 server (a plain HTTP server, a web console) is told apart from a missing bucket (SeaweedFS's
``NoSuchBucket``) and reported as such, naming the endpoint and the port to check."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import run_server
from botocore.utils import is_valid_endpoint_url, is_valid_ipv6_endpoint_url
from s3servers import PlainHttpServer

from filesink.cli.main import main
from filesink.demo.s3server import S3Settings
from filesink.errors import StorageAccessError
from filesink.output.probe import check_s3
from filesink.s3options import endpoint_problem

pytestmark = pytest.mark.timeout(120)

NO_SCHEME = "127.0.0.1:9000"
SAID = "has no scheme: use http://127.0.0.1:9000 or https://127.0.0.1:9000"
ENV_SAID = f"AWS_ENDPOINT_URL={NO_SCHEME} {SAID} (set it so, or unset it and give --s3-endpoint). Nothing was written."


def filesink(*args: str, env: dict[str, str] | None = None) -> Any:
    environ = {k: v for k, v in os.environ.items() if k not in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3")}
    return run_server.filesink(args, 90, env=env, environ=environ)


def _run(tmp_path: Path, *extra: str, output: str = "s3://filesink-test/table") -> list[str]:
    (tmp_path / "in").mkdir(exist_ok=True)
    return ["run", "--input", str(tmp_path / "in"), "--output", output, "--state-dir", str(tmp_path / "state"), *extra]


@pytest.fixture(autouse=True)
def _no_endpoint_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    monkeypatch.delenv("AWS_IGNORE_CONFIGURED_ENDPOINT_URLS", raising=False)


# -- an endpoint that is not a URL -------------------------------------------------------------------------------


def test_what_is_wrong_with_an_endpoint_and_the_s3_client_agrees() -> None:
    problems = {
        NO_SCHEME: SAID,
        "localhost:9000": "has no scheme: use http://localhost:9000 or https://localhost:9000",
        "s3://bucket": "is a location, not an endpoint",
        "ftp://host:21": "has the scheme ftp://, and an S3 endpoint is http:// or https://: use http://host:21",
        "http://": "has no host",
        "http://host:port": "has a port that is not a number",
        "http://my_minio:9000": "has the host name 'my_minio', which the S3 client refuses",
    }
    for url, said in problems.items():
        problem = endpoint_problem(url)
        assert problem is not None and problem.startswith(said), (url, problem)
        assert not (is_valid_endpoint_url(url) and is_valid_ipv6_endpoint_url(url)), f"botocore takes {url}"
    for url in (
        "http://127.0.0.1:9000",
        "https://s3.eu-west-1.amazonaws.com",
        "http://[::1]:8333",
        "http://minio:9000/",
    ):
        assert endpoint_problem(url) is None, url
        assert is_valid_endpoint_url(url) or is_valid_ipv6_endpoint_url(url), f"botocore refuses {url}"


def test_run_refuses_an_endpoint_without_a_scheme_before_anything(tmp_path: Path) -> None:
    """The user's command: a usage error naming the option, no traceback, no state directory."""
    proc = filesink(*_run(tmp_path, "--s3-endpoint", NO_SCHEME))
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.splitlines()[-1] == f"filesink run: error: --s3-endpoint {NO_SCHEME} {SAID}"
    assert "Traceback" not in proc.stderr
    proc = filesink(*_run(tmp_path), env={"AWS_ENDPOINT_URL": NO_SCHEME})
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.splitlines()[-1] == f"error: {ENV_SAID}"
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "state").exists(), "nothing may be made"


@pytest.mark.parametrize(
    "argv",
    [
        ["run", "--input", "in", "--output", "s3://b/t", "--state-dir", "state", "--endpoint-url"],
        ["recover", "status", "--state-dir", "state", "--s3-endpoint"],
        ["recover", "plan", "--log-store", "s3://b/log", "--s3-endpoint"],
        ["recover", "apply", "--state-dir", "state", "--endpoint-url"],
        ["recover", "move-log-store", "--log-store", "s3://b/log", "--s3-endpoint"],
    ],
    ids=["run", "status", "plan", "apply", "move-log-store"],
)
def test_every_command_refuses_it_when_parsing(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stopped:
        main([*argv, NO_SCHEME])
    assert stopped.value.code == 2
    step = " ".join(argv[:2]) if argv[0] == "recover" else "run"
    assert capsys.readouterr().err.splitlines()[-1] == f"filesink {step}: error: {argv[-1]} {NO_SCHEME} {SAID}"


def test_a_storage_option_or_aws_endpoint_url_without_a_scheme_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert main(_run(tmp_path, "--storage-option", f"client_kwargs.endpoint_url={NO_SCHEME}")) == 2
    said = f"error: the storage option client_kwargs.endpoint_url {NO_SCHEME} {SAID}. Nothing was written."
    assert capsys.readouterr().err.splitlines()[-1] == said
    assert main(_run(tmp_path, "--storage-options", '{"endpoint_url": "s3://bucket"}')) == 2
    assert "the storage option endpoint_url s3://bucket is a location, not an endpoint" in capsys.readouterr().err
    monkeypatch.setenv("AWS_ENDPOINT_URL", NO_SCHEME)
    assert main(["recover", "status", "--log-store", "s3://filesink-test/log"]) == 2
    assert capsys.readouterr().err.splitlines()[-1] == f"error: {ENV_SAID}"
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "http://127.0.0.1:9")  # the S3 client takes this one: it is checked
    with pytest.raises(
        StorageAccessError, match=r"cannot reach the S3 endpoint http://127\.0\.0\.1:9 \(from AWS_ENDPOINT_URL_S3\)"
    ):
        check_s3("s3://filesink-test/log", {"key": "AKIAEXAMPLE", "secret": "s3cr3t"}, "log store")
    assert not (tmp_path / "state").exists()


# -- an endpoint that answers, but is not S3 ---------------------------------------------------------------------


def _at(server: S3Settings, endpoint: str) -> dict[str, Any]:
    return {"key": server.access_key, "secret": server.secret_key, "client_kwargs": {"endpoint_url": endpoint}}


def _not_s3(text: str, what: str, url: str, endpoint: str, reply: str) -> None:
    assert text.startswith(f"the {what} {url}: the endpoint {endpoint} answered, but not as an S3 server: {reply}"), (
        text
    )
    assert "with no S3 error code in it" in text and "is the port of the S3 API" in text, text
    assert "not its master's (9333)" in text and "not its console's (9001)" in text, text
    assert "does not exist" not in text and "refused access" not in text, text


def test_not_s3_is_told_apart_from_a_missing_bucket(
    tmp_path: Path, s3_server: S3Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = s3_server.url("table")
    check_s3(url, s3_server.storage_options(), "output")  # the S3 port, the bucket: nothing to say
    with pytest.raises(StorageAccessError) as missing:
        check_s3("s3://no-such-bucket-here/table", s3_server.storage_options(), "output")
    assert str(missing.value) == (
        f"the output s3://no-such-bucket-here/table: bucket 'no-such-bucket-here' does not exist at "
        f"{s3_server.endpoint}; create it first"
    )
    replies = {"files": "HTTP 404 Not Found, a text/html reply from 'SimpleHTTP/", "page": "a text/html reply from"}
    for kind, reply in replies.items():
        with PlainHttpServer(kind, tmp_path) as plain:
            with pytest.raises(StorageAccessError) as refused:
                check_s3(url, _at(s3_server, plain.endpoint), "log store")
            assert plain.requests >= 1
        _not_s3(str(refused.value), "log store", url, plain.endpoint, reply)
        assert s3_server.secret_key not in str(refused.value)
    with PlainHttpServer("files", tmp_path) as plain:  # the endpoint from the variable: named with it
        monkeypatch.setenv("AWS_ENDPOINT_URL", plain.endpoint)
        with pytest.raises(StorageAccessError) as refused:
            check_s3(url, {"key": s3_server.access_key, "secret": s3_server.secret_key}, "output")
    _not_s3(str(refused.value), "output", url, f"{plain.endpoint} (from AWS_ENDPOINT_URL)", "HTTP 404 Not Found")


def test_run_and_recover_say_an_endpoint_is_not_s3(tmp_path: Path, s3_server: S3Settings) -> None:
    """From the command line: exit 1, the message, no traceback, nothing written."""
    keys = {"AWS_ACCESS_KEY_ID": s3_server.access_key, "AWS_SECRET_ACCESS_KEY": s3_server.secret_key}
    url = s3_server.url("table")
    with PlainHttpServer("files", tmp_path / "in") as plain:
        ran = filesink(*_run(tmp_path, "--s3-endpoint", plain.endpoint, output=url), env=keys)
        status = filesink(
            "recover", "status", "--log-store", s3_server.url("log"), "--s3-endpoint", plain.endpoint, env=keys
        )
    for proc, what, where in ((ran, "output", url), (status, "log store", s3_server.url("log"))):
        assert proc.returncode == 1, proc.stderr
        assert "Traceback" not in proc.stderr
        _not_s3(proc.stderr.strip().removeprefix("error: "), what, where, plain.endpoint, "HTTP 404 Not Found")
    assert not (tmp_path / "state").exists()
    assert s3_server.filesystem().find(f"{s3_server.bucket}/table") == []
