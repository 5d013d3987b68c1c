"""A Spark standalone cluster for the tests: one master and N workers from the pyspark package, on loopback.

``SparkCluster(workdir).start()`` runs ``<pyspark>/bin/spark-class`` with the standalone ``Master`` and
``Worker`` classes, every one bound to 127.0.0.1 (``--host`` and ``SPARK_LOCAL_IP``) on ports chosen free
beforehand, each worker with a few cores and modest memory and its work directory under ``workdir``, and
returns the master URL once every worker is registered (the master's web UI serves its state as ``/json``).
A cluster that does not come up raises :class:`SparkClusterError` with the daemons' logs.

With ``private_dirs``, workers from index ``shared_workers`` on each run in a mount namespace of their own
(``unshare --mount``), where a tmpfs is mounted over each of those directories before the worker starts: the worker,
its executors and their Python workers see them empty, and what they write there stays in their namespace, as on a
machine that does not share the driver's disk. That needs root and ``unshare`` (:func:`private_dirs_unavailable`
says why not). ``/proc/<pid>/root/<path>`` shows a directory as a process of that namespace sees it
(:meth:`SparkCluster.private_view`).

Each daemon starts in a session of its own, which its executor JVMs and their Python workers inherit (the
Python daemons change their process group, not their session), so ``stop()`` can end every process the
cluster started, executors included. A daemon also gets SIGTERM if the test process dies without stopping
it (Linux), and a worker stops its executors when it ends.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shlex
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from filesink.demo.s3server import _die_with_parent

LOOPBACK = "127.0.0.1"
EXECUTOR_CLASS = "org.apache.spark.executor.CoarseGrainedExecutorBackend"
MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
LOG_TAIL_LINES = 60

# What the test run's environment must not pass on to the daemons and, through them, to executors.
_DROPPED_ENV_PREFIXES = ("SPARK_", "PYSPARK_", "FILESINK_")


class SparkClusterError(RuntimeError):
    """The cluster did not come up (or a daemon died); the message holds the command lines and the logs."""


def spark_home() -> Path:
    """The Spark distribution inside the installed pyspark package."""
    import pyspark

    home = Path(pyspark.__file__).parent
    if not (home / "bin" / "spark-class").is_file() or not (home / "jars").is_dir():
        raise SparkClusterError(f"{home} has no bin/spark-class or jars/: not a pyspark package with Spark in it")
    return home


@dataclass
class _Daemon:
    name: str
    command: list[str]
    log: Path
    process: subprocess.Popen[bytes] | None = None
    session: int | None = None
    """The session the daemon leads (its pid), which its executors and their Python workers are in."""


@dataclass
class SparkCluster:
    """A standalone master and ``workers`` workers; see the module docstring."""

    workdir: Path
    workers: int = 2
    cores: int = 1
    memory: str = "1g"
    """What each worker offers to executors (``--memory``)."""
    daemon_memory: str = "256m"
    """Heap of the master and worker JVMs themselves (``SPARK_DAEMON_MEMORY``)."""
    start_timeout: float = 90.0
    private_dirs: tuple[Path, ...] = ()
    """Directories the isolated workers see as empty tmpfs mounts of their own (created if missing)."""
    shared_workers: int = 0
    """With ``private_dirs``: how many of the first workers see the driver's files (the others are isolated)."""
    master_url: str = ""
    web_url: str = ""
    _daemons: list[_Daemon] = field(default_factory=list)

    def __enter__(self) -> SparkCluster:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # -- start and stop ---------------------------------------------------------------------------------

    def start(self) -> str:
        """Start the master and the workers; return the master URL once every worker is registered."""
        if self._daemons:
            raise RuntimeError("the cluster is already started")
        home = spark_home()
        self.workdir = Path(self.workdir)
        (self.workdir / "logs").mkdir(parents=True, exist_ok=True)
        (self.workdir / "conf").mkdir(exist_ok=True)  # empty: no spark-defaults.conf from anywhere else
        ports = free_ports(2 + 2 * self.workers)
        master_port, master_ui = ports[0], ports[1]
        self.master_url = f"spark://{LOOPBACK}:{master_port}"
        self.web_url = f"http://{LOOPBACK}:{master_ui}"
        spark_class = str(home / "bin" / "spark-class")
        self._daemons.append(
            _Daemon(
                "master",
                [spark_class, MASTER_CLASS, *_listen(master_port, master_ui)],
                self.workdir / "logs" / "master.log",
            )
        )
        for directory in self.private_dirs:
            Path(directory).mkdir(parents=True, exist_ok=True)
        for i in range(self.workers):
            work = self.workdir / f"worker-{i}"
            work.mkdir(exist_ok=True)
            port, ui = ports[2 + 2 * i], ports[3 + 2 * i]
            command = [
                *(spark_class, WORKER_CLASS, *_listen(port, ui)),
                *("--cores", str(self.cores), "--memory", self.memory, "--work-dir", str(work)),
                self.master_url,
            ]
            if self.isolated(i):
                command = isolated(command, self.private_dirs)
            self._daemons.append(_Daemon(f"worker-{i}", command, self.workdir / "logs" / f"worker-{i}.log"))
        env = self._environment(home)
        try:
            self._launch(self._daemons[0], env)
            self._wait(lambda state: True, "the master's web UI did not answer")
            for daemon in self._daemons[1:]:
                self._launch(daemon, env)
            self._wait(
                lambda state: state.get("aliveworkers") == self.workers,
                f"{self.workers} workers did not register with the master",
            )
        except BaseException:
            self.stop()
            raise
        return self.master_url

    def stop(self, timeout: float = 20.0) -> None:
        """SIGTERM the daemons (a worker stops its executors), then SIGKILL whatever of them is left (each wait
        at most ``timeout`` seconds)."""
        daemons = [d for d in self._daemons if d.process is not None]
        for daemon in reversed(daemons):  # workers first
            assert daemon.process is not None
            if daemon.process.poll() is None:
                daemon.process.terminate()
        deadline = time.monotonic() + timeout
        for daemon in daemons:
            assert daemon.process is not None
            with contextlib.suppress(subprocess.TimeoutExpired):
                daemon.process.wait(max(0.1, deadline - time.monotonic()))
        for pid in self.pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for daemon in daemons:
            assert daemon.process is not None
            if daemon.process.poll() is None:
                daemon.process.kill()
            daemon.process.wait(timeout)  # SIGKILLed: reaped at once
            daemon.process = None

    def _environment(self, home: Path) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(_DROPPED_ENV_PREFIXES)}
        env.update(
            SPARK_HOME=str(home),
            SPARK_CONF_DIR=str(self.workdir / "conf"),
            SPARK_LOCAL_IP=LOOPBACK,
            SPARK_LOCAL_DIRS=str(self.workdir / "local"),
            SPARK_DAEMON_MEMORY=self.daemon_memory,
            SPARK_MASTER_OPTS="-Dspark.master.rest.enabled=false",
            SPARK_WORKER_OPTS="-Dspark.worker.cleanup.enabled=false",
        )
        return env

    def _launch(self, daemon: _Daemon, env: dict[str, str]) -> None:
        with daemon.log.open("wb") as log:
            daemon.process = subprocess.Popen(
                daemon.command,
                cwd=self.workdir,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_die_with_parent(),  # SIGTERM if the test process dies without stopping it
            )
        daemon.session = daemon.process.pid

    def _wait(self, ready: Any, what: str) -> None:
        deadline = time.monotonic() + self.start_timeout
        while True:
            for daemon in self._daemons:
                if daemon.process is not None and daemon.process.poll() is not None:
                    raise SparkClusterError(self.describe(f"{daemon.name} exited with code {daemon.process.poll()}"))
            try:
                if ready(self.state()):
                    return
            except (OSError, ValueError):
                pass  # not answering yet
            if time.monotonic() > deadline:
                raise SparkClusterError(self.describe(f"{what} within {self.start_timeout:.0f} s"))
            time.sleep(0.25)

    # -- looking at it ----------------------------------------------------------------------------------

    def isolated(self, worker: int) -> bool:
        """Whether worker ``worker`` (0, 1, ...) sees ``private_dirs`` as empty directories of its own."""
        return bool(self.private_dirs) and worker >= self.shared_workers

    def worker_pid(self, worker: int) -> int:
        """The pid of the running worker ``worker``'s JVM (it runs in its own mount namespace if isolated)."""
        daemon = self._daemons[1 + worker]
        if daemon.process is None or daemon.process.poll() is not None:
            raise SparkClusterError(f"{daemon.name} is not running")
        return daemon.process.pid

    def private_view(self, worker: int, path: Path) -> Path:
        """``path`` as worker ``worker`` (and its executors) sees it: through ``/proc/<pid>/root``, which resolves
        in that process's mount namespace."""
        return Path(f"/proc/{self.worker_pid(worker)}/root") / Path(path).absolute().relative_to("/")

    def state(self) -> dict[str, Any]:
        """The master's state: ``aliveworkers``, ``workers``, ``activeapps``, ``completedapps``, ..."""
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never via a proxy
        with opener.open(self.web_url + "/json", timeout=5) as response:
            state: dict[str, Any] = json.load(response)
        return state

    def pids(self) -> list[int]:
        """Every live process the cluster started: daemons, executor JVMs, their Python daemons and workers."""
        return processes_in_sessions({d.session for d in self._daemons if d.session is not None})

    def executor_pids(self) -> list[int]:
        """The executor JVMs running now."""
        return [pid for pid in self.pids() if EXECUTOR_CLASS in cmdline(pid)]

    def describe(self, what: str) -> str:
        """``what``, then every daemon's command line and log tail, then the executors' logs."""
        parts = [what]
        for daemon in self._daemons:
            parts.append(f"--- {daemon.name}: {shlex.join(daemon.command)}\n{_tail(daemon.log)}")
        for log in sorted(self.workdir.glob("worker-*/app-*/*/std*")):
            parts.append(f"--- executor log {log.relative_to(self.workdir)}\n{_tail(log)}")
        return "\n".join(parts)


def isolated(command: list[str], private_dirs: tuple[Path, ...]) -> list[str]:
    """``command`` run in a mount namespace of its own with an empty tmpfs mounted over each of ``private_dirs``
    (``unshare`` execs the shell, which execs ``command``: the pid stays the command's)."""
    mounts = [f"mount -t tmpfs -o size=256m filesink-private {shlex.quote(str(d))}" for d in private_dirs]
    script = " && ".join([*mounts, f"exec {shlex.join(command)}"])
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", script]


def private_dirs_unavailable() -> str | None:
    """Why workers cannot get private directories here (``private_dirs``), or None: it takes root (a tmpfs is
    mounted), ``unshare`` (util-linux) and a kernel that lets this process make mount namespaces."""
    if os.geteuid() != 0:
        return "mounting a private tmpfs for a worker needs root"
    if shutil.which("unshare") is None or shutil.which("mount") is None:
        return "unshare and mount (util-linux) are not installed"
    with tempfile.TemporaryDirectory(prefix="filesink-unshare-") as directory:
        command = isolated(["sh", "-c", 'touch "$0"/seen', directory], (Path(directory),))
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=20, check=False)
        except (OSError, subprocess.TimeoutExpired) as e:
            return f"unshare failed: {e}"
        if done.returncode != 0:
            return f"unshare --mount with a tmpfs failed here ({done.stderr.strip() or done.returncode})"
        if os.listdir(directory):
            return "a tmpfs mounted under unshare --mount showed in this namespace"
    return None


def _listen(port: int, ui_port: int) -> list[str]:
    return ["--host", LOOPBACK, "--port", str(port), "--webui-port", str(ui_port)]


def _tail(path: Path) -> str:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except FileNotFoundError:
        return "    (no log)"
    shown = lines[-LOG_TAIL_LINES:]
    if len(lines) > len(shown):
        shown = [f"[... {len(lines) - len(shown)} lines ...]", *shown]
    return "\n".join("    " + line for line in shown) or "    (empty)"


# -- processes -----------------------------------------------------------------------------------------------


def _stat(pid: int) -> list[str] | None:
    """Fields of /proc/<pid>/stat after the command name (state, ppid, pgrp, session, ...), or None."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return text[text.rindex(")") + 2 :].split()


def parent_pid(pid: int) -> int | None:
    fields = _stat(pid)
    return int(fields[1]) if fields else None


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except (FileNotFoundError, ProcessLookupError):
        return ""


def processes_in_sessions(sessions: set[int]) -> list[int]:
    """Live (not zombie) processes whose session id is one of ``sessions``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        fields = _stat(int(entry.name))
        if fields and fields[0] != "Z" and int(fields[3]) in sessions:
            found.append(int(entry.name))
    return sorted(found)


def executor_of(pid: int) -> int | None:
    """The executor JVM that ``pid`` (a Python worker, say) runs under: the nearest such ancestor, or None."""
    current: int | None = pid
    while current and current > 1:
        if EXECUTOR_CLASS in cmdline(current):
            return current
        current = parent_pid(current)
    return None


# -- ports ---------------------------------------------------------------------------------------------------


def free_ports(count: int) -> list[int]:
    """``count`` distinct ports free on 127.0.0.1 now, below the kernel's ephemeral range when there is room
    (so that outgoing connections do not take them before the daemons bind)."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    rng = random.SystemRandom()
    held: list[socket.socket] = []
    try:
        for _ in range(1000):
            if len(held) == count:
                return [s.getsockname()[1] for s in held]
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                sock.bind((LOOPBACK, rng.randint(10000, low - 1) if low > 11000 else 0))
            except OSError:
                sock.close()
                continue
            held.append(sock)
        raise SparkClusterError(f"could not find {count} free ports on {LOOPBACK}")
    finally:
        for sock in held:
            sock.close()
