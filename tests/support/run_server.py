"""One long-lived ``filesink`` process per test process, for the commands end-to-end tests run without killing or
signalling them.

A ``filesink run`` in a fresh process spends most of a short test's time starting: Python's imports, then Spark's
JVM (its launch, its classes loaded and compiled), then a SparkContext; measured on a 2-core machine, a run of 300
rows took 18.9 s in a fresh process and 5.1 s as the next command of the same process (the JVM and the imports
already there). So :func:`filesink` sends each command to a server process (this module, run as a script) that
runs ``filesink.cli.main.main(argv)`` in-process, one command at a time, and answers with its exit code, stdout and
stderr, as ``subprocess.run`` would:

- **Output**: the server's file descriptors 1 and 2 are pipes it reads itself, so everything a command writes is
  caught, Python's prints and logs and the JVM's own lines alike (the JVM inherits them when it starts). A command's
  output ends at a marker written after it returns, on each pipe, behind everything it wrote.
- **A fresh command each time**: the command's environment (the test process's, with the test's variables) and
  working directory are set for it, and put back after it; ``sys.argv`` is what ``python -m filesink`` gives. A
  SparkContext a command left open (a refusal before its own stop, a failure) is stopped after it, so the next one
  makes its own, with its own master and options, in the same JVM. ``SystemExit`` is the exit code; an exception
  that would end a process is printed as Python prints it, with exit code 1.
- **One server per launch environment**: the JVM, and the Python workers it starts, keep the environment the server
  started with, so commands share a server only when they agree on every variable that reaches them
  (:func:`launch_key`: ``AWS_*``, ``FILESINK_*``, ``SPARK_*``, ``PYSPARK_*``, ``JAVA_*``, ``PATH``, ``HOME``, ...). What
  the product keeps per process (the output's filesystems, the tasks' checks, the request counts, the failpoints'
  hits, the sinks open in the process) is emptied after each command. At most :data:`MAX_SERVERS` live at once.
- **What needs a process of its own gets one** (:func:`needs_own_process`): a command that asks for jars
  (``--format kafka``, ``spark.jars*``), which only a new JVM takes. Tests that kill or signal a command start it
  themselves.
- **Deadlines**: the client waits for each answer at most the command's timeout; a server that does not answer in
  time is killed with its process group (its JVM and Python workers), the test fails naming the command and how long
  it waited (run the test with ``FILESINK_TEST_RUN_SERVER=0`` to see the command's own output), and the next command
  starts a new server.

``FILESINK_TEST_RUN_SERVER=0`` runs every command in a process of its own instead, as before, to compare.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

START_TIMEOUT = 60.0
"""Seconds for a server to read its first request (its imports)."""
MARK = "\x00filesink-test-run-server-end\x00"
"""Written on both output pipes after each command: what comes before it is that command's."""
LAUNCH_VARIABLES = ("PATH", "CLASSPATH", "LD_LIBRARY_PATH", "PYTHONPATH", "HOME", "TMPDIR")
LAUNCH_PREFIXES = ("AWS_", "FILESINK_", "SPARK_", "PYSPARK_", "JAVA_", "JDK_", "HADOOP_", "_JAVA_")
OWN_PROCESS_WORDS = ("kafka", "spark.jars", "--packages", "--jars", "spark.driver.memory", "extraClassPath")


def launch_key(env: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    """The variables of ``env`` that a server's JVM and Python workers keep from its start."""
    return tuple(sorted((k, v) for k, v in env.items() if k in LAUNCH_VARIABLES or k.startswith(LAUNCH_PREFIXES)))


def needs_own_process(args: Sequence[str]) -> bool:
    """Whether the command ``args`` must run in a process of its own: it asks for jars, which only a new JVM takes."""
    return any(word in arg for arg in args for word in OWN_PROCESS_WORDS)


# -- the client, in the test process ---------------------------------------------------------------------------


class _Server:
    """A server process of this test process, for one launch environment, started on first use."""

    def __init__(self, env: dict[str, str]) -> None:
        self.proc: subprocess.Popen[str] | None = None
        self.env = env

    def start(self) -> subprocess.Popen[str]:
        if self.proc is not None and self.proc.poll() is None:
            return self.proc
        self.proc = subprocess.Popen(
            [sys.executable, __file__],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,  # everything a command writes reaches the client in its answer
            text=True,
            start_new_session=True,
            env=self.env,
        )
        return self.proc

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        from helpers import kill

        with contextlib.suppress(Exception):
            kill(proc, group=True)


_SERVERS: dict[tuple[tuple[str, str], ...], _Server] = {}
"""The servers of this test process, the one used last at the end."""
MAX_SERVERS = 2
"""Servers kept at once per test process (each holds a JVM); the one used longest ago is stopped first."""
_LOCK = threading.Lock()


def _server(env: dict[str, str]) -> _Server:
    key = launch_key(env)
    server = _SERVERS.pop(key, None) or _Server(env)
    _SERVERS[key] = server
    while len(_SERVERS) > MAX_SERVERS:
        _SERVERS.pop(next(iter(_SERVERS))).stop()
    return server


@atexit.register
def _stop_all() -> None:
    for server in _SERVERS.values():
        server.stop()


def filesink(
    args: Sequence[str],
    timeout: float,
    *,
    env: Mapping[str, str] | None = None,
    environ: Mapping[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """``python -m filesink ARGS`` with ``environ`` (default: the test process's environment) and ``env`` added, as
    ``subprocess.run(..., capture_output=True, text=True)`` would give it; through the server unless the command
    needs a process of its own. Fails the test after ``timeout`` seconds, naming the command."""
    from helpers import run

    command = [sys.executable, "-m", "filesink", *map(str, args)]
    full = dict(os.environ if environ is None else environ, **(env or {}))
    if os.environ.get("FILESINK_TEST_RUN_SERVER", "1") == "0" or needs_own_process(command):
        return run(command, timeout, f"filesink {args[0]}", capture_output=True, text=True, env=full)
    with _LOCK:
        return _ask(_server(full), command, [str(a) for a in args], full, timeout)


def _ask(
    server: _Server, command: list[str], args: list[str], env: dict[str, str], timeout: float
) -> subprocess.CompletedProcess[str]:
    import pytest

    proc = server.start()
    assert proc.stdin is not None
    request = {"args": args, "env": env, "cwd": os.getcwd()}
    try:
        proc.stdin.write(json.dumps(request) + "\n")
        proc.stdin.flush()
    except OSError:  # it died since the last command: one new server
        server.stop()
        proc = server.start()
        assert proc.stdin is not None
        proc.stdin.write(json.dumps(request) + "\n")
        proc.stdin.flush()
    started = time.monotonic()
    line = _read_answer(proc, timeout)
    if line is None or not line.strip():
        server.stop()
        what = f"filesink {args[0]}" if args else "filesink"
        ended = "timed out after" if line is None else "the server ended after"
        pytest.fail(f"{ended} {time.monotonic() - started:.0f} s waiting for {what} (run server; killed)")
    answer = json.loads(line)
    return subprocess.CompletedProcess(command, answer["returncode"], answer["stdout"], answer["stderr"])


def _read_answer(proc: subprocess.Popen[str], timeout: float) -> str | None:
    """The server's next line, or None when ``timeout`` seconds pass first."""
    from helpers import _read_line

    assert proc.stdout is not None
    return _read_line(proc.stdout, time.monotonic() + timeout)


# -- the server ---------------------------------------------------------------------------------------------------


class _Catcher:
    """What is written to one file descriptor, read by a thread, cut at :data:`MARK`."""

    def __init__(self, fd: int) -> None:
        read, write = os.pipe()
        os.dup2(write, fd)
        os.close(write)
        self.fd = fd
        self.text = ""
        self.done = threading.Condition()
        self.ended: list[str] = []
        threading.Thread(target=self._read, args=(read,), daemon=True).start()

    def _read(self, read: int) -> None:
        pending = b""
        while chunk := os.read(read, 65536):
            pending += chunk
            text = pending.decode("utf-8", errors="replace") if not _partial(pending) else None
            if text is None:
                continue
            pending = b""
            with self.done:
                self.text += text
                while MARK in self.text:
                    before, _, self.text = self.text.partition(MARK)
                    self.ended.append(before)
                    self.done.notify_all()

    def take(self, timeout: float) -> str:
        """Everything written before the next mark (written by the caller first)."""
        os.write(self.fd, MARK.encode())
        with self.done:
            if not self.done.wait_for(lambda: self.ended, timeout):
                return self.text + "\n[run server: the output's end was not seen]\n"
            return self.ended.pop(0)


def _partial(data: bytes) -> bool:
    """Whether ``data`` ends inside a UTF-8 character."""
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as e:
        return e.start >= len(data) - 3 and e.reason == "unexpected end of data"
    return False


def _stop_spark() -> None:
    """Stop what a command left running of Spark: its streaming queries and its SparkContext (the JVM stays)."""
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    session = SparkSession.getActiveSession()
    if session is not None:
        for query in session.streams.active:
            with contextlib.suppress(Exception):
                query.stop()
    if SparkContext._active_spark_context is not None:
        with contextlib.suppress(Exception):
            SparkContext._active_spark_context.stop()
    SparkSession._instantiatedSession = None
    SparkSession._activeSession = None


def _one(args: list[str], main: Any) -> int:
    sys.argv = [str(Path(main.__code__.co_filename).parents[1] / "__main__.py"), *args]
    try:
        code = main(args)
    except SystemExit as e:
        code = e.code
    except BaseException:  # what would end a process: Python prints it and exits with 1
        traceback.print_exc()
        return 1
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def serve(requests: IO[str], answers: IO[str]) -> None:
    from helpers import forget_process_state

    out, err = _Catcher(1), _Catcher(2)
    from filesink.cli.main import main

    for line in requests:
        request = json.loads(line)
        saved_env, saved_cwd = dict(os.environ), os.getcwd()
        os.environ.clear()
        os.environ.update(request["env"])
        os.chdir(request["cwd"])
        try:
            code = _one(request["args"], main)
        finally:
            with contextlib.suppress(Exception):
                _stop_spark()
            forget_process_state()
            sys.stdout.flush()
            sys.stderr.flush()
            os.chdir(saved_cwd)
            os.environ.clear()
            os.environ.update(saved_env)
        answer = {"returncode": code, "stdout": out.take(30), "stderr": err.take(30)}
        answers.write(json.dumps(answer) + "\n")
        answers.flush()


if __name__ == "__main__":
    answers = os.fdopen(os.dup(1), "w")
    sys.stdin.reconfigure(line_buffering=True)
    serve(sys.stdin, answers)
