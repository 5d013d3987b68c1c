"""The progress ``filesink run`` shows: the log backlog read from the state database beside the live sink,
and the files the sink committed; a live panel on a terminal, one line per new epoch otherwise."""

from __future__ import annotations

import io

from rich.console import Console
from sink_helpers import append_epoch, batch_rows

from filesink import ExactlyOnceParquetSink, Rollover
from filesink.cli.progress import Progress, committed_line, files_line, held, recovered_commits, rows_line
from filesink.committer.ledger import PlannedFile
from filesink.output import OutputLocation, list_objects
from filesink.words import size
from recovery.resolve import Action, RecoveryPlan, Resolution


def _sink(tmp_path):
    rollover = Rollover(target_file_size=None, max_age_seconds=None, max_epochs=1000)
    return ExactlyOnceParquetSink(str(tmp_path / "out"), tmp_path / "state", vnodes=8, parallelism=2, rollover=rollover)


def test_backlog_and_files_as_a_line_per_epoch(tmp_path):
    sink = _sink(tmp_path)
    buffer = io.StringIO()
    progress = Progress(Console(file=buffer, force_terminal=False, width=200), sink.stats, sink.state_dir, "t")
    assert held(sink.state_dir).rows == 0
    with progress:
        progress.update()
        assert buffer.getvalue() == "", "nothing new, no line"
        for epoch in (0, 1):
            append_epoch(sink, epoch, batch_rows(epoch, 300))
            sink.stats.last_epoch, sink.stats.batches, sink.stats.rows_in = epoch, epoch + 1, 300 * (epoch + 1)
        h = held(sink.state_dir)
        assert (h.rows, h.epochs, h.first_epoch, h.last_epoch) == (600, 2, 0, 1)
        progress.update()
        progress.update()
        sink.flush()
        progress.update()
    lines = buffer.getvalue().splitlines()
    assert len(lines) == 2, lines
    assert lines[0].startswith("epoch 1: 600 rows in (2 batches), log backlog 600 rows (")
    assert "from epochs 0-1, files committed none yet" in lines[0]
    committed = sink.stats.file_sizes
    assert len(committed) == 2 and all(s > 0 for s in committed)
    assert lines[1].endswith(
        f"log backlog nothing, files committed 2 ({size(sum(committed))}; median file "
        f"{size(sum(committed) / 2)}, last {size(committed[-1])})"
    )
    assert held(sink.state_dir).rows == 0
    sink.close()


def test_a_live_panel_on_a_terminal(tmp_path):
    sink = _sink(tmp_path)
    append_epoch(sink, 0, batch_rows(0, 250))
    sink.stats.last_epoch, sink.stats.batches, sink.stats.rows_in = 0, 1, 250
    buffer = io.StringIO()
    with Progress(Console(file=buffer, force_terminal=True, width=120), sink.stats, sink.state_dir, "job") as p:
        p.update()
    text = buffer.getvalue()
    for expected in ("job", "epoch", "rows in", "250 (1 batch)", "log backlog", "250 rows", "files committed"):
        assert expected in text, text
    sink.close()


def test_sizes():
    assert [size(812), size(3.4 * 1024), size(128 * 2**20), size(3 * 2**30)] == [
        "812 B",
        "3.4 KiB",
        "128.0 MiB",
        "3.0 GiB",
    ]


def test_files_of_a_partitioned_output_are_counted_as_objects_too(tmp_path):
    rollover = Rollover(target_file_size=None, max_age_seconds=None, max_epochs=1000)
    out = tmp_path / "out"
    sink = ExactlyOnceParquetSink(
        str(out), tmp_path / "state", vnodes=8, parallelism=2, rollover=rollover, partition_by=["event_date"]
    )
    append_epoch(sink, 0, batch_rows(0, 300))
    sink.flush()
    objects = [key for key, _ in list_objects(OutputLocation(str(out), {})) if key.endswith(".parquet")]
    s = sink.stats
    assert s.files_committed == 2 and s.objects == len(objects) > 2, (s, objects)
    assert files_line(s.file_sizes, s.objects).startswith(f"2, as {len(objects)} Parquet objects (")
    assert files_line(s.file_sizes, 2).startswith("2 ("), "one object per file: no second count"
    s.replayed = 1
    assert rows_line(s) == "0 rows in (0 batches; 1 batch run again, already in the log store)"
    sink.close()


def test_files_recovery_committed_are_counted_with_the_runs():
    """A run whose recovery at start committed the files the last run left pending never says it committed none."""

    def resolved(action: Action) -> Resolution:
        return Resolution(PlannedFile(f"part-{action}", 0, 0, {0: 0}, 0, 1, 1, "test"), [], action)

    plan = RecoveryPlan(files=[resolved(a) for a in (Action.COMMIT, Action.REWRITE, Action.DROP, Action.RELEASED)])
    assert recovered_commits(plan) == 2, "committed as they were, or written again and committed"
    assert recovered_commits(None) == recovered_commits(RecoveryPlan()) == 0
    assert committed_line([], None, 0) == "none yet"
    assert committed_line([], None, 2) == (
        "2 by recovery at start (left pending by the last run), none yet from this run's batches"
    )
    assert committed_line([1024, 2048], 2, 1) == (
        "2 (3.0 KiB; median file 1.5 KiB, last 2.0 KiB) and 1 by recovery at start (left pending by the last run)"
    )


def test_the_progress_line_counts_what_recovery_committed(tmp_path):
    sink = _sink(tmp_path)
    buffer = io.StringIO()
    progress = Progress(Console(file=buffer, force_terminal=False, width=300), sink.stats, sink.state_dir, "t", 2)
    append_epoch(sink, 0, batch_rows(0, 10))
    sink.stats.last_epoch, sink.stats.batches, sink.stats.rows_in = 0, 1, 10
    with progress:
        progress.update()
    line = buffer.getvalue().strip()
    assert line.endswith(
        "files committed 2 by recovery at start (left pending by the last run), none yet from this run's batches"
    ), line
    sink.close()
