"""Mutation testing of the protocol: the simulation run against the product with one guard of
:mod:`logstore.guards` switched off (a mutant), to find a seed whose run the checker fails.

:func:`hunt` looks for the first such seed among the light seeds (the default tier's), then the full ones (the
chaos tier's), then the modes of a store without conditional create. A mutant no seed catches is a blind spot of
the simulation or a guard that protects nothing (docs/reliability.md, "Mutation testing").

Some guards are a second line: the protocol checks its term several times in one step, and the mutant of one
check is caught only where the checks before and after it are switched off too (its ``partners``). Such a guard is
caught by a seed that passes with the partners off and fails once the guard is off as well.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from mutants import mutant

from .run import LIGHT_SEEDS, Result, simulate


@dataclass(frozen=True)
class Catch:
    """A seed that catches a mutant, in a mode of the simulation: ``conditional`` False is a store without
    conditional create (with ``single_driver``: the sink's option for one)."""

    seed: int
    conditional: bool = True
    single_driver: bool = False

    def run(self) -> Result:
        return simulate(self.seed, conditional=self.conditional, single_driver=self.single_driver)

    def line(self) -> str:
        mode = ("" if self.conditional else ", conditional=False") + (", single_driver" if self.single_driver else "")
        return f"seed {self.seed}{mode}"


def candidates(light: int, full: int) -> Iterator[Catch]:
    """Where :func:`hunt` looks, in order: ``light`` light seeds, ``full`` full seeds, then 500 seeds of each
    mode without conditional create (as the default tier runs them)."""
    yield from (Catch(s) for s in range(LIGHT_SEEDS, LIGHT_SEEDS + light))
    yield from (Catch(s) for s in range(full))
    yield from (Catch(s, conditional=False) for s in range(500))
    yield from (Catch(s, conditional=False, single_driver=True) for s in range(500))


def caught(catch: Catch, guard: str, partners: tuple[str, ...] = ()) -> Result | None:
    """The failed run if ``catch`` catches the mutant without ``guard``: it fails with ``guard`` (and ``partners``)
    off, and, with ``partners``, passes with only ``partners`` off (so ``guard`` is what made it pass: a second
    line behind them)."""
    with mutant(guard, *partners):
        result = catch.run()
    if result.ok:
        return None
    if partners:
        with mutant(*partners):
            if not catch.run().ok:
                return None
    return result


@dataclass(frozen=True)
class Hunt:
    guard: str
    partners: tuple[str, ...]
    catch: Catch | None
    tried: int
    """Seeds run until the first that caught the mutant (all of them, if none did)."""
    seconds: float
    found: str = ""
    """What the checker (or the run) found wrong, for the first catching seed."""


def hunt(guard: str, order: Iterable[Catch], partners: tuple[str, ...] = ()) -> Hunt:
    """Run ``order`` until a seed catches the mutant without ``guard`` (behind ``partners``: :func:`caught`)."""
    started = time.monotonic()
    tried = 0
    for catch in order:
        tried += 1
        result = caught(catch, guard, partners)
        if result is not None:
            found = result.failure or "; ".join(result.problems)
            return Hunt(guard, partners, catch, tried, time.monotonic() - started, found.splitlines()[0][:200])
    return Hunt(guard, partners, None, tried, time.monotonic() - started)
