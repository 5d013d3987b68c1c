"""A throwaway PostgreSQL server for the tests (the Iceberg destination's SQL catalog): Debian's binaries, a data
directory in a fresh temp directory, 127.0.0.1 on a free port, trust authentication, no Unix socket.

:class:`PostgresServer` ``start()`` returns a SQLAlchemy URI once the server accepts connections, ``stop()`` ends it
and removes its directory. Every wait has a deadline. PostgreSQL refuses to run as root: as root, ``initdb`` and
``postgres`` run as an unprivileged user (``nobody``, or ``postgres`` if it exists), which owns the data directory.
A server that cannot start raises :class:`PostgresUnavailable` with the reason (its log's tail included), which the
session fixture turns into a skip.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

START_TIMEOUT = 30.0
"""Seconds for initdb, and again for the server to accept connections."""
STOP_TIMEOUT = 10.0
"""Seconds for a fast shutdown before the server is killed."""
USER = "filesink"
"""The database superuser initdb creates (the URI's user)."""
LOOPBACK = "127.0.0.1"


class PostgresUnavailable(RuntimeError):
    """No PostgreSQL server could be started here; the message says why."""


def find_bindir() -> Path:
    """The directory holding ``initdb`` and ``postgres``: on PATH, else the newest ``/usr/lib/postgresql/*/bin``."""
    found = shutil.which("initdb")
    if found and shutil.which("postgres"):
        path = Path(found).resolve().parent
        if (path / "postgres").is_file():
            return path
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: _version(Path(p).parent.name))
    for candidate in reversed(candidates):
        path = Path(candidate)
        if (path / "initdb").is_file() and (path / "postgres").is_file():
            return path
    raise PostgresUnavailable("no initdb and postgres found (on PATH or in /usr/lib/postgresql/*/bin)")


def _version(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(p) for p in text.split("."))
    except ValueError:
        return (0,)


def _run_as() -> dict[str, Any]:
    """Popen's arguments to run PostgreSQL's programs as an unprivileged user when this process is root."""
    if os.geteuid() != 0:
        return {}
    for name in ("postgres", "nobody"):
        try:
            entry = pwd.getpwnam(name)
        except KeyError:
            continue
        if entry.pw_uid != 0:
            return {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": []}
    raise PostgresUnavailable("running as root, and no unprivileged user (postgres, nobody) to run PostgreSQL as")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind((LOOPBACK, 0))
        port: int = sock.getsockname()[1]
        return port


class PostgresServer:
    def __init__(self) -> None:
        self.root: Path | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = 0
        self._log: Any = None

    @property
    def uri(self) -> str:
        """The SQLAlchemy URI of the server's ``postgres`` database (psycopg2)."""
        return f"postgresql+psycopg2://{USER}@{LOOPBACK}:{self.port}/postgres"

    def _log_tail(self) -> str:
        if self.root is None or not (self.root / "server.log").exists():
            return ""
        return (self.root / "server.log").read_text(errors="replace")[-2000:]

    def start(self) -> str:
        """Start the server; its URI once it accepts connections. Raises :class:`PostgresUnavailable`."""
        try:
            return self._start()
        except PostgresUnavailable:
            self.stop()
            raise
        except Exception as e:
            tail = self._log_tail()
            self.stop()
            raise PostgresUnavailable(f"{type(e).__name__}: {e}" + (f"\n{tail}" if tail else "")) from e

    def _start(self) -> str:
        bindir = find_bindir()
        run_as = _run_as()
        self.root = Path(tempfile.mkdtemp(prefix="filesink-pg-"))
        data = self.root / "data"
        data.mkdir()
        if run_as:
            for path in (self.root, data):
                os.chown(path, run_as["user"], run_as["group"])
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(self.root),
            "LC_ALL": "C",
            "LANG": "C",
            "TZ": "UTC",
        }
        try:
            subprocess.run(
                [str(bindir / "initdb"), "-D", str(data), "-U", USER, "--auth=trust", "-E", "UTF8", "--no-locale",
                 "--no-sync"],
                cwd=self.root,
                env=env,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=START_TIMEOUT,
                check=True,
                **run_as,
            )  # fmt: skip
        except subprocess.CalledProcessError as e:
            output = (e.stdout or b"").decode(errors="replace") + (e.stderr or b"").decode(errors="replace")
            raise PostgresUnavailable(f"initdb failed (exit {e.returncode}): {output[-2000:]}") from e
        except subprocess.TimeoutExpired as e:
            raise PostgresUnavailable(f"initdb did not finish within {START_TIMEOUT} s") from e
        self.port = _free_port()
        log_path = self.root / "server.log"
        self._log = open(log_path, "wb")  # noqa: SIM115 (closed in stop)
        if run_as:
            os.chown(log_path, run_as["user"], run_as["group"])
        self.proc = subprocess.Popen(
            [str(bindir / "postgres"), "-D", str(data), "-p", str(self.port),
             "-c", f"listen_addresses={LOOPBACK}", "-c", "unix_socket_directories=",
             "-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off",
             "-c", "max_connections=50", "-c", "shared_buffers=16MB"],
            cwd=self.root,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            **run_as,
        )  # fmt: skip
        self._wait_ready()
        return self.uri

    def _wait_ready(self) -> None:
        import psycopg2  # type: ignore[import-untyped]

        assert self.proc is not None
        deadline = time.monotonic() + START_TIMEOUT
        last: Exception | None = None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise PostgresUnavailable(f"postgres exited with {self.proc.returncode}:\n{self._log_tail()}")
            try:
                conn = psycopg2.connect(host=LOOPBACK, port=self.port, user=USER, dbname="postgres", connect_timeout=2)
            except psycopg2.OperationalError as e:
                last = e
                time.sleep(0.1)
                continue
            conn.close()
            return
        raise PostgresUnavailable(
            f"postgres did not accept connections within {START_TIMEOUT} s ({last}):\n{self._log_tail()}"
        )

    def stop(self) -> None:
        """Stop the server (a fast shutdown, killed after :data:`STOP_TIMEOUT`) and remove its directory."""
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGINT)  # fast shutdown: ends the connections, no waiting for clients
            try:
                proc.wait(STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(STOP_TIMEOUT)
        if self._log is not None:
            self._log.close()
            self._log = None
        if self.root is not None:
            shutil.rmtree(self.root, ignore_errors=True)
            self.root = None


@contextlib.contextmanager
def postgres_server() -> Iterator[str]:
    """A started server's SQLAlchemy URI for the ``with`` block; stopped after it."""
    server = PostgresServer()
    uri = server.start()
    try:
        yield uri
    finally:
        server.stop()
