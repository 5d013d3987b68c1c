"""The seeded scheduler: actors are threads, only one runs at a time, and the baton passes at scheduling points.

Every storage call (and every step of the modelled output and checkpoint) calls :meth:`Scheduler.point`. There
the running actor may be killed (:class:`Crash` is raised in it, as a SIGKILL would stop it: nothing after the
point happens), paused for a number of steps (a stalled driver), or made to hand the baton to another ready
actor. Every choice comes from one ``random.Random(seed)``, drawn in an order that only the seed decides, so a
run replays exactly. Each wait has a deadline and each run a step bound: a run that exceeds either fails.
"""

from __future__ import annotations

import _thread
import contextlib
import random
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

HANDOFF_SECONDS = 30.0
"""Real seconds an actor waits for the baton before the run is declared hung."""
SECONDS_PER_STEP = 0.05
"""Simulated seconds one scheduling point takes (the clock of :class:`SimClock`)."""


class Crash(BaseException):
    """Raised in an actor the scheduler kills: its process is gone, and nothing it does after this happens."""


class Aborted(BaseException):
    """Raised in every actor once the run failed (step bound, hang, an unexpected error): the run stops."""


@dataclass(frozen=True)
class Knobs:
    switch: float = 0.3
    """Chance, at each point, that the baton goes to a ready actor picked at random (else the runner keeps it)."""
    crash: float = 0.0
    """Chance, at each point, that the running actor (if crashable) is killed there."""
    pause: float = 0.0
    """Chance, at each point, that the running actor is paused there."""
    pause_steps: int = 100
    """The longest pause, in steps of the other actors."""
    max_steps: int = 20_000
    """Scheduling points in one run at most; more fails the run (a livelock, or a harness bug)."""


class Actor:
    def __init__(self, scheduler: Scheduler, name: str, body: Callable[[Actor], None], crashable: bool) -> None:
        self.scheduler = scheduler
        self.name = name
        self.body = body
        self.crashable = crashable
        self.wake_at = 0
        self.done = False
        self.crashing = False
        """Killed: every point it reaches raises :class:`Crash` again until :meth:`reborn`."""
        self.baton = threading.Lock()
        self.baton.acquire()  # held: the actor waits on it until the scheduler releases it
        self.started = False
        self.skew = 0.0
        """Seconds this actor's wall clock is ahead of the true time (negative: behind); ``time.monotonic`` is not
        skewed."""

    def reborn(self) -> None:
        """A new process of this actor starts (after a crash): it runs again."""
        self.crashing = False

    def _main(self) -> None:
        s = self.scheduler
        if not self.baton.acquire(timeout=HANDOFF_SECONDS):
            s.fail(f"{self.name} never got the baton")
        s.local.actor = self
        try:
            self.live()
        finally:
            s.finish(self)

    def live(self) -> None:
        s = self.scheduler
        try:
            if not s.aborted:
                self.body(self)
        except (Crash, Aborted):
            pass
        except BaseException:
            s.fail(f"{self.name} failed unexpectedly at step {s.step}:\n{traceback.format_exc()}")


class Scheduler:
    def __init__(self, seed: int, knobs: Knobs) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.knobs = knobs
        self.actors: list[Actor] = []
        self.step = 0
        self.trace: list[tuple[int, str, str]] = []
        self.failure: str | None = None
        self.aborted = False
        self.local = threading.local()
        self._finished = threading.Event()

    # -- set-up and the run ------------------------------------------------------------------------------------

    def spawn(self, name: str, body: Callable[[Actor], None], *, crashable: bool = True, start_at: int = 0) -> Actor:
        actor = Actor(self, name, body, crashable)
        actor.wake_at = start_at
        self.actors.append(actor)
        return actor

    def run(self, timeout: float = 120.0) -> None:
        """Run every actor to its end, each in a thread of its own; a failure is left in :attr:`failure`."""
        self._finished.clear()
        for actor in self.actors:
            if not actor.started:  # (threads without Thread.start's handshake: each start is a wake-up less)
                actor.started = True
                _thread.start_new_thread(actor._main, ())
        first = self._choose(None)
        if first is None:
            return
        first.baton.release()
        if not self._finished.wait(timeout):
            self.fail(f"the run did not end within {timeout} s (step {self.step})")
            self._finished.wait(HANDOFF_SECONDS)

    def run_here(self, name: str, body: Callable[[Actor], None]) -> None:
        """Run one actor alone, in this thread (no other actor may be left): the final phase of a run."""
        assert all(a.done for a in self.actors), "run_here is for an actor alone"
        actor = Actor(self, name, body, crashable=False)
        actor.started = True
        self.actors.append(actor)
        self.local.actor = actor
        try:
            actor.live()
        finally:
            actor.done = True
            self.local.actor = None

    def current(self) -> Actor | None:
        actor: Actor | None = getattr(self.local, "actor", None)
        return actor

    # -- what actors call ------------------------------------------------------------------------------------

    def point(self, op: str) -> None:
        """A scheduling point before ``op``, which takes effect (atomically) when this returns: the trace records it
        then, so the trace is in the order the operations took effect."""
        actor = self.current()
        if actor is None:
            return  # outside the simulation: set-up and the checks
        if self.aborted:
            raise Aborted()
        if actor.crashing:
            raise Crash()
        self.step += 1
        if self.step > self.knobs.max_steps:
            self.fail(f"the step bound ({self.knobs.max_steps}) was exceeded")
            raise Aborted()
        if actor.crashable and self.rng.random() < self.knobs.crash:
            self.trace.append((self.step, actor.name, f"** killed before: {op}"))
            actor.crashing = True
            raise Crash()
        if self.rng.random() < self.knobs.pause:
            actor.wake_at = self.step + self.rng.randint(1, self.knobs.pause_steps)
            self.trace.append((self.step, actor.name, f"** paused until step {actor.wake_at}, before: {op}"))
        self._yield(actor)
        self.trace.append((self.step, actor.name, op))

    def sleep(self, steps: int, why: str = "sleeps") -> None:
        """Let the other actors run ``steps`` steps (a pause the actor asks for: never a crash)."""
        actor = self.current()
        if actor is None or steps <= 0:
            return
        if self.aborted:
            raise Aborted()
        actor.wake_at = self.step + steps
        self.trace.append((self.step, actor.name, f"{why} until step {actor.wake_at}"))
        self._yield(actor)

    def note(self, text: str) -> None:
        """Add a line to the trace (not a scheduling point)."""
        actor = self.current()
        self.trace.append((self.step, actor.name if actor else "-", text))

    def choice(self, p: float) -> bool:
        return self.rng.random() < p

    # -- the baton --------------------------------------------------------------------------------------------

    def _choose(self, runner: Actor | None) -> Actor | None:
        if runner is not None and not runner.done and runner.wake_at <= self.step:  # (the same draws, less work)
            if self.rng.random() >= self.knobs.switch:
                return runner
            return self.rng.choice([a for a in self.actors if not a.done and a.wake_at <= self.step])
        ready = [a for a in self.actors if not a.done and a.wake_at <= self.step]
        if not ready:
            waiting = [a for a in self.actors if not a.done]
            if not waiting:
                return None
            self.step = min(a.wake_at for a in waiting)  # nobody can run before: the clock jumps
            ready = [a for a in waiting if a.wake_at <= self.step]
        if runner in ready and self.rng.random() >= self.knobs.switch:
            return runner
        return self.rng.choice(ready)

    def _yield(self, actor: Actor) -> None:
        nxt = self._choose(actor)
        if nxt is actor or nxt is None:
            return
        nxt.baton.release()
        if not actor.baton.acquire(timeout=HANDOFF_SECONDS):
            self.fail(f"{actor.name} waited {HANDOFF_SECONDS} s for the baton (step {self.step})")
        if self.aborted:
            raise Aborted()

    def finish(self, actor: Actor) -> None:
        actor.done = True
        if self.aborted:
            if all(a.done for a in self.actors):
                self._finished.set()
            return
        nxt = self._choose(None)
        if nxt is None:
            self._finished.set()
        else:
            nxt.baton.release()

    def fail(self, why: str) -> None:
        """Stop the run: every waiting actor wakes up and raises :class:`Aborted`."""
        if self.failure is None:
            self.failure = why
        if self.aborted:
            return
        self.aborted = True
        for actor in self.actors:
            if not actor.done and actor is not self.current():
                with contextlib.suppress(RuntimeError):  # not held: it runs, and stops at its next point
                    actor.baton.release()
        if all(a.done or a is self.current() for a in self.actors):
            self._finished.set()


class SimClock:
    """``time.time``, ``time.monotonic`` and ``time.sleep`` of simulated time: the scheduler's steps. Product modules
    see it in place of the ``time`` module during a run, so leases and ages follow the interleaving, not the host."""

    EPOCH = 1_700_000_000.0

    def __init__(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler

    def time(self) -> float:
        actor = self.scheduler.current()
        return self.EPOCH + self.scheduler.step * SECONDS_PER_STEP + (actor.skew if actor is not None else 0.0)

    def monotonic(self) -> float:
        return self.scheduler.step * SECONDS_PER_STEP

    def perf_counter(self) -> float:
        return self.monotonic()

    def sleep(self, seconds: float) -> None:
        self.scheduler.sleep(max(1, round(seconds / SECONDS_PER_STEP)), "time.sleep")

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)  # the rest of the time module (strftime, gmtime, ...) as it is
