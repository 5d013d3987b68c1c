"""Over 1,000 epochs the state database and the log store hold open work only, not history.

Spark plays no part in what is measured here, so the epochs are appended in-process with the log store's
driver-side append (the same segment format and seal the Spark tasks use) and rolled with the sink's own
roll step; each file is written in-process (there is no Spark session).
"""

from __future__ import annotations

import random
from collections import Counter

import pyarrow as pa
from sink_helpers import COLUMNS, batch_rows, parquet_files, read_pyarrow

from filesink import ExactlyOnceParquetSink, Rollover
from logstore.home import is_home_record


def test_state_and_log_stay_bounded_over_1000_epochs(tmp_path):
    path = str(tmp_path / "out")
    rules = Rollover(target_file_size=None, max_epochs=10, max_age_seconds=None)
    sink = ExactlyOnceParquetSink(path, tmp_path / "state", vnodes=8, parallelism=2, rollover=rules)
    store, state = sink.log_store, sink.ledger
    rng = random.Random(3)
    expected: Counter = Counter()
    peak = Counter()
    for epoch in range(1000):
        rows = batch_rows(epoch, 5)
        expected.update(rows)
        table = pa.table(dict(zip(COLUMNS, zip(*rows, strict=True), strict=True)))
        table = table.append_column("__vnode", pa.array([rng.randrange(8) for _ in rows], pa.int32()))
        if epoch == 0:
            state.record_schema("[]", None)
        desc = store.append(epoch, table)
        store.seal(epoch, [desc])
        if epoch == 0:
            from filesink.schema.conform import file_schema_bytes

            state.record_schema("[]", file_schema_bytes(desc.schema_bytes))
        sink._roll(force=False)
        for table_name in ("log_epochs", "log_segments", "log_segment_vnodes", "sink_files", "sink_file_vnodes"):
            count = store.db.execute(f"SELECT COUNT(*) FROM {table_name}").fetchone()[0]
            peak[table_name] = max(peak[table_name], count)
        peak["segment files"] = max(
            peak["segment files"], len([n for n, _ in store.storage.list_files() if not is_home_record(n)])
        )
    sink.flush()
    sink.close()
    # Open work: a writer's file holds 10 epochs with data for its vnodes, which can span a few more sealed
    # epochs when its vnodes get no rows in some of them. History (1,000 epochs) is gone.
    assert peak["log_epochs"] <= 20 and peak["log_segments"] <= 20, peak
    assert peak["log_segment_vnodes"] <= 20 * 8, peak
    assert peak["sink_files"] == 0 and peak["sink_file_vnodes"] == 0, "files are pending only inside a roll"
    assert peak["segment files"] <= 20, peak
    assert 2 * 80 <= len(parquet_files(path)) <= 2 * 100
    assert read_pyarrow(path) == expected
