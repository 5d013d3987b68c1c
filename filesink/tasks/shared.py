"""Whether the executors see the driver's local directories, checked before anything is sealed or written.

On a cluster whose executors run on other machines, Spark tasks on the executors append to the log store, read it
back and write the output's files. A local log store (the default, ``<state_dir>/log``) or a local output works only
if it is one shared file system mounted at the same path on the driver and on every executor. Otherwise each
executor writes into a directory of its own disk that merely has the same name: its segments are not in the driver's
log store (the seal fails), and its files are not in the driver's output.

Each run checks it with markers created on the driver's side and looked for on the executors':

- a local log store: the run's writer term record, ``home/terms/<T>.json``, which the driver created at start with a
  random nonce in it (:meth:`logstore.home.DurableHome.take_term`);
- a local output: an empty file with a random name that the driver creates in the run's staging directory, where the
  file writers put their temp files (``<staging>/term-<T>/.filesink-shared-<random>.tmp``,
  :func:`filesink.output.mark_staging`).

:class:`SharedDirs` (picklable) says what to look for. Every append task and every file-writing task runs
:meth:`SharedDirs.problem` before it reads or writes anything, and reports a problem to the driver as a row (as the
admission's refusals are), which raises :class:`~filesink.errors.NotSharedError`. On a cluster (a master that is not
``local``), a run's first batch first runs :func:`probe`: a job of one task per executor core, which Spark spreads
over every executor registered by then, so that none of them appends or writes before all were checked. The check
costs one small read and one ``stat`` per Python worker and run: a passed check is remembered in the process.

A marker can also be missing because the run was fenced: a newer run took a term, pruned this run's term record and
renamed its staging directory away. The check then passes (it sees the newer term in the log store), and the run's
own fencing stops it with ``FencedError``. Locations on S3 are not checked: every executor reaches the same bucket by
its URL.
"""

from __future__ import annotations

import json
import socket
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from logstore.home import DurableHome, term_path
from logstore.storage import LogLocation, is_local

from ..output import OutputLocation, mark_staging
from .taskrows import PROBE_SCHEMA, UNSHARED_COLUMN, probed

if TYPE_CHECKING:  # the tasks import this module: not the state database's side (sqlite-utils imports pandas)
    from logstore import LogStore

_passed: set[SharedDirs] = set()
"""The checks that passed in this process (a Python worker runs many tasks of a run)."""
_passed_lock = threading.Lock()


@dataclass(frozen=True)
class SharedDirs:
    """What the tasks of one run look for (picklable); see the module docstring."""

    term: int
    log: LogLocation
    """The log store (its term records say whether the run was fenced, wherever it is)."""
    log_nonce: str | None
    """The nonce of the run's term record, for a local log store; None: the log store is not checked."""
    output: str | None
    """A local output's directory; None: the output is not checked."""
    marker: str | None
    """The marker's path, in the run's staging directory of a local output."""
    driver_host: str

    def problem(self) -> str | None:
        """What this process sees that is not the driver's, or None: every marker is there (or the run was
        fenced, which its own checks report)."""
        with _passed_lock:
            if self in _passed:
                return None
        found = self._log_problem()
        if found is None:
            found = self._output_problem()
        if found is None:
            with _passed_lock:
                _passed.add(self)
            return None
        return None if self._fenced() else found

    def _log_problem(self) -> str | None:
        if self.log_nonce is None:
            return None
        storage = self.log.open()
        record = term_path(self.term)
        try:
            nonce = json.loads(storage.read_all(record)).get("nonce")
            seen = "holds another run's nonce" if nonce != self.log_nonce else ""
        except FileNotFoundError:
            nonce, seen = None, "is not there"
        except (OSError, ValueError, AttributeError) as e:
            nonce, seen = None, f"cannot be read ({e})"
        if nonce == self.log_nonce:
            return None
        return (
            f"the log store {self.log.canonical} is a local directory, and what executor host {_host()} sees at that "
            f"path is not the driver's (host {self.driver_host}): this run's writer term record "
            f"{storage.display(record)}, which the driver created, {seen}. On a cluster whose executors run on "
            "other machines, the log store must be shared storage, such as s3://bucket/prefix (log_store=, filesink "
            "run --log-store), or one shared file system mounted at the same path on the driver and every executor; "
            "the default log store, <state_dir>/log, is on the driver's disk. An existing sink's log store is moved "
            "with filesink recover move-log-store (docs/recovery.md)"
        )

    def _output_problem(self) -> str | None:
        if self.output is None or self.marker is None:
            return None
        marker = Path(self.marker)
        try:
            if marker.is_file():
                return None
            seen = "is not there"
        except OSError as e:
            seen = f"cannot be seen ({e})"
        return (
            f"the output {self.output} is a local directory, and what executor host {_host()} sees at that path is "
            f"not the driver's (host {self.driver_host}): the marker {marker.name}, which the driver created in this "
            f"run's staging directory {marker.parent} (where the file writers put their temp files before renaming "
            f"them into the output), {seen}. On a cluster whose executors run on other machines, a local output and "
            "its staging directory must be one shared file system mounted at the same path on the driver and every "
            "executor; or write the output to s3://bucket/table"
        )

    def _fenced(self) -> bool:
        """Whether the log store holds a term above this run's (a newer run fenced it)."""
        try:
            newest = DurableHome(self.log.open()).newest_term()
        except Exception:
            return False
        return newest is not None and newest > self.term


def _host() -> str:
    return socket.gethostname()


def shared_dirs(store: LogStore, output: OutputLocation, term: int) -> SharedDirs | None:
    """The check of the run that holds ``term``, after its recovery (which prepared its staging directory): reads
    the nonce of a local log store's term record, creates the marker in a local output's staging directory. None
    when neither the log store nor the output is local."""
    location = store.target.location
    local_log = is_local(location.url)
    if not local_log and not output.is_local:
        return None
    nonce = None
    if local_log:
        record = store.home.read(term_path(term)) or {}
        nonce = record.get("nonce") if isinstance(record.get("nonce"), str) else None
    marker = str(mark_staging(output, term, uuid.uuid4().hex)) if output.is_local else None
    return SharedDirs(
        term=term,
        log=location,
        log_nonce=nonce,
        output=str(output.local_root()) if output.is_local else None,
        marker=marker,
        driver_host=_host(),
    )


def on_cluster(spark: Any) -> bool:
    """Whether ``spark``'s executors may run on other machines: its master is not ``local`` (nor ``local[N]``,
    ``local-cluster[...]``); a master that cannot be read counts as a cluster."""
    try:
        master = spark.sparkContext.master
    except Exception:
        try:
            master = spark.conf.get("spark.master", None)
        except Exception:
            master = None
    return not (isinstance(master, str) and master.startswith("local"))


def probe(spark: Any, check: SharedDirs, fallback_tasks: int) -> list[str]:
    """Run ``check`` in a job of one task per executor core (Spark's default parallelism: the cores of the executors
    registered now, at least 2; ``fallback_tasks`` where it is not known, under Spark Connect). Spark hands the tasks
    of a job to free cores as they are offered, so each idle executor gets its share. Returns the problems found."""
    try:
        tasks = max(2, int(spark.sparkContext.defaultParallelism))
    except Exception:
        tasks = max(2, fallback_tasks)

    def probe_task(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for _ in batches:
            pass
        yield probed(check.problem())

    rows = spark.range(0, tasks, 1, tasks).mapInArrow(probe_task, PROBE_SCHEMA).collect()
    return [r[UNSHARED_COLUMN] for r in rows if r[UNSHARED_COLUMN] is not None]


def refusal_message(problems: list[str], outcome: str) -> str:
    """The driver's message: the first problem an executor found, how many more did, and ``outcome`` (what was
    and was not done)."""
    more = f" ({len(problems) - 1} more tasks found the same)" if len(problems) > 1 else ""
    return f"{problems[0]}{more}. {outcome}"
