"""A fault-injecting HTTP reverse proxy for S3 on 127.0.0.1, between the code under test and the S3 server.

Requests are read whole and forwarded byte for byte (request line, headers with the client's ``Host``, so
SigV4 signatures still verify, and the body as sent, framed by ``Content-Length`` or chunked); answers are
read whole and relayed byte for byte. ``Expect: 100-continue`` is answered by the proxy. Client connections
are kept alive; each forwarded request uses a fresh connection to the server, so the proxy never sends a
request twice.

Before forwarding, the proxy may inject one fault into a request (``FAULT_KINDS``):

- ``5xx``: answer ``500 InternalError`` or ``503 SlowDown`` itself, with an S3 XML error body;
- ``timeout``: forward nothing and answer nothing until the client gives up (or ``hold_seconds`` pass);
- ``drop``: close the connection without forwarding;
- ``lost_response``: forward the request, let the server apply it and answer, then close the client's
  connection without sending the answer;
- ``unsupported``: answer ``501 NotImplemented`` itself, as a server that lacks the operation does.

Faults come from :class:`FaultRule` (kind, probability, optional set of S3 operations, see
:func:`classify`) drawn with a seeded RNG, or are queued with :meth:`FaultProxy.inject` for the next
matching requests. Counters per kind and per operation are kept.

``forget_completed``: SeaweedFS answers a repeated ``CompleteMultipartUpload`` of a completed
upload with 200; other servers answer ``404 NoSuchUpload``. With this option the proxy answers such a
repeat with ``NoSuchUpload`` itself, so clients meet the stricter behaviour. Path-style addressing only.
"""

from __future__ import annotations

import contextlib
import io
import random
import select
import socket
import threading
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from types import TracebackType
from urllib.parse import parse_qs, urlsplit

FAULT_KINDS = ("5xx", "timeout", "drop", "lost_response", "unsupported")
PROXY_READ_TIMEOUT = 2.0
"""The read timeout of clients that go through the proxy in tests (seconds)."""
MAX_HEAD_BYTES = 64 * 1024


@dataclass(frozen=True)
class FaultRule:
    kind: str
    probability: float
    operations: frozenset[str] | None = None
    """S3 operations (names as :func:`classify` gives them) the rule applies to; None: every operation."""

    def __post_init__(self) -> None:
        if self.kind not in FAULT_KINDS:
            raise ValueError(f"unknown fault kind {self.kind!r}; one of {FAULT_KINDS}")
        if not 0.0 <= self.probability <= 1.0:
            raise ValueError(f"fault probability {self.probability} is not within 0..1")

    def applies(self, operation: str) -> bool:
        return self.operations is None or operation in self.operations


def classify(method: str, target: str) -> str:
    """The S3 operation of a path-style request, e.g. ``CompleteMultipartUpload`` for ``POST /b/k?uploadId=..``."""
    parts = urlsplit(target)
    query = parse_qs(parts.query, keep_blank_values=True)
    bucket, _, key = parts.path.lstrip("/").partition("/")
    if not bucket:
        return "ListBuckets" if method == "GET" else f"{method}Service"
    if not key:
        if method == "GET":
            if "uploads" in query:
                return "ListMultipartUploads"
            if "location" in query:
                return "GetBucketLocation"
            return "ListObjectsV2" if query.get("list-type") == ["2"] else "ListObjects"
        if method == "POST" and "delete" in query:
            return "DeleteObjects"
        return {"HEAD": "HeadBucket", "PUT": "CreateBucket", "DELETE": "DeleteBucket"}.get(method, f"{method}Bucket")
    if method == "POST":
        if "uploads" in query:
            return "CreateMultipartUpload"
        if "uploadId" in query:
            return "CompleteMultipartUpload"
    elif method == "PUT":
        if "partNumber" in query and "uploadId" in query:
            return "UploadPart"
        return "PutObject"
    elif method == "GET":
        return "ListParts" if "uploadId" in query else "GetObject"
    elif method == "HEAD":
        return "HeadObject"
    elif method == "DELETE":
        return "AbortMultipartUpload" if "uploadId" in query else "DeleteObject"
    return f"{method}Object"


@dataclass
class _Message:
    head: bytes
    """Start line and headers, up to and including the empty line."""
    body: bytes
    start: str
    headers: dict[str, str]
    """Lower-case names; repeated headers joined with ``,``."""
    framed: bool = True
    """Whether the body's end is known from the message (else it ran to the end of the connection)."""

    def header(self, name: str) -> str:
        return self.headers.get(name, "")


class _Closed(Exception):
    """The peer closed the connection (cleanly, between messages)."""


def _read_head(reader: io.BufferedReader) -> tuple[bytes, str, dict[str, str]]:
    lines: list[bytes] = []
    size = 0
    while True:
        line = reader.readline(MAX_HEAD_BYTES + 1)
        if not line:
            if lines:
                raise ConnectionError("connection closed inside a message head")
            raise _Closed
        size += len(line)
        if size > MAX_HEAD_BYTES:
            raise ConnectionError("message head too long")
        lines.append(line)
        if line in (b"\r\n", b"\n"):
            break
    start = lines[0].decode("latin-1").rstrip("\r\n")
    headers: dict[str, str] = {}
    for raw in lines[1:-1]:
        name, _, value = raw.decode("latin-1").partition(":")
        name, value = name.strip().lower(), value.strip()
        headers[name] = f"{headers[name]},{value}" if name in headers else value
    return b"".join(lines), start, headers


def _read_exact(reader: io.BufferedReader, size: int) -> bytes:
    data = reader.read(size)
    if len(data) != size:
        raise ConnectionError(f"connection closed after {len(data)} of {size} body bytes")
    return bytes(data)


def _read_chunked(reader: io.BufferedReader) -> bytes:
    """A chunked body, raw: every chunk with its size line, the last chunk and the trailers."""
    out = bytearray()
    while True:
        line = reader.readline(MAX_HEAD_BYTES)
        if not line.endswith(b"\n"):
            raise ConnectionError("connection closed inside a chunk size line")
        out += line
        size = int(line.split(b";", 1)[0].strip(), 16)
        if size == 0:
            break
        out += _read_exact(reader, size + 2)  # data and its CRLF
    while True:  # trailers, up to the empty line
        line = reader.readline(MAX_HEAD_BYTES)
        if not line.endswith(b"\n"):
            raise ConnectionError("connection closed inside chunk trailers")
        out += line
        if line in (b"\r\n", b"\n"):
            return bytes(out)


def _read_body(reader: io.BufferedReader, headers: dict[str, str], *, to_eof: bool) -> bytes:
    if "chunked" in headers.get("transfer-encoding", "").lower():
        return _read_chunked(reader)
    if "content-length" in headers:
        return _read_exact(reader, int(headers["content-length"]))
    return reader.read() if to_eof else b""


def _error_response(status: int, code: str, message: str, resource: str, *, head_only: bool) -> _Message:
    """An S3 error answer made up by the proxy (no body for a HEAD request, as HTTP wants)."""
    body = (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f"<Error><Code>{code}</Code><Message>{message}</Message><Resource>{resource}</Resource>"
        "<RequestId>faultproxy</RequestId></Error>"
    ).encode()
    reasons = {404: "Not Found", 500: "Internal Server Error", 501: "Not Implemented", 503: "Service Unavailable"}
    reason = reasons[status]
    start = f"HTTP/1.1 {status} {reason}"
    length = "0" if head_only else str(len(body))
    headers = {"content-type": "application/xml", "content-length": length, "x-amz-request-id": "faultproxy"}
    head = start + "\r\n" + "".join(f"{name}: {value}\r\n" for name, value in headers.items()) + "\r\n"
    return _Message(head.encode(), b"" if head_only else body, start, headers)


class FaultProxy:
    """The proxy; see the module docstring. Use as a context manager, or ``start()`` and ``stop()``."""

    def __init__(
        self,
        backend: str,
        *,
        seed: int = 0,
        rules: Iterable[FaultRule] = (),
        hold_seconds: float = 30.0,
        forget_completed: bool = False,
    ) -> None:
        url = urlsplit(backend)
        if url.scheme != "http" or not url.hostname or not url.port:
            raise ValueError(f"backend must be http://host:port, not {backend!r}")
        self.backend = (url.hostname, url.port)
        self.hold_seconds = hold_seconds
        self.forget_completed = forget_completed
        self.requests: Counter[str] = Counter()
        """Requests per operation (faulty ones included)."""
        self.faults: Counter[tuple[str, str]] = Counter()
        """Injected faults per (kind, operation)."""
        self.emulated: Counter[str] = Counter()
        """Answers the proxy made up for ``forget_completed``, per error code."""
        self.connections = 0
        """Client connections accepted."""
        self._rules = list(rules)
        self._queued: list[tuple[str, str | None]] = []
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._completed: set[str] = set()
        self._listener: socket.socket | None = None
        self._threads: list[threading.Thread] = []
        self._clients: set[socket.socket] = set()
        self._stopping = threading.Event()

    # -- control -----------------------------------------------------------------------------------------

    @property
    def endpoint(self) -> str:
        assert self._listener is not None, "the proxy is not started"
        host, port = self._listener.getsockname()[:2]
        return f"http://{host}:{port}"

    def set_rules(self, rules: Iterable[FaultRule]) -> None:
        with self._lock:
            self._rules = list(rules)

    def inject(self, kind: str, operation: str | None = None, count: int = 1) -> None:
        """Inject ``kind`` into the next ``count`` requests of ``operation`` (any operation if None)."""
        FaultRule(kind, 1.0)  # validates the kind
        with self._lock:
            self._queued += [(kind, operation)] * count

    def clear_injected(self) -> None:
        """Forget the faults :meth:`inject` queued that no request has met yet."""
        with self._lock:
            self._queued.clear()

    def faults_by_kind(self) -> Counter[str]:
        with self._lock:
            out: Counter[str] = Counter()
            for (kind, _op), n in self.faults.items():
                out[kind] += n
            return out

    def faults_by_operation(self, kind: str | None = None) -> Counter[str]:
        with self._lock:
            out: Counter[str] = Counter()
            for (k, op), n in self.faults.items():
                if kind is None or k == kind:
                    out[op] += n
            return out

    def total_faults(self) -> int:
        with self._lock:
            return sum(self.faults.values())

    def _choose(self, operation: str) -> str | None:
        with self._lock:
            self.requests[operation] += 1
            kind = None
            for i, (queued, op) in enumerate(self._queued):
                if op is None or op == operation:
                    kind = queued
                    del self._queued[i]
                    break
            else:
                for rule in self._rules:
                    if rule.applies(operation) and self._rng.random() < rule.probability:
                        kind = rule.kind
                        break
            if kind is not None:
                self.faults[(kind, operation)] += 1
            return kind

    def _pick_5xx(self) -> tuple[int, str, str]:
        with self._lock:
            slow = self._rng.random() < 0.5
        if slow:
            return 503, "SlowDown", "Please reduce your request rate."
        return 500, "InternalError", "We encountered an internal error. Please try again."

    # -- lifecycle ---------------------------------------------------------------------------------------

    def start(self) -> FaultProxy:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", 0))
        listener.listen(64)
        listener.settimeout(0.1)  # accept() wakes up to notice stop(); closing the socket would not wake it
        self._listener = listener
        thread = threading.Thread(target=self._accept, name="faultproxy-accept", daemon=True)
        thread.start()
        self._threads.append(thread)
        return self

    def stop(self) -> None:
        self._stopping.set()
        if self._listener is not None:
            self._listener.close()
        with self._lock:
            clients = list(self._clients)
        for client in clients:
            _close(client)
        for thread in self._threads:
            thread.join(timeout=5)

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def _accept(self) -> None:
        assert self._listener is not None
        while not self._stopping.is_set():
            try:
                client, _addr = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            client.settimeout(None)
            with self._lock:
                self.connections += 1
                self._clients.add(client)
                self._threads = [t for t in self._threads if t.is_alive()]
            thread = threading.Thread(target=self._serve, args=(client,), name="faultproxy-conn", daemon=True)
            thread.start()
            self._threads.append(thread)

    # -- one client connection ---------------------------------------------------------------------------

    def _serve(self, client: socket.socket) -> None:
        reader = client.makefile("rb")
        try:
            while not self._stopping.is_set():
                try:
                    keep = self._one(client, reader)
                except (_Closed, OSError, ValueError):
                    return
                if not keep:
                    return
        finally:
            reader.close()
            _close(client)
            with self._lock:
                self._clients.discard(client)

    def _one(self, client: socket.socket, reader: io.BufferedReader) -> bool:
        """Serve one request; False when the client connection is to be closed."""
        head, start, headers = _read_head(reader)
        method, target, _version = start.split(" ", 2)
        if headers.get("expect", "").lower() == "100-continue":
            client.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
        body = _read_body(reader, headers, to_eof=False)
        request = _Message(head, body, start, headers)
        operation = classify(method, target)
        kind = self._choose(operation)
        if kind == "drop":
            return False
        if kind == "timeout":
            select.select([client], [], [], self.hold_seconds)  # returns once the client hangs up
            return False
        if kind == "5xx":
            status, code, message = self._pick_5xx()
            answer = _error_response(status, code, message, urlsplit(target).path, head_only=method == "HEAD")
            client.sendall(answer.head + answer.body)
            return True
        if kind == "unsupported":
            message = "A header you provided implies functionality that is not implemented."
            answer = _error_response(501, "NotImplemented", message, urlsplit(target).path, head_only=method == "HEAD")
            client.sendall(answer.head + answer.body)
            return True
        response = self._forward(request, method, target, operation)
        if kind == "lost_response":
            return False  # the server applied the request; its answer never reaches the client
        client.sendall(response.head + response.body)
        closing = "close" in response.header("connection").lower() or "close" in request.header("connection").lower()
        return response.framed and not closing

    def _forward(self, request: _Message, method: str, target: str, operation: str) -> _Message:
        upload_id = parse_qs(urlsplit(target).query).get("uploadId", [""])[0]
        if self.forget_completed and operation == "CompleteMultipartUpload":
            with self._lock:
                known = upload_id in self._completed
                if known:
                    self.emulated["NoSuchUpload"] += 1
            if known:
                message = "The specified multipart upload does not exist."
                return _error_response(404, "NoSuchUpload", message, urlsplit(target).path, head_only=False)
        with socket.create_connection(self.backend, timeout=120) as server:
            server.sendall(request.head + request.body)
            server_reader = server.makefile("rb")
            try:
                while True:
                    head, start, headers = _read_head(server_reader)
                    status = int(start.split(" ", 2)[1])
                    if not 100 <= status < 200:
                        break
                no_body = method == "HEAD" or status in (204, 304)
                body = b"" if no_body else _read_body(server_reader, headers, to_eof=True)
            finally:
                server_reader.close()
        if operation == "CompleteMultipartUpload" and status == 200 and b"<Error>" not in body:
            with self._lock:
                self._completed.add(upload_id)
        framed = no_body or "content-length" in headers or "chunked" in headers.get("transfer-encoding", "").lower()
        return _Message(head, body, start, headers, framed)


def _close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    sock.close()
