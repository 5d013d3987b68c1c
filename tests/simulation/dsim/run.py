"""One run of the simulation: a scenario drawn from the seed, its actors under the scheduler, a final clean driver,
then the checker. :func:`simulate` is a pure function of its arguments; :meth:`Result.report` says how to replay.

Scenarios (all drawn from the seed): two or three drivers, each living one to four processes that may be killed
at any scheduling point, paused for a while (a stalled driver overlapping a newer one: a rolling update), or
restarted on a lost state directory or on an old backup of it; the drivers start at different times; and
sometimes ``recover apply`` runs from the log store alone, racing them.
"""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass, field

from filesink.rolling.rollover import Rollover

from .actors import REFUSALS, Driver, Habits, recover_apply, refused
from .checker import check
from .output import patched
from .scheduler import Knobs, Scheduler
from .world import INSIDE, SHARED, Outcome, StateDisk, World

REPLAY_VAR = "DSIM_SEED"
"""``DSIM_SEED=<seed> pytest tests/simulation -k replay`` replays one seed and prints its whole trace."""


@dataclass(frozen=True)
class Scenario:
    batches: list[int]
    vnodes: int
    parallelism: int
    max_epochs: int
    knobs: Knobs
    drivers: list[tuple[int, Habits]]
    """Per driver: the step it starts at, and its habits."""
    recover_at: int | None
    recover_lease: float
    """``--owner-lease`` of ``recover apply``: 120 s (the default) or shorter (an impatient operator)."""
    setup: str = SHARED
    """Where the log store lives (:data:`.world.SHARED`, :data:`.world.INSIDE` the state directory)."""
    recover_skew: float = 0.0
    """How far ``recover apply``'s clock is ahead of the true time (negative: behind)."""

    def line(self) -> str:
        k = self.knobs
        return (
            f"{len(self.drivers)} drivers (lives {[h.lives for _, h in self.drivers]}, start at "
            f"{[at for at, _ in self.drivers]}), {len(self.batches)} batches, {self.vnodes} vnodes, parallelism "
            f"{self.parallelism}, files of <= {self.max_epochs} epochs, switch {k.switch}, crash {k.crash}, pause "
            f"{k.pause} (<= {k.pause_steps} steps), recover apply "
            + (
                f"at step {self.recover_at} (lease {self.recover_lease:g} s, clock {self.recover_skew:+g} s)"
                if self.recover_at is not None
                else "no"
            )
            + f", log store {self.setup}, clocks {[h.skews for _, h in self.drivers]}"
            + f" (jump {[h.jump for _, h in self.drivers]})"
        )


LIGHT_SEEDS = 1_000_000
"""Seeds from here on draw light scenarios (fewer processes and batches: the default tier's); below it, full ones
(the chaos tier's)."""


def scenario(seed: int) -> Scenario:
    light = seed >= LIGHT_SEEDS
    rng = random.Random(f"scenario-{seed}")
    chaos = rng.choice([0.0, 0.003, 0.01, 0.03])
    knobs = Knobs(
        switch=rng.choice([0.02, 0.1, 0.3, 0.7]),
        crash=chaos,
        pause=rng.choice([0.0, 0.005, 0.02]),
        pause_steps=rng.choice([20, 80, 300]),
    )
    drivers = []
    for k in range(rng.choice([2, 2, 3])):
        habits = Habits(
            lives=rng.randint(1, 3 if light else 4),
            batches_per_life=rng.randint(1, 4 if light else 6),
            lose_state=rng.choice([0.0, 0.0, 0.15]),
            restore_backup=rng.choice([0.0, 0.0, 0.3]),
            take_backup=rng.choice([0.0, 0.5]),
            flush=rng.choice([0.0, 0.3]),
            close=rng.choice([0.3, 0.8]),
        )
        drivers.append((0 if k == 0 else rng.randint(0, 150), habits))
    sc = Scenario(
        batches=[rng.choice([0, 1, 2, 3, 3, 4]) for _ in range(rng.randint(2, 6) if light else rng.randint(3, 8))],
        vnodes=rng.randint(1, 4),
        parallelism=rng.randint(1, 2),
        max_epochs=rng.randint(1, 3),
        knobs=knobs,
        drivers=drivers,
        recover_at=rng.randint(0, 400) if rng.random() < 0.4 else None,
        recover_lease=rng.choice([120.0, 10.0, 0.0]),
    )
    return setups(sc, random.Random(f"setup-{seed}"))


SKEWS = [(0.0,), (0.0,), (0.0, 3600.0), (0.0, -3600.0), (-30.0, 30.0), (0.0, 3600.0, -3600.0)]
"""Clocks a driver may have (seconds ahead of the true time): right, an hour ahead or behind (a wrong time zone
or a clock that jumps), or off by half a minute either way."""
LONG_PAUSE = 2600
"""Steps of a pause longer than ``recover apply``'s default lease (130 simulated seconds)."""


def setups(sc: Scenario, rng: random.Random) -> Scenario:
    """The documented setups, drawn from a generator of their own (the draws above stay as they were): where the log
    store lives, the drivers' and ``recover``'s clocks, and pauses that outlast the owner lease.

    With the log store inside the state directory (the default setup), the state directory belongs to one driver
    (its processes one after the other; its lock keeps out a second), a backup holds the log store, and a restore
    puts the durable home back with it. A lost state directory loses the sink there, which start-up refuses
    (tested apart), so it is not drawn; nor is a ``recover apply`` racing a restore of the home (an operator who
    restores a log store stops everything that uses it first)."""
    setup = rng.choice([SHARED, SHARED, INSIDE])
    drivers = [
        (at, dataclasses.replace(h, skews=rng.choice(SKEWS), jump=rng.choice([0.0, 0.0, 0.2]))) for at, h in sc.drivers
    ]
    recover_at = sc.recover_at
    if setup == INSIDE:
        drivers = [(0, dataclasses.replace(drivers[0][1], lose_state=0.0))]
        if drivers[0][1].restore_backup:
            recover_at = None
    knobs = sc.knobs
    if knobs.pause and rng.random() < 0.2:
        knobs = dataclasses.replace(knobs, pause_steps=LONG_PAUSE)
    return dataclasses.replace(
        sc,
        setup=setup,
        drivers=drivers,
        recover_at=recover_at,
        knobs=knobs,
        recover_skew=rng.choice([0.0, 0.0, 3600.0, -3600.0, 30.0, -30.0]),
    )


@dataclass
class Result:
    seed: int
    scenario: Scenario
    conditional: bool
    single_driver: bool
    failure: str | None
    """Why the run itself failed (an unexpected error, a hang, the step bound), or None."""
    problems: list[str]
    """What the checker found wrong with the output."""
    outcome: Outcome
    trace: list[tuple[int, str, str]] = field(repr=False)
    steps: int = 0
    world: World | None = field(default=None, repr=False)

    @property
    def ok(self) -> bool:
        return self.failure is None and not self.problems

    def report(self, *, lines: int = 300) -> str:
        mode = ("" if self.conditional else " conditional=False") + (" single_driver" if self.single_driver else "")
        head = [
            f"seed {self.seed}{mode}: {self.failure or '; '.join(self.problems)}",
            f"  scenario: {self.scenario.line()}",
            f"  returned to Spark: {sorted(self.outcome.returned)}; refusals: {dict(self.outcome.refusals)}; "
            f"final driver: {self.outcome.final}",
            f"  replay: {REPLAY_VAR}={self.seed}{' DSIM_CONDITIONAL=0' if not self.conditional else ''}"
            f"{' DSIM_SINGLE_DRIVER=1' if self.single_driver else ''} pytest tests/simulation -k replay -s",
            f"  trace (last {lines} of {len(self.trace)} entries, in the order they took effect; step, actor, "
            "operation):",
        ]
        shown = compact(self.trace)[-lines:] if lines else []
        return "\n".join(head + [f"    {s:6d} {a:9s} {op}" for s, a, op in shown])


def compact(trace: list[tuple[int, str, str]]) -> list[tuple[int, str, str]]:
    """The trace with runs of one actor's reads of one kind folded into one line."""
    out: list[tuple[int, str, str]] = []
    for step, actor, op in trace:
        if out and out[-1][1] == actor and out[-1][2].split(" ", 1)[0] == op.split(" ", 1)[0] == "read":
            out[-1] = (out[-1][0], actor, f"{out[-1][2]}, {op.removeprefix('read ')}")
        else:
            out.append((step, actor, op))
    return out


def simulate(seed: int, *, conditional: bool = True, single_driver: bool = False) -> Result:
    """Run ``seed``. ``conditional=False``: the log store ignores conditional creates. ``single_driver``: one
    driver (its processes one after the other) and no ``recover apply``, with the sink's ``single_driver``
    option, as an operator who accepted a store without conditional create runs it."""
    sc = scenario(seed)
    if single_driver:
        sc = dataclasses.replace(sc, drivers=sc.drivers[:1], recover_at=None)
    s = Scheduler(seed, sc.knobs)
    world = World(s, batches=sc.batches, vnodes=sc.vnodes, conditional=conditional, setup=sc.setup)
    rollover = Rollover(target_file_size=None, max_age_seconds=None, max_epochs=sc.max_epochs)
    drivers = [
        Driver(
            world,
            f"driver{k}",
            parallelism=sc.parallelism,
            rollover=rollover,
            habits=h,
            disk=StateDisk.empty(),
            single_driver=single_driver,
        )
        for k, (_, h) in enumerate(sc.drivers)
    ]
    with patched(s, world.output):
        for d, (at, _) in zip(drivers, sc.drivers, strict=True):
            s.spawn(d.name, d.body, start_at=at)
        if sc.recover_at is not None:
            s.spawn(
                "recover",
                lambda actor: recover_apply(world, actor, sc.recover_lease, sc.recover_skew),
                start_at=sc.recover_at,
            )
        s.run()
        if s.failure is None:
            s.knobs = Knobs(switch=0.0, max_steps=s.step + 20_000)
            s.run_here("final", lambda actor: final(world, drivers, actor))
    problems = check(world) if s.failure is None else []
    return Result(seed, sc, conditional, single_driver, s.failure, problems, world.outcome, s.trace, s.step, world)


def final(world: World, drivers: list[Driver], actor: object) -> None:
    """The final driver, alone: on the state directory of a driver (or an empty one), it runs every batch the
    checkpoint has not passed, and one more, and flushes. Refused, it starts again on an empty state directory
    (rebuilt from the durable home), as the operator would; refused again, the run ends refused."""
    s = world.scheduler
    # The query goes on: new input arrives, and Spark brings the final driver at least one batch past the
    # scenario's. A state restored behind the checkpoint learns of the gap only from a batch; a model in which the
    # input had ended would call the rows of the batches it missed silently lost, where the next batch of the
    # query (or a start-up after files were committed: the output's mark) is refused.
    world.sizes.append(1)
    disks = [d.disk for d in drivers] + [StateDisk.empty()]
    first = s.rng.choice(disks)
    for attempt, disk in enumerate([first, StateDisk.empty()]):
        s.note(f"final driver, attempt {attempt + 1}")
        like = drivers[0]
        d = Driver(
            world,
            "final",
            parallelism=like.parallelism,
            rollover=like.rollover,
            habits=Habits(),
            disk=disk,
            single_driver=like.single_driver,
        )
        try:
            d.life(len(world.sizes) + 1, flush=True, close=True)
        except Exception as e:
            refused(world, e, d.store)
            world.outcome.final = f"refused: {type(e).__name__}"
            if not isinstance(e, REFUSALS):
                raise
            continue
        world.outcome.final = "drained"
        return
