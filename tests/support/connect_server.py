"""A Spark Connect server for the tests: the one bundled in pyspark, run as its own process on 127.0.0.1.

``ConnectServer(workdir).start()`` runs ``spark-submit --class ...SparkConnectServer`` (as pyspark's
``sbin/start-connect-server.sh --wait`` does), with a random authentication token, and returns the client URL
once the server's gRPC port answers. The server's foreachBatch workers run this Python (``PYSPARK_PYTHON``), so
they import the project as the tests do. ``kill()`` is a SIGKILL of the server (its workers see their socket
close and end); ``stop()`` ends it gently. A server that does not come up raises :class:`ConnectStartError` with
its command line and log.
"""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pyspark
from helpers import support_env
from s3servers import free_port

LOOPBACK = "127.0.0.1"
START_TIMEOUT = 240.0
"""The server takes about 40 s to start on a quiet 2-core machine; a busy one may take several times that."""
PROJECT = Path(__file__).resolve().parents[2]
SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"


class ConnectStartError(RuntimeError):
    """The Connect server did not come up; the message holds its command line and log."""


def spark_home() -> Path:
    return Path(os.environ.get("SPARK_HOME") or Path(pyspark.__file__).parent)


class ConnectServer:
    """One Spark Connect server process (``master`` ``local[N]``) with a token; ``url`` for the clients."""

    def __init__(self, workdir: Path | str, *, master: str = "local[2]", conf: dict[str, str] | None = None) -> None:
        self.workdir = Path(workdir)
        self.master = master
        self.conf = dict(conf or {})
        self.token = secrets.token_hex(16)
        self.port = 0
        self.log_path = self.workdir / "connect-server.log"
        self.command: list[str] = []
        self.startup_seconds: float | None = None
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        # "localhost", not 127.0.0.1: pyspark's client turns TLS on for a token with an IP address host.
        return f"sc://localhost:{self.port}/;token={self.token}"

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process else None

    def start(self, *, timeout: float = START_TIMEOUT) -> str:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        conf = {
            "spark.connect.grpc.binding.address": LOOPBACK,
            "spark.connect.grpc.binding.port": str(self.port),
            "spark.ui.enabled": "false",
            "spark.sql.shuffle.partitions": "4",
            "spark.driver.host": LOOPBACK,
            "spark.local.dir": str(self.workdir / "spark-local"),
            # the foreachBatch worker's socket to the server waits this long for a busy machine
            "spark.python.authenticate.socketTimeout": "120s",
            **self.conf,
        }
        self.command = [str(spark_home() / "bin" / "spark-submit"), "--class", SERVER_CLASS, "--name", "filesink-test"]
        self.command += ["--master", self.master]
        for key, value in conf.items():
            self.command += ["--conf", f"{key}={value}"]
        env = support_env(
            SPARK_CONNECT_AUTHENTICATE_TOKEN=self.token,
            PYSPARK_PYTHON=sys.executable,
            PYSPARK_DRIVER_PYTHON=sys.executable,
            SPARK_HOME=str(spark_home()),
        )
        # the server's Python workers import the project these tests run (a work tree may not be the installed one)
        env["PYTHONPATH"] = os.pathsep.join([str(PROJECT), env["PYTHONPATH"]])
        for name in ("SPARK_REMOTE", "SPARK_CONNECT_MODE_ENABLED", "SPARK_LOCAL_REMOTE"):
            env.pop(name, None)
        started = time.monotonic()
        with open(self.log_path, "ab") as log:
            self._process = subprocess.Popen(
                self.command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=self.workdir, start_new_session=True
            )
        deadline = started + timeout
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                self._fail(f"exited with status {self._process.returncode}")
            if _answers(self.port) and "Spark Connect server started" in self.log():
                self.startup_seconds = time.monotonic() - started
                return self.url
            time.sleep(0.5)
        self.kill()
        self._fail(f"did not answer on port {self.port} within {timeout:.0f} s")
        raise AssertionError("unreachable")

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def _fail(self, what: str) -> None:
        raise ConnectStartError(
            f"the Spark Connect server {what}.\ncommand: {' '.join(self.command)}\nlog ({self.log_path}):\n"
            + self.log()[-6000:]
        )

    def kill(self) -> None:
        """SIGKILL the server's process group (the JVM and its Python workers) and wait for it."""
        self._signal(signal.SIGKILL, wait=30.0)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 30 s."""
        if self._process is None or self._process.poll() is not None:
            return
        self._signal(signal.SIGTERM, wait=30.0)
        if self._process.poll() is None:
            self.kill()

    def _signal(self, sig: int, *, wait: float) -> None:
        process = self._process
        if process is None or process.poll() is not None:
            return
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        try:
            process.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            if sig != signal.SIGKILL:
                return
            raise


def connect_client_env() -> dict[str, str]:
    """The environment of a Connect client run as a subprocess: the support modules importable, none of pyspark's
    Connect-mode variables of this process, and this Python for the Spark workers of a client that starts the
    server itself (``remote("local[2]")``), as in a virtual environment."""
    env = support_env(PYSPARK_PYTHON=sys.executable)
    for name in ("SPARK_REMOTE", "SPARK_CONNECT_MODE_ENABLED", "SPARK_LOCAL_REMOTE"):
        env.pop(name, None)
    return env


def _answers(port: int) -> bool:
    try:
        with socket.create_connection((LOOPBACK, port), timeout=1.0):
            return True
    except OSError:
        return False
