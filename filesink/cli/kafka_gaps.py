"""Records Kafka no longer held when a query with ``failOnDataLoss=false`` came to read them: Spark skips them with a
warning in its own log only, so ``filesink run`` finds them in the query's progress and says so.

Each micro-batch's progress names, per source, the offsets it starts from and ends at (``startOffset``,
``endOffset``: per topic, per partition) and the rows it read (``numInputRows``). Every offset of a topic that is
neither compacted nor written by transactions holds one record, so a batch that read fewer rows than its offsets
span lost the difference at the source (deleted by retention, or a topic deleted and created again, before the query
read them). A partition new to the query counts from offset 0. The first batch of a new query has no start in its
progress (it starts where ``--starting-offsets`` says, which is past what retention deleted before): it is not
checked. See ``docs/kafka.md``.
"""

from __future__ import annotations

import ast
import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Span:
    """The offsets ``start`` (inclusive) to ``end`` (exclusive) of one partition that a batch covered."""

    topic: str
    partition: int
    start: int
    end: int

    def text(self) -> str:
        return f"{self.topic} partition {self.partition} offsets {self.start}-{self.end - 1}"


@dataclass(frozen=True)
class Shortfall:
    """A batch that read ``read`` rows where its offsets (``spans``) held ``expected`` records."""

    batch_id: int
    expected: int
    read: int
    spans: tuple[Span, ...]

    @property
    def missing(self) -> int:
        return self.expected - self.read

    def line(self) -> str:
        where = ", ".join(s.text() for s in self.spans)
        return (
            f"warning: batch {self.batch_id} read {self.read:,} of the {self.expected:,} records in {where}: "
            f"{self.missing:,} were no longer in Kafka (deleted by retention, or their topic recreated, before this "
            "query read them) and are not in the output (failOnDataLoss=false; docs/kafka.md)"
        )


def _parsed(text: Any) -> Any:
    """An offset of a progress: JSON (Spark's own), or, as pyspark 4's ``SourceProgress`` gives it, the Python text
    of the parsed JSON (``str()`` of a dict; ``'None'`` for none)."""
    if not isinstance(text, str):
        return text
    try:
        return json.loads(text)
    except ValueError:
        pass
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return None


def _offsets(text: Any) -> dict[tuple[str, int], int]:
    """Spark's Kafka offsets (``{"topic": {"0": 42}}``) as (topic, partition) -> offset; {} for none."""
    parsed = _parsed(text)
    if not isinstance(parsed, dict):
        return {}
    return {
        (topic, int(p)): int(o)
        for topic, parts in parsed.items()
        if isinstance(parts, dict)
        for p, o in parts.items()
        if str(p).lstrip("-").isdigit() and isinstance(o, int)
    }


def _get(item: Any, name: str) -> Any:
    return item.get(name) if isinstance(item, dict) else getattr(item, name, None)


def _spans(progress: Any) -> tuple[list[Span], int] | None:
    """The offsets a batch's progress covers and the rows it read; None for the first batch of a new query (where
    it started is not in its progress)."""
    spans: list[Span] = []
    read = 0
    for source in _get(progress, "sources") or []:
        if not _parsed(_get(source, "startOffset")):
            return None
        start, end = _offsets(_get(source, "startOffset")), _offsets(_get(source, "endOffset"))
        spans += [Span(t, p, start.get((t, p), 0), o) for (t, p), o in sorted(end.items()) if o > start.get((t, p), 0)]
        read += int(_get(source, "numInputRows") or 0)
    return spans, read


def new_shortfalls(progresses: Iterable[Any], seen: set[int]) -> list[Shortfall]:
    """The shortfalls of the batches in ``progresses`` (dicts, or pyspark's ``StreamingQueryProgress``) not in
    ``seen``; the ids of the batches that covered offsets are added to it (a progress without new offsets, as
    Spark reports while the topics are idle, carries the id of the batch still to come)."""
    found = []
    for progress in progresses:
        batch_id = _get(progress, "batchId")
        if batch_id is None or batch_id in seen:
            continue
        covered = _spans(progress)
        if covered is None:
            seen.add(batch_id)
            continue
        spans, read = covered
        expected = sum(s.end - s.start for s in spans)
        if not spans:
            continue
        seen.add(batch_id)
        if read < expected:
            found.append(Shortfall(int(batch_id), expected, read, tuple(spans)))
    return found


class GapWatch:
    """Wraps a run's progress display (:class:`filesink.cli.progress.Progress`): at each update, reads the query's
    recent progress and prints a warning for each batch that lost records at the source."""

    def __init__(self, progress: Any, query: Any) -> None:
        self.progress = progress
        self.query = query
        self.found: list[Shortfall] = []
        self._seen: set[int] = set()

    def __enter__(self) -> GapWatch:
        self.progress.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.poll()
        self.progress.__exit__(*exc)

    def update(self) -> None:
        self.poll()
        self.progress.update()

    def poll(self) -> None:
        try:
            progresses = self.query.recentProgress
        except Exception:  # the query's JVM side is gone: what was found stands
            return
        for gap in new_shortfalls(progresses, self._seen):
            self.found.append(gap)
            self.progress.console.print(gap.line(), highlight=False, soft_wrap=True)

    def summary(self) -> str | None:
        """The run's total, if any batch lost records at the source."""
        if not self.found:
            return None
        missing = sum(g.missing for g in self.found)
        batches = ", ".join(str(g.batch_id) for g in self.found)
        return (
            f"warning: {missing:,} records were no longer in Kafka when this run came to read them (batches "
            f"{batches}, named above): the output has a gap there (failOnDataLoss=false; docs/kafka.md)"
        )
