"""The older of two drivers on one durable home, run as a subprocess by the split-brain test.

Usage: python split_brain_job.py OUTPUT LOG_STORE STATE_DIR   (storage options as JSON in SPLIT_BRAIN_S3)

Opens the sink, seals epochs 0 and 1 (rows held), prints ``ready`` and waits for a line on standard input (the
newer driver has started by then). Then it tries, in turn, to seal epoch 2, to pre-commit (flush), to commit
(idle vnodes) and to sweep the log store, printing ``<step>: <outcome>`` for each (``fenced`` or ``done``),
and ``end``. It never closes the sink (the driver is cut off, not stopped).
"""

from __future__ import annotations

import json
import os
import sys

from sink_helpers import append_epoch, batch_rows

from filesink import ExactlyOnceParquetSink, FencedError, Rollover

HOLD = Rollover(target_file_size=None, max_age_seconds=None, max_epochs=1000)


def main() -> None:
    output, log_store, state = sys.argv[1:4]
    options = json.loads(os.environ.get("SPLIT_BRAIN_S3", "{}")) or None
    sink = ExactlyOnceParquetSink(
        output, state, log_store=log_store, vnodes=8, parallelism=2, rollover=HOLD, storage_options=options
    )
    for epoch in range(2):
        append_epoch(sink, epoch, batch_rows(epoch, 100, seed=5))
    print("ready", flush=True)
    sys.stdin.readline()
    steps = {
        "seal": lambda: append_epoch(sink, 2, batch_rows(2, 100, seed=5)),
        "pre-commit": sink.flush,
        "commit": lambda: sink.ledger.commit([], {}, range(8), sink.term),
        "sweep": lambda: sink.log_store.collect_garbage(sweep=True, unsealed=True),
    }
    for step, action in steps.items():
        try:
            action()
        except FencedError:
            print(f"{step}: fenced", flush=True)
        else:
            print(f"{step}: done", flush=True)
    print("end", flush=True)


if __name__ == "__main__":
    main()
