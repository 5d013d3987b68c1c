"""Data and comparison helpers shared by the log store tests."""

from __future__ import annotations

import os
import random
from collections.abc import Iterable, Mapping
from pathlib import Path

import pyarrow as pa

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
