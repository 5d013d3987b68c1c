"""A streaming job without Spark, for the failpoint tests: the sink's per-epoch protocol driven in one process
(append and seal an epoch, then roll over), so that a failpoint can raise, kill or hang anywhere in it, file
writing and start-up recovery included.

Usage: python matrix_job.py STATE OUTPUT EPOCHS PARALLELISM

The rows of epoch ``e`` are ``epoch_rows(e)`` (``MATRIX_JOB_ROWS`` of them, default 60). With ``MATRIX_JOB_S3``
set (JSON storage options), OUTPUT is an ``s3://`` URL and the log store is ``OUTPUT + "-log"``; with
``MATRIX_JOB_LOG`` set, the log store is that local directory. With ``MATRIX_JOB_TABLE`` set (``delta``,
``iceberg``), OUTPUT is a table of that format (Iceberg: ``matrix.events`` in the embedded catalog). Prints
``started`` once the sink is open (recovery done), ``epoch N`` after each epoch, ``done`` at the end. Started
again, it goes on from the last sealed epoch, as a Spark query does from its checkpoint.
"""

from __future__ import annotations

import json
import os
import sys
from collections import Counter
from pathlib import Path

from sink_helpers import append_epoch, batch_rows

from filesink import ExactlyOnceParquetSink, Rollover

RULES = Rollover(target_file_size=None, max_epochs=2, max_age_seconds=None)
PARTITION_BY = ("event_date",)


def epoch_rows(epoch: int) -> list[tuple]:
    return batch_rows(epoch, int(os.environ.get("MATRIX_JOB_ROWS") or 60), seed=5)


def expected_rows(epochs: int) -> Counter:
    expected: Counter = Counter()
    for e in range(epochs):
        expected.update(epoch_rows(e))
    return expected


def open_sink(state: str | Path, output: str, parallelism: int, options: dict | None) -> ExactlyOnceParquetSink:
    return ExactlyOnceParquetSink(
        output,
        state,
        log_store=output + "-log" if options else os.environ.get("MATRIX_JOB_LOG") or None,
        vnodes=8,
        parallelism=parallelism,
        partition_by=list(PARTITION_BY),
        rollover=RULES,
        storage_options=options,
        table_format=os.environ.get("MATRIX_JOB_TABLE") or "directory",
        table="matrix.events" if os.environ.get("MATRIX_JOB_TABLE") == "iceberg" else None,
    )


def run(state: str | Path, output: str, epochs: int, parallelism: int, options: dict | None = None) -> None:
    sink = open_sink(state, output, parallelism, options)
    print("started", flush=True)
    for epoch in range(sink.log_store.last_sealed_epoch + 1, epochs):
        append_epoch(sink, epoch, epoch_rows(epoch))  # what the sink's __call__ does with a Spark batch
        sink._roll(force=False)
        print(f"epoch {epoch}", flush=True)
    sink.flush()
    sink.close()
    print("done", flush=True)


def main() -> None:
    state, output, epochs, parallelism = sys.argv[1:5]
    options = json.loads(os.environ.get("MATRIX_JOB_S3") or "null")
    run(state, output, int(epochs), int(parallelism), options)


if __name__ == "__main__":
    main()
