"""A fresh ``local[2]`` session: start the Python workers' warm-up (:mod:`filesink.cli.warmup`), wait for it, then run a
``mapInArrow`` job whose tasks report when their worker process started. Prints one JSON object: the job's
submission time and each task's worker start time, both as seconds since the boot of the machine."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator

import pyarrow as pa

from filesink.cli.localspark import local_spark
from filesink.cli.warmup import start_python_workers


def _since_boot() -> float:
    with open("/proc/uptime") as f:
        return float(f.read().split()[0])


def _started(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    with open("/proc/self/stat") as f:
        ticks = int(f.read().rpartition(")")[2].split()[19])  # field 22: start time, in clock ticks since boot
    for _ in batches:
        pass
    yield pa.record_batch({"pid": [os.getpid()], "started": [ticks / os.sysconf("SC_CLK_TCK")]})


def main() -> None:
    spark = local_spark("warmup-job", cores=2)
    warm = start_python_workers(spark, 2)
    assert warm is not None  # a local master
    warm.join(float(sys.argv[1]))
    submitted = _since_boot()
    rows = spark.range(0, 2, 1, 2).mapInArrow(_started, "pid long, started double").collect()
    print(json.dumps({"warmed": not warm.is_alive(), "submitted": submitted, "started": [r.started for r in rows]}))
    spark.stop()


if __name__ == "__main__":
    main()
