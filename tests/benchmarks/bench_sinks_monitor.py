"""What the parent process watches while a benchmark job runs: memory of the job's processes, and when files
appear in the output (Linux ``/proc``; the output is listed from this process, as a reader would)."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

PAGE = os.sysconf("SC_PAGE_SIZE")
TICK = os.sysconf("SC_CLK_TCK")


def _children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry.name}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        tree.setdefault(ppid, []).append(int(entry.name))
    return tree


def descendants(pid: int) -> list[int]:
    tree, found, todo = _children(), [], [pid]
    while todo:
        p = todo.pop()
        for c in tree.get(p, []):
            found.append(c)
            todo.append(c)
    return found


def status(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM (peak RSS) of a process, in bytes (empty if it is gone)."""
    values: dict[str, int] = {}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            key, _, rest = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                values[key] = int(rest.split()[0]) * 1024
    except OSError:
        pass
    return values


def cpu_seconds(pids: list[int]) -> float:
    """CPU seconds (user and system) of ``pids``, with the children each has waited for (gone ones count 0)."""
    ticks = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        ticks += sum(int(x) for x in fields[11:15])  # utime, stime, cutime, cstime
    return ticks / TICK


def _exe_name(pid: int) -> str:
    try:
        return os.path.basename(os.readlink(f"/proc/{pid}/exe"))
    except OSError:
        return ""


@dataclass
class MemoryPeaks:
    """Peak RSS of a job's process tree, sampled every ``interval`` seconds."""

    jvm: int = 0
    """Peak RSS (VmHWM) of the Spark JVM."""
    driver_python: int = 0
    """Peak RSS (VmHWM) of the job's own Python process (the Spark driver's Python side)."""
    workers: int = 0
    """Largest sum of the RSS of the Python worker processes (the JVM's Python children) at one sample."""
    worker_max: int = 0
    """Largest peak RSS (VmHWM) of one Python worker process."""


class MemorySampler:
    def __init__(self, pid: int, interval: float = 0.1) -> None:
        self.pid = pid
        self.interval = interval
        self.peaks = MemoryPeaks()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> MemorySampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def sample(self) -> None:
        p = self.peaks
        p.driver_python = max(p.driver_python, status(self.pid).get("VmHWM", 0))
        workers = 0
        for pid in descendants(self.pid):
            name = _exe_name(pid)
            memory = status(pid)
            if name == "java":
                p.jvm = max(p.jvm, memory.get("VmHWM", 0))
            elif name.startswith("python"):
                workers += memory.get("VmRSS", 0)
                p.worker_max = max(p.worker_max, memory.get("VmHWM", 0))
        p.workers = max(p.workers, workers)


@dataclass
class Appearances:
    """When each name was first seen by a poller listing the output."""

    first_seen: dict[str, float] = field(default_factory=dict)
    polls: int = 0


class Poller:
    """Calls ``lister`` every ``interval`` seconds and notes when each name it returns is first seen."""

    def __init__(self, lister: Callable[[], list[str]], interval: float = 0.1) -> None:
        self.lister = lister
        self.interval = interval
        self.seen = Appearances()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Poller:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.poll()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.poll()

    def poll(self) -> None:
        try:
            names = self.lister()
        except (FileNotFoundError, NotADirectoryError):
            names = []
        now = time.time()
        self.seen.polls += 1
        for name in names:
            self.seen.first_seen.setdefault(name, now)


def local_lister(directory: Path) -> Callable[[], list[str]]:
    def names() -> list[str]:
        return [e.name for e in os.scandir(directory)]

    return names
