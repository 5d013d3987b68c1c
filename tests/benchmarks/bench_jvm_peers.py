"""Our sink next to the JVM sinks our users would pick, side by side in the same Spark (the pinned Spark 4.1.1 with
the Delta and Iceberg connectors of ``tests/support/engines_env.py``), each to its end state:

- ``delta``: Delta's streaming sink (``writeStream.format("delta")``), then ``OPTIMIZE`` to our target file size
  (``spark.databricks.delta.optimize.maxFileSize``);
- ``iceberg``: Iceberg's streaming sink into a Hadoop catalog table, then
  ``CALL <catalog>.system.rewrite_data_files`` with ``target-file-size-bytes`` at our target;
- ``spark``: Spark's Parquet file sink (no compaction: its files are its end state);
- ``ours``, ``ours-delta``, ``ours-iceberg``: our sink writing a directory, a Delta table and an Iceberg table
  (its embedded SQLite catalog), flushed at the end.

Not a test (pytest does not collect it). Run from the repository root::

    python tests/benchmarks/bench_jvm_peers.py                   # 10,000,000 rows, 2 rounds, events
    python tests/benchmarks/bench_jvm_peers.py --quick           # 200,000 rows, 1 round: a smoke run
    python tests/benchmarks/bench_jvm_peers.py --rows 2000000 --variants ours,delta,iceberg --plot docs/x.png

Each run is a job process of its own (``bench_jvm_peers_job.py``) with ``local[2]`` Spark, 2 input files per
micro-batch, available-now trigger, over the same Parquet input (``--source parquet``), or over the same rows
as JSON values in a topic of a local Kafka broker (``--source kafka``, :func:`kafka_input`: every variant reads it
with Spark's Kafka source, as many records per batch as 2 input files hold). The order of the variants
alternates from round to round. Measured per run: seconds from the
query's start to the end state; steady-state rows/s (the rows of every batch but the first over the time from the
first batch's end to the last one's); CPU seconds per million rows of the job's process tree, split into the
JVM, the driver's Python and the Python workers (``/proc``, sampled); the files at the end; and how long a row
waits to be readable (the JVM sinks: a batch's trigger, from its planning to its commit; ours: from its batch's
planning to the moment a poller of the output saw a file holding it). Each end state is checked against the input
row by row: the sorted 64-bit hashes of every row (a multiset), not counts only. It prints the machine's load
before and after every run, the medians and the ratios measured in the same run.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import bench_sinks as sinks
import bench_sinks_data as data
import bench_sinks_monitor as monitor
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
SUPPORT = REPO / "tests" / "support"
JOB = HERE / "bench_jvm_peers_job.py"
VARIANTS = ("ours", "ours-delta", "ours-iceberg", "delta", "iceberg", "spark")
PEERS = ("delta", "iceberg", "spark")
LABELS = {
    "ours": "ours, directory",
    "ours-delta": "ours, Delta",
    "ours-iceberg": "ours, Iceberg",
    "delta": "Delta sink + OPTIMIZE",
    "iceberg": "Iceberg sink + rewrite_data_files",
    "spark": "Spark file sink",
}
TABLE_FORMATS = {"ours": "directory", "ours-delta": "delta", "ours-iceberg": "iceberg"}
SOURCES = ("parquet", "kafka")
PRODUCE_ROWS = 500_000
"""Rows written to the topic by one producer process (the broker's console producer, a JVM of its own)."""
PRODUCE_DEADLINE = 900.0
DEADLINE_SECONDS = 3600
SAMPLE_SECONDS = 0.25


@dataclass
class Run:
    variant: str
    round: int
    rows: int
    seconds: float
    query_seconds: float
    steady_rows_per_second: float
    cpu: dict[str, float]
    files: int
    latencies: list[float]
    load: tuple[float, float]
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def cpu_per_million(self) -> float:
        return sum(self.cpu.values()) / (self.rows / 1e6)


class CpuSampler:
    """CPU seconds of a process and its descendants, by part (``jvm``, ``driver`` Python, Python ``workers``):
    every process's last sampled user+system time, so a process that ended counts up to its last sample."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.last: dict[tuple[int, str], tuple[str, float]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> CpuSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(SAMPLE_SECONDS)

    def sample(self) -> None:
        for pid in [self.pid, *monitor.descendants(self.pid)]:
            try:
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                exe = os.path.basename(os.readlink(f"/proc/{pid}/exe"))
            except OSError:
                continue
            part = "driver" if pid == self.pid else "jvm" if exe.startswith("java") else "workers"
            self.last[(pid, fields[19])] = (part, (int(fields[11]) + int(fields[12])) / monitor.TICK)

    def split(self) -> dict[str, float]:
        parts = {"jvm": 0.0, "driver": 0.0, "workers": 0.0}
        for part, seconds in self.last.values():
            parts[part] += seconds
        return parts


def recursive_lister(directory: Path) -> Any:
    def names() -> list[str]:
        return [p.name for p in directory.rglob("*.parquet")] if directory.exists() else []

    return names


# -- the end state, row by row ------------------------------------------------------------------------


def _normalized(table: pa.Table, names: list[str]) -> pa.Table:
    """The columns of the input, in its order, in one type per kind: timestamps as microseconds, plain strings."""
    columns = []
    for name in names:
        col = table.column(name)
        if pa.types.is_dictionary(col.type):
            col = col.cast(col.type.value_type)
        if pa.types.is_timestamp(col.type):
            col = pc.cast(col.cast(pa.timestamp("us", col.type.tz)), pa.int64())
        elif pa.types.is_large_string(col.type):
            col = col.cast(pa.string())
        columns.append(col)
    return pa.table(columns, names=names)


def row_hashes(files: list[str], names: list[str]) -> np.ndarray:
    """The sorted 64-bit hashes of every row of ``files`` (a multiset of rows)."""
    import pandas as pd

    parts = []
    for f in files:
        table = _normalized(pq.read_table(f.removeprefix("file://")), names)
        parts.append(pd.util.hash_pandas_object(table.to_pandas(), index=False).to_numpy())
    return np.sort(np.concatenate(parts)) if parts else np.empty(0, np.uint64)


def end_files(variant: str, out: Path) -> list[str]:
    """The data files of a run's end state."""
    if variant in ("ours", "spark"):
        return [str(p) for p in out.rglob("*.parquet") if not any(q.startswith(("_", ".")) for q in p.parts[-3:])]
    if variant in ("delta", "ours-delta"):
        from deltalake import DeltaTable

        return list(DeltaTable(str(out)).file_uris())
    if variant == "ours-iceberg":
        from pyiceberg.catalog.sql import SqlCatalog

        from filesink.destination.iceberg import CATALOG_NAME, EMBEDDED_CATALOG

        catalog = SqlCatalog(CATALOG_NAME, uri=f"sqlite:///{out}/{EMBEDDED_CATALOG}", warehouse=f"file://{out}")
        return [t.file.file_path for t in catalog.load_table("bench.events").scan().plan_files()]
    from pyiceberg.table import StaticTable

    metadata = out / "bench" / "events" / "metadata"
    version = (metadata / "version-hint.text").read_text().strip()
    table = StaticTable.from_metadata(str(metadata / f"v{version}.metadata.json"))
    return [t.file.file_path for t in table.scan().plan_files()]


# -- the Kafka source -------------------------------------------------------------------------------------

TOPIC = "bench-input"
KAFKA_PARTITIONS = 2


def kafka_input(work: Path, paths: list[Path], rows: int) -> tuple[Any, dict[str, Any]]:
    """A local broker (``tests/support/kafka_env.py``) holding the input's rows, in the files' order, in a topic of
    :data:`KAFKA_PARTITIONS` partitions, keyed by ``user_id``: each value the JSON of one row, a timestamp as its
    microseconds since the epoch. Every variant reads it from the earliest offsets with ``maxOffsetsPerTrigger`` at
    the rows of :data:`bench_sinks.FILES_PER_BATCH` input files, the parquet source's batch. Returns the broker and
    the jobs' ``kafka`` spec."""
    from kafka_env import kafka_home, start_broker

    home, reason = kafka_home()
    if home is None:
        raise SystemExit(f"no Kafka broker: {reason}")
    started = time.monotonic()
    broker = start_broker(home, work / "kafka")
    try:
        broker.create_topic(TOPIC, KAFKA_PARTITIONS)
        names = list(pq.read_schema(paths[0]).names)
        records: list[tuple[str, str]] = []
        for i, path in enumerate(paths):  # one producer (a JVM) per PRODUCE_ROWS rows, not per file
            rows_of_file = _normalized(pq.read_table(path), names).to_pylist()
            records += [(str(r["user_id"]), json.dumps(r, separators=(",", ":"))) for r in rows_of_file]
            if len(records) >= PRODUCE_ROWS or i == len(paths) - 1:
                broker.produce(TOPIC, records, deadline=PRODUCE_DEADLINE)
                records = []
        held = sum(broker.end_offsets(TOPIC).values())
        if held != rows:
            raise SystemExit(f"the topic {TOPIC} holds {held:,} records, not the input's {rows:,}")
    except BaseException:
        broker.stop()
        raise
    per_batch = data.file_rows(rows)[0] * sinks.FILES_PER_BATCH
    print(
        f"Kafka: {rows:,} rows as JSON in {TOPIC} ({KAFKA_PARTITIONS} partitions) in "
        f"{time.monotonic() - started:.1f} s; maxOffsetsPerTrigger {per_batch:,}",
        flush=True,
    )
    return broker, {"bootstrap": broker.bootstrap, "topic": TOPIC, "max_offsets_per_trigger": per_batch}


# -- one run ------------------------------------------------------------------------------------------


def _steady(progress: list[dict[str, Any]]) -> float:
    """Rows of every batch but the first over the seconds from the first batch's end to the last one's."""
    done = [p for p in progress if p["rows"] > 0]
    if len(done) < 2:
        return float("nan")
    ends = [sinks._parse_ts(p["timestamp"]) + p["durations_ms"].get("triggerExecution", 0) / 1000 for p in done]
    return sum(p["rows"] for p in done[1:]) / (ends[-1] - ends[0])


def _latencies(variant: str, result: dict[str, Any], seen: dict[str, float]) -> list[float]:
    progress = [p for p in result["progress"] if p["rows"] > 0]
    if variant in PEERS:
        return [p["durations_ms"].get("triggerExecution", 0) / 1000 for p in progress]
    # ours: a batch's rows are readable once every writer has a file whose end epoch is at or past the batch
    starts = {p["batch"]: sinks._parse_ts(p["timestamp"]) for p in progress}
    by_writer: dict[str, list[tuple[int, float]]] = {}
    for name, at in seen.items():
        parts = name.removesuffix(".parquet").split("-")
        if len(parts) == 7 and parts[0] == "part":
            by_writer.setdefault(f"{parts[4]}-{parts[5]}", []).append((int(parts[3]), at))
    out = []
    for batch, start in starts.items():
        times = [min((t for end, t in files if end >= batch), default=None) for files in by_writer.values()]
        if times and all(t is not None for t in times):
            out.append(max(t for t in times if t is not None) - start)
    return out


def run_once(
    args: argparse.Namespace, engines: Any, work: Path, input_dir: Path, expected: np.ndarray, variant: str, round_: int
) -> Run:
    name = f"{args.workload}-{variant}-r{round_}"
    job_dir = work / name
    job_dir.mkdir(parents=True)
    out = job_dir / "out"
    out.mkdir()
    rollover = sinks.side_by_side_rollover(args.rows, args.workload)
    kind = "ours" if variant in TABLE_FORMATS else variant
    spec = sinks.job_spec(
        variant,
        kind,
        job_dir,
        input_dir,
        args.rows,
        str(out),
        trigger_seconds=None,
        files_per_batch=sinks.FILES_PER_BATCH,
        rollover=rollover,
        workload=args.workload,
    )
    spec.update(jars=[str(j) for j in engines.jars], target_file_size=rollover["target_file_size"])
    if kind == "ours":
        spec["table_format"] = TABLE_FORMATS[variant]
        spec["table"] = "bench.events" if variant == "ours-iceberg" else None
    if args.kafka:
        spec["kafka"] = args.kafka
    spec_path = job_dir / "spec.json"
    spec_path.write_text(json.dumps(spec))
    env = {k: v for k, v in os.environ.items() if k not in ("SPARK_HOME", "PYTHONHOME", "VIRTUAL_ENV")}
    env = {k: v for k, v in env.items() if not k.startswith("PYSPARK_")}
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), str(REPO)])
    log = job_dir / "job.log"
    load_before = os.getloadavg()[0]
    with open(log, "wb") as job_log:
        child = subprocess.Popen(
            [str(engines.python), str(JOB), str(spec_path)], cwd=REPO, env=env, stdout=job_log, stderr=job_log
        )
        with CpuSampler(child.pid) as cpu, monitor.Poller(recursive_lister(out), sinks.POLL_SECONDS) as poller:
            try:
                child.wait(DEADLINE_SECONDS)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
    if child.returncode != 0:
        raise sinks._fail(f"{name} (exit {child.returncode})", log)
    load_after = os.getloadavg()[0]
    result = json.loads(spec_path.with_suffix(".result.json").read_text())
    files = end_files(variant, out)
    got = row_hashes(files, list(pq.read_schema(min(input_dir.glob("*.parquet"))).names))
    if got.shape != expected.shape or not np.array_equal(got, expected):
        raise SystemExit(
            f"{name}: the end state's rows differ from the input's ({len(got):,} rows in {len(files)} files, the "
            f"input {len(expected):,}); its files are in {job_dir}"
        )
    run = Run(
        variant,
        round_,
        args.rows,
        result["t_end"] - result["t_start"],
        result["t_query_end"] - result["t_start"],
        _steady(result["progress"]),
        cpu.split(),
        len(files),
        _latencies(variant, result, poller.seen.first_seen),
        (load_before, load_after),
    )
    print(
        f"  {variant}, round {round_}: {run.seconds:.1f} s to the end state (query {run.query_seconds:.1f} s), "
        f"steady {run.steady_rows_per_second:,.0f} rows/s, CPU {run.cpu_per_million:.1f} s/M rows "
        f"({', '.join(f'{k} {v:.1f}' for k, v in run.cpu.items())}), {run.files} files, rows checked "
        f"{len(got):,}; load {run.load[0]:.1f} -> {run.load[1]:.1f}",
        flush=True,
    )
    if not args.keep:
        shutil.rmtree(job_dir, ignore_errors=True)
    return run


# -- report ---------------------------------------------------------------------------------------------


def _med(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def report(runs: list[Run], variants: tuple[str, ...], rows: int, workload: str) -> list[str]:
    by = {v: [r for r in runs if r.variant == v] for v in variants}

    def row(title: str, cell: Any) -> str:
        return f"| {title} | " + " | ".join(cell(by[v]) for v in variants) + " |"

    lines = [
        f"`{workload}`, {rows:,} rows, {max(len(r) for r in by.values())} round(s), medians:",
        "",
        "| | " + " | ".join(LABELS[v] for v in variants) + " |",
        "|---|" + "---:|" * len(variants),
        row("seconds, query start to the end state", lambda rs: f"{_med([r.seconds for r in rs]):.1f}"),
        row("of which the query, s", lambda rs: f"{_med([r.query_seconds for r in rs]):.1f}"),
        row("rows/s to the end state", lambda rs: f"{rows / _med([r.seconds for r in rs]):,.0f}"),
        row("steady-state rows/s", lambda rs: f"{_med([r.steady_rows_per_second for r in rs]):,.0f}"),
        row("CPU s per M rows", lambda rs: f"{_med([r.cpu_per_million for r in rs]):.1f}"),
        row(
            "of which JVM / driver Python / workers",
            lambda rs: " / ".join(f"{_med([r.cpu[k] for r in rs]) / (rows / 1e6):.1f}" for k in rs[0].cpu),
        ),
        row("files at the end", lambda rs: ", ".join(str(r.files) for r in rs)),
        row(
            "seconds until a row is readable, median / max",
            lambda rs: (
                f"{_med([x for r in rs for x in r.latencies]):.1f} / "
                f"{max((x for r in rs for x in r.latencies), default=float('nan')):.1f}"
            ),
        ),
        row("load (1 min) before -> after", lambda rs: ", ".join(f"{r.load[0]:.1f} -> {r.load[1]:.1f}" for r in rs)),
        "",
    ]
    peers = [p for p in PEERS if p in by and p != "spark"]
    for ours in [v for v in variants if v in TABLE_FORMATS]:
        for peer in peers:
            ratios = _ratios(by[peer], by[ours])
            if ratios:
                verdict = "holds" if _med(ratios) >= 1.0 else "does NOT hold"
                lines.append(
                    f"- {LABELS[peer]}'s seconds over {LABELS[ours]}'s, by round: "
                    f"{', '.join(f'{x:.2f}' for x in ratios)}; median **{_med(ratios):.2f}** (goal >= 1.0: {verdict})."
                )
    return [*lines, ""]


def _ratios(numerator: list[Run], denominator: list[Run]) -> list[float]:
    top = {r.round: r.seconds for r in numerator}
    bottom = {r.round: r.seconds for r in denominator}
    return [top[k] / bottom[k] for k in sorted(top) if k in bottom]


def plot(runs: list[Run], variants: tuple[str, ...], rows: int, path: Path, load: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    names = [LABELS[v] for v in variants]
    seconds = [_med([r.seconds for r in runs if r.variant == v]) for v in variants]
    left.barh(names, seconds, color=["tab:blue" if v in TABLE_FORMATS else "tab:gray" for v in variants])
    left.set_xlabel("seconds, query start to the compacted end state (lower is better)")
    left.invert_yaxis()
    bottom = np.zeros(len(variants))
    for part, colour in (("jvm", "tab:orange"), ("driver", "tab:green"), ("workers", "tab:purple")):
        values = np.array([_med([r.cpu[part] for r in runs if r.variant == v]) / (rows / 1e6) for v in variants])
        right.barh(names, values, left=bottom, label=part, color=colour)
        bottom += values
    right.set_xlabel("CPU seconds per million rows")
    right.invert_yaxis()
    right.set_yticklabels([])
    right.legend()
    fig.suptitle(f"{rows:,} rows, local[2] Spark 4.1.1; {load}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--workload", default="events", choices=sorted(data.WORKLOADS))
    parser.add_argument(
        "--source",
        default="parquet",
        choices=SOURCES,
        help="kafka: the input's rows as JSON values in a topic of a local broker, read by every variant",
    )
    parser.add_argument("--quick", action="store_true", help="200,000 rows, 1 round")
    parser.add_argument("--dir", type=Path, default=None, help="where the runs' files go (a temp directory)")
    parser.add_argument("--keep", action="store_true", help="keep each run's files")
    parser.add_argument("--plot", type=Path, default=None, help="write the plot (PNG) here")
    parser.add_argument("--json", type=Path, default=None, help="write every run's figures here")
    parser.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated, of {', '.join(VARIANTS)}")
    parser.add_argument(
        "--first-round",
        type=int,
        default=1,
        help="number the rounds from this one (an even first round starts in the reverse order): a run of the "
        "rounds after an earlier run's, to be reported together with --from-json",
    )
    parser.add_argument(
        "--from-json", type=Path, nargs="+", default=None, help="report and plot the runs of --json files together"
    )
    args = parser.parse_args(argv)
    if args.from_json:
        saves = [json.loads(path.read_text()) for path in args.from_json]
        if len({saved["rows"] for saved in saves}) != 1:
            raise SystemExit("--from-json: the files hold runs of different row counts; report them apart")
        runs = [Run(**{**r, "load": tuple(r["load"])}) for saved in saves for r in saved["runs"]]
        variants = tuple(v for v in VARIANTS if any(r.variant == v for r in runs))
        loads = "; ".join(saved["loads"] for saved in saves)
        print("\n".join(report(runs, variants, saves[0]["rows"], args.workload)))
        print(loads)
        if args.plot:
            plot(runs, variants, saves[0]["rows"], args.plot, loads)
        return 0
    variants = tuple(v for v in VARIANTS if v in args.variants.split(","))
    if args.quick:
        args.rows, args.rounds = 200_000, 1
    sys.path.insert(0, str(SUPPORT))
    from engines_env import pinned_engines

    engines, reason = pinned_engines()
    if engines is None:
        raise SystemExit(f"no Spark with the Delta and Iceberg connectors: {reason}")
    started, load = time.monotonic(), os.getloadavg()
    work = data.work_directory(args.dir, "bench-jvm-peers-")
    print(f"{engines.python}; {os.cpu_count()} CPU(s); work in {work}; load {load[0]:.2f}", flush=True)
    stack = contextlib.ExitStack()
    try:
        input_dir = work / "input"
        paths = data.generate(input_dir, args.rows, data.WORKLOADS[args.workload])
        expected = row_hashes([str(p) for p in paths], list(pq.read_schema(paths[0]).names))
        args.kafka = None
        if args.source == "kafka":
            broker, args.kafka = kafka_input(work, paths, args.rows)
            stack.callback(broker.stop)
        runs = []
        for round_ in range(args.first_round, args.first_round + args.rounds):
            order = variants if round_ % 2 else variants[::-1]
            runs += [run_once(args, engines, work, input_dir, expected, v, round_) for v in order]
    finally:
        stack.close()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    end = os.getloadavg()
    loads = f"load (1/5/15 min) {load[0]:.2f}/{load[1]:.2f}/{load[2]:.2f} -> {end[0]:.2f}/{end[1]:.2f}/{end[2]:.2f}"
    print("\n".join(["", *report(runs, variants, args.rows, args.workload)]))
    print(f"{os.cpu_count()} CPU(s); {loads}; {(time.monotonic() - started) / 60:.1f} minutes.")
    if args.json:
        args.json.write_text(json.dumps({"rows": args.rows, "loads": loads, "runs": [r.__dict__ for r in runs]}))
    if args.plot:
        plot(runs, variants, args.rows, args.plot, loads)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
