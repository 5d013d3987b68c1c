"""What the sink's Spark tasks run leaves pandas unimported (filesink.arrowvalues says why: 0.3 s of CPU and tens of MB
in every Python worker). A fresh Python process, as a worker is, runs an append task's steps (the check that it sees
the driver's local directories, the admission, the segment, its row for the driver, a refusal's row, the row of a
task that does not see them) and a file writer's (the file, its row, the row of a file not written), then reports
which step imported pandas, if any; the rows it returns are checked here."""

from __future__ import annotations

import importlib.util
import json
import pickle
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from filesink.output import OutputLocation, prepare_staging
from filesink.output.limits import key_limits
from filesink.tasks.admission import Admission
from filesink.tasks.shared import shared_dirs
from filesink.tasks.writer import FileTask
from logstore import LogStore, append_segment, requestcounts

VNODES = 4

CHILD = r"""
import json, pickle, sys
from pathlib import Path

import pyarrow as pa

work = Path(sys.argv[1])
steps = {}

def step(name):
    steps[name] = "pandas" in sys.modules

from filesink.tasks import taskrows
from logstore import requestcounts
from filesink.tasks.writer import write_file
from logstore import append_segment

inputs = pickle.loads((work / "inputs.pkl").read_bytes())
rows = pa.ipc.open_file(str(work / "rows.arrow")).read_all()
step("start")
before = requestcounts.snapshot()
assert inputs["shared"].problem() is None
step("shared")
admitted = inputs["admission"].admit(rows.to_batches())
step("admission")
descriptor = append_segment(inputs["target"], inputs["epoch"], admitted, writer_id="p0-a0")
step("segment")
out = [taskrows.appended(pickle.dumps(descriptor), taskrows.task_counts(before, 1))]
out.append(taskrows.refused("rows of batch 7: refused \udcff"))
out.append(taskrows.unshared("not the driver's"))
step("append rows")
objects = write_file(inputs["output"], inputs["task"])
step("file")
out.append(taskrows.written(inputs["task"].name, pickle.dumps(objects), taskrows.task_counts(before, 0)))
out.append(taskrows.not_written("part-1", "not the driver's"))
step("file row")
with pa.ipc.new_file(str(work / "out.arrow"), out[0].schema) as w:
    for batch in out[:3]:
        w.write_batch(batch)
with pa.ipc.new_file(str(work / "written.arrow"), out[3].schema) as w:
    for batch in out[3:]:
        w.write_batch(batch)
print(json.dumps(steps))
"""


PARTITION_BY = ("day", "score")


def rows(first: int, count: int, partitioned: bool = False) -> pa.Table:
    """Rows with a timestamp in a zone given by a Java short id (its check converts a value in pyarrow), and the
    partition columns: a text and a float (the file writer splits rows by their directories)."""
    numbers = range(first, first + count)
    table = pa.table(
        {
            "id": pa.array(numbers, pa.int64()),
            "name": pa.array([f"row {i}" for i in numbers]),
            "ts": pa.array(numbers, pa.timestamp("us", tz="PST")),
            "__vnode": pa.array([i % VNODES for i in numbers], pa.int32()),
        }
    )
    if not partitioned:
        return table
    table = table.add_column(1, "day", pa.array([f"2026-11-{i % 3 + 1:02d}" for i in numbers]))
    return table.add_column(2, "score", pa.array([None if i % 7 == 0 else i % 2 + 0.5 for i in numbers], pa.float64()))


@pytest.mark.parametrize("partition_by", [(), PARTITION_BY], ids=["unpartitioned", "partitioned"])
def test_the_tasks_leave_pandas_unimported(tmp_path, partition_by):
    assert importlib.util.find_spec("pandas") is not None, "pandas is a dependency: the check would prove nothing"
    store = LogStore.open(tmp_path / "state", vnodes=VNODES)
    parted = bool(partition_by)
    try:
        store.seal(0, [append_segment(store.target, 0, rows(0, 500, parted), writer_id="w0")])
        plan = tuple(store.plan_read({v: -1 for v in range(VNODES)}, 0))
        columns = rows(0, 1, parted).drop_columns(["__vnode"]).schema
        task = FileTask(
            name="part-0",
            log=store.location,
            plan=plan,
            schema_bytes=columns.serialize().to_pybytes(),
            partition_by=partition_by,
        )
        output = OutputLocation(str(tmp_path / "out"))
        limits = key_limits(output) if parted else None
        admission = Admission(1, columns.serialize().to_pybytes(), partition_by, limits)
        term = store.home.take_term(0)
        prepare_staging(output, term)
        shared = shared_dirs(store, output, term)
        assert shared is not None and shared.log_nonce and shared.marker
        inputs = {"admission": admission, "target": store.target, "epoch": 1, "output": output, "task": task}
        inputs["shared"] = shared
        (tmp_path / "inputs.pkl").write_bytes(pickle.dumps(inputs))
        with pa.ipc.new_file(str(tmp_path / "rows.arrow"), rows(500, 300, parted).schema) as w:
            w.write_table(rows(500, 300, parted))

        done = subprocess.run(
            [sys.executable, "-c", CHILD, str(tmp_path)], capture_output=True, text=True, timeout=120, check=False
        )
        assert done.returncode == 0, done.stderr
        steps = json.loads(done.stdout)
        assert list(steps) == ["start", "shared", "admission", "segment", "append rows", "file", "file row"]
        imported = [name for name, has in steps.items() if has]
        assert imported == [], f"pandas was imported by the step(s) {imported}"

        appended = pa.ipc.open_file(str(tmp_path / "out.arrow")).read_all().to_pylist()
        descriptor = pickle.loads(appended[0]["descriptor"])
        assert (descriptor.epoch, descriptor.rows) == (1, 300)
        assert appended[0]["refused"] is None and appended[0]["unshared"] is None
        # The counts a task reports (a local log store and output make no requests; attempt 1 is a retry).
        assert requestcounts.decode(appended[0]["counts"]) == {("retries", "spark", "task"): 1}
        assert appended[1] == {
            "descriptor": None,
            "refused": "rows of batch 7: refused ?",
            "unshared": None,
            "counts": None,
        }
        assert appended[2] == {"descriptor": None, "refused": None, "unshared": "not the driver's", "counts": None}
        written = pa.ipc.open_file(str(tmp_path / "written.arrow")).read_all().to_pylist()
        assert [(r["name"], r["unshared"]) for r in written] == [("part-0", None), ("part-1", "not the driver's")]
        assert written[1]["objects"] is None
        assert [r["counts"] for r in written] == [None, None], "attempt 0, no requests: nothing to report"
        objects = pickle.loads(written[0]["objects"])
        assert sum(o.rows for o in objects) == 500
        if not parted:
            assert pq.read_table(Path(output.url) / objects[0].key).num_rows == 500
            return
        # 3 days, 2 scores and null: each object holds the rows of its directory, and every row is in one
        by_dir = {o.key.rsplit("/", 1)[0]: pq.read_table(Path(output.url) / o.key) for o in objects}
        assert len(by_dir) == 9
        logged = rows(0, 500, True).drop_columns(["ts"]).to_pylist()  # "PST" is a Java id, not a Python one
        for directory, table in by_dir.items():
            day, score = (part.split("=", 1)[1] for part in directory.split("/"))
            want = [
                r["id"]
                for r in logged
                if r["day"] == day and str(r["score"]) == score.replace("__HIVE_DEFAULT_PARTITION__", "None")
            ]
            assert sorted(table.column("id").to_pylist()) == want, directory
    finally:
        store.close()
