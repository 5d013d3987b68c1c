"""The modelled output, and how the real recovery and sink steps reach it.

The output is a dict of objects (key -> rows) and the set of writer terms whose staging is live. A writer
publishes through its term's staging: the publish is a scheduling point, then atomic, and fails once recovery
fenced the term (renamed its staging away), as a rename out of a renamed directory does. Before publishing, the
writer runs the real writer-side fence check (:class:`filesink.output.Fence`).

:func:`patched` routes the output functions that :mod:`recovery.resolve` and the sink's roles call to this
model when the output passed is a :class:`ModelOutput` (any other output goes to the real function), gives the
product modules simulated time, and makes ``uuid.uuid4`` seeded, for the length of one run.
"""

from __future__ import annotations

import contextlib
import random
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

from filesink.errors import FencedError
from filesink.output.fencing import delete_records, records
from filesink.output.garbage import OutputGarbage
from filesink.tasks.writer import FileTask, WrittenObject
from logstore import LogLocation, read_plan

from .scheduler import Scheduler, SimClock
from .storage import MemStorage

Row = tuple[int, int]
"""A row of the source: (batch id, row number in the batch)."""


class ModelOutput:
    is_local = False
    url = "model://output"
    storage_options: dict[str, Any] = {}  # noqa: RUF012 (read only)

    def __init__(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler
        self.objects: dict[str, list[Row]] = {}
        self.records = MemStorage(scheduler, root=self.url)
        """The output's own records (its claim, its commit mark), which the product reads and writes as a log store
        location at the output's URL: ``LogLocation(output.url).open()`` gives this."""
        self.live: set[int] = set()
        """Terms whose staging exists (prepared, not fenced or released)."""

    def _point(self, op: str) -> None:
        self.scheduler.point(f"output: {op}")

    def staging_places(self) -> list[Any]:
        return []

    def prepare(self, term: int) -> None:
        self._point(f"prepare staging of term {term}")
        self.live.add(term)

    def release(self, term: int) -> None:
        self._point(f"release staging of term {term}")
        self.live.discard(term)

    def fence(self, term: int) -> int:
        self._point(f"fence terms below {term}")
        fenced = {t for t in self.live if t < term}
        self.live -= fenced
        return len(fenced)

    def keys(self, name: str) -> list[tuple[str, int]]:
        self._point(f"list {name}")
        key = object_key(name)
        return [(key, size(self.objects[key]))] if key in self.objects else []

    def publish(self, term: int, key: str, rows: list[Row]) -> None:
        self._point(f"publish {key} (term {term})")
        if term not in self.live:
            raise FencedError(f"file {key}: the staging of writer term {term} is gone (fenced); it must not publish")
        self.objects[key] = rows

    def write(self, task: FileTask) -> list[WrittenObject]:
        """The writer of one file: read its rows from the log store, check the fence, publish."""
        rows: list[Row] = []
        for item in read_plan(task.log.open(), task.plan):
            columns = item.batch.to_pydict()
            rows += zip(columns["batch"], columns["i"], strict=True)
        key = object_key(task.name)
        fence = task.fence
        if fence is not None:
            fence.check(f"file {task.name}")
        self.publish(task.term, key, rows)
        return [WrittenObject(key, size(rows), len(rows))]


def object_key(name: str) -> str:
    return f"{name}.parquet"


def size(rows: list[Row]) -> int:
    return 100 + 16 * len(rows)


# -- routing the product's output calls to the model ---------------------------------------------------------

MODEL: dict[str, Callable[..., Any]] = {
    "fence_writers": lambda out, storage, term, *a, **k: out.fence(term),
    "prepare_staging": lambda out, term, *a, **k: out.prepare(term),
    "release_staging": lambda out, term, *a, **k: out.release(term),
    "object_keys": lambda out, name, *a, **k: out.keys(name),
    "find_output_garbage": lambda out, storage, sink_id, term, *a, **k: OutputGarbage(
        records=list(records(storage, below=term))
    ),
    "remove_output_garbage": lambda out, storage, garbage, *a, **k: delete_records(storage, garbage.records),
    "remove_failed_attempts": lambda out, *a, **k: 0,
    "write_file": lambda out, task, *a, **k: out.write(task),
}
ROUTED = ("recovery.resolve", "filesink.sink.face", "filesink.sink.start", "filesink.sink.roll")
"""Modules whose output calls are routed (the names they imported that :data:`MODEL` knows)."""
PRODUCT = ("logstore", "filesink", "recovery")
MIGRATING = ("logstore.store", "filesink.committer.ledger")
"""Modules that apply the state database's migrations at every open (the check alone costs more than a run's
storage calls: it is skipped for databases copied from the simulation's template)."""


def _router(name: str, real: Callable[..., Any]) -> Callable[..., Any]:
    model = MODEL[name]

    def route(output: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(output, ModelOutput):
            return model(output, *args, **kwargs)
        return real(output, *args, **kwargs)

    route.__wrapped__ = real  # type: ignore[attr-defined]
    return route


_timed: tuple[int, list[Any]] = (0, [])


def _timed_modules() -> list[Any]:
    """The product's modules that use the ``time`` module (looked for again when more modules were imported)."""
    global _timed
    if _timed[0] != len(sys.modules):
        modules = list(sys.modules.items())
        _timed = (len(modules), [m for n, m in modules if n.split(".")[0] in PRODUCT and getattr(m, "time", 0) is time])
    return _timed[1]


def _migrating(real: Callable[..., Any]) -> Callable[..., Any]:
    def apply_migrations(db: Any, *args: Any, **kwargs: Any) -> Any:
        if getattr(db, "from_template", False):
            return None
        return real(db, *args, **kwargs)

    apply_migrations.__wrapped__ = real  # type: ignore[attr-defined]
    return apply_migrations


@contextlib.contextmanager
def patched(scheduler: Scheduler, output: ModelOutput) -> Iterator[None]:
    """For one run: the product's output calls go to the model, its modules see simulated time, and
    ``uuid.uuid4`` draws from the run's seed (segment names, term nonces), so the run replays exactly."""
    saved: list[tuple[Any, str, Any]] = []

    def swap(owner: Any, attr: str, value: Any) -> None:
        saved.append((owner, attr, getattr(owner, attr)))
        setattr(owner, attr, value)

    real_open = LogLocation.open

    def open_location(location: LogLocation) -> Any:
        return output.records if location.url == output.url else real_open(location)

    swap(LogLocation, "open", open_location)

    for module_name in ROUTED:
        module = sys.modules[module_name]
        for name in MODEL:
            real = getattr(module, name, None)
            if real is not None:
                swap(module, name, _router(name, getattr(real, "__wrapped__", real)))
    for module_name in MIGRATING:  # a state database copied from the template has every migration already
        module = sys.modules[module_name]
        real = module.apply_migrations
        swap(module, "apply_migrations", _migrating(getattr(real, "__wrapped__", real)))
    clock = SimClock(scheduler)
    for module in _timed_modules():
        swap(module, "time", clock)
    ids = random.Random(scheduler.seed ^ 0x5EED)
    swap(uuid, "uuid4", lambda: uuid.UUID(int=ids.getrandbits(128), version=4))
    try:
        yield
    finally:
        for owner, attr, value in reversed(saved):
            setattr(owner, attr, value)
