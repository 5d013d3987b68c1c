"""Probe an S3 location before anything starts: the endpoint answers, is an S3 server, accepts the credentials, has
the bucket.

Used by ``filesink run`` and ``filesink recover`` for the output and the log store, so that a wrong endpoint or key
fails in seconds with a message naming the location, the endpoint and what to check, never showing the secret key.

An S3 server answers a listing it refuses with an S3 error document, whose code botocore gives (``NoSuchBucket``,
``AccessDenied``, ...). Anything else at the endpoint (another port of the same server, a web console, any HTTP
server) answers with no such document: botocore then gives the bare HTTP status as the code (``404``, and s3fs a
``FileNotFoundError``), or cannot parse a reply that is not XML. Those are reported as "not an S3 server", never as a
missing bucket or refused credentials. (A header such as ``x-amz-request-id`` tells nothing: SeaweedFS's master, filer
and volume ports send it too.)
"""

from __future__ import annotations

import http
import os
from collections.abc import Iterator, Mapping
from typing import Any

from logstore.storage import LIMITS_HINT, is_unreachable, open_filesystem

from ..errors import StorageAccessError
from ..s3options import check_endpoint, configured_endpoint_variable

S3_PORT_HINT = (
    "Check that --s3-endpoint (or AWS_ENDPOINT_URL) is the port of the S3 API, not another port of the server: "
    "SeaweedFS's S3 port (8333 by default), not its master's (9333), filer's (8888) or volume's (8080); MinIO's API "
    "port (9000 by default), not its console's (9001); Garage's S3 API (3900), not its web or admin port."
)


def check_s3(url: str, storage_options: Mapping[str, Any], what: str) -> None:
    """Raise :class:`StorageAccessError` unless the bucket of ``url`` can be listed with ``storage_options``.

    ``what`` names the location in the message (``output``, ``log store``). The secret key never appears in
    a message; the access key id is shown shortened."""
    import botocore.exceptions

    options = dict(storage_options)
    config = dict(options.get("config_kwargs") or {})
    config.setdefault("retries", {"max_attempts": 1, "mode": "standard"})  # fail fast: this is only a probe
    options["config_kwargs"] = config
    options["skip_instance_cache"] = True
    check_endpoint(options, os.environ)  # one from AWS_ENDPOINT_URL that botocore would refuse: named, exit 2
    variable = configured_endpoint_variable(os.environ)
    endpoint = (
        (options.get("client_kwargs") or {}).get("endpoint_url")
        or options.get("endpoint_url")
        or (f"{os.environ[variable]} (from {variable})" if variable else "AWS S3")
    )
    key = options.get("key") or os.environ.get("AWS_ACCESS_KEY_ID") or ""
    who = f"access key id {key[:4]}…" if key else "the default AWS credentials"
    secret = options.get("secret") or os.environ.get("AWS_SECRET_ACCESS_KEY") or ""
    try:
        fs, root = open_filesystem(url, options)
        bucket = root.split("/", 1)[0]
        fs.ls(bucket, refresh=True)
    except Exception as e:
        bucket = url.split("://", 1)[-1].split("/", 1)[0]
        if isinstance(e, ValueError) and str(e).startswith("Invalid endpoint"):  # botocore's, e.g. from ~/.aws/config
            raise StorageAccessError(
                f"the {what} {url}: the S3 endpoint {str(e).removeprefix('Invalid endpoint:').strip()} is not a URL "
                "the S3 client takes: give --s3-endpoint http://HOST:PORT (or https://). Nothing was written."
            ) from None
        if is_unreachable(e):
            raise StorageAccessError(
                f"the {what} {url}: cannot reach the S3 endpoint {endpoint} ({_short(e, secret)}). Check "
                "--s3-endpoint (or AWS_ENDPOINT_URL) and that the server is running and answering. "
                f"{LIMITS_HINT}: --storage-option config_kwargs.read_timeout=SECONDS and so on. Nothing was written."
            ) from None
        reply = not_s3(e)
        if reply is not None:
            raise StorageAccessError(
                f"the {what} {url}: the endpoint {endpoint} answered, but not as an S3 server: {reply}. "
                f"{S3_PORT_HINT} Nothing was written."
            ) from None
        code = s3_error_code(e)
        if code == "NoSuchBucket":
            raise StorageAccessError(
                f"the {what} {url}: bucket {bucket!r} does not exist at {endpoint}; create it first"
            ) from None
        if isinstance(e, PermissionError):
            raise StorageAccessError(
                f"the {what} {url}: {endpoint} refused access with {who} ({_short(e, secret)}). Check "
                "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or the AWS profile) and the bucket's policy."
            ) from None
        if isinstance(e, botocore.exceptions.NoCredentialsError):
            raise StorageAccessError(
                f"the {what} {url}: no S3 credentials were found. Set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, "
                "or AWS_PROFILE."
            ) from None
        if not isinstance(e, OSError | botocore.exceptions.BotoCoreError):
            raise
        said = f"{code}: " if code and code not in str(e) else ""
        raise StorageAccessError(
            f"the {what} {url}: the S3 endpoint {endpoint} could not list bucket {bucket!r} ({said}"
            f"{_short(e, secret)}). Check --s3-endpoint (or AWS_ENDPOINT_URL), the bucket's name, and that the "
            "server is running."
        ) from None


def _chain(error: BaseException) -> Iterator[BaseException]:
    """``error`` and the errors it was raised from (s3fs raises its own from botocore's)."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def _client_error(error: BaseException) -> Any:
    """botocore's ``ClientError`` behind ``error`` (which holds the reply), or None."""
    import botocore.exceptions

    return next((e for e in _chain(error) if isinstance(e, botocore.exceptions.ClientError)), None)


def s3_error_code(error: BaseException) -> str | None:
    """The error code of the reply behind ``error``: S3's (``NoSuchBucket``), or the bare HTTP status botocore puts
    there when the reply held no S3 error document (``404``); None if there was no reply."""
    client = _client_error(error)
    if client is None:
        return None
    code = (client.response.get("Error") or {}).get("Code")
    return str(code) if code else None


def not_s3(error: BaseException) -> str | None:
    """If the reply behind ``error`` shows that what answered is not an S3 server, what it answered (``HTTP 404 Not
    Found, with no S3 error code``); else None (an S3 error, or no reply at all)."""
    from botocore.parsers import ResponseParserError

    for e in _chain(error):
        if isinstance(e, ResponseParserError):
            return "its reply is not the XML an S3 server sends (" + str(e).splitlines()[0][:200] + ")"
    client = _client_error(error)
    if client is None:
        return None
    code = str((client.response.get("Error") or {}).get("Code") or "")
    if code and not code.isdigit():
        return None  # an S3 error document's code: an S3 server said it
    metadata = client.response.get("ResponseMetadata") or {}
    status, headers = metadata.get("HTTPStatusCode"), metadata.get("HTTPHeaders") or {}
    try:
        said = f"HTTP {status} {http.HTTPStatus(int(status)).phrase}" if status is not None else ""
    except ValueError:
        said = f"HTTP {status}"
    kind = str(headers.get("content-type") or "").split(";")[0].strip()
    if kind and "xml" not in kind.lower():
        # botocore reports a 200 whose body is not XML as a 500: the status is only said when it is not that
        article = "an" if kind[:1].lower() in "aeiou" else "a"
        said = f"{said}, {article} {kind} reply" if status != 500 else f"{article} {kind} reply"
    server = headers.get("server")
    by = f" from {server!r}" if server else ""
    return f"{said or 'a reply'}{by}, with no S3 error code in it"


def _short(error: BaseException, secret: str) -> str:
    text = str(error).splitlines()[0] if str(error) else type(error).__name__
    return text.replace(secret, "***") if secret else text
