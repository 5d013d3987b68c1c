"""Named failpoints for crash and fault tests.

A failpoint is a named place in the protocol where a test can make the process fail. They are configured by the
environment variable ``FILESINK_FAILPOINTS``, a comma-separated list of ``name=action`` where action is one of

- ``raise``: raise :class:`FailpointError`;
- ``kill``: SIGKILL the current process (nothing after that point runs, not even ``finally`` blocks);
- ``hang``: sleep until the process is killed;
- ``enospc``, ``eio``: raise ``OSError`` with that errno (a full disk, an I/O error);
- ``stop``: SIGSTOP the current process; it carries on from there when sent SIGCONT (a paused "zombie"). It
  first moves to a session of its own, so that it outlives a parent that dies (as a writer on another
  machine would): a Spark worker in local mode is otherwise terminated with its daemon.

``name=action@N`` fires only on the N-th time (1-based) the failpoint is reached in this process.
``name#text=action`` fires only where the place's detail (for example the file being written) contains
``text``; ``@N`` then counts those places only. With the variable unset, :func:`failpoint` costs one
dictionary lookup.

With ``FILESINK_FAILPOINT_DIR`` set to a directory shared by the processes of a test (driver, Spark
workers, restarts), every failpoint that fires first appends ``<name> <pid> <detail>`` to ``fired.log``
there, and ``name=action@once`` fires only the first time the failpoint is reached in any of them.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import signal
import time

ENV_VAR = "FILESINK_FAILPOINTS"
DIR_VAR = "FILESINK_FAILPOINT_DIR"
FIRED_LOG = "fired.log"
ACTIONS = ("raise", "kill", "hang", "stop", "enospc", "eio")

_hits: dict[str, int] = {}


class FailpointError(RuntimeError):
    """Raised by a failpoint configured with the ``raise`` action."""


ONCE = 0
"""``@once`` as a count: the first time in any process sharing ``FILESINK_FAILPOINT_DIR``."""


def _parse(spec: str) -> dict[str, tuple[str, str, int | None]]:
    result: dict[str, tuple[str, str, int | None]] = {}
    for item in filter(None, (part.strip() for part in spec.split(","))):
        name, sep, action = item.partition("=")
        nth: int | None = None
        if "@" in action:
            action, _, count = action.partition("@")
            if count == "once" and not os.environ.get(DIR_VAR):
                raise ValueError(f"{ENV_VAR}: {item!r} uses @once, which needs {DIR_VAR} set to a shared directory")
            nth = ONCE if count == "once" else int(count)
        if not sep or action not in ACTIONS:
            raise ValueError(
                f"{ENV_VAR}: bad entry {item!r}; expected name=action with action one of {', '.join(ACTIONS)}"
            )
        name, _, text = name.strip().partition("#")
        result[name] = (action, text, nth)
    return result


def failpoint(name: str, detail: str = "") -> None:
    """Fail here if the environment asks for it (see the module docstring); ``detail`` says where exactly."""
    spec = os.environ.get(ENV_VAR)
    if not spec:
        return
    config = _parse(spec).get(name)
    if config is None:
        return
    action, text, nth = config
    if text not in detail:
        return
    key = f"{name}#{text}" if text else name
    _hits[key] = _hits.get(key, 0) + 1
    if nth is not None and nth != ONCE and _hits[key] != nth:
        return
    shared = os.environ.get(DIR_VAR)
    if shared:
        if nth == ONCE and not _first_time(shared, key):
            return
        _log_fired(shared, name, detail)
    if action == "raise":
        raise FailpointError(f"failpoint {name} fired" + (f" at {detail}" if detail else ""))
    if action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if action in ("enospc", "eio"):
        code = errno.ENOSPC if action == "enospc" else errno.EIO
        raise OSError(code, os.strerror(code))
    if action == "stop":
        # A session of its own: the kernel sends SIGHUP and SIGCONT to a stopped process group that its
        # parent's exit orphans; a group in its own session is orphaned from the start and left alone.
        with contextlib.suppress(OSError):  # already a group leader
            os.setsid()
        os.kill(os.getpid(), signal.SIGSTOP)
        return
    while True:  # hang
        time.sleep(3600)


def _first_time(shared: str, key: str) -> bool:
    marker = os.path.join(shared, "once-" + hashlib.sha1(key.encode()).hexdigest()[:16])
    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
    except FileExistsError:
        return False
    return True


def _log_fired(shared: str, name: str, detail: str) -> None:
    line = f"{name} {os.getpid()} {detail}\n".encode()
    fd = os.open(os.path.join(shared, FIRED_LOG), os.O_CREAT | os.O_APPEND | os.O_WRONLY, 0o644)
    try:
        os.write(fd, line)
        os.fsync(fd)  # the action may be SIGKILL
    finally:
        os.close(fd)


def fired(shared: str) -> list[tuple[str, int, str]]:
    """What fired so far in the processes sharing ``shared``: (name, pid, detail), in order."""
    try:
        with open(os.path.join(shared, FIRED_LOG)) as f:
            lines = f.read().splitlines()
    except FileNotFoundError:
        return []
    out = []
    for line in lines:
        name, pid, detail = [*line.split(" ", 2), ""][:3]
        out.append((name, int(pid), detail))
    return out
