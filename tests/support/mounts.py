"""Real mounts for the tests of outputs and state directories on file systems of their own: a tmpfs, a bind mount,
a read-only bind mount, and a command run without root's permission overrides. Each skips the test, saying why,
where the machine does not allow it (not root, no CAP_SYS_ADMIN, no ``mount`` or ``setpriv``); every mount is
unmounted when its ``with`` block ends, also when the test fails."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import pytest

MOUNT_WAIT = 30.0
"""Seconds a mount or unmount command may take."""


def _mount(args: Sequence[str], what: str) -> None:
    if os.geteuid() != 0:
        pytest.skip(f"mounting {what} needs root (CAP_SYS_ADMIN); this test runs as uid {os.geteuid()}")
    if shutil.which("mount") is None or shutil.which("umount") is None:
        pytest.skip(f"mounting {what} needs the mount and umount commands, which are not installed")
    done = subprocess.run(["mount", *args], capture_output=True, text=True, timeout=MOUNT_WAIT)
    if done.returncode != 0:
        pytest.skip(f"mounting {what} is not permitted here: mount {' '.join(args)}: {done.stderr.strip()}")


def _umount(target: Path) -> None:
    done = subprocess.run(["umount", str(target)], capture_output=True, text=True, timeout=MOUNT_WAIT)
    if done.returncode != 0:  # busy: detach it now, so that a failed test never leaves a mount behind
        subprocess.run(["umount", "-l", str(target)], capture_output=True, text=True, timeout=MOUNT_WAIT, check=True)


def remount(target: Path, *options: str) -> None:
    """``mount -o remount,<options> target`` (``ro``/``rw``, with ``bind`` for a bind mount); fails the test if
    it fails (the mount itself was allowed)."""
    done = subprocess.run(
        ["mount", "-o", ",".join(["remount", *options]), str(target)], capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 0, f"remount {options} of {target} failed: {done.stderr}"


@contextmanager
def tmpfs(directory: Path, size: str = "64m") -> Iterator[Path]:
    """A tmpfs mounted on ``directory`` (created if missing): a file system of its own."""
    directory.mkdir(parents=True, exist_ok=True)
    _mount(["-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(directory)], f"a tmpfs on {directory}")
    try:
        yield directory
    finally:
        _umount(directory)


@contextmanager
def bind(source: Path, target: Path, *, readonly: bool = False) -> Iterator[Path]:
    """``source`` bind-mounted on ``target`` (both created if missing; they may be the same directory): the
    same file system, another mount (renames between the two fail with ``EXDEV``). Read-only if asked."""
    source.mkdir(parents=True, exist_ok=True)
    target.mkdir(parents=True, exist_ok=True)
    _mount(["--bind", str(source), str(target)], f"{source} on {target}")
    try:
        if readonly:
            remount(target, "bind", "ro")
        yield target
    finally:
        _umount(target)


WITHOUT_DAC = ["setpriv", "--bounding-set=-dac_override,-dac_read_search", "--inh-caps=-dac_override,-dac_read_search"]
"""A command prefix: run as root without the capabilities that let root ignore permission bits, so that a
``chmod a-w`` directory is read-only to the command as to any user (the test's Python lives in root's home,
which other users cannot enter)."""


def without_dac(probe_dir: Path) -> list[str]:
    """:data:`WITHOUT_DAC`, after checking that a command run with it cannot write into ``probe_dir`` (a
    directory the caller made read-only with ``chmod a-w``); skips the test where that cannot be arranged."""
    if os.geteuid() != 0:
        return []  # an ordinary user is subject to permission bits already
    if shutil.which("setpriv") is None:
        pytest.skip("running a command without root's permission overrides needs setpriv, which is not installed")
    probe = probe_dir / "probe"
    done = subprocess.run([*WITHOUT_DAC, "touch", str(probe)], capture_output=True, text=True, timeout=30)
    if done.returncode == 0:
        probe.unlink()
        pytest.skip(f"setpriv could not drop root's permission overrides here (it could write into {probe_dir})")
    if "Permission denied" not in done.stderr:
        pytest.skip(f"setpriv does not work here: {done.stderr.strip()}")
    return list(WITHOUT_DAC)
