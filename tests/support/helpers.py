"""Data and comparison helpers shared by the log store tests, and waits with a deadline for every test."""

from __future__ import annotations

import contextlib
import decimal
import math
import os
import random
import select
import shlex
import signal
import subprocess
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any, NoReturn

import pyarrow as pa
import pytest

from logstore import LogBatch


def make_rows(ids: Iterable[int], vnodes: Iterable[int]) -> pa.Table:
    """Rows with an id, a payload derived from it, and the vnode column the log store sorts by."""
    ids = list(ids)
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "payload": pa.array([f"row-{i}" * (1 + i % 3) for i in ids], pa.string()),
            "__vnode": pa.array(list(vnodes), pa.int32()),
        }
    )


def random_rows(rng: random.Random, first_id: int, count: int, vnodes: int) -> pa.Table:
    return make_rows(range(first_id, first_id + count), [rng.randrange(vnodes) for _ in range(count)])


def flatten(items: Iterable[LogBatch]) -> list[tuple[int, int, int, str]]:
    """Each row read back as (vnode, epoch, id, payload), in read order."""
    out = []
    for item in items:
        d = item.batch.to_pydict()
        out += [(item.vnode, item.epoch, i, p) for i, p in zip(d["id"], d["payload"], strict=True)]
    return out


def expected_order(epochs: dict[int, list[tuple[str, pa.Table]]], vnodes: range) -> list[tuple[int, int, int, str]]:
    """What a read of ``vnodes`` over ``epochs`` (epoch -> [(segment name, appended table)]) must return.

    Order: vnode, epoch, segment name, then the order rows had in the appended table.
    """
    out = []
    for v in vnodes:
        for epoch in sorted(epochs):
            for _name, table in sorted(epochs[epoch], key=lambda s: s[0]):
                d = table.to_pydict()
                out += [
                    (v, epoch, i, p) for i, p, vn in zip(d["id"], d["payload"], d["__vnode"], strict=True) if vn == v
                ]
    return out


def process_state(pid: int) -> str:
    """The one-letter state of a process from ``/proc`` (``T`` when stopped), or ``gone``."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return "gone"


SUPPORT = Path(__file__).parent
"""The test support directory: helpers, and the jobs tests run as subprocesses (``sink_job.py``, ...)."""


def support_env(base: Mapping[str, str] | None = None, **extra: str) -> dict[str, str]:
    """The environment for a job of :data:`SUPPORT` run as a subprocess: ``base`` (default: this process's),
    ``extra``, and the support directory first on ``PYTHONPATH`` so that the job imports the helpers."""
    env = dict(os.environ if base is None else base, **extra)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(SUPPORT), env.get("PYTHONPATH")]))
    return env


# ---------------------------------------------------------------------------------------------------------
# Waits with a deadline: a test waiting for a subprocess, a line of its output or a state fails naming what it
# waited for, with the end of the subprocess's output, and kills the subprocess (a test never hangs).
# ---------------------------------------------------------------------------------------------------------

KILL_WAIT = 30.0
"""Seconds to wait for a SIGKILLed process to be reaped."""
DRAIN_WAIT = 10.0
"""Seconds to read what is left on a killed process's pipes (a process it started may still hold them open)."""
TAIL = 3000
"""Characters of a process's output shown in a failure."""


def kill(proc: subprocess.Popen[Any], *, group: bool | None = None, timeout: float = KILL_WAIT) -> None:
    """SIGKILL ``proc`` and reap it. With ``group``, its whole process group too (a process started with
    ``start_new_session=True``: a Spark driver's JVM and Python workers go with it); by default, whether it
    leads its group is found out while it is not yet reaped. A process that already ended is only reaped."""
    if group is None:
        try:
            group = proc.returncode is None and os.getpgid(proc.pid) == proc.pid
        except ProcessLookupError:
            group = False
    with contextlib.suppress(ProcessLookupError):
        if group:
            os.killpg(proc.pid, signal.SIGKILL)
        else:
            proc.kill()  # nothing once it is reaped
    proc.wait(timeout)
    if group:  # the group's other processes (a JVM, Python workers) may still be finishing a write: wait them out
        deadline = time.monotonic() + timeout
        while _live_members(proc.pid):
            if time.monotonic() > deadline:
                raise AssertionError(f"processes {_live_members(proc.pid)} of group {proc.pid} still run after SIGKILL")
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            time.sleep(0.05)


def _live_members(group: int) -> list[int]:
    """The processes of process group ``group`` that are not zombies (from /proc; empty where there is none)."""
    found = []
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[-1].split()  # after the command name, which may hold spaces
        if len(fields) > 2 and fields[0] != "Z" and int(fields[2]) == group:
            found.append(int(entry))
    return found


def wait_until(
    predicate: Callable[[], object],
    timeout: float,
    what: str,
    *,
    proc: subprocess.Popen[Any] | None = None,
    describe: Callable[[], str] | None = None,
    interval: float = 0.05,
) -> None:
    """Poll ``predicate()`` until it is true. Fail the test, naming ``what``, when ``timeout`` seconds pass
    first, or when ``proc`` (if given) ends first; ``proc`` is then killed, and the end of its output (and
    ``describe()``) is in the message."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if proc is not None and proc.poll() is not None:
            if predicate():  # the process ended between the check above and this one, and that was awaited
                return
            _fail(f"the process ended (exit {proc.returncode}) while waiting for {what}", proc, describe)
        if time.monotonic() > deadline:
            _fail(f"timed out after {timeout:g} s waiting for {what}", proc, describe)
        time.sleep(interval)


def readline_with_deadline(
    proc: subprocess.Popen[str], timeout: float, what: str, *, stream: IO[str] | None = None
) -> str:
    """The next line of ``proc``'s stdout (or of ``stream``, another of its text pipes); "" at the end of it.
    When no line comes within ``timeout`` seconds, kill ``proc`` and fail the test naming ``what``."""
    stream = proc.stdout if stream is None else stream
    assert stream is not None, "not a pipe"
    line = _read_line(stream, time.monotonic() + timeout)
    if line is None:
        _fail(f"timed out after {timeout:g} s waiting for {what}", proc)
    return line


def wait_for_line(
    proc: subprocess.Popen[str],
    match: str | Callable[[str], object],
    timeout: float,
    what: str,
    *,
    stream: IO[str] | None = None,
    skip: bool = False,
) -> str:
    """Read ``proc``'s stdout (or ``stream``, another of its text pipes) until a line that is ``match`` (with
    its newline) or for which ``match(line)`` is true; return it. Without ``skip`` it must be the next line.
    When another line comes (without ``skip``), the stream ends, or ``timeout`` seconds pass first, kill
    ``proc`` and fail the test naming ``what``, with the lines read and the end of the process's output."""
    stream = proc.stdout if stream is None else stream
    assert stream is not None, "not a pipe"
    matches = (lambda line: line == match) if isinstance(match, str) else match
    deadline = time.monotonic() + timeout
    read: list[str] = []
    while True:
        line = _read_line(stream, deadline)
        if line is None:
            _fail(f"timed out after {timeout:g} s waiting for {what}", proc, read=read, stream=stream)
        if not line:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(DRAIN_WAIT)
            ended = "still running" if proc.returncode is None else f"exit {proc.returncode}"
            _fail(f"the output ended ({ended}) before {what}", proc, read=read, stream=stream)
        read.append(line)
        if matches(line):
            return line
        if not skip:
            _fail(f"waiting for {what}, read {line!r}", proc, read=read, stream=stream)


def communicate(proc: subprocess.Popen[str], timeout: float, what: str) -> tuple[str, str]:
    """``proc.communicate()``, for at most ``timeout`` seconds: if ``proc`` has not ended by then, kill it and
    fail the test naming ``what``, with the end of its output."""
    try:
        return proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        pass
    kill(proc)
    try:
        out, err = proc.communicate(timeout=DRAIN_WAIT)
    except subprocess.TimeoutExpired as e:  # a process it started still holds the pipes open
        out, err = e.stdout, e.stderr
    pytest.fail(f"timed out after {timeout:g} s waiting for {what} (pid {proc.pid}, killed){_output(out, err)}")


def wait_for_exit(proc: subprocess.Popen[Any], timeout: float, what: str) -> int:
    """``proc.wait()``, for at most ``timeout`` seconds: if ``proc`` has not ended by then, kill it and fail
    the test naming ``what``, with the end of its output."""
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        _fail(f"timed out after {timeout:g} s waiting for {what}", proc)


def run(
    args: Sequence[str], timeout: float, what: str | None = None, **kwargs: Any
) -> subprocess.CompletedProcess[Any]:
    """``subprocess.run(args, timeout=timeout, **kwargs)``; if the command has not ended within ``timeout``
    seconds (it is then killed), fail the test naming ``what`` (default: the command), with the end of its
    output."""
    try:
        return subprocess.run(args, timeout=timeout, **kwargs)
    except subprocess.TimeoutExpired as e:
        what = what or shlex.join(map(str, args))
        pytest.fail(f"timed out after {timeout:g} s waiting for {what} (killed){_output(e.stdout, e.stderr)}")


def _fail(
    message: str,
    proc: subprocess.Popen[Any] | None,
    describe: Callable[[], str] | None = None,
    *,
    read: Sequence[str] = (),
    stream: IO[str] | None = None,
) -> NoReturn:
    """Kill ``proc`` and fail the test with ``message``, the end of the process's output (``read`` are lines
    already read from its pipe ``stream``) and ``describe()``."""
    details = ""
    if proc is not None:
        kill(proc)
        message += f" (pid {proc.pid}, killed)"
        out = "".join(read) if stream is not None and stream is proc.stdout else ""
        err = "".join(read) if stream is not None and stream is proc.stderr else ""
        details = _output(out + _drain(proc.stdout), err + _drain(proc.stderr))
    if describe is not None:
        details += "\n" + describe()
    pytest.fail(message + details)


def _output(out: str | bytes | None, err: str | bytes | None) -> str:
    """The ends of a process's stdout and stderr, for a failure message."""
    text = ""
    for name, data in (("stdout", out), ("stderr", err)):
        if isinstance(data, bytes):
            data = data.decode(errors="replace")
        if data:
            text += f"\n--- {name} (end):\n{data[-TAIL:]}"
    return text


def _read_line(stream: IO[str], deadline: float) -> str | None:
    """The next line of a subprocess's text pipe ("" at its end), or None once ``deadline`` (of
    ``time.monotonic()``) passes. The pipe's descriptor is read a byte at a time, so nothing after the line is
    taken from the pipe: a later read, or ``communicate()``, gets the rest. (The stream object itself must
    not have been read from: what it buffered would be skipped.)"""
    fd = stream.fileno()
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    line = bytearray()
    while not line.endswith(b"\n"):
        remaining = deadline - time.monotonic()
        if remaining <= 0 or not poller.poll(math.ceil(remaining * 1000)):
            return None
        byte = os.read(fd, 1)
        if not byte:
            break
        line += byte
    return line.decode(errors="replace").replace("\r\n", "\n")


def _drain(stream: IO[Any] | None, timeout: float = DRAIN_WAIT) -> str:
    """What is left on a subprocess's pipe, read until its end or for at most ``timeout`` seconds."""
    if stream is None or stream.closed:
        return ""
    fd = stream.fileno()
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    deadline = time.monotonic() + timeout
    chunks = []
    while (remaining := deadline - time.monotonic()) > 0 and poller.poll(math.ceil(remaining * 1000)):
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks).decode(errors="replace")


def random_column(rng: random.Random, kind: str, n: int, null_share: float) -> pa.Array:
    """``n`` random values of one kind of column (see COLUMN_KINDS), about ``null_share`` of them null."""

    def values(make):
        return [None if rng.random() < null_share else make() for _ in range(n)]

    if kind == "int64":
        return pa.array(values(lambda: rng.getrandbits(62)), pa.int64())
    if kind == "int8":
        return pa.array(values(lambda: rng.randrange(-100, 100)), pa.int8())
    if kind == "float":
        return pa.array(values(rng.random), pa.float64())
    if kind == "bool":
        return pa.array(values(lambda: rng.random() < 0.5), pa.bool_())
    if kind == "string":  # empty, short and long strings, multi-byte characters
        return pa.array(values(lambda: "é" * rng.randrange(rng.choice([1, 4, 60]))), pa.string())
    if kind == "sparse_string":  # mostly empty: a group's next rows may hold little string data
        return pa.array(values(lambda: "z" * 100 if rng.random() < 0.002 else ""), pa.string())
    if kind == "large_string":
        return pa.array(values(lambda: "x" * rng.randrange(12)), pa.large_string())
    if kind == "binary":
        return pa.array(values(lambda: rng.randbytes(rng.randrange(6))), pa.binary())
    if kind == "timestamp":
        return pa.array(values(lambda: rng.getrandbits(40)), pa.timestamp("us", tz="UTC"))
    if kind == "decimal":
        return pa.array(values(lambda: decimal.Decimal(rng.randrange(10**6)) / 100), pa.decimal128(12, 2))
    if kind == "fixed_binary":
        return pa.array(values(lambda: rng.randbytes(3)), pa.binary(3))
    if kind == "list":
        return pa.array(values(lambda: [rng.randrange(9) for _ in range(rng.randrange(4))]), pa.list_(pa.int32()))
    if kind == "struct":
        make = lambda: {"a": rng.randrange(9), "b": "y" * rng.randrange(5)}  # noqa: E731
        return pa.array(values(make), pa.struct([("a", pa.int32()), ("b", pa.string())]))
    raise AssertionError(kind)


COLUMN_KINDS = [
    "int64",
    "int8",
    "float",
    "bool",
    "string",
    "sparse_string",
    "large_string",
    "binary",
    "timestamp",
    "decimal",
    "fixed_binary",
    "list",
    "struct",
]


PROCESS_STATE = (
    ("logstore.failpoints", "_hits"),
    ("logstore.requestcounts", "_counts"),
    ("logstore.segment_cache", "_warned"),
    ("filesink.output.location", "_fs_cache"),
    ("filesink.tasks.shared", "_passed"),
    ("filesink.sink.connect", "_open"),
)
"""What the product keeps per process (module, container): the failpoints' hits, the request counts, the segment
cache's warnings said once, the output's filesystems, the tasks' checks, the sinks open in the process."""


def forget_process_state() -> None:
    """Empty what the product keeps per process (:data:`PROCESS_STATE`, and s3fs's shared instances), in the modules
    already imported, so that what runs next in this process starts as a new process would: a forked job
    (``forkserver``) or the run server's next command (``run_server``)."""
    import sys

    for module, name in PROCESS_STATE:
        loaded = sys.modules.get(module)
        if loaded is not None:
            getattr(loaded, name).clear()
    s3fs = sys.modules.get("s3fs")
    if s3fs is not None:
        s3fs.S3FileSystem.clear_instance_cache()
