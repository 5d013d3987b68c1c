"""One roll of the sink into a partitioned table, without Spark (``sink_helpers.append_epoch``), run as a
subprocess so that a failpoint can stop or kill it mid-roll (``logstore.failpoints``).

Usage: python engine_roll_job.py TABLE STATE FORMAT FIRST_EPOCH EPOCHS

Appends epochs FIRST_EPOCH .. FIRST_EPOCH + EPOCHS - 1 (``sink_helpers.batch_rows``), flushes (one roll: one table
commit) and prints ``done``. An Iceberg table is ``engine_tables.TABLE`` in the embedded catalog beside the table.
"""

from __future__ import annotations

import sys

from engine_tables import TABLE
from sink_helpers import append_epoch, batch_rows

from filesink import ExactlyOnceParquetSink, Rollover

HOLD = Rollover(target_file_size=None, max_age_seconds=None, max_epochs=1000)


def open_sink(table: str, state: str, table_format: str) -> ExactlyOnceParquetSink:
    extra = {"table": TABLE} if table_format == "iceberg" else {}
    return ExactlyOnceParquetSink(
        table,
        state,
        vnodes=8,
        parallelism=2,
        rollover=HOLD,
        table_format=table_format,
        partition_by=["event_date"],
        **extra,
    )


def main() -> None:
    table, state, table_format, first, epochs = sys.argv[1:6]
    with open_sink(table, state, table_format) as sink:
        for epoch in range(int(first), int(first) + int(epochs)):
            append_epoch(sink, epoch, batch_rows(epoch, 40))
        sink.flush()
    print("done", flush=True)


if __name__ == "__main__":
    main()
