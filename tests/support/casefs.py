"""A case-insensitive, case-preserving file system (FUSE), as macOS's default APFS and SMB shares are: a name
finds the entry whose case-folded NFC form is the same, and a new entry keeps the case it was created with.

``python casefs.py BACKING MOUNTPOINT`` serves BACKING at MOUNTPOINT until unmounted (``fusermount3 -u``) or
killed. Tests start it with :func:`mounted`. It needs /dev/fuse, libfuse3 (Debian: fuse3) and mfusepy.
"""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
import sys
import unicodedata
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def _fold(name: str) -> str:
    return unicodedata.normalize("NFC", name).casefold()


def mounted_at(mountpoint: Path) -> bool:
    return os.path.ismount(mountpoint)


def unavailable() -> str | None:
    """Why this machine cannot mount the file system, or None."""
    import shutil

    if os.geteuid() != 0:
        return f"mounting a FUSE file system here needs root; this test runs as uid {os.geteuid()}"
    if not os.path.exists("/dev/fuse") or shutil.which("fusermount3") is None:
        return "FUSE is not available (/dev/fuse and fusermount3: Debian's fuse3 package)"
    try:
        import mfusepy  # noqa: F401
    except (ImportError, OSError) as e:
        return f"mfusepy or libfuse3 cannot be loaded: {e}"
    return None


@contextlib.contextmanager
def mounted(backing: Path, mountpoint: Path, timeout: float = 20.0) -> Iterator[Path]:
    """Serve ``backing`` case-insensitively at ``mountpoint`` for the duration of the block; unmounted (and the
    server ended) when it ends, also when the test fails."""
    from helpers import kill, wait_until

    backing.mkdir(parents=True, exist_ok=True)
    mountpoint.mkdir(parents=True, exist_ok=True)
    log_path = mountpoint.parent / f"{mountpoint.name}.casefs.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([sys.executable, __file__, str(backing), str(mountpoint)], stdout=log, stderr=log)
        try:
            wait_until(
                lambda: mounted_at(mountpoint),
                timeout,
                f"the case-insensitive file system to mount at {mountpoint}",
                proc=proc,
                describe=lambda: log_path.read_text(errors="replace"),
            )
            yield mountpoint
        finally:
            _unmount(mountpoint)
            if proc.poll() is None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=10)
            kill(proc)


def _unmount(mountpoint: Path, timeout: float = 10.0) -> None:
    """Unmount; while it is busy (a file just closed), try again, then detach it lazily."""
    from helpers import wait_until

    def unmounted() -> bool:
        done = subprocess.run(["fusermount3", "-u", str(mountpoint)], capture_output=True, timeout=30)
        return done.returncode == 0 or not mounted_at(mountpoint)

    try:
        wait_until(unmounted, timeout, f"{mountpoint} to unmount", interval=0.2)
    finally:
        if mounted_at(mountpoint):
            subprocess.run(["fusermount3", "-uz", str(mountpoint)], capture_output=True, timeout=30)


def _serve(backing: str, mountpoint: str) -> None:
    import mfusepy as fuse

    class CaseInsensitive(fuse.Operations):  # type: ignore[misc]
        use_ns = True  # utimens gets nanoseconds

        def __init__(self, root: str) -> None:
            self.root = root

        def _real(self, path: str) -> str:
            """The backing path of ``path``: each component matched case-insensitively when it exists."""
            real = self.root
            for part in [p for p in path.split("/") if p]:
                name = part
                if not os.path.lexists(os.path.join(real, part)) and os.path.isdir(real):
                    for entry in os.listdir(real):
                        if _fold(entry) == _fold(part):
                            name = entry
                            break
                real = os.path.join(real, name)
            return real

        def _call(self, fn: Any, *args: Any) -> Any:
            try:
                return fn(*args)
            except OSError as e:
                raise fuse.FuseOSError(e.errno or errno.EIO) from e

        def access(self, path: str, amode: int) -> int:
            if not os.access(self._real(path), amode):
                raise fuse.FuseOSError(errno.EACCES)
            return 0

        def getattr(self, path: str, fh: int | None = None) -> dict[str, Any]:
            st = self._call(os.lstat, self._real(path))
            keys = ("st_mode", "st_nlink", "st_uid", "st_gid", "st_size", "st_atime", "st_mtime", "st_ctime")
            return {k: getattr(st, k) for k in keys}

        def readdir(self, path: str, fh: int) -> list[str]:
            return [".", "..", *self._call(os.listdir, self._real(path))]

        def mkdir(self, path: str, mode: int) -> int:
            self._call(os.mkdir, self._real(path), mode)
            return 0

        def rmdir(self, path: str) -> int:
            self._call(os.rmdir, self._real(path))
            return 0

        def unlink(self, path: str) -> int:
            self._call(os.unlink, self._real(path))
            return 0

        def rename(self, old: str, new: str) -> int:
            self._call(os.replace, self._real(old), self._real(new))  # an existing name of any case is replaced
            return 0

        def link(self, target: str, source: str) -> int:
            self._call(os.link, self._real(source), self._real(target))  # `ln source target`
            return 0

        def chmod(self, path: str, mode: int) -> int:
            self._call(os.chmod, self._real(path), mode)
            return 0

        def chown(self, path: str, uid: int, gid: int) -> int:
            self._call(os.chown, self._real(path), uid, gid)
            return 0

        def utimens(self, path: str, times: tuple[int, int] | None = None) -> int:
            self._call(os.utime, self._real(path), None if times is None else (times[0] / 1e9, times[1] / 1e9))
            return 0

        def create(self, path: str, mode: int, fi: Any = None) -> int:
            fd: int = self._call(os.open, self._real(path), os.O_RDWR | os.O_CREAT | os.O_TRUNC, mode)
            return fd

        def open(self, path: str, flags: int) -> int:
            fd: int = self._call(os.open, self._real(path), flags)
            return fd

        def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
            data: bytes = self._call(os.pread, fh, size, offset)
            return data

        def write(self, path: str, data: bytes, offset: int, fh: int) -> int:
            written: int = self._call(os.pwrite, fh, data, offset)
            return written

        def truncate(self, path: str, length: int, fh: int | None = None) -> int:
            self._call(os.truncate, self._real(path) if fh is None else fh, length)
            return 0

        def flush(self, path: str, fh: int) -> int:
            return 0

        def fsync(self, path: str, datasync: int, fh: int) -> int:
            self._call(os.fsync, fh)
            return 0

        def fsyncdir(self, path: str, datasync: int, fh: int) -> int:
            return 0

        def release(self, path: str, fh: int) -> int:
            self._call(os.close, fh)
            return 0

        def statfs(self, path: str) -> dict[str, int]:
            st = os.statvfs(self._real(path))
            keys = ("f_bavail", "f_bfree", "f_blocks", "f_bsize", "f_favail", "f_ffree", "f_files", "f_flag")
            return {**{k: getattr(st, k) for k in keys}, "f_frsize": st.f_frsize, "f_namemax": st.f_namemax}

    fuse.FUSE(
        CaseInsensitive(backing),
        mountpoint,
        foreground=True,
        nothreads=True,
        entry_timeout=0,
        attr_timeout=0,
        negative_timeout=0,
    )


if __name__ == "__main__":
    _serve(sys.argv[1], sys.argv[2])
