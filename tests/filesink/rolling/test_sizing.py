"""The size rule's cold start: a sample encode of held rows measures Parquet bytes per log byte."""

from __future__ import annotations

import itertools

import pyarrow as pa
import pytest
from sink_helpers import append_epoch, batch_rows

from filesink import ExactlyOnceParquetSink, Rollover
from filesink.rolling import sizing
from filesink.rolling.sizing import column_groups, encoded_size, sample_ratio
from filesink.tasks.writer import write_file

NO_RULES = Rollover(target_file_size=None, max_age_seconds=None, max_epochs=1000)


def _held(tmp_path, partition_by=None, epochs=6, rows=400):
    """A sink holding ``epochs`` epochs of rows (no file written) and the file a flush would write now."""
    sink = ExactlyOnceParquetSink(
        str(tmp_path / "out"),
        tmp_path / "state",
        vnodes=8,
        parallelism=1,
        rollover=NO_RULES,
        partition_by=partition_by,
        row_group_rows=500,
    )
    for epoch in range(epochs):
        append_epoch(sink, epoch, batch_rows(epoch, rows))
    (planned,), _ = sink._plan(force=True)
    return sink, planned, sink._file_task(planned, sink.term)


@pytest.mark.parametrize("partition_by", [None, ["event_date"]])
def test_a_sample_of_every_row_measures_the_file_that_is_then_written(tmp_path, partition_by):
    sink, planned, task = _held(tmp_path, partition_by)
    sample = sample_ratio(task, max_rows=10**9)
    assert sample.rows == planned.rows == 2400
    written = write_file(sink.output, task)
    if partition_by:
        assert len(written) == 3  # three dates: the sample encoded three objects too
    actual = sum(o.size for o in written) / planned.log_bytes
    assert sample.ratio == pytest.approx(actual, rel=0.01)
    sink.close()


def test_a_sample_stops_after_whole_blocks_of_at_least_max_rows(tmp_path):
    sink, planned, task = _held(tmp_path)
    sample = sample_ratio(task, max_rows=1000)
    block_rows = sorted({b.rows for item in task.plan for b in item.blocks})
    assert 1000 <= sample.rows < 1000 + max(block_rows)
    assert sample.rows < planned.rows
    assert 0 < sample.ratio < 1
    sink.close()


def test_before_its_first_file_a_sink_plans_by_a_sample_and_then_by_what_it_wrote(tmp_path, monkeypatch):
    """With the log-size estimate (ratio 1.0) the first file would be a fraction of the target; sampled, it
    lands within 0.8-1.0 of it, and the next file is planned by the ratio of the committed one. Each sample
    after the first has at least twice the rows of the one before (a few more rows barely move the ratio)."""
    samples: list[int] = []

    def sample(task, max_rows):
        result = sample_ratio(task, max_rows)
        samples.append(result.rows)
        return result

    monkeypatch.setattr("filesink.sink.roll.sample_ratio", sample)
    target = 24 * 1024
    sink = ExactlyOnceParquetSink(
        str(tmp_path / "out"),
        tmp_path / "state",
        vnodes=8,
        parallelism=1,
        rollover=Rollover(target_file_size=target, max_age_seconds=None),
        row_group_rows=5000,
    )
    for epoch in range(80):
        append_epoch(sink, epoch, batch_rows(epoch, 100))
        sink._roll(force=False)  # what the sink does after each batch's seal
    sizes = sink.stats.file_sizes
    assert sink._sample is not None and sink._sample.rows > 0
    assert len(samples) >= 2, samples  # the first sample was small: the estimate was refined
    assert all(b >= sizing.RESAMPLE_GROWTH * a for a, b in itertools.pairwise(samples)), samples
    assert sink.ledger.bytes_per_log_byte() is not None
    assert len(sizes) >= 3, sizes
    for size in sizes:
        assert 0.8 * target <= size <= target, sizes
    sink.close()


def test_column_groups_hold_every_column_once_in_table_order_and_balance_bytes():
    table = pa.table(
        {
            "small": pa.array([i % 100 for i in range(1000)], pa.int8()),
            "big": pa.array(["x" * 100] * 1000),
            "mid": pa.array(range(1000), pa.int64()),
            "mid2": pa.array(range(1000), pa.int64()),
        }
    )
    groups = column_groups(table, 2)
    assert sorted(c for g in groups for c in g) == sorted(table.column_names)
    assert groups == [["big"], ["small", "mid", "mid2"]]  # the 100 KB column alone, the rest with each other
    assert column_groups(table, 8) == [["big"], ["mid"], ["mid2"], ["small"]]  # never more groups than columns
    assert column_groups(table, 1) == [table.column_names]


def test_a_large_sample_encoded_by_column_groups_has_the_size_of_one_encode(monkeypatch):
    """The groups' objects add up to the whole object's size within the bound the module states (0.1 %), with
    the dictionary columns the file would have, a nested column and the schema's metadata."""
    rows = 300_000
    table = pa.table(
        {
            "id": pa.array(range(rows), pa.int64()),
            "text": pa.array([f"value-{i % 977}-{i * 7919 % 100_003}" for i in range(rows)]),
            "code": pa.array([f"c{i % 13}" for i in range(rows)]),
            "amount": pa.array([i * 0.37 % 1000 for i in range(rows)]),
            "nested": pa.StructArray.from_arrays(
                [pa.array(range(rows), pa.int32()), pa.array([f"n{i % 50_021}" for i in range(rows)])], ["a", "b"]
            ),
        },
        metadata={b"spark": b"x" * 2000},
    )
    options = {"compression": "zstd", "use_dictionary": ["code", "nested.b"], "store_schema": True}
    assert table.get_total_buffer_size() < sizing.PARALLEL_BYTES
    whole = encoded_size(table, options, 100_000)  # under PARALLEL_BYTES: one encode
    monkeypatch.setattr(sizing, "PARALLEL_BYTES", 0)
    for threads in (2, 3, 5):
        monkeypatch.setattr(sizing, "THREADS", threads)
        assert len(column_groups(table, threads)) == threads
        grouped = encoded_size(table, options, 100_000)
        assert whole <= grouped <= whole * 1.001, (threads, whole, grouped)
