"""A log store writer run as a subprocess by the crash tests, so that it can be SIGKILLed anywhere.

Usage: python crash_child.py STATE_DIR EPOCHS ROWS_PER_WRITER [LOG_URL]

Appends epochs last_sealed+1 .. EPOCHS-1, two segments each, with rows that are a pure function of the epoch
(see ``epoch_rows``), sealing each;
prints ``started`` once open, then ``sealed N`` after each seal. Options for an S3 log URL come
from the ``CRASH_CHILD_S3`` environment variable (JSON).
"""

from __future__ import annotations

import json
import os
import sys

from helpers import make_rows

from logstore import LogStore, append_segment

VNODES = 8


def epoch_rows(epoch: int, writer: int, rows: int):
    first = (epoch * 2 + writer) * rows
    ids = range(first, first + rows)
    return make_rows(ids, [(i * 2654435761) % VNODES for i in ids])


def main() -> None:
    state_dir, epochs, rows = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    url = sys.argv[4] if len(sys.argv) > 4 else None
    options = json.loads(os.environ.get("CRASH_CHILD_S3", "{}"))
    store = LogStore.open(state_dir, url, vnodes=VNODES, storage_options=options)
    store.collect_garbage(unsealed=True)  # start-up: nothing can be appending
    print("started", flush=True)
    for epoch in range(store.last_sealed_epoch + 1, epochs):
        descs = [append_segment(store.target, epoch, epoch_rows(epoch, w, rows), writer_id=f"w{w}") for w in (0, 1)]
        store.seal(epoch, descs)
        print(f"sealed {epoch}", flush=True)
    store.close()


if __name__ == "__main__":
    main()
