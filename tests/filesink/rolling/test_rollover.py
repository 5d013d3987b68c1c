"""Rollover rules as a pure function of the rules, one writer's per-epoch backlog and the clock."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from filesink.errors import SinkOptionError
from filesink.rolling.rollover import MAX_FILL, MIN_FILL, Decision, EpochBacklog, Rollover, choose_end_epoch

NOW = 1_000_000.0


def epochs(*sizes, rows=10, age=0.0):
    return [EpochBacklog(i, rows, size, NOW - age) for i, size in enumerate(sizes)]


def test_size_closes_at_the_last_epoch_within_the_target():
    rules = Rollover(target_file_size=100, max_age_seconds=None)
    assert choose_end_epoch(rules, epochs(30, 30), now=NOW, bytes_per_log_byte=1.0) is None
    assert choose_end_epoch(rules, epochs(30, 30, 30), now=NOW, bytes_per_log_byte=1.0) == Decision(2, "size")
    assert choose_end_epoch(rules, epochs(30, 30, 30, 30), now=NOW, bytes_per_log_byte=1.0) == Decision(2, "size")
    assert choose_end_epoch(rules, epochs(60, 60), now=NOW, bytes_per_log_byte=0.5) is None
    assert choose_end_epoch(rules, epochs(90, 90), now=NOW, bytes_per_log_byte=0.5) == Decision(1, "size")
    # 85 of 100 is full enough, but another epoch of the average size (5) still fits: keep filling
    assert choose_end_epoch(rules, epochs(*[10] * 17), now=NOW, bytes_per_log_byte=0.5) is None
    # 95 of 100 (MAX_FILL) and another would not fit; with one more epoch there, the file still ends at 95
    assert choose_end_epoch(rules, epochs(*[10] * 19), now=NOW, bytes_per_log_byte=0.5) == Decision(18, "size")
    assert choose_end_epoch(rules, epochs(*[10] * 20), now=NOW, bytes_per_log_byte=0.5) == Decision(18, "size")


def test_an_epoch_larger_than_the_target_is_a_file_of_its_own():
    rules = Rollover(target_file_size=100, max_age_seconds=None)
    assert choose_end_epoch(rules, epochs(500, 10), now=NOW, bytes_per_log_byte=1.0) == Decision(0, "size")


def test_rows_epochs_and_age():
    assert choose_end_epoch(
        Rollover(target_file_size=None, max_rows=25, max_age_seconds=None),
        epochs(1, 1, 1),
        now=NOW,
        bytes_per_log_byte=1,
    ) == Decision(1, "rows")
    assert choose_end_epoch(
        Rollover(target_file_size=None, max_rows=20, max_age_seconds=None),
        epochs(1, 1, 1),
        now=NOW,
        bytes_per_log_byte=1,
    ) == Decision(1, "rows")
    assert choose_end_epoch(
        Rollover(target_file_size=None, max_epochs=2, max_age_seconds=None),
        epochs(1, 1, 1),
        now=NOW,
        bytes_per_log_byte=1,
    ) == Decision(1, "epochs")
    aged = Rollover(target_file_size=None, max_age_seconds=60)
    assert choose_end_epoch(aged, epochs(1, 1, age=59), now=NOW, bytes_per_log_byte=1) is None
    assert choose_end_epoch(aged, epochs(1, 1, age=60), now=NOW, bytes_per_log_byte=1) == Decision(1, "age")
    assert choose_end_epoch(aged, [], now=NOW, bytes_per_log_byte=1) is None


@given(st.lists(st.integers(1, 15), min_size=1, max_size=60), st.floats(0.2, 3.0))
def test_size_driven_files_land_between_min_fill_and_the_target(sizes, ratio):
    """With epochs smaller than (MAX_FILL - MIN_FILL) of the target, every size-driven file's estimate is 0.8..0.95
    x target."""
    target = 100
    rules = Rollover(target_file_size=target, max_age_seconds=None)
    backlog = [EpochBacklog(i, 1, s / ratio * target / 100, NOW) for i, s in enumerate(sizes)]
    while backlog:
        # the barrier moves one epoch at a time, as in a running query
        for seen in range(1, len(backlog) + 1):
            decision = choose_end_epoch(rules, backlog[:seen], now=NOW, bytes_per_log_byte=ratio)
            if decision:
                break
        else:
            return
        held = [e for e in backlog if e.epoch <= decision.end_epoch]
        size = sum(e.log_bytes for e in held) * ratio
        assert MIN_FILL * target - 1e-9 <= size <= MAX_FILL * target + 1e-9
        backlog = backlog[len(held) :]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"target_file_size": 0}, "target_file_size must be a positive integer"),
        ({"max_rows": -1}, "max_rows must be a positive integer"),
        ({"max_epochs": 1.5}, "max_epochs must be a positive integer"),
        ({"max_age_seconds": float("nan")}, "max_age_seconds must be a positive number"),
        ({"max_age_seconds": True}, "max_age_seconds must be a positive number"),
        (
            {"target_file_size": None, "max_age_seconds": None},
            "needs at least one rule",
        ),
    ],
)
def test_invalid_rules_are_refused(kwargs, match):
    with pytest.raises(SinkOptionError, match=match):
        Rollover(**kwargs)
