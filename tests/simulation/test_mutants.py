"""Mutation testing of the protocol's guards (:mod:`logstore.guards`): the simulation must catch the product with
any one guard switched off.

- Default tier: each guard's recorded seed (:data:`CATCHES`) still catches its mutant (a run of a few
  milliseconds each), every guard site in the product is listed, and nothing but a test turns a guard off.
- Chaos tier (``-m chaos``): the campaign. For each guard, seeds are run from the start with the guard off until
  one fails (light seeds, then full ones, then the modes without conditional create); it prints the seed and how
  many seeds it took, and fails for a guard no seed catches. docs/reliability.md reports the score.

A recorded seed replays exactly on the code it was found on; once the product changes, the same seed takes
another interleaving, so a recorded seed that stops catching its mutant fails with the seed the hunt finds now
(record that one).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from dsim.mutation import Catch, candidates, hunt
from mutants import mutant

import logstore
from logstore import guards
from logstore.guards import GUARDS

CATCHES: dict[str, Catch] = {}
"""The first seed that caught each guard's mutant (docs/reliability.md, "Mutation testing")."""
UNCAUGHT: dict[str, str] = {}
"""Guards no seed of the campaign catches, and why that is right (none, for now)."""
LIGHT, FULL = 5_000, 20_000
"""Seeds the campaign tries for each mutant: the default tier's light seeds, then the chaos tier's full ones."""
ROOT = Path(logstore.__file__).parent.parent


@pytest.fixture(autouse=True)
def quiet() -> Iterator[None]:
    logging.disable(logging.WARNING)
    yield
    logging.disable(logging.NOTSET)


def test_every_guard_site_is_listed_and_every_listed_guard_has_a_site() -> None:
    sites: dict[str, list[str]] = {}
    for package in ("logstore", "filesink", "recovery"):
        for path in sorted((ROOT / package).rglob("*.py")):
            for name in re.findall(r'guards\.on\("([^"]+)"\)', path.read_text()):
                sites.setdefault(name, []).append(str(path.relative_to(ROOT)))
    assert sorted(set(sites) - set(GUARDS)) == [], f"guard sites not in logstore.guards.GUARDS: {sites}"
    assert sorted(set(GUARDS) - set(sites)) == [], "guards listed with no site in the product"


def test_only_a_test_turns_a_guard_off() -> None:
    """No environment variable, file or option reaches the switch: :mod:`logstore.guards` reads none, and every
    guard is on unless :func:`mutants.mutant` (a test, in its own process) switched it off."""
    source = Path(guards.__file__).read_text()
    assert not re.search(r"\bos\b|environ|getenv|open\(", source.split('"""', 2)[2]), "guards reads the outside"
    assert all(guards.on(name) for name in GUARDS)
    with mutant("gap.restored_state"):
        assert not guards.on("gap.restored_state") and guards.on("writer.fence")
    assert all(guards.on(name) for name in GUARDS)
    with pytest.raises(KeyError), mutant("no.such.guard"):
        pass


def test_every_guard_is_caught_or_explained() -> None:
    assert not set(CATCHES) & set(UNCAUGHT), "a guard is either caught or explained"
    assert set(CATCHES) | set(UNCAUGHT) == set(GUARDS), f"guards with no catching seed: {set(GUARDS) - set(CATCHES)}"


@pytest.mark.timeout(300)
@pytest.mark.parametrize("guard", sorted(CATCHES))
def test_the_recorded_seed_catches_the_mutant(guard: str) -> None:
    catch = CATCHES[guard]
    assert catch.run().ok, f"{catch.line()} fails with every guard on: a bug of the product, not a mutant's"
    with mutant(guard):
        result = catch.run()
    if result.ok:
        found = hunt(guard, candidates(LIGHT, 0))
        pytest.fail(
            f"{catch.line()} no longer catches the mutant without {guard} (the code changed since it was found); "
            f"the hunt now finds {found.catch.line() if found.catch else 'none in the light seeds'}: record it"
        )


@pytest.mark.chaos
@pytest.mark.timeout(7200)
@pytest.mark.parametrize("guard", sorted(GUARDS))
def test_campaign(guard: str, request: pytest.FixtureRequest) -> None:
    """From scratch: the first seed that catches the mutant, and how many it took (``-s`` prints them)."""
    selected = str(request.config.option.markexpr or "")
    if "chaos" not in selected or "not chaos" in selected:
        pytest.skip("the chaos tier runs with -m chaos")
    found = hunt(guard, candidates(LIGHT, FULL))
    print(
        f"{guard}: {found.catch.line() if found.catch else 'not caught'} after {found.tried} seeds "
        f"({found.seconds:.0f} s): {found.found}"
    )
    if guard in UNCAUGHT:
        assert found.catch is None, f"{guard} is caught now ({found.catch}): move it to CATCHES"
        return
    assert found.catch is not None, f"no seed of {found.tried} catches the mutant without {guard}"
