"""Rollover rules: when a writer closes the file it is building. Files close only at epoch boundaries.

:func:`choose_end_epoch` is a pure function of the rules, the per-epoch backlog of one writer and the
clock, so it is tested on its own.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from ..errors import SinkOptionError

MIN_FILL = 0.8
"""A size-driven file is closed once its estimated size reaches this fraction of the target."""

MAX_FILL = 0.95
"""Size-driven files are planned to at most this fraction of the target. The size is an estimate (log bytes
times a ratio learned from earlier files, or measured on a sample before the first), which is a few percent
off from file to file; the headroom keeps files within the target when it is low."""


@dataclass(frozen=True)
class Rollover:
    """When to close a file; any rule that is reached closes it. ``None`` turns a rule off.

    - ``target_file_size``: bytes of Parquet. The file is closed at the last epoch that keeps its estimated
      size within ``MAX_FILL`` of the target, once it holds at least ``MIN_FILL`` of it and one more epoch of
      the average size would not fit (one epoch larger than that makes a file of its own: epochs are never
      split).
    - ``max_rows``: rows in one file (files close at the last epoch that stays within it).
    - ``max_age_seconds``: seconds since the oldest epoch the file holds was sealed; also fires while the
      stream is idle.
    - ``max_epochs``: epochs in one file.
    """

    target_file_size: int | None = 128 * 2**20
    max_rows: int | None = None
    max_age_seconds: float | None = 300.0
    max_epochs: int | None = None

    def __post_init__(self) -> None:
        for name in ("target_file_size", "max_rows", "max_epochs"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value <= 0):
                raise SinkOptionError(f"Rollover.{name} must be a positive integer or None, not {value!r}")
        age = self.max_age_seconds
        if age is not None and (
            isinstance(age, bool) or not isinstance(age, int | float) or not math.isfinite(age) or age <= 0
        ):
            raise SinkOptionError(f"Rollover.max_age_seconds must be a positive number of seconds or None, not {age!r}")
        if self.target_file_size is None and self.max_rows is None and self.max_epochs is None and age is None:
            raise SinkOptionError(
                "Rollover needs at least one rule (target_file_size, max_rows, max_age_seconds or max_epochs); "
                "with none, files would only ever be written by flush()"
            )


@dataclass(frozen=True)
class EpochBacklog:
    """What one writer holds of one sealed epoch (summed over its vnodes)."""

    epoch: int
    rows: int
    log_bytes: int
    sealed_at: float


@dataclass(frozen=True)
class Decision:
    end_epoch: int
    reason: str


def choose_end_epoch(
    rules: Rollover, epochs: Sequence[EpochBacklog], *, now: float, bytes_per_log_byte: float
) -> Decision | None:
    """The epoch at which to close a file over ``epochs`` (ascending, all unwritten), or None to keep it open.

    ``bytes_per_log_byte`` estimates Parquet bytes from log bytes (learned from files already written).
    """
    if not epochs:
        return None
    if rules.max_age_seconds is not None and now - epochs[0].sealed_at >= rules.max_age_seconds:
        return Decision(epochs[-1].epoch, "age")
    rows = size = 0.0
    for i, e in enumerate(epochs):
        rows += e.rows
        size += e.log_bytes * bytes_per_log_byte
        last = epochs[i - 1].epoch if i else None
        if rules.max_rows is not None and rows > rules.max_rows:
            return Decision(last if last is not None else e.epoch, "rows")
        if rules.target_file_size is not None and size > MAX_FILL * rules.target_file_size:
            return Decision(last if last is not None else e.epoch, "size")
        if rules.max_rows is not None and rows == rules.max_rows:
            return Decision(e.epoch, "rows")
        if rules.max_epochs is not None and i + 1 >= rules.max_epochs:
            return Decision(e.epoch, "epochs")
    target = rules.target_file_size
    if target is not None and size >= MIN_FILL * target and size + size / len(epochs) > MAX_FILL * target:
        # Full enough, and one more epoch of the average size would not fit: close now.
        return Decision(epochs[-1].epoch, "size")
    return None
