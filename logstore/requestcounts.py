"""Requests this process made to object stores, counted where the storage clients make them.

Each count is keyed by ``(figure, store, kind)``: ``figure`` is ``requests``, ``errors`` (a request that failed
after the client's retries) or ``retries`` (botocore's retries of a request, where its answer says them); ``store``
is ``log`` (segments), ``home`` (the durable home's records, under ``home/`` of the log store's location) or
``output`` (the output's file writes); ``kind`` is ``put``, ``get``, ``head``, ``list`` or ``delete``. A local
directory makes no requests and counts none.

The counts are the process's, from its start: a reader takes a :func:`snapshot` and subtracts an earlier one
(:func:`since`). Spark tasks do that over their run and send the difference to the driver in their result rows
(:func:`encode`, :func:`decode`); the driver's sink adds them to its own (``filesink.metrics.figures``).

This module runs in Spark tasks: it imports only the standard library.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping

Key = tuple[str, str, str]
"""``(figure, store, kind)``."""

LOG, HOME, OUTPUT = "log", "home", "output"
HOME_PREFIX = "home/"
"""Relative paths under the log store's location that are the durable home's records (``logstore.home.HOME``)."""

_lock = threading.Lock()
_counts: dict[Key, int] = {}


def count(store: str, kind: str, figure: str = "requests", n: int = 1) -> None:
    """Add ``n`` to the count of ``(figure, store, kind)``."""
    if n <= 0:
        return
    key = (figure, store, kind)
    with _lock:
        _counts[key] = _counts.get(key, 0) + n


def store_of(relpath: str) -> str:
    """``home`` for a record of the durable home, else ``log``: the store a path of the log store's location is in."""
    return HOME if relpath.startswith(HOME_PREFIX) else LOG


def retries_in(answer: object) -> int:
    """The retries botocore made of a request, from its answer's ``ResponseMetadata`` (0 when it has none)."""
    if not isinstance(answer, Mapping):
        return 0
    attempts = answer.get("ResponseMetadata", {}).get("RetryAttempts", 0)
    return attempts if isinstance(attempts, int) else 0


def snapshot() -> dict[Key, int]:
    """The process's counts now (a copy)."""
    with _lock:
        return dict(_counts)


def since(before: Mapping[Key, int]) -> dict[Key, int]:
    """The counts made since ``before`` (a :func:`snapshot`), without the keys that did not change."""
    now = snapshot()
    return {key: n - before.get(key, 0) for key, n in now.items() if n != before.get(key, 0)}


def encode(counts: Mapping[Key, int]) -> str:
    """``counts`` as JSON text, for a task's result row."""
    return json.dumps([[*key, n] for key, n in sorted(counts.items())])


def decode(text: str | None) -> dict[Key, int]:
    """What :func:`encode` made (empty for None)."""
    if not text:
        return {}
    return {(str(figure), str(store), str(kind)): int(n) for figure, store, kind, n in json.loads(text)}
