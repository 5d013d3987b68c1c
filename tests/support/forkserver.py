"""A fork server (a zygote) for the Python scripts the tests run as subprocesses.

A fresh ``python job.py`` pays about a second of imports (pyarrow, s3fs, botocore, the packages) before it does
about a second of work. The zygote, one per test process (started on first use, stopped at its exit), imports
those modules once and forks a child per request: the child runs the script as ``__main__`` (``runpy``), with
the requested argv, environment (``os.environ`` replaced wholesale), working directory and stdio (file
descriptors passed over a UNIX socket), in a session of its own (``os.killpg(proc.pid, ...)`` works as with
``start_new_session=True``). :func:`popen` gives a :class:`subprocess.Popen` (a :class:`ForkedProcess`, whose
exit status the zygote reports) that the waits of ``helpers`` use unchanged; :func:`run` is ``helpers.run``
with the child started there.

What makes a forked child behave as a fresh process:

- the zygote stays single-threaded (checked before each fork) and never starts Spark or a JVM;
- only modules that read the environment when used, not when imported, are preloaded; a request whose
  environment differs from the zygote's in any other variable than :data:`LAZY_VARS` (``PYTHON*`` and the
  locale included) runs as a plain subprocess;
- the child resets what a preloaded module may hold: the failpoints' hit counts, the temp directory, the
  ``random`` seed, the logging handlers; ``sys.path`` is the one a fresh interpreter builds (the script's
  directory, ``PYTHONPATH``, then the site's), stdio objects are made anew on the new descriptors, the atexit
  handlers are those the preloaded modules registered on import (the zygote registers none);
- the child runs the script only once the client has its pid: a request that timed out never runs, so the
  plain subprocess that replaces it is the only run.

A wait has a deadline (:data:`START_WAIT` for the zygote, :data:`REPLY_WAIT` for a request); when the zygote
cannot start, a request fails or the zygote died, the call falls back to a plain :class:`subprocess.Popen`
and says so on stderr (once per reason). ``FILESINK_TEST_FORKSERVER=0`` turns the server off.
"""

from __future__ import annotations

import atexit
import contextlib
import io
import json
import os
import select
import socket
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

ENABLE_VAR = "FILESINK_TEST_FORKSERVER"
"""``0`` runs every job as a plain subprocess (to compare the two)."""
PRELOAD = (
    "numpy",
    "pandas",
    "pyarrow",
    "pyarrow.parquet",
    "pyarrow.dataset",
    "pyarrow.fs",
    "fsspec",
    "s3fs",
    "botocore",
    "botocore.session",
    "aiobotocore",
    "duckdb",
    "pytest",
    "logstore",
    "filesink",
    "recovery",
    "recovery.cli",
    "helpers",
    "sink_helpers",
    "checker",
)
"""Imported by the zygote before it forks: the jobs' imports (``matrix_job``, ``crash_child``, ``python -m
recovery``). None reads an environment variable outside :data:`LAZY_VARS` when imported. Not the table
formats' (``deltalake``, ``pyiceberg``): only a job on a table imports them, and pyiceberg's modules take about
a second to tear down at exit, which every other child would then pay."""
LAZY_VARS = (
    "FILESINK_",
    "MATRIX_JOB_",
    "CRASH_CHILD_",
    "AWS_",
    "PYTEST_CURRENT_TEST",
    "PYTHONPATH",
    "PYSPARK_",
    "_PYSPARK_",
    "SPARK_",
    "_RJEM_",
)
"""Variables (prefixes) read only when used, never when a preloaded module is imported: a child may have other
values than the zygote. ``PYTHONPATH`` goes into the child's ``sys.path``. Spark's (``PYSPARK_PYTHON``, which a test
process's first local Spark session sets, ``SPARK_*``) are read by pyspark, which the zygote never imports: without
them here, every job after a test process's first Spark session ran as a plain subprocess. ``_RJEM_MALLOC_CONF`` is
what a test process's import of polars sets for its allocator, which a forked child has already started with."""
START_WAIT = 120.0
"""Seconds for the zygote to import :data:`PRELOAD` and say it is ready (a loaded 2-core machine)."""
REPLY_WAIT = 60.0
"""Seconds for the zygote to fork a child and send its pid."""
STOP_WAIT = 10.0
MAX_MESSAGE = 1 << 20

SUPPORT = Path(__file__).parent
_ENV_AT_IMPORT = dict(os.environ)
"""The test process's environment before any test changed it: the zygote's (less :data:`LAZY_VARS`)."""


def enabled() -> bool:
    return os.environ.get(ENABLE_VAR, "1") != "0"


def _lazy(name: str) -> bool:
    return name.startswith(LAZY_VARS)


# ---------------------------------------------------------------------------------------------------------
# Client: the test process's side.
# ---------------------------------------------------------------------------------------------------------


class Unavailable(Exception):
    """The fork server cannot run this request: it runs as a plain subprocess."""


_said: set[str] = set()
_lock = threading.Lock()
_server: _Server | None = None
_server_failed = False


def _say_once(reason: str) -> None:
    if reason not in _said:
        _said.add(reason)
        print(f"forkserver: {reason}; running as a plain subprocess", file=sys.stderr, flush=True)


class _Server:
    """The zygote process and the socket requests go through."""

    def __init__(self) -> None:
        self.env = {k: v for k, v in _ENV_AT_IMPORT.items() if not _lazy(k)}
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        support, fd = str(SUPPORT), theirs.fileno()
        code = f"import sys; sys.path.insert(0, {support!r}); import forkserver; forkserver.main({fd})"
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", code],
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                pass_fds=[theirs.fileno()],
                start_new_session=True,
            )
        finally:
            theirs.close()
        self.control = ours
        self.send_lock = threading.Lock()
        try:
            ready = _recv(ours, time.monotonic() + START_WAIT, "the fork server to start")
        except Unavailable:
            self.stop()
            raise
        if ready.get("ready") is not True:
            self.stop()
            raise Unavailable(f"the fork server did not start: {ready}")
        self.pid = self.proc.pid

    def mismatch(self, env: Mapping[str, str]) -> str | None:
        """Why a child with ``env`` would not start as a fresh process does (None: it would)."""
        names = sorted(k for k in set(env) | set(self.env) if not _lazy(k) and env.get(k) != self.env.get(k))
        if names:
            return f"the environment differs from the fork server's in {', '.join(names[:5])}"
        return None

    def spawn(self, request: dict[str, Any], fds: Sequence[int]) -> tuple[socket.socket, int]:
        """Fork a child for ``request`` with stdio ``fds``: its reply socket and pid (it runs once told to)."""
        reply, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            with self.send_lock:
                socket.send_fds(self.control, [json.dumps(request).encode()], [theirs.fileno(), *fds])
        except OSError as e:
            reply.close()
            raise Unavailable(f"the fork server is gone ({e})") from None
        finally:
            theirs.close()
        try:
            answer = _recv(reply, time.monotonic() + REPLY_WAIT, "the fork server to fork")
            if "error" in answer:
                raise Unavailable(f"the fork server refused: {answer['error']}")
            reply.send(b"go")  # the child runs the script from here; closing `reply` instead would end it
        except (Unavailable, OSError) as e:
            reply.close()
            raise Unavailable(str(e)) from None
        return reply, int(answer["pid"])

    def stop(self) -> None:
        self.control.close()  # the zygote ends at the end of its control socket
        try:
            self.proc.wait(STOP_WAIT)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(STOP_WAIT)


def _recv(sock: socket.socket, deadline: float, what: str) -> dict[str, Any]:
    """The next message on ``sock`` (a JSON object), waited for until ``deadline``."""
    remaining = deadline - time.monotonic()
    if remaining <= 0 or not select.select([sock], [], [], remaining)[0]:
        raise Unavailable(f"timed out waiting for {what}")
    data = sock.recv(MAX_MESSAGE)
    if not data:
        raise Unavailable(f"the fork server ended while waiting for {what}")
    return dict(json.loads(data))


def _get_server() -> _Server | None:
    global _server, _server_failed
    with _lock:
        if _server_failed:
            return None
        if _server is None:
            try:
                _server = _Server()
            except (Unavailable, OSError) as e:
                _server_failed = True
                _say_once(f"the fork server did not start ({e})")
                return None
            atexit.register(_stop_server)
        return _server


def _stop_server() -> None:
    global _server
    with _lock:
        if _server is not None:
            _server.stop()
            _server = None


def _drop_server(server: _Server) -> None:
    """A server that failed a request takes no more (a later call falls back at once); it still reports the
    exits of the children it started, and stops at exit."""
    global _server_failed
    with _lock:
        if _server is server:
            _server_failed = True


def _target(args: Sequence[Any]) -> tuple[str, str, list[str]] | None:
    """``("script", path, argv)`` or ``("module", name, argv)`` for ``[sys.executable, script.py | -m module,
    ...]``; None for any other command (it runs as a plain subprocess)."""
    if isinstance(args, (str, bytes)) or len(args) < 2 or str(args[0]) != sys.executable:
        return None
    rest = [str(a) for a in args[1:]]
    if rest[0] == "-m" and len(rest) > 1:
        return "module", rest[1], rest[2:]
    if rest[0].endswith(".py") and not rest[0].startswith("-"):
        return "script", rest[0], rest[1:]
    return None


def popen(
    args: Sequence[Any],
    *,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    stdin: Any = None,
    stdout: Any = None,
    stderr: Any = None,
    text: bool | None = None,
    encoding: str | None = None,
    errors: str | None = None,
    universal_newlines: bool | None = None,
    start_new_session: bool = False,
    **other: Any,
) -> subprocess.Popen[Any]:
    """``subprocess.Popen(args, ...)`` for ``[sys.executable, script.py | -m module, ...]``, forked from the
    zygote; any other command, or other keyword arguments, start a plain subprocess. The child always leads a
    session of its own (as with ``start_new_session=True``)."""
    kwargs = dict(
        env=env,
        cwd=cwd,
        stdin=stdin,
        stdout=stdout,
        stderr=stderr,
        text=text,
        encoding=encoding,
        errors=errors,
        universal_newlines=universal_newlines,
    )
    target = _target(args)
    if other or target is None or not enabled():
        return subprocess.Popen(args, start_new_session=start_new_session, **kwargs, **other)
    server = _get_server()
    if server is None:
        return subprocess.Popen(args, start_new_session=start_new_session, **kwargs)
    child_env = dict(os.environ if env is None else env)
    reason = server.mismatch(child_env)
    if reason:
        _say_once(reason)
        return subprocess.Popen(args, start_new_session=start_new_session, **kwargs)
    kind, name, argv = target
    request = {"kind": kind, "name": name, "argv": argv, "env": child_env, "cwd": os.fspath(cwd or os.getcwd())}
    text_mode = bool(encoding or errors or text or universal_newlines)
    try:
        return ForkedProcess(server, args, request, stdin, stdout, stderr, text_mode, encoding, errors)
    except Unavailable as e:
        _say_once(f"the fork server failed a request ({e})")
        _drop_server(server)
        return subprocess.Popen(args, start_new_session=start_new_session, **kwargs)


class ForkedProcess(subprocess.Popen):  # type: ignore[type-arg]
    """A child of the zygote, as a :class:`subprocess.Popen`: ``communicate``, ``wait``, ``poll``,
    ``send_signal``, ``kill``, ``terminate`` are Popen's, over the exit status the zygote reports."""

    def __init__(
        self,
        server: _Server,
        args: Sequence[Any],
        request: dict[str, Any],
        stdin: Any,
        stdout: Any,
        stderr: Any,
        text_mode: bool,
        encoding: str | None,
        errors: str | None,
    ) -> None:
        # Popen.__init__ would fork: set what its other methods use instead.
        self.args = args
        self.returncode: int | None = None
        self._child_created = False
        self._communication_started = False
        self._sigint_wait_secs = 0.25
        self._input = None
        self._input_offset = 0
        self._closed_child_pipe_fds = True
        self._waitpid_lock = threading.Lock()
        self.text_mode = text_mode
        self.universal_newlines = text_mode
        if text_mode and encoding is None:
            encoding = subprocess._text_encoding()  # type: ignore[attr-defined]
        self.encoding, self.errors = encoding, errors
        self.pipesize = -1
        self.stdin = self.stdout = self.stderr = None
        self._reply: socket.socket | None = None
        self.pid = -1

        to_close: list[int] = []  # the child's ends, once passed
        ours: dict[str, int] = {}
        child: list[int] = []
        try:
            for i, (name, spec) in enumerate((("stdin", stdin), ("stdout", stdout), ("stderr", stderr))):
                if spec is None:
                    child.append(i)
                elif spec == subprocess.PIPE:
                    r, w = os.pipe()
                    ours[name], theirs = (w, r) if i == 0 else (r, w)
                    child.append(theirs)
                    to_close.append(theirs)
                elif spec == subprocess.DEVNULL:
                    fd = os.open(os.devnull, os.O_RDWR)
                    child.append(fd)
                    to_close.append(fd)
                elif spec == subprocess.STDOUT and i == 2:
                    child.append(child[1])
                elif isinstance(spec, int):
                    child.append(spec)
                else:
                    child.append(spec.fileno())
            self._reply, self.pid = server.spawn(request, child)
        except BaseException:
            for fd in ours.values():
                os.close(fd)
            raise
        finally:
            for fd in to_close:
                os.close(fd)
        if "stdin" in ours:
            self.stdin = open(ours["stdin"], "wb", -1)  # noqa: SIM115 (closed as Popen's are)
            if text_mode:
                self.stdin = io.TextIOWrapper(self.stdin, write_through=True, encoding=encoding, errors=errors)
        for name in ("stdout", "stderr"):
            if name in ours:
                stream: Any = open(ours[name], "rb", -1)  # noqa: SIM115
                if text_mode:
                    stream = io.TextIOWrapper(stream, encoding=encoding, errors=errors)
                setattr(self, name, stream)

    def _status(self, timeout: float | None) -> bool:
        """Take the exit status if the zygote sent it within ``timeout`` seconds (None: no limit)."""
        if self.returncode is not None:
            return True
        assert self._reply is not None
        if not select.select([self._reply], [], [], timeout)[0]:
            return False
        data = self._reply.recv(MAX_MESSAGE)
        if not data:
            raise RuntimeError(f"the fork server ended before it reported the exit of pid {self.pid}")
        status = json.loads(data)["status"]
        self.returncode = os.waitstatus_to_exitcode(status)
        self._reply.close()
        return True

    def _internal_poll(self, _deadstate: Any = None, **_: Any) -> int | None:
        with self._waitpid_lock:
            self._status(0)
        return self.returncode

    def _wait(self, timeout: float | None) -> int:
        with self._waitpid_lock:
            if not self._status(timeout):
                raise subprocess.TimeoutExpired(self.args, timeout)  # type: ignore[arg-type]
        assert self.returncode is not None
        return self.returncode

    def __del__(self) -> None:
        if self._reply is not None:
            self._reply.close()

    def __repr__(self) -> str:
        return f"<ForkedProcess: returncode: {self.returncode} args: {list(self.args)!r}>"


def run(args: Sequence[Any], timeout: float, what: str | None = None, **kwargs: Any) -> subprocess.CompletedProcess:
    """``helpers.run`` with the command started by :func:`popen`: ``subprocess.run(args, timeout=timeout,
    **kwargs)``; if the command has not ended within ``timeout`` seconds (it is then killed), fail the test
    naming ``what`` (default: the command), with the end of its output."""
    import shlex

    import pytest
    from helpers import _output

    if kwargs.pop("capture_output", False):
        kwargs["stdout"] = kwargs["stderr"] = subprocess.PIPE
    check = kwargs.pop("check", False)
    with popen(args, **kwargs) as proc:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired as e:
            proc.kill()  # as subprocess.run does
            e.stdout, e.stderr = proc.communicate()
            what = what or shlex.join(map(str, args))
            pytest.fail(f"timed out after {timeout:g} s waiting for {what} (killed){_output(e.stdout, e.stderr)}")
    done = subprocess.CompletedProcess(args, proc.returncode, out, err)
    if check:
        done.check_returncode()
    return done


# ---------------------------------------------------------------------------------------------------------
# Server: the zygote's side.
# ---------------------------------------------------------------------------------------------------------


def _threads() -> int:
    """The process's threads, Python's and the C libraries' (from /proc)."""
    return len(os.listdir("/proc/self/task"))


def main(control_fd: int) -> None:
    """The zygote: preload, then serve until the control socket ends; in a forked child, run its script."""
    job = _serve(control_fd)
    if job is not None:
        job()  # in the child, at the top level: its exit is the interpreter's (atexit, threads, stdio)


def _serve(control_fd: int) -> Callable[[], None] | None:
    control = socket.socket(fileno=control_fd)  # ends with the test process, however that ends
    base_path = [p for p in sys.path if p not in ("", str(SUPPORT))]  # the standard library and the site
    sys.path.insert(0, str(SUPPORT))
    for module in PRELOAD:
        with contextlib.suppress(ImportError):
            __import__(module)
    del sys.path[0]
    threads = _threads()  # C libraries' helpers (OpenBLAS, jemalloc) that fork handles; Python's: one
    if threading.active_count() != 1:
        control.send(json.dumps({"ready": False, "threads": threading.active_count()}).encode())
        return None
    control.send(json.dumps({"ready": True}).encode())
    children: dict[int, tuple[int, socket.socket]] = {}  # pidfd -> (pid, reply socket)
    while True:
        ready, _, _ = select.select([control, *children], [], [])
        for fd in ready:
            if fd is control:
                try:
                    data, fds, _flags, _addr = socket.recv_fds(control, MAX_MESSAGE, 8)
                except OSError:
                    return None
                if not data:
                    return None  # the test process is done
                try:
                    job = _fork(json.loads(data), fds, control, children, base_path, threads)
                except Exception:  # a bad request: the client times out on it and falls back
                    traceback.print_exc()
                    continue
                if job is not None:
                    return job  # in the child
            else:
                pid, reply = children.pop(fd)
                _, status = os.waitpid(pid, 0)
                os.close(fd)
                with contextlib.suppress(OSError):
                    reply.send(json.dumps({"status": status}).encode())
                reply.close()


def _fork(
    request: dict[str, Any],
    fds: list[int],
    control: socket.socket,
    children: dict[int, tuple[int, socket.socket]],
    base_path: list[str],
    threads: int,
) -> Callable[[], None] | None:
    reply = socket.socket(fileno=fds[0])
    stdio = fds[1:]
    if threading.active_count() != 1 or _threads() > threads:
        with contextlib.suppress(OSError):
            reply.send(json.dumps({"error": f"{threading.active_count()} threads in the fork server"}).encode())
        reply.close()
        for fd in stdio:
            os.close(fd)
        return None
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        try:
            return _child(request, reply, stdio, control, children, base_path)
        except BaseException:
            with contextlib.suppress(Exception):
                os.write(2, f"forkserver: the child could not start:\n{traceback.format_exc()}".encode())
            os._exit(255)
    for fd in stdio:
        os.close(fd)
    try:
        pidfd = os.pidfd_open(pid)
    except OSError as e:  # never seen: the child then waits for a "go" that is not coming
        with contextlib.suppress(OSError):
            reply.send(json.dumps({"error": f"pidfd_open: {e}"}).encode())
        os.waitpid(pid, 0)
        reply.close()
        return None
    children[pidfd] = (pid, reply)
    with contextlib.suppress(OSError):
        reply.send(json.dumps({"pid": pid}).encode())
    return None


def _child(
    request: dict[str, Any],
    reply: socket.socket,
    stdio: list[int],
    control: socket.socket,
    children: dict[int, tuple[int, socket.socket]],
    base_path: list[str],
) -> Callable[[], None]:
    """In the forked child: become a fresh process for ``request``; the job to run at the top level."""
    os.setsid()
    control.close()
    for pidfd, (_pid, other) in children.items():
        os.close(pidfd)
        other.close()
    children.clear()
    for target, fd in enumerate(stdio):
        os.dup2(fd, target)
    for fd in set(stdio):
        if fd > 2:
            os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    _reset_modules()
    kind, name = request["kind"], request["name"]
    pythonpath = [os.path.abspath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    first = os.getcwd() if kind == "module" else os.path.dirname(os.path.realpath(name))
    sys.path[:] = [first, *pythonpath, *base_path]
    sys.argv[:] = [name if kind == "script" else "-m", *request["argv"]]
    _new_stdio()
    # Run only once the client has the pid; it closes the socket instead when it gave up on this request.
    go = reply.recv(16)
    reply.close()
    if go != b"go":
        os._exit(255)
    return lambda: _run(kind, name)


def _reset_modules() -> None:
    """What a preloaded module holds that a fresh process starts without."""
    import logging
    import random
    import tempfile

    random.seed()
    tempfile.tempdir = None  # computed again from TMPDIR and the like
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
    root.setLevel(logging.WARNING)
    logging.disable(logging.NOTSET)
    from helpers import forget_process_state

    forget_process_state()


def _new_stdio() -> None:
    """sys.stdin, sys.stdout and sys.stderr as a fresh interpreter makes them on descriptors 0, 1, 2 (the
    encoding and buffering variables are the zygote's: a request with others runs as a plain subprocess)."""
    made = []
    for fd, old in ((0, sys.__stdin__), (1, sys.__stdout__), (2, sys.__stderr__)):
        assert old is not None
        if fd == 0:
            raw: Any = open(fd, "rb", closefd=False)  # noqa: SIM115 (the process's stdio)
        else:
            raw = open(fd, "wb", closefd=False, buffering=0 if old.write_through else -1)  # noqa: SIM115
        line_buffering = fd == 2 or (fd == 1 and os.isatty(fd))
        made.append(
            io.TextIOWrapper(
                raw,
                encoding=old.encoding,
                errors=old.errors,
                line_buffering=line_buffering,
                write_through=old.write_through,
            )
        )
    sys.stdin, sys.stdout, sys.stderr = made
    sys.__stdin__, sys.__stdout__, sys.__stderr__ = made  # type: ignore[misc]


def _run(kind: str, name: str) -> None:
    import runpy

    try:
        if kind == "module":
            runpy.run_module(name, run_name="__main__", alter_sys=True)
        else:
            runpy.run_path(name, run_name="__main__")
    except (SystemExit, KeyboardInterrupt):
        raise
    except BaseException as e:
        # The traceback a fresh interpreter prints: from the script's frames on.
        tb = e.__traceback__
        here = {__file__, runpy.__file__, "<frozen runpy>"}
        while tb is not None and tb.tb_next is not None and tb.tb_frame.f_code.co_filename in here:
            tb = tb.tb_next
        sys.excepthook(type(e), e.with_traceback(tb), tb)
        raise SystemExit(1) from None
