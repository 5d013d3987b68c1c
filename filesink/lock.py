"""The state directory's lock: one live sink (or recovery run) per state directory."""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import time
from pathlib import Path

from .errors import SinkLockedError

LOCK_FILE = "sink.lock"


class StateLock:
    """An exclusive OS lock on the state directory: released by the OS when the holder dies."""

    def __init__(self, state_dir: Path) -> None:
        self.path = state_dir / LOCK_FILE
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(self.fd, 4096, 0).decode(errors="replace").strip() or "unknown"
            os.close(self.fd)
            raise SinkLockedError(
                f"the state directory {state_dir} is in use by another live sink ({holder}). Only one query may "
                "write through a state directory at a time. The lock is an OS file lock, released when its holder "
                "exits: if that process is gone, nothing holds it and you can start again."
            ) from None
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, f"pid {os.getpid()} on {socket.gethostname()} since {time.ctime()}\n".encode(), 0)

    def release(self) -> None:
        with contextlib.suppress(OSError):
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)


def lock_holder(state_dir: Path) -> str | None:
    """Who holds the state directory's lock right now (None if nobody), without keeping it."""
    path = state_dir / LOCK_FILE
    if not path.exists():
        return None
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return os.pread(fd, 4096, 0).decode(errors="replace").strip() or "unknown"
    finally:
        os.close(fd)
    return None
