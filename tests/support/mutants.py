"""Mutants of the protocol for the mutation tests: :func:`mutant` switches one guard of :mod:`logstore.guards` off
in this process for the length of a ``with`` block (never through the environment: a product run cannot)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from logstore import guards


@contextlib.contextmanager
def mutant(*names: str) -> Iterator[None]:
    """The product with the guards ``names`` switched off, in this process, until the block ends."""
    unknown = [n for n in names if n not in guards.GUARDS]
    if unknown:
        raise KeyError(f"no guards named {unknown}; see logstore.guards.GUARDS")
    off = guards._off
    before = set(off)
    off.update(names)
    try:
        yield
    finally:
        off.clear()
        off.update(before)
