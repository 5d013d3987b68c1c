"""The protocol's guards, by name: every term check, fence, refusal, gap check and ordering rule of the durable
home that keeps the output exactly once, each named after what it protects.

A guard site reads ``if guards.on("gap.restored_state") and ...``. In every run of the product each guard is on:
:func:`on` reads a private set that only a test, in its own process, can fill (``tests/support/mutants.py``); no
environment variable, option or file turns a guard off. The mutation tests switch one guard off at a time and
require the simulation (``tests/simulation``) to catch the mutant: a guard no interleaving needs protects
nothing, or the simulation has a blind spot (docs/reliability.md, "Mutation testing").
"""

from __future__ import annotations

GUARDS: dict[str, str] = {
    # ownership: the newest term record
    "term.newer_fences": "every fence check (seal, pre-commit, commit, drop, truncation, sweep, clean-up) refuses a "
    "run once a newer term record exists",
    "term.taken_once": "a term record a store replaced (no conditional create) is refused, not shared by two runs",
    # the home's ordering rules
    "home.newer_epoch_record_wins": "of several counted records of one epoch, the newest term's is the epoch's",
    "home.late_record_ignored": "a record an older term wrote above the newest base does not count (split brain)",
    "home.older_truncation_capped": "an older term's truncate point counts only up to the newest base",
    "home.vanished_record_relisted": "a record that vanishes between listing and read means listing again",
    # the seal
    "seal.term_after_home_record": "the term is checked after the seal's home record, before the database's seal",
    "seal.order_under_transaction": "the epoch order is checked again inside the seal's transaction",
    # start-up
    "start.diverged_state": "a state holding epochs the home does not count is refused (StateDivergedError)",
    "start.term_before_clean": "a run checks its term before deleting stale records from the home",
    "gap.restored_state": "a batch id past the next one (the state is behind the checkpoint) is refused",
    "gap.lost_state": "a batch id past 0 on an empty state (the state was lost) is refused",
    "mark.restored_state": "a state behind the output's commit mark (restored with its log store) is refused",
    "batch.behind_sealed": "a batch id below the last sealed epoch (another checkpoint) is refused",
    # the ledger: pre-commit, commit, drop
    "precommit.home_term": "the home term is checked before a pre-commit's home records",
    "precommit.home_term_after_record": "the home term is checked after a pre-commit's home records",
    "ledger.database_term": "pre-commit, commit and drop check the database's term inside their transaction",
    "commit.home_term": "the home term is checked before a commit",
    "drop.home_term": "the home term is checked before a drop",
    "truncation.term": "the home term is checked before truncate points are made durable",
    "gc.term": "the home term is checked before released segments are deleted and before the log store is swept",
    # the output
    "writer.fence": "a file writer checks its fence before it publishes",
    "output.fence_older_writers": "a new run fences the staging of older terms' writers",
}
"""Every guard and what it protects."""

_off: set[str] = set()
"""Guards a test switched off in this process (``tests/support/mutants.py``); empty in every product run."""


def on(name: str) -> bool:
    """Whether guard ``name`` is on: always, unless a test of this process switched it off."""
    if not _off:
        return True
    if name not in GUARDS:
        raise KeyError(f"no guard named {name!r}")
    return name not in _off
