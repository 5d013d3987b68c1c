"""A sink refuses what is not its own, before it writes or deletes anything: a log store claimed by another sink,
the batches of another streaming query, and a first batch above 0 on a new, empty state (the old state was lost).

The queries are real Spark streaming queries (a file source, available-now), so that the query id comes from the
checkpoint as it does in production.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from sink_helpers import append_epoch, batch_rows, input_file, parquet_files, read_pyarrow, run_query

from filesink import ExactlyOnceParquetSink, OutputClaimedError, Rollover
from logstore import LogStoreClaimedError
from logstore.home import CLAIM_FILE

HOLD = Rollover(target_file_size=None, max_age_seconds=None, max_epochs=1000)
"""Files are written only by flush(): every sealed row is held in the log store until then."""
SCHEMA = "id long, user_id long, event_date string, amount double"


def _sink(root: Path, state: str, *, output: str | None = None, **kwargs):
    return ExactlyOnceParquetSink(
        output or str(root / "out"), root / state, vnodes=8, parallelism=2, rollover=HOLD, **kwargs
    )


# -- the log store's claim ------------------------------------------------------------------------------------


@pytest.fixture(params=["local", "s3"])
def base(request, tmp_path):
    """(a base location for log stores and outputs, storage options)."""
    if request.param == "local":
        return str(tmp_path), None
    return request.getfixturevalue("s3_prefix"), request.getfixturevalue("s3_options")


def _files(sink) -> list[str]:
    return sorted(name for name, _ in sink.log_store.storage.list_files())


def test_a_log_store_claimed_by_another_sink_is_refused_and_nothing_is_deleted(tmp_path, base):
    url, options = base
    shared = f"{url}/shared-log"
    a = _sink(tmp_path, "state-a", output=f"{url}/out-a", log_store=shared, storage_options=options)
    append_epoch(a, 0, batch_rows(0, 200))
    append_epoch(a, 1, batch_rows(1, 100))
    before = _files(a)
    assert CLAIM_FILE in before and len([n for n in before if n.endswith(".seg")]) == 2
    with pytest.raises(
        LogStoreClaimedError,
        match=rf"durable home of sink {a.log_store.sink_id}, which writes to .*out-a.*not of this sink",
    ):
        _sink(tmp_path, "state-b", output=f"{url}/out-b", log_store=shared, storage_options=options)
    assert _files(a) == before, "the refused sink deleted nothing (its start-up would have swept A's segments)"
    a.flush()
    assert read_pyarrow(a.path, options) == Counter(batch_rows(0, 200)) + Counter(batch_rows(1, 100))
    a.close()


def test_two_sinks_with_log_stores_of_their_own_under_one_prefix_both_work(tmp_path, base):
    url, options = base
    sinks = [
        _sink(tmp_path, f"state-{n}", output=f"{url}/out-{n}", log_store=f"{url}/log/{n}", storage_options=options)
        for n in ("a", "b")
    ]
    for i, sink in enumerate(sinks):
        append_epoch(sink, 0, batch_rows(0, 50, seed=i))
        sink.flush()
    for i, sink in enumerate(sinks):
        assert read_pyarrow(sink.path, options) == Counter(batch_rows(0, 50, seed=i))
        sink.close()


# -- batches of another query, and a lost state ----------------------------------------------------------------


def test_the_batches_of_another_query_are_refused_even_a_replayed_batch_id(spark, tmp_path):
    """A deleted checkpoint: the new query's batch 0 has the id of the last sealed epoch, which was taken for a
    replay and skipped (its rows lost) before the sink recorded the query's id."""
    source = tmp_path / "input"
    expected = input_file(source, 0)
    sink = _sink(tmp_path, "state")
    assert run_query(spark, sink, source, tmp_path / "checkpoint") is None
    assert sink.log_store.last_sealed_epoch == 0
    recorded = sink.ledger.query_id()
    assert recorded

    input_file(source, 1)  # new rows, read by a query with a new checkpoint (a new query id) as its batch 0
    error = run_query(spark, sink, source, tmp_path / "checkpoint-new")
    assert error is not None
    message = str(error)
    assert "comes from streaming query" in message and recorded in message, message
    assert "Nothing of this batch was written" in message
    assert sink.log_store.last_sealed_epoch == 0, "nothing sealed"
    sink.close()

    # A restart with the original checkpoint goes on: its batches 1 and 2 read the files it has not read yet.
    expected += Counter(batch_rows(1, 300, seed=7)) + input_file(source, 2)
    again = _sink(tmp_path, "state")
    assert run_query(spark, again, source, tmp_path / "checkpoint") is None
    again.flush()
    assert read_pyarrow(again.path) == expected
    again.close()


def test_a_new_empty_state_refuses_a_first_batch_above_zero_unless_accepted(spark, tmp_path):
    """The driver's disk is lost with the state directory (and its local log store); the checkpoint survives. A
    new sink on the same output is refused at once (the output is the lost sink's); on a new output, the restarted
    query's first batch 1 is refused, nothing sealed. Accepted explicitly, the sink goes on from batch 1."""
    source = tmp_path / "input"
    first = input_file(source, 0)
    old = _sink(tmp_path, "state")
    old_id = old.log_store.sink_id
    assert run_query(spark, old, source, tmp_path / "checkpoint") is None
    old.close()  # rows of batch 0 are held in the old state's log store, never written

    second = input_file(source, 1)
    with pytest.raises(OutputClaimedError, match=rf"belongs to sink {old_id}.*accept_state_loss=True"):
        _sink(tmp_path, "state-new")

    lost = _sink(tmp_path, "state-new", output=str(tmp_path / "out-new"))
    error = run_query(spark, lost, source, tmp_path / "checkpoint")
    assert error is not None
    message = str(error)
    assert "StateLostError" in message and "batch 1 arrived" in message and "accept_state_loss=True" in message
    assert "Nothing of this batch was written" in message and "recorded itself as the owner of the output" in message
    assert lost.log_store.last_sealed_epoch == -1, "nothing sealed"
    lost.close()

    accepted = _sink(tmp_path, "state-new", accept_state_loss=True, output=str(tmp_path / "out-new"))
    assert run_query(spark, accepted, source, tmp_path / "checkpoint") is None
    accepted.flush()
    written = read_pyarrow(accepted.path)
    assert written == second, "batch 1 is written; batch 0's rows were held only by the lost state"
    assert not written & first
    accepted.close()

    replacing = _sink(tmp_path, "state-other", accept_state_loss=True)  # takes the lost sink's output over
    assert replacing.log_store.sink_id != old_id
    replacing.close()


# -- the output's claim ----------------------------------------------------------------------------------------


def test_an_output_written_by_another_sink_is_refused_and_nothing_is_written(tmp_path, base):
    """Two sinks on one output would both write every row they are given (4,000 rows for 2,000 ids)."""
    url, options = base
    a = _sink(tmp_path, "state-a", output=f"{url}/out", log_store=f"{url}/log-a", storage_options=options)
    append_epoch(a, 0, batch_rows(0, 100))
    a.flush()
    files = parquet_files(a.path, options)
    with pytest.raises(OutputClaimedError, match=rf"belongs to sink {a.log_store.sink_id}.*not to this sink"):
        _sink(tmp_path, "state-b", output=f"{url}/out", log_store=f"{url}/log-b", storage_options=options)
    assert parquet_files(a.path, options) == files
    append_epoch(a, 1, batch_rows(1, 100))
    a.flush()
    assert read_pyarrow(a.path, options) == Counter(batch_rows(0, 100)) + Counter(batch_rows(1, 100))
    a.close()
