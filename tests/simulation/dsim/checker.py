"""The checker: the modelled output against the source, as exact multisets.

- No row is in the output twice, and no row is there that no batch had: always (a refusal cannot take back
  what a reader saw).
- If the final, clean driver drained everything (every batch then returned to Spark at least once, and
  ``flush()`` wrote all that was held), every row of every batch is in the output: exactly once.
- If it was refused instead, rows may be missing: the operator was told (a refusal is fine; silence is not).
"""

from __future__ import annotations

from collections import Counter

from .output import Row
from .world import World

SHOWN = 6


def check(world: World) -> list[str]:
    """What is wrong with the run's output (nothing: an empty list)."""
    got: Counter[Row] = Counter(row for rows in world.output.objects.values() for row in rows)
    source = {row for batch in range(len(world.sizes)) for row in world.rows(batch)}
    problems = []
    twice = sorted(row for row, n in got.items() if n > 1)
    if twice:
        problems.append(f"duplicated: {len(twice)} rows, in batches {_batches(twice)} ({_where(world, twice)})")
    unknown = sorted(row for row in got if row not in source)
    if unknown:
        problems.append(f"rows no batch had: {unknown[:SHOWN]}")
    problems += world.outcome.anomalies
    if world.outcome.final == "drained":
        missing = sorted(source - set(got))
        if missing:
            problems.append(
                f"silently lost: {len(missing)} rows of batches {_batches(missing)}, whose calls returned to Spark "
                "and which the final driver drained without an error"
            )
    return problems


def _batches(rows: list[Row]) -> list[int]:
    return sorted({b for b, _ in rows})


def _where(world: World, rows: list[Row]) -> str:
    """The objects that hold the first of ``rows``."""
    first = rows[0]
    keys = sorted(k for k, held in world.output.objects.items() if first in held)
    return f"row {first} in {keys}"
