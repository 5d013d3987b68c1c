"""What a failed storage call was, and what to do about it: one answer for every message that gives advice.

:func:`diagnose` reads an exception and the place it is about (a local path or a URL) and returns its
:class:`Kind`, its cause as one clause, and the remedy for that kind: free space for a full disk, access for a
refusal, the disk for an I/O error, the S3 server and the way to it for a network error, and so on.

What it reads is what reaches the log store's callers: ``OSError`` of the local disk, ``sqlite3.Error``, and
for S3 the built-in ``OSError`` that :func:`logstore.storage.storage_error` makes of the storage client's
error (the client's error is its ``__cause__``, and the S3 answer, if one came, is on that). That module owns the
client: it tells the kinds only the client's own errors show (a connection that failed, missing credentials, a
bad checksum) and records them with :func:`record`. On S3 an errno says nothing of a disk: s3fs gives ``EIO``
to every S3 error code it does not know.
"""

from __future__ import annotations

import errno
import re
from dataclasses import dataclass
from enum import StrEnum
from typing import TypeVar
from urllib.parse import urlsplit


class Kind(StrEnum):
    """What kind of failure an error is, by what to do about it."""

    NO_SPACE = "no space"
    """The disk is full, or the user's quota on it is spent."""
    PERMISSION = "permission"
    """The file system or the S3 server refused access."""
    CREDENTIALS = "credentials"
    """No S3 credentials were found."""
    CLOCK = "clock"
    """The S3 server refused a request signed at a time too far from its own."""
    READ_ONLY = "read-only"
    """The file system is mounted read-only."""
    DISK = "disk"
    """The disk or the file system failed (an I/O error)."""
    UNREACHABLE = "unreachable"
    """The server (S3's, or a network file system's) could not be reached, or did not answer in time."""
    SERVER = "server"
    """The S3 server answered with an error of its own (5xx, throttling), after the retries."""
    NO_BUCKET = "no bucket"
    """The S3 bucket does not exist."""
    CHECKSUM = "checksum"
    """The S3 server sent a checksum that does not match the data it sent."""
    OTHER = "other"
    """None of the above."""


@dataclass(frozen=True)
class Diagnosis:
    """An error as a message tells it: ``cause`` (one clause, without a final period), ``remedy`` (an imperative
    clause, without a final period) and ``note`` (a sentence that follows the remedy, or empty)."""

    kind: Kind
    cause: str
    remedy: str
    note: str = ""

    def advise(self, then: str = "", *, first: bool = False) -> str:
        """The remedy as a sentence, with ``then`` after it (``free space on ..., then restart the query.``), and
        the note; capitalised if ``first`` (it starts a sentence)."""
        text = f"{self.remedy}, then {then}." if then else f"{self.remedy}."
        if first:
            text = text[0].upper() + text[1:]
        return f"{text} {self.note}." if self.note else text


OTHER_REMEDY = "fix the cause"
"""The remedy of an error of no kind :func:`diagnose` knows."""
CHECKSUMS_WHEN = "when_required"
"""botocore's checksum setting the sink's S3 clients use (:data:`logstore.storage.S3_CHECKSUMS`), which the remedy
of a checksum error names."""


@dataclass(frozen=True)
class _Recorded:
    kind: Kind | None
    cause: str
    note: str
    what: str


_RECORD = "logstore_diagnosis"
"""The attribute under which :func:`record` keeps what it was given on an exception."""

E = TypeVar("E", bound=BaseException)


def record(error: E, cause: str, *, kind: Kind | None = None, note: str = "", what: str = "") -> E:
    """``error``, on which :func:`diagnose` finds ``cause`` (and ``kind`` and ``note``, if given) as they were
    before the message of ``error`` added ``what`` failed and what to do: for an error made from another one with
    a message of its own (:func:`logstore.storage.storage_error`), so that a caller that wraps it tells the cause
    once, and the remedy its kind calls for."""
    setattr(error, _RECORD, _Recorded(kind, clause(cause), clause(note), clause(what)))
    return error


def _recorded(error: BaseException) -> _Recorded | None:
    found = getattr(error, _RECORD, None)
    return found if isinstance(found, _Recorded) else None


def clause(text: str) -> str:
    """``text`` as one clause: one line, without the period (or other stop) at its end."""
    return " ".join(text.split()).rstrip(" .;:,")


def cause_of(error: BaseException) -> str:
    """What ``error`` says went wrong, as one clause: the cause :func:`record` kept, an ``OSError``'s ``strerror``
    (the file it names is the caller's to say), or its text."""
    recorded = _recorded(error)
    if recorded is not None:
        return recorded.cause
    strerror = error.strerror if isinstance(error, OSError) else None
    return clause(strerror if isinstance(strerror, str) and strerror else str(error) or type(error).__name__)


def told(error: BaseException) -> str:
    """What failed and why, as one clause, for a caller that does not name the file itself: ``what`` and the cause
    :func:`record` kept (without the advice the message of ``error`` adds), or the text of ``error``."""
    recorded = _recorded(error)
    if recorded is not None and recorded.what:
        return f"{recorded.what}: {recorded.cause}"
    return clause(str(error) or type(error).__name__)


def is_local(url: str) -> bool:
    """Whether ``url`` names a local path (a plain path or a ``file://`` URL) rather than an fsspec URL."""
    return "://" not in url or url.startswith("file://")


def _chain(error: BaseException) -> list[BaseException]:
    """``error`` and the errors it was raised from (or while handling), outermost first."""
    seen: list[BaseException] = []
    current: BaseException | None = error
    while current is not None and len(seen) < 16 and not any(current is s for s in seen):
        seen.append(current)
        current = current.__cause__ or current.__context__
    return seen


def s3_answer(error: BaseException) -> tuple[str | None, int | None]:
    """The S3 error code and HTTP status behind ``error`` (s3fs raises its errors from botocore's, which hold the
    server's answer); ``(None, None)`` if no answer came."""
    for seen in _chain(error):
        response = getattr(seen, "response", None)
        if isinstance(response, dict):
            status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            return response.get("Error", {}).get("Code"), status if isinstance(status, int) else None
    return None, None


_NETWORK_ERRNOS = {
    getattr(errno, name)
    for name in (
        "ECONNREFUSED",
        "ECONNRESET",
        "ECONNABORTED",
        "ETIMEDOUT",
        "EHOSTUNREACH",
        "EHOSTDOWN",
        "ENETUNREACH",
        "ENETDOWN",
        "ESTALE",
    )
    if hasattr(errno, name)
}
"""Errnos of a network that failed (``ESTALE``: a network file system's handle the server forgot)."""
_DENIED = {
    "AccessDenied",
    "AccountProblem",
    "AllAccessDisabled",
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "ExpiredToken",
    "InvalidToken",
    "InvalidSecurity",
}
"""S3 error codes of a refusal: the credentials, or what they may do."""
_BUSY = {"SlowDown", "ServiceUnavailable", "InternalError", "Throttling", "ThrottlingException", "RequestLimitExceeded"}
"""S3 error codes of a server that failed a request (or refused it for its load)."""
_SQLITE_KINDS = {
    "SQLITE_FULL": Kind.NO_SPACE,
    "SQLITE_IOERR": Kind.DISK,
    "SQLITE_READONLY": Kind.READ_ONLY,
    "SQLITE_PERM": Kind.PERMISSION,
}
"""SQLite's error names (``sqlite3.Error.sqlite_errorname``, extended ones start with these) of each kind."""


def diagnose(error: BaseException, location: str, *, writing: bool = True, kind: Kind | None = None) -> Diagnosis:
    """What ``error`` was and what to do about it, for the local path or URL ``location`` (the file or directory
    the failed call was about). ``writing``: the call wrote (else it read), for the remedy of a refusal. ``kind``:
    what the storage client's owner told of its own error (else what :func:`record` kept, if anything)."""
    recorded = _recorded(error)
    told = kind or (recorded.kind if recorded else None)
    if is_local(location):
        kind, remedy = _local(error, location.removeprefix("file://"), writing)
    else:
        kind, remedy = _remote(error, location, writing, told)
    return Diagnosis(kind, cause_of(error), remedy, recorded.note if recorded else "")


def _local(error: BaseException, path: str, writing: bool) -> tuple[Kind, str]:
    code = next((e.errno for e in _chain(error) if isinstance(e, OSError) and e.errno is not None), None)
    name = str(getattr(error, "sqlite_errorname", "") or "")
    sqlite_kind = next((kind for prefix, kind in _SQLITE_KINDS.items() if name.startswith(prefix)), None)
    if code == errno.ENOSPC or sqlite_kind is Kind.NO_SPACE:
        return Kind.NO_SPACE, f"free space on the disk holding {path}"
    if code == getattr(errno, "EDQUOT", None):
        return Kind.NO_SPACE, f"free space in the disk quota of the user that runs the sink, on the disk holding {path}"
    if code in (errno.EACCES, errno.EPERM) or sqlite_kind is Kind.PERMISSION:
        return Kind.PERMISSION, f"give the user that runs the sink permission to {_access(writing)} {path}"
    if code == errno.EROFS or sqlite_kind is Kind.READ_ONLY:
        return Kind.READ_ONLY, (
            f"see that the file system holding {path} is mounted read-write (if the kernel made it read-only after "
            "disk errors, check the disk first)"
        )
    if code == errno.EIO or sqlite_kind is Kind.DISK:
        return Kind.DISK, f"check the disk holding {path} (the kernel's log, dmesg, shows its errors)"
    if code in _NETWORK_ERRNOS or isinstance(error, (ConnectionError, TimeoutError)):
        return Kind.UNREACHABLE, f"check the network file system holding {path}, its server and the network to it"
    return Kind.OTHER, OTHER_REMEDY


def _remote(error: BaseException, url: str, writing: bool, told: Kind | None) -> tuple[Kind, str]:
    chain = _chain(error)
    code, status = s3_answer(error)
    parts = urlsplit(url)
    endpoint = _endpoint(chain)
    label = "S3 server" if parts.scheme in ("s3", "s3a") else "server"
    if endpoint:
        server = f"the {label} at {endpoint}"
    elif parts.netloc:
        server = f"the {label} of {parts.scheme}://{parts.netloc}"
    else:
        server = f"the {label}"
    if told is Kind.CREDENTIALS:
        return told, (
            "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE), or give key and secret in the storage "
            "options"
        )
    if told is Kind.CHECKSUM:
        return told, (
            f"set the storage option config_kwargs response_checksum_validation={CHECKSUMS_WHEN}, the default "
            "(the server sent a checksum that does not match the data it sent: it does not support response "
            "checksums on every request; rclone's sends the whole object's with a ranged read)"
        )
    if code == "NoSuchBucket":
        bucket = parts.netloc or "the bucket"
        return Kind.NO_BUCKET, f"create the bucket {bucket}, or correct the bucket's name in {url}"
    if code == "RequestTimeTooSkewed":
        return Kind.CLOCK, f"set this host's clock right ({server} refuses requests signed at a time far from its own)"
    if code in _DENIED or status == 403 or (code is None and isinstance(error, PermissionError)):
        return Kind.PERMISSION, (
            f"check the access key and secret the sink uses, and that the bucket's policy lets them "
            f"{_access(writing)} {url}"
        )
    if told is Kind.UNREACHABLE or code == "RequestTimeout" or (code is None and _no_answer(chain)):
        return Kind.UNREACHABLE, (
            f"check that {server} answers (the endpoint URL, the network and DNS on the way, the server itself)"
        )
    if code in _BUSY or (status is not None and status >= 500):
        return Kind.SERVER, f"check {server} (it failed the request after the retries; its log says why)"
    return Kind.OTHER, OTHER_REMEDY


def _access(writing: bool) -> str:
    return "write to" if writing else "read"


def _no_answer(chain: list[BaseException]) -> bool:
    """Whether an error of ``chain`` says that no answer came: a connection refused, reset or timed out (the
    client's own errors for these are told by :func:`logstore.storage.storage_error`)."""
    return any(
        isinstance(e, (ConnectionError, TimeoutError)) or (isinstance(e, OSError) and e.errno in _NETWORK_ERRNOS)
        for e in chain
    )


_ENDPOINT_IN_TEXT = re.compile(r'endpoint URL: "([^"]+)"')
"""How botocore's errors of a connection name the URL they asked (``Could not connect to the endpoint URL: "..."``)."""


def _endpoint(chain: list[BaseException]) -> str | None:
    """``scheme://host:port`` of the endpoint an error of ``chain`` names (botocore's keep it as ``endpoint_url``)."""
    for e in chain:
        kwargs = getattr(e, "kwargs", None)
        url = kwargs.get("endpoint_url") if isinstance(kwargs, dict) else None
        if not isinstance(url, str):
            found = _ENDPOINT_IN_TEXT.search(str(e))
            url = found.group(1) if found else None
        if url:
            parts = urlsplit(url)
            if parts.scheme and parts.netloc:
                return f"{parts.scheme}://{parts.netloc}"
    return None
