"""What the sink's Spark tasks run leaves pandas unimported (filesink.arrowvalues says why: 0.3 s of CPU and tens of MB
in every Python worker). A fresh Python process, as a worker is, runs an append task's steps (the admission, the
segment, its row for the driver, a refusal's row) and a file writer's (the file, its row), then reports which step
imported pandas, if any; the rows it returns are checked here."""

from __future__ import annotations

import importlib.util
import json
import pickle
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from filesink.admission import Admission
from filesink.output import OutputLocation
from filesink.writer import FileTask
from logstore import LogStore, append_segment

VNODES = 4

CHILD = r"""
import json, pickle, sys
from pathlib import Path

import pyarrow as pa

work = Path(sys.argv[1])
steps = {}

def step(name):
    steps[name] = "pandas" in sys.modules

from filesink import taskrows
from filesink.writer import write_file
from logstore import append_segment

inputs = pickle.loads((work / "inputs.pkl").read_bytes())
rows = pa.ipc.open_file(str(work / "rows.arrow")).read_all()
step("start")
admitted = inputs["admission"].admit(rows.to_batches())
step("admission")
descriptor = append_segment(inputs["target"], inputs["epoch"], admitted, writer_id="p0-a0")
step("segment")
out = [taskrows.appended(pickle.dumps(descriptor)), taskrows.refused("rows of batch 7: refused \udcff")]
step("append rows")
objects = write_file(inputs["output"], inputs["task"])
step("file")
out.append(taskrows.written(inputs["task"].name, pickle.dumps(objects)))
step("file row")
with pa.ipc.new_file(str(work / "out.arrow"), out[0].schema) as w:
    w.write_batch(out[0])
    w.write_batch(out[1])
with pa.ipc.new_file(str(work / "written.arrow"), out[2].schema) as w:
    w.write_batch(out[2])
print(json.dumps(steps))
"""


def rows(first: int, count: int) -> pa.Table:
    """Rows with a timestamp in a zone given by a Java short id (its check converts a value in pyarrow)."""
    return pa.table(
        {
            "id": pa.array(range(first, first + count), pa.int64()),
            "name": pa.array([f"row {i}" for i in range(first, first + count)]),
            "ts": pa.array(range(first, first + count), pa.timestamp("us", tz="PST")),
            "__vnode": pa.array([i % VNODES for i in range(first, first + count)], pa.int32()),
        }
    )


def test_the_tasks_leave_pandas_unimported(tmp_path):
    assert importlib.util.find_spec("pandas") is not None, "pandas is a dependency: the check would prove nothing"
    store = LogStore.open(tmp_path / "state", vnodes=VNODES)
    try:
        store.seal(0, [append_segment(store.target, 0, rows(0, 500), writer_id="w0")])
        plan = tuple(store.plan_read({v: -1 for v in range(VNODES)}, 0))
        columns = rows(0, 1).drop_columns(["__vnode"]).schema
        task = FileTask(name="part-0", log=store.location, plan=plan, schema_bytes=columns.serialize().to_pybytes())
        output = OutputLocation(str(tmp_path / "out"))
        admission = Admission(1, columns.serialize().to_pybytes())
        inputs = {"admission": admission, "target": store.target, "epoch": 1, "output": output, "task": task}
        (tmp_path / "inputs.pkl").write_bytes(pickle.dumps(inputs))
        with pa.ipc.new_file(str(tmp_path / "rows.arrow"), rows(500, 300).schema) as w:
            w.write_table(rows(500, 300))

        done = subprocess.run(
            [sys.executable, "-c", CHILD, str(tmp_path)], capture_output=True, text=True, timeout=120, check=False
        )
        assert done.returncode == 0, done.stderr
        steps = json.loads(done.stdout)
        assert list(steps) == ["start", "admission", "segment", "append rows", "file", "file row"]
        imported = [name for name, has in steps.items() if has]
        assert imported == [], f"pandas was imported by the step(s) {imported}"

        appended = pa.ipc.open_file(str(tmp_path / "out.arrow")).read_all().to_pylist()
        descriptor = pickle.loads(appended[0]["descriptor"])
        assert (descriptor.epoch, descriptor.rows) == (1, 300)
        assert appended[0]["refused"] is None
        assert appended[1] == {"descriptor": None, "refused": "rows of batch 7: refused ?"}
        written = pa.ipc.open_file(str(tmp_path / "written.arrow")).read_all().to_pylist()
        assert [r["name"] for r in written] == ["part-0"]
        objects = pickle.loads(written[0]["objects"])
        assert sum(o.rows for o in objects) == 500
        path = Path(output.url) / objects[0].key
        assert pq.read_table(path).num_rows == 500
    finally:
        store.close()
