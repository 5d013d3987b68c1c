"""What ``filesink run`` finds in a Kafka query's progress with failOnDataLoss=false (:mod:`filesink.cli.kafka_gaps`):
the progress is Spark's, as a dict; the end-to-end check is ``tests/e2e/test_kafka.py``."""

from __future__ import annotations

import json
from typing import Any

from filesink.cli.kafka_gaps import GapWatch, Span, new_shortfalls
from filesink.cli.kafka_source import kafka_fix


def _progress(
    batch: int, start: dict[str, Any] | None, end: dict[str, Any], rows: int, text: Any = json.dumps
) -> dict[str, Any]:
    """A progress as Spark's JSON has it (``text``: ``str``, as pyspark 4's ``SourceProgress`` gives offsets)."""
    source = {"startOffset": text(start), "endOffset": text(end), "numInputRows": rows}
    return {"batchId": batch, "sources": [source]}


def test_offsets_as_pyspark_gives_them() -> None:
    """pyspark 4's ``SourceProgress`` has ``str()`` of the parsed JSON: ``'None'`` for the first batch's start."""
    progresses = [
        _progress(0, None, {"t": {"0": 5}}, 1, text=str),
        _progress(1, {"t": {"0": 5}}, {"t": {"0": 9}}, 1, text=str),
    ]
    assert [(g.batch_id, g.missing) for g in new_shortfalls(progresses, set())] == [(1, 3)]


def test_a_batch_that_read_fewer_rows_than_its_offsets_span_is_reported_once() -> None:
    seen: set[int] = set()
    progresses = [
        _progress(0, None, {"t": {"0": 50, "1": 50}}, 90),  # a new query's first batch: not checked
        _progress(1, {"t": {"0": 50, "1": 50}}, {"t": {"0": 100, "1": 50, "2": 7}}, 57),  # a partition is new
        _progress(2, {"t": {"0": 100, "1": 50, "2": 7}}, {"t": {"0": 140, "1": 60, "2": 7}}, 20),
        _progress(3, {"t": {"0": 140, "1": 60, "2": 7}}, {"t": {"0": 140, "1": 60, "2": 7}}, 0),  # idle
    ]
    found = new_shortfalls(progresses, seen)
    assert [(g.batch_id, g.expected, g.read, g.missing) for g in found] == [(2, 50, 20, 30)]
    assert found[0].spans == (Span("t", 0, 100, 140), Span("t", 1, 50, 60))
    assert "batch 2 read 20 of the 50 records in t partition 0 offsets 100-139, t partition 1 offsets 50-59: 30 " in (
        found[0].line()
    )
    assert seen == {0, 1, 2}  # the idle progress names the batch still to come: checked when it runs
    assert new_shortfalls(progresses, seen) == []
    late = _progress(3, {"t": {"0": 140, "1": 60, "2": 7}}, {"t": {"0": 150, "1": 60, "2": 7}}, 4)
    assert [g.missing for g in new_shortfalls([late], seen)] == [6]


class _Console:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def print(self, text: str, **_: Any) -> None:
        self.lines.append(text)


class _Shown:
    def __init__(self) -> None:
        self.console = _Console()
        self.updates = 0

    def __enter__(self) -> _Shown:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def update(self) -> None:
        self.updates += 1


class _Query:
    def __init__(self) -> None:
        self.recentProgress: list[dict[str, Any]] = []


def test_the_watch_prints_each_shortfall_as_it_comes_and_a_total() -> None:
    shown, query = _Shown(), _Query()
    with GapWatch(shown, query) as gaps:
        gaps.update()
        query.recentProgress.append(_progress(4, {"t": {"0": 0}}, {"t": {"0": 10}}, 7))
        gaps.update()
        gaps.update()
        query.recentProgress.append(_progress(5, {"t": {"0": 10}}, {"t": {"0": 20}}, 0))
    assert shown.updates == 3
    assert [line.split(":")[0] for line in shown.console.lines] == ["warning", "warning"]
    assert "batch 4 read 7 of the 10" in shown.console.lines[0] and "batch 5 read 0 of" in shown.console.lines[1]
    assert gaps.summary() == (
        "warning: 13 records were no longer in Kafka when this run came to read them (batches 4, 5, named above): "
        "the output has a gap there (failOnDataLoss=false; docs/kafka.md)"
    )


def test_a_value_that_is_not_json_of_the_schema_says_a_record_cannot_be_corrected() -> None:
    summary = ["[MALFORMED_RECORD_IN_PARSING.WITHOUT_SUGGESTION] Malformed records are detected in record parsing"]
    fix = kafka_fix(summary)
    assert "not JSON that --schema describes" in fix and "--kafka-value string" in fix and "replace" not in fix
