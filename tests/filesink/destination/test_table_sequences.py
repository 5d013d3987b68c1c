"""Seeded sequences of events on Delta and Iceberg tables written by the sink without Spark's jobs: rolls, restarts,
crashes, a lost state directory, kills at the roll's and recovery's failpoints, schema changes, another writer's
appends, compactions, vacuums, checkpoints and expiries; after each step every reader reads the table, its rows are
the model's exactly, and no file is committed twice (``table_sequences.py``).

The default tier plays :data:`DEFAULT_SEEDS` seeds of :data:`DEFAULT_STEPS` events per format; the chaos tier
(``-m chaos``) many more. A failure prints the seed, the step and the event list;
``FILESINK_TABLE_SEQ_SEED=N python -m pytest -n 0 tests/filesink/destination/test_table_sequences.py -k 'replay and
delta' -s`` replays seed N (on the same code) and prints each step as it runs. ``FILESINK_TABLE_SEQ_STEPS`` sets
the replay's length if the failing run's was not the default's.

A planted bug (what the sink read from a checkpoint written back in Arrow's shapes: ``metaData.format.options``
as ``[]``, the bug ``delta_actions.py`` fixed) is found by the default tier's seeds: the test of that shows the
generator reaches "checkpoint, restart, schema change" within its budget.
"""

from __future__ import annotations

import logging
import os
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from table_sequences import SEED_VAR, Result, draw, play

pytest.importorskip("deltalake")
pytest.importorskip("pyiceberg")

DEFAULT_SEEDS = 2
DEFAULT_STEPS = 30
CHAOS_SEEDS = 200
CHAOS_STEPS = 60
DUCKDB_EVERY = 15
STEPS_VAR = "FILESINK_TABLE_SEQ_STEPS"


@pytest.fixture(autouse=True)
def quiet() -> Iterator[None]:
    """The product logs a warning at every rebuild, kill and failed checkpoint: many per sequence."""
    logging.disable(logging.WARNING)
    yield
    logging.disable(logging.NOTSET)


@pytest.fixture(scope="module")
def duckdb_python() -> Path | None:
    """The pinned DuckDB, if its environment is built already (building it is the DuckDB tests' business)."""
    from duckdb_env import cache_root, env_name

    home = cache_root() / env_name()
    python = home / "bin" / "python"
    return python if (home / "ready.json").exists() and python.exists() else None


def run_seeds(tmp_path: Path, table_format: str, seeds: range, steps: int, duckdb: Path | None) -> list[Result]:
    results = []
    started = time.monotonic()
    outcomes: Counter[str] = Counter()
    for seed in seeds:
        result = play(
            draw(seed, table_format, steps),
            tmp_path / f"{table_format}-{seed}",
            duckdb_python=duckdb,
            duckdb_every=DUCKDB_EVERY,
        )
        outcomes += result.outcomes
        results.append(result)
    failed = [r.plan.seed for r in results if not r.ok]
    print(
        f"{table_format} seeds {seeds.start}..{seeds.stop - 1}, {steps} steps each: "
        f"{time.monotonic() - started:.1f} s; failed {failed}; {dict(sorted(outcomes.items()))}"
    )
    return results


def describe(results: list[Result]) -> str:
    failed = [r for r in results if not r.ok]
    return f"{len(failed)} failing seeds: {[r.plan.seed for r in failed]}\n\n" + "\n\n".join(
        r.report() for r in failed[:2]
    )


@pytest.mark.timeout(240)
@pytest.mark.parametrize("table_format", ["delta", "iceberg"])
def test_sequences(tmp_path, table_format, duckdb_python):
    results = run_seeds(tmp_path, table_format, range(DEFAULT_SEEDS), DEFAULT_STEPS, duckdb_python)
    assert all(r.ok for r in results), describe(results)
    outcomes = sum((r.outcomes for r in results), Counter())
    fired = [k for k in outcomes if k.startswith("fired filesink.table")]
    assert fired, f"no kill at a table failpoint fired: {outcomes}"
    assert outcomes["rebuilt"], f"no state was lost and rebuilt: {outcomes}"


@pytest.mark.chaos
@pytest.mark.timeout(7200)
@pytest.mark.parametrize("table_format", ["delta", "iceberg"])
def test_sequences_chaos(tmp_path, table_format, duckdb_python):
    results = run_seeds(tmp_path, table_format, range(1000, 1000 + CHAOS_SEEDS), CHAOS_STEPS, duckdb_python)
    assert all(r.ok for r in results), describe(results)


@pytest.mark.parametrize("table_format", ["delta", "iceberg"])
def test_replay(tmp_path, table_format, duckdb_python):
    """One seed (``FILESINK_TABLE_SEQ_SEED``), step by step."""
    if SEED_VAR not in os.environ:
        pytest.skip(f"replays the seed {SEED_VAR} names")
    steps = int(os.environ.get(STEPS_VAR, DEFAULT_STEPS))
    plan = draw(int(os.environ[SEED_VAR]), table_format, steps)
    result = play(plan, tmp_path / "replay", duckdb_python=duckdb_python, duckdb_every=DUCKDB_EVERY, verbose=True)
    print(dict(result.outcomes))
    assert result.ok, result.report()


def _arrow_shapes(table: Any) -> list[dict[str, Any]]:
    """The checkpoint reader before the fix: pyarrow's values as they come (a map as a list of pairs)."""
    import pyarrow.compute as pc

    actions = []
    for kind, column in zip(table.column_names, table.columns, strict=True):
        for row in column.filter(pc.is_valid(column)).to_pylist():
            actions.append({kind: row})
    return actions


@pytest.mark.timeout(240)
def test_the_generator_finds_the_planted_checkpoint_bug(tmp_path, monkeypatch):
    """The bug delta_actions.py fixed, planted back: what the sink reads from a checkpoint stays in Arrow's shapes,
    so a restarted sink's first new column writes ``"options":[]`` and readers refuse the table. The default tier's
    seeds find it, and the report names the seed, the step and the events."""
    from filesink.destination import delta_log

    monkeypatch.setattr(delta_log, "checkpoint_actions", _arrow_shapes)
    monkeypatch.setattr(delta_log, "protocol_shape", lambda kind, fields: dict(fields))
    results = run_seeds(tmp_path, "delta", range(DEFAULT_SEEDS), DEFAULT_STEPS, None)
    failed = [r for r in results if not r.ok]
    assert failed, "the generator did not find the planted bug in the default tier's seeds"
    report = failed[0].report()
    print(report)
    assert f"seed {failed[0].plan.seed}" in report and f"step {failed[0].failed_at}:" in report
    assert f"{SEED_VAR}={failed[0].plan.seed}" in report
    # the failure is the readers' refusal of the table, not something else
    assert any(word in failed[0].error.lower() for word in ("options", "map", "json", "parse", "invalid")), report
