"""Our sink next to Spark's own Parquet sink and a Delta sink, side by side in one run.

Not a test (pytest does not collect it). Run from the repository root with the project and its ``bench`` extra
installed::

    python tests/benchmarks/bench_sinks.py                 # 10,000,000 rows, 10,000 epochs of history
    python tests/benchmarks/bench_sinks.py --workloads events   # one workload only
    python tests/benchmarks/bench_sinks.py --quick         # 200,000 rows, 200 epochs of history: a smoke run

For each workload (``--workloads``, ``bench_sinks_data.WORKLOADS``) it generates the input (Parquet files) and
streams it with the same trigger and parallelism through Spark's Parquet sink, ``foreachBatch`` +
``write_deltalake`` (with an application transaction per batch) and our sink to a local directory, each in its
own process with its own local Spark; on ``events`` also our sink to S3 (a SeaweedFS server the script starts).
Then, on ``events``, it measures the file count at 1-second triggers, what readers (DuckDB, Polars) gain from
our output over Spark's sink's when both are partitioned (``bench_sinks_readers.py``), restart time and state
size against history, and peak writer memory against target file size. It prints its tables and writes them,
with the machine and versions, between the markers of ``docs/benchmarks.md`` (``--report``), with a plot
(``--plot``). Every figure is measured in the run; no goal is asserted. See ``docs/benchmarks.md``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import bench_sinks_data as data
import bench_sinks_monitor as monitor
import bench_sinks_readers as readers

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
MiB = 2**20
MB = 1e6
FULL_ROWS = 10_000_000
QUICK_ROWS = 200_000
MAX_AGE_SECONDS = 60.0
PARALLELISM = 2
FILES_PER_BATCH = 2
POLL_SECONDS = 0.1
LOAD_WARNING = 2.5
BEGIN_MARK = "<!-- bench_sinks: begin (written by tests/benchmarks/bench_sinks.py) -->"
END_MARK = "<!-- bench_sinks: end -->"

# Goals of the issue, reported (never asserted).
GOAL_THROUGHPUT = 1.0
GOAL_THROUGHPUT_WORKLOADS = ("events", "strings")
"""The workloads the throughput goal is judged on; the others are reported without a goal."""
GOAL_FEWER_FILES = 10.0
GOAL_IN_BAND = 0.9
GOAL_RESTART = 1.2
GOAL_STATE = 1.1
GOAL_WRITER_MEMORY = 1.1


# -- running one job -------------------------------------------------------------------------------------


@dataclass
class SinkRun:
    """The measured figures of one streaming job."""

    label: str
    kind: str
    rows: int
    seconds: float
    files: list[int]
    latencies: list[float]
    memory: monitor.MemoryPeaks
    batches: int
    rows_out: int
    size_rolled: list[int] = field(default_factory=list)
    """Our sink: sizes of the files rolled by the size rule."""
    size_rolled_later: list[int] = field(default_factory=list)
    """The same without each writer's first file (planned by a sampled Parquet/log ratio, before any commit)."""
    rollover: dict[str, Any] = field(default_factory=dict)
    load: tuple[float, float] = (0.0, 0.0)
    workload: str = "events"
    output: str = ""
    """Where the output is (a local directory or an S3 URL)."""

    @property
    def rows_per_second(self) -> float:
        return self.rows / self.seconds


def slug(label: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", label.lower()).strip("-")


def job_name(label: str, workload: str) -> str:
    """A job's directory (and S3 prefix): the label's slug, after the workload's name unless it is ``events``."""
    return slug(label if workload == "events" else f"{workload} {label}")


def _percentile(values: list[float] | list[int], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    k = (len(ordered) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def _run_child(args: list[str], log: Path) -> subprocess.Popen[str]:
    with open(log, "w") as out:
        return subprocess.Popen(
            [sys.executable, *args], cwd=REPO, stdout=subprocess.PIPE, stderr=out, text=True, start_new_session=True
        )


def _fail(what: str, log: Path) -> SystemExit:
    tail = "\n".join(log.read_text(errors="replace").splitlines()[-40:]) if log.exists() else ""
    return SystemExit(f"{what} failed; the end of its log {log}:\n{tail}")


class Output:
    """An output location as a reader sees it: a local directory or an S3 prefix."""

    def __init__(self, url: str, s3: Any = None) -> None:
        self.url = url
        self.fs = s3.filesystem() if s3 is not None else None

    def _strip(self, url: str) -> str:
        return url.removeprefix("s3://")

    def lister(self, sub: str = "") -> Any:
        if self.fs is None:
            return monitor.local_lister(Path(self.url) / sub)
        path = self._strip(f"{self.url}/{sub}" if sub else self.url)
        fs = self.fs

        def names() -> list[str]:
            return [p.rsplit("/", 1)[-1] for p in fs.ls(path, refresh=True, detail=False)]

        return names

    def parquet_files(self) -> dict[str, int]:
        """Relative key -> size of every Parquet file, outside ``_``/``.`` directories (Spark's and Delta's logs)."""
        found: dict[str, int] = {}
        if self.fs is None:
            root = Path(self.url)
            for path in root.rglob("*.parquet"):
                rel = path.relative_to(root)
                if not any(part.startswith(("_", ".")) for part in rel.parts):
                    found[str(rel)] = path.stat().st_size
            return found
        prefix = self._strip(self.url)
        for key, info in self.fs.find(prefix, detail=True).items():
            if key.endswith(".parquet"):
                found[key[len(prefix) + 1 :]] = int(info["size"])
        return found

    def rows(self, keys: list[str]) -> int:
        import pyarrow.parquet as pq

        total = 0
        for key in keys:
            if self.fs is None:
                total += pq.read_metadata(Path(self.url) / key).num_rows
            else:
                with self.fs.open(f"{self._strip(self.url)}/{key}", "rb") as f:
                    total += pq.ParquetFile(f).metadata.num_rows
        return total


def _parse_ts(text: str) -> float:
    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def _batch_latencies(kind: str, result: dict[str, Any], seen: dict[str, float], output: Output) -> list[float]:
    """Per batch with rows: seconds from the batch's end to the moment a poller saw its rows (see the docs)."""
    rows_of = {p["batch"]: p["rows"] for p in result["progress"]}
    visible: dict[int, float] = {}
    ends: dict[int, float] = {}
    if kind == "spark":
        # The batch ends when its trigger does; its rows are visible to Spark readers once _spark_metadata/<id> is.
        for p in result["progress"]:
            if p["rows"] > 0:  # idle triggers report the next batch id with no rows
                ends[p["batch"]] = _parse_ts(p["timestamp"]) + p["durations_ms"].get("triggerExecution", 0) / 1000
        for name, at in seen.items():
            head = name.split(".")[0]
            if head.isdigit():
                visible[int(head)] = min(at, visible.get(int(head), at))
    else:
        ends = {e["batch"]: e["end"] for e in result["ends"] if not e.get("skipped")}
    if kind == "delta":
        log_dir = Path(output.url) / "_delta_log"
        for name, at in seen.items():
            if not name.endswith(".json"):
                continue
            for line in (log_dir / name).read_text().splitlines():
                txn = json.loads(line).get("txn")
                if txn is not None:
                    visible[int(txn["version"])] = at
    if kind == "ours":
        # A batch's rows are visible once every writer (vnode range) has a file whose end epoch is at or past it.
        by_writer: dict[str, list[tuple[int, float]]] = {}
        for name, at in seen.items():
            parts = name.removesuffix(".parquet").split("-")
            if len(parts) == 7 and parts[0] == "part":
                by_writer.setdefault(f"{parts[4]}-{parts[5]}", []).append((int(parts[3]), at))
        for batch in ends:
            times = [min((t for end, t in files if end >= batch), default=None) for files in by_writer.values()]
            if times and all(t is not None for t in times):
                visible[batch] = max(t for t in times if t is not None)
    return [visible[b] - ends[b] for b in sorted(ends) if rows_of.get(b, 0) > 0 and b in visible]


def side_by_side_rollover(rows: int, workload: str = "events") -> dict[str, Any]:
    """Our sink's rollover in the side-by-side runs (``Rollover`` keywords): a 60-second age rule and the
    workload's target (16 MiB for ``events``) at 10 M rows, scaled with the rows of an input file, so that a batch
    is the same share of a file at every scale."""
    return {
        "target_file_size": int(data.WORKLOADS[workload].target_mib * MiB * data.file_rows(rows)[0] / 100_000),
        "max_age_seconds": MAX_AGE_SECONDS,
    }


def job_spec(
    label: str,
    kind: str,
    job: Path,
    input_dir: Path,
    rows: int,
    output_url: str,
    *,
    trigger_seconds: float | None,
    files_per_batch: int,
    rollover: dict[str, Any],
    storage_options: dict[str, Any] | None = None,
    workload: str = "events",
    partition_by: list[str] | None = None,
) -> dict[str, Any]:
    """What ``bench_sinks_jobs.run`` runs: one sink over the input, its checkpoint and state under ``job``."""
    return {
        "name": label,
        "kind": kind,
        "workload": workload,
        "partition_by": partition_by or [],
        "input": str(input_dir),
        "output": output_url,
        "checkpoint": str(job / "checkpoint"),
        "state": str(job / "state"),
        "rows": rows,
        "parallelism": PARALLELISM,
        "max_files_per_trigger": files_per_batch,
        "trigger_seconds": trigger_seconds,
        "rollover": rollover,
        "storage_options": storage_options,
    }


def run_sink(
    label: str,
    kind: str,
    work: Path,
    input_dir: Path,
    rows: int,
    *,
    output: Output,
    trigger_seconds: float | None,
    files_per_batch: int,
    rollover: dict[str, Any],
    s3: Any = None,
    workload: str = "events",
    partition_by: list[str] | None = None,
) -> SinkRun:
    """Run one streaming job in a child process while this process samples its memory and lists its output."""
    job = work / job_name(label, workload)
    shutil.rmtree(job, ignore_errors=True)
    job.mkdir(parents=True)
    spec = job_spec(
        label,
        kind,
        job,
        input_dir,
        rows,
        output.url,
        trigger_seconds=trigger_seconds,
        files_per_batch=files_per_batch,
        rollover=rollover,
        storage_options=s3.storage_options() if s3 is not None else None,
        workload=workload,
        partition_by=partition_by,
    )
    spec_path = job / "spec.json"
    spec_path.write_text(json.dumps(spec))
    sub = {"spark": "_spark_metadata", "delta": "_delta_log", "ours": ""}[kind]
    log = job / "job.log"
    load_before = os.getloadavg()[0]
    child = _run_child([str(HERE / "bench_sinks_jobs.py"), str(spec_path)], log)
    with monitor.MemorySampler(child.pid) as sampler, monitor.Poller(output.lister(sub), POLL_SECONDS) as poller:
        child.wait()
    if child.returncode != 0:
        raise _fail(f"the {label} job", log)
    result = json.loads(spec_path.with_suffix(".result.json").read_text())
    files = output.parquet_files()
    rows_out = output.rows(list(files))
    memory = sampler.peaks
    memory.driver_python = max(memory.driver_python, int(result["driver_python_maxrss"]))
    run = SinkRun(
        label=label,
        kind=kind,
        rows=rows,
        seconds=result["t_end"] - result["t_start"],
        files=sorted(files.values()),
        latencies=_batch_latencies(kind, result, poller.seen.first_seen, output),
        memory=memory,
        batches=sum(1 for p in result["progress"] if p["rows"] > 0),
        rows_out=rows_out,
        load=(load_before, os.getloadavg()[0]),
        rollover=rollover,
        workload=workload,
        output=output.url,
    )
    if kind == "ours":
        sizes = {key.rsplit("/", 1)[-1].removesuffix(".parquet"): size for key, size in files.items()}
        firsts: dict[str, str] = {}
        for n in sorted(sizes, key=lambda n: n.split("-")[3]):  # by end epoch
            firsts.setdefault("-".join(n.split("-")[4:6]), n)
        rolled = [n for n, reason in result["reasons"].items() if reason == "size" and n in sizes]
        run.size_rolled = [sizes[n] for n in rolled]
        run.size_rolled_later = [sizes[n] for n in rolled if n not in firsts.values()]
    if rows_out != rows:
        print(f"  WARNING: {workload}, {label}: the output holds {rows_out:,} rows, the input {rows:,}")
    print(
        f"  {workload}, {label}: {run.rows_per_second:,.0f} rows/s, {len(run.files)} files, {run.batches} batches, "
        f"{run.seconds:.1f} s (load {run.load[0]:.1f} -> {run.load[1]:.1f})",
        flush=True,
    )
    return run


# -- history, restart and writer memory (bench_sinks_direct.py) ------------------------------------------


def _direct(args: list[str], log: Path) -> subprocess.Popen[str]:
    return _run_child([str(HERE / "bench_sinks_direct.py"), *args], log)


def _read_json_line(child: subprocess.Popen[str], key: str, log: Path) -> dict[str, Any]:
    assert child.stdout is not None
    for line in child.stdout:
        if line.startswith("{"):
            value: dict[str, Any] = json.loads(line)
            if key in value:
                return value
    raise _fail(f"child {child.args!r}", log)


def _kill(child: subprocess.Popen[str]) -> None:
    os.kill(child.pid, signal.SIGKILL)
    child.wait()


@dataclass
class History:
    epochs: int
    build_seconds: float
    restarts: list[float]
    recovered: list[int]
    state_bytes: int
    state_used: int


RESTART_ROUNDS = 5
"""Start-ups timed per history: one per history in each round, the histories in turn."""


def history_runs(
    work: Path, epochs: list[int], rows_per_epoch: int, rounds: int = RESTART_ROUNDS
) -> dict[int, History]:
    """For each number of epochs: build that history and SIGKILL the sink in the middle of the next epoch. Then
    time start-ups in ``rounds`` rounds, each starting every history's sink once (each also killed after one
    more epoch), so that a slow moment of the machine falls on all histories alike, not on one. Then open and
    close each sink cleanly and size its database."""
    jobs: dict[int, Path] = {}
    built: dict[int, float] = {}
    for n in epochs:
        job = jobs[n] = work / f"history-{n}"
        shutil.rmtree(job, ignore_errors=True)
        job.mkdir(parents=True)
        log = job / "history.log"
        child = _direct(["history", str(job / "state"), str(job / "out"), str(n), str(rows_per_epoch)], log)
        built[n] = _read_json_line(child, "done", log)["seconds"]
        _kill(child)  # in the middle of the next epoch
        print(f"  history {n:,} epochs: built in {built[n]:.0f} s", flush=True)
    times: dict[int, list[float]] = {n: [] for n in epochs}
    recovered: dict[int, list[int]] = {n: [] for n in epochs}
    for i in range(rounds):
        for n, job in jobs.items():
            rlog = job / f"restart-{i}.log"
            child = _direct(["restart", str(job / "state"), str(job / "out")], rlog)
            started = _read_json_line(child, "start_seconds", rlog)
            _read_json_line(child, "ready", rlog)
            _kill(child)
            times[n].append(started["start_seconds"])
            recovered[n].append(started["recovered_files"])
    results: dict[int, History] = {}
    for n, job in jobs.items():
        slog = job / "size.log"
        child = _direct(["size", str(job / "state"), str(job / "out")], slog)
        sized = _read_json_line(child, "file_bytes", slog)
        child.wait()
        results[n] = History(
            n, built[n], times[n], recovered[n], sized["file_bytes"] + sized["wal_bytes"], sized["used_bytes"]
        )
        print(
            f"  history {n:,} epochs: start-up after SIGKILL {', '.join(f'{t:.3f}' for t in times[n])} s; "
            f"state database {results[n].state_bytes:,} bytes",
            flush=True,
        )
    return results


@dataclass
class WriterMemory:
    target: int
    files: list[dict[str, Any]]

    @property
    def peak(self) -> int:
        return max(int(f["rss_peak"]) for f in self.files)

    @property
    def largest_file(self) -> int:
        return max(int(f["bytes"]) for f in self.files)


def writer_memory(work: Path, target: int, inputs: list[Path]) -> WriterMemory:
    job = work / f"writer-{target // MiB}MiB"
    shutil.rmtree(job, ignore_errors=True)
    job.mkdir(parents=True)
    log = job / "writer.log"
    child = _direct(["writer", str(job / "state"), str(job / "out"), str(target), *map(str, inputs)], log)
    measured = _read_json_line(child, "files", log)
    child.wait()
    result = WriterMemory(target, measured["files"])
    print(
        f"  writer, target {target // MiB} MiB: {len(result.files)} files, largest {result.largest_file / MB:.1f} MB, "
        f"peak writer RSS {result.peak / MB:.0f} MB",
        flush=True,
    )
    return result


# -- environment -----------------------------------------------------------------------------------------


def _command_version(args: list[str]) -> str:
    try:
        done = subprocess.run(args, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    text = (done.stdout + done.stderr).strip().splitlines()
    return text[0] if text else "unknown"


def machine() -> dict[str, str]:
    import deltalake
    import pyarrow
    import pyspark

    from filesink.demo.s3server import find_weed

    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return {
        "cpu": f"{os.cpu_count()} x {cpu}",
        "memory": f"{memory / 2**30:.0f} GiB",
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "pyspark": pyspark.__version__,
        "java": _command_version(["java", "-version"]),
        "pyarrow": pyarrow.__version__,
        "deltalake": deltalake.__version__,
        "seaweedfs": _command_version([find_weed(), "version"]),
    }


# -- report ----------------------------------------------------------------------------------------------


def _mb(n: float) -> str:
    return f"{n / MB:,.1f}"


def _seconds(values: list[float]) -> str:
    if not values:
        return "n/a"
    return f"{statistics.median(values):.2f} / {_percentile(values, 0.9):.2f} / {max(values):.2f}"


def _load_note(load: tuple[float, float]) -> str:
    return f"{load[0]:.1f} → {load[1]:.1f}" + (" ⚠" if max(load) > LOAD_WARNING else "")


def _rollover_text(run: SinkRun) -> str:
    if run.kind != "ours":
        return ""
    if not run.rollover:
        return ", `Rollover()` (128 MiB, 300 s)"
    parts = [f"{k}={v / MiB:g} MiB" if k == "target_file_size" else f"{k}={v:g}" for k, v in run.rollover.items()]
    return f", `Rollover({', '.join(parts)})`"


def main_table(runs: list[SinkRun]) -> list[str]:
    base = runs[0].rows_per_second
    lines = [
        "| sink | rows/s | vs (1) | files | file MB p10 / p50 / p90 | visible after batch end, s: median / p90 / max "
        "| JVM peak RSS MB | Python driver peak MB | Python workers peak MB | load avg |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for i, r in enumerate(runs, 1):
        sizes = " / ".join(_mb(_percentile(r.files, q)) for q in (0.1, 0.5, 0.9))
        lines.append(
            f"| ({i}) {r.label} | {r.rows_per_second:,.0f} | {r.rows_per_second / base:.2f}x | {len(r.files):,} | "
            f"{sizes} | {_seconds(r.latencies)} | {r.memory.jvm / MB:,.0f} | {r.memory.driver_python / MB:,.0f} | "
            f"{r.memory.workers / MB:,.0f} | {_load_note(r.load)} |"
        )
    return lines


@dataclass
class Readers:
    """The partitioned 1-second runs (Spark's sink, ours) and the readers' figures over their outputs."""

    runs: list[SinkRun]
    figures: list[readers.ReaderFigure]
    warnings: list[str]


def _size_columns(run: SinkRun) -> str:
    return " / ".join(_mb(_percentile(run.files, q)) for q in (0.1, 0.5, 0.9))


READER_OUTPUTS = ("Spark's sink", "ours")
"""The names of the partitioned runs' outputs in the readers' table."""


def readers_section(part: Readers) -> list[str]:
    return [
        f"What readers gain: 1-second triggers as above, both outputs partitioned by `{readers.PARTITION}` "
        f"({len(data.COUNTRIES)} values):",
        "",
        "| sink | files | file MB p10 / p50 / p90 | rows/s | load avg |",
        "|---|---:|---:|---:|---:|",
        *(
            f"| {r.label}{_rollover_text(r)} | {len(r.files):,} | {_size_columns(r)} | {r.rows_per_second:,.0f} | "
            f"{_load_note(r.load)} |"
            for r in part.runs
        ),
        "",
        "Queries over each output (`"
        + "`; `".join(f"{q}: {readers.QUERY_TEXT[q]}" for q in readers.QUERIES)
        + f"`), each in a fresh process, median of {readers.ROUNDS} runs of the query alone; the page cache is "
        "warm for both outputs. Files opened: distinct Parquet files the query's process opened successfully "
        + ("(`strace -f -e trace=openat,open`)." if shutil.which("strace") else "(n/a: strace is not installed)."),
        "",
        *readers.table(part.figures, *READER_OUTPUTS),
        *(["", *part.warnings] if part.warnings else []),
    ]


def report(
    args: argparse.Namespace,
    env: dict[str, str],
    all_runs: dict[str, list[SinkRun]],
    inputs: dict[str, tuple[int, int]],
    trigger_runs: list[SinkRun],
    part: Readers,
    histories: dict[int, History],
    writers: list[WriterMemory],
    target: int,
    loads: tuple[tuple[float, float, float], tuple[float, float, float]],
    wall: float,
) -> list[str]:
    """The report's lines. ``all_runs``: the side-by-side runs of each workload; ``inputs``: each workload's input
    files and bytes."""
    short, long = min(histories), max(histories)
    mid = 100 if 100 in histories else sorted(histories)[len(histories) // 2]
    ours = [r for r in all_runs.get("events", []) if r.kind == "ours"]
    spark = next(iter(all_runs.values()))[0]
    restart_ratio = statistics.median(histories[long].restarts) / statistics.median(histories[short].restarts)
    state_ratio = histories[long].state_bytes / histories[mid].state_bytes
    writer_ratio = writers[-1].peak / writers[0].peak
    sized_runs = [r for r in ours + trigger_runs if r.rollover.get("target_file_size") == target]
    size_rolled = [s for r in sized_runs for s in r.size_rolled]
    in_band = [s for s in size_rolled if 0.8 * target <= s <= target]
    later = [s for r in sized_runs for s in r.size_rolled_later]
    later_in_band = [s for s in later if 0.8 * target <= s <= target]
    t_spark, t_default, t_ours = trigger_runs
    fewer = len(t_spark.files) / max(1, len(t_default.files))
    fewer_sized = len(t_spark.files) / max(1, len(t_ours.files))
    growth = [max(f["rss_peak"] - f["rss_before"] for f in w.files) for w in writers]
    growth_ratio = growth[-1] / max(1, growth[0])

    def verdict(ok: bool) -> str:
        return "**holds**" if ok else "**does not hold**"

    def share(part: list[int], whole: list[int]) -> str:
        """``part`` of ``whole`` files in the band, and the verdict; no verdict when there are none to judge."""
        if not whole:
            return "no such files in this run (too few rows for the target): not measured"
        fraction = len(part) / len(whole)
        return f"{len(part)} of {len(whole)} ({fraction:.0%}): {verdict(fraction >= GOAL_IN_BAND)}"

    goals = []
    for name, runs in all_runs.items():
        mine = [r for r in runs if r.kind == "ours"]
        ratios = [r.rows_per_second / runs[0].rows_per_second for r in mine]
        text = ", ".join(f"{r.label.replace(',', '')} {x:.2f}x" for r, x in zip(mine, ratios, strict=True))
        if name in GOAL_THROUGHPUT_WORKLOADS:
            goals.append(
                f"- Throughput ≥ {GOAL_THROUGHPUT:.1f}x Spark's sink, `{name}`: {text}: "
                f"{verdict(max(ratios) >= GOAL_THROUGHPUT)}."
            )
        else:
            goals.append(f"- Throughput next to Spark's sink, `{name}` (no goal): {text}.")
    goals += [
        f"- ≥ {GOAL_FEWER_FILES:.0f}x fewer files than Spark's sink at 1-second triggers: {len(t_spark.files):,} "
        f"against {len(t_default.files):,} with the default `Rollover()`, {fewer:.1f}x: "
        f"{verdict(fewer >= GOAL_FEWER_FILES)}; "
        f"with the {target / MiB:g} MiB target {len(t_ours.files):,}, {fewer_sized:.1f}x: "
        f"{verdict(fewer_sized >= GOAL_FEWER_FILES)}.",
        f"- ≥ {GOAL_IN_BAND:.0%} of size-rolled files within 0.8-1.0x of the target ({target / MiB:g} MiB, "
        f"`events` runs (3), (4) and the 1-second run with that target): {share(in_band, size_rolled)}; without each "
        "writer's first file (planned by a sampled Parquet-to-log ratio, before the sink had committed a file) "
        f"{share(later_in_band, later)}.",
        f"- Restart time flat in history (ratio ≤ {GOAL_RESTART}): {long:,} against {short:,} epochs "
        f"{restart_ratio:.2f}: {verdict(restart_ratio <= GOAL_RESTART)}.",
        f"- State size flat in history (ratio ≤ {GOAL_STATE}): {long:,} against {mid:,} epochs {state_ratio:.2f}: "
        f"{verdict(state_ratio <= GOAL_STATE)}.",
        f"- Peak writer memory flat in target file size (ratio ≤ {GOAL_WRITER_MEMORY}): "
        f"{writers[-1].target // MiB} MiB against {writers[0].target // MiB} MiB {writer_ratio:.2f}: "
        f"{verdict(writer_ratio <= GOAL_WRITER_MEMORY)}; growth of the writer's RSS while writing "
        f"{growth_ratio:.2f}: {verdict(growth_ratio <= GOAL_WRITER_MEMORY)}.",
    ]
    when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    every_run = [r for runs in all_runs.values() for r in runs] + trigger_runs + part.runs
    busy = max(loads[0][0], loads[1][0]) > LOAD_WARNING or any(max(r.load) > LOAD_WARNING for r in every_run)

    def workload_target(name: str) -> int:
        return int(side_by_side_rollover(args.rows, name)["target_file_size"])

    keys = sorted({c for name in all_runs for c in data.WORKLOADS[name].key_columns})
    tables: list[str] = []
    for name, runs in all_runs.items():
        files, size = inputs[name]
        tables += [
            f"`{name}`: {data.WORKLOADS[name].description}; {files} input files, {size / MB:,.0f} MB:",
            "",
            *main_table(runs),
            "",
        ]
    lines = [
        f"Run of {when}: `python tests/benchmarks/bench_sinks.py {' '.join(args.argv)}`".rstrip() + ", "
        f"{args.rows:,} rows in {len(data.file_rows(args.rows))} input files, {wall / 60:.0f} minutes.",
        "",
        "Machine: " + "; ".join(f"{k} {v}" for k, v in env.items()) + ".",
        f"Load average (1/5/15 min) at the start {'/'.join(f'{x:.2f}' for x in loads[0])}, at the end "
        f"{'/'.join(f'{x:.2f}' for x in loads[1])}"
        + (
            f"; **some figures were taken while the 1-minute load average was above {LOAD_WARNING}** (⚠ below)."
            if busy
            else "."
        ),
        "",
        f"Side by side: `local[{PARALLELISM}]`, {PARALLELISM} shuffle partitions, available-now trigger with "
        f"{FILES_PER_BATCH} input files per batch ({spark.batches} batches of about "
        f"{args.rows // max(1, spark.batches):,} rows), one table per workload. Our sink: key "
        f"{', '.join(f'`{k}`' for k in keys)}, 256 vnodes, parallelism "
        f"{PARALLELISM}, `Rollover(target_file_size=..., max_age_seconds={MAX_AGE_SECONDS:g})` with the target "
        + ", ".join(f"{workload_target(w) / MiB:g} MiB for `{w}`" for w in all_runs)
        + " (a writer's file holds several batches), zstd; its time includes the final `flush()`.",
        "",
        *tables,
        f"At 1-second triggers, 1 input file per batch ({t_spark.batches} batches), the `events` input:",
        "",
        "| sink | files | file MB p10 / p50 / p90 | visible after batch end, s: median / p90 / max | rows/s "
        "| load avg |",
        "|---|---:|---:|---:|---:|---:|",
        *(
            f"| {r.label}{_rollover_text(r)} | {len(r.files):,} | {_size_columns(r)} | {_seconds(r.latencies)} | "
            f"{r.rows_per_second:,.0f} | {_load_note(r.load)} |"
            for r in trigger_runs
        ),
        "",
        f"Files, Spark's sink against ours: **{fewer:.1f}x fewer** with the default `Rollover()`, "
        f"**{fewer_sized:.1f}x fewer** with the {target / MiB:g} MiB target.",
        "",
        *readers_section(part),
        "",
        "| history | built in | start-up after SIGKILL, s (each run) | files recovered | state database bytes "
        "(file + WAL) | bytes in use |",
        "|---:|---:|---|---|---:|---:|",
    ]
    for n in sorted(histories):
        h = histories[n]
        lines.append(
            f"| {n:,} epochs | {h.build_seconds:.0f} s | {', '.join(f'{t:.3f}' for t in h.restarts)} | "
            f"{', '.join(map(str, h.recovered))} | {h.state_bytes:,} | {h.state_used:,} |"
        )
    lines += [
        "",
        f"Restart ratio ({long:,} / {short:,} epochs, medians): **{restart_ratio:.2f}**. "
        f"State size ratio ({long:,} / {mid:,} epochs): **{state_ratio:.2f}**.",
        "",
        "| target file size | files | largest file MB | peak writer RSS MB | RSS before writing MB | "
        "pyarrow peak allocation MB |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for w in writers:
        lines.append(
            f"| {w.target // MiB:,} MiB | {len(w.files)} | {_mb(w.largest_file)} | {_mb(w.peak)} | "
            f"{_mb(max(f['rss_before'] for f in w.files))} | {_mb(max(f['arrow_peak'] for f in w.files))} |"
        )
    lines += [
        "",
        f"Peak writer memory ratio: **{writer_ratio:.2f}**; ratio of the RSS growth while writing (peak minus RSS "
        f"before writing): **{growth_ratio:.2f}** ({growth[-1] / MB:.0f} MB against {growth[0] / MB:.0f} MB).",
        "",
        "Goals:",
        "",
        *goals,
    ]
    return lines


def write_report(path: Path, lines: list[str], plot_name: str) -> None:
    block = [BEGIN_MARK, *lines, "", f"![throughput and file sizes]({plot_name})", END_MARK]
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    if BEGIN_MARK in text and END_MARK in text:
        head, rest = text.split(BEGIN_MARK, 1)
        tail = rest.split(END_MARK, 1)[1]
        text = head + "\n".join(block) + tail
    else:
        text = text.rstrip("\n") + "\n\n## Results of the sink comparison\n\n" + "\n".join(block) + "\n"
    path.write_text(text)


def plot(
    path: Path, all_runs: dict[str, list[SinkRun]], trigger_runs: list[SinkRun], part_runs: list[SinkRun], target: int
) -> None:
    """Left: rows/s of each sink on each workload; right: the file sizes of the `events` runs."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    bars = [r for runs in all_runs.values() for r in runs]
    fig, (left, right) = plt.subplots(1, 2, figsize=(14, max(5.0, 0.3 * (len(bars) + len(part_runs)) + 1.5)))
    colors = {"spark": "#888", "delta": "#bbb", "ours": "#2a7"}
    left.barh(
        [f"{r.workload}: {r.label}" for r in bars],
        [r.rows_per_second / 1000 for r in bars],
        color=[colors[r.kind] for r in bars],
    )
    left.set_xlabel("thousand rows per second (higher is better)")
    left.invert_yaxis()
    left.set_title("throughput per workload, available-now trigger")
    runs = all_runs.get("events", [])
    shown = [*runs, *trigger_runs, *part_runs]
    names = [r.label for r in runs]
    names += [f"{r.label.removesuffix(' 1s')}, 1 s triggers" for r in trigger_runs + part_runs]
    right.boxplot([[s / MB for s in r.files] for r in shown], orientation="horizontal", whis=(10, 90), showfliers=True)
    right.set_yticks(range(1, len(shown) + 1), names)
    right.invert_yaxis()
    right.set_xscale("log")
    right.xaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
    right.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    right.axvline(target / MB, color="#2a7", linestyle="--", linewidth=1)
    right.set_xlabel(f"file size, MB (log scale; whiskers p10-p90; dashed line: our {target / MiB:g} MiB target)")
    right.set_title("output file sizes, events")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


# -- main ------------------------------------------------------------------------------------------------


PATH_OPTIONS = {"--dir": "DIR", "--report": "REPORT", "--plot": "PLOT"}


def without_paths(argv: list[str]) -> list[str]:
    """The command line as the report shows it: the values of path options become their names, so the report
    names no directory of the machine it ran on."""
    shown = []
    for i, arg in enumerate(argv):
        option, equals, _ = arg.partition("=")
        if equals and option in PATH_OPTIONS:
            shown.append(f"{option}={PATH_OPTIONS[option]}")
        elif i and argv[i - 1] in PATH_OPTIONS:
            shown.append(PATH_OPTIONS[argv[i - 1]])
        else:
            shown.append(arg)
    return shown


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Our sink next to Spark's Parquet sink and a Delta sink.")
    parser.add_argument("--rows", type=int, default=None, help=f"input rows (default {FULL_ROWS:,})")
    parser.add_argument("--quick", action="store_true", help=f"a smoke run: {QUICK_ROWS:,} rows, short histories")
    parser.add_argument("--history", type=int, default=None, help="epochs of the long history (default 10,000)")
    parser.add_argument("--report", type=Path, default=REPO / "docs" / "benchmarks.md", help="the Markdown report")
    parser.add_argument("--plot", type=Path, default=None, help="the PNG plot (default: next to the report)")
    parser.add_argument("--dir", type=Path, default=None, help="work directory (default: a temp dir in the cwd)")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    parser.add_argument(
        "--workloads",
        default=",".join(data.WORKLOADS),
        help=f"the side-by-side runs' workloads, comma-separated (default {','.join(data.WORKLOADS)})",
    )
    args = parser.parse_args(argv)
    workloads = [w.strip() for w in args.workloads.split(",") if w.strip()]
    unknown = [w for w in workloads if w not in data.WORKLOADS]
    if unknown or not workloads:
        parser.error(f"--workloads: unknown {', '.join(unknown) or 'none given'}; use {', '.join(data.WORKLOADS)}")
    args.argv = without_paths(sys.argv[1:] if argv is None else argv)
    args.rows = args.rows or (QUICK_ROWS if args.quick else FULL_ROWS)
    long_history = args.history or (200 if args.quick else 10_000)
    if long_history <= 100:
        parser.error("--history must be above 100")
    plot_path = args.plot or args.report.with_name("benchmarks-sinks.png")
    sized = side_by_side_rollover(args.rows)
    target = sized["target_file_size"]

    started = time.monotonic()
    load_start = os.getloadavg()
    env = machine()
    print(f"sink benchmark: {args.rows:,} rows; load average {load_start[0]:.2f}", flush=True)
    work = data.work_directory(args.dir, "bench_sinks-")
    from filesink.demo.s3server import SeaweedServer

    server = SeaweedServer(work / "seaweedfs")
    try:
        input_dir = work / "input"

        def input_of(name: str) -> Path:
            return input_dir if name == "events" else work / f"input-{name}"

        def make_input(name: str) -> Path:
            directory = input_of(name)
            paths = data.WORKLOADS[name].generate(directory, args.rows)
            size = sum(p.stat().st_size for p in paths)
            input_sizes[name] = (len(paths), size)
            print(f"input {name}: {len(paths)} files, {size / MB:.1f} MB", flush=True)
            return directory

        input_sizes: dict[str, tuple[int, int]] = {}
        make_input("events")
        inputs = sorted(input_dir.glob("*.parquet"))
        s3 = server.start()

        def side_by_side(
            label: str,
            kind: str,
            trigger: float | None,
            per_batch: int,
            remote: bool = False,
            rollover: dict[str, Any] | None = None,
            workload: str = "events",
            partition_by: list[str] | None = None,
        ) -> SinkRun:
            full = label + (" 1s" if trigger else "")
            name = job_name(full, workload)
            out = Output(s3.url(name), s3) if remote else Output(str(work / name / "out"))
            return run_sink(
                full,
                kind,
                work,
                input_of(workload),
                args.rows,
                output=out,
                trigger_seconds=trigger,
                files_per_batch=per_batch,
                rollover=(side_by_side_rollover(args.rows, workload) if rollover is None else rollover)
                if kind == "ours"
                else {},
                s3=s3 if remote else None,
                workload=workload,
                partition_by=partition_by,
            )

        all_runs: dict[str, list[SinkRun]] = {}
        for w in workloads:
            print(f"side by side, available-now trigger, workload {w}:", flush=True)
            if w != "events":
                make_input(w)
            all_runs[w] = [
                side_by_side("Spark parquet sink", "spark", None, FILES_PER_BATCH, workload=w),
                side_by_side("Delta (deltalake)", "delta", None, FILES_PER_BATCH, workload=w),
                side_by_side("ours, local", "ours", None, FILES_PER_BATCH, workload=w),
            ]
            if w == "events":
                all_runs[w].append(side_by_side("ours, S3", "ours", None, FILES_PER_BATCH, remote=True))
            elif not args.keep:  # the other workloads' inputs and outputs are not needed again: free the disk
                shutil.rmtree(input_of(w), ignore_errors=True)
                for r in all_runs[w]:
                    shutil.rmtree(work / job_name(r.label, w), ignore_errors=True)
        print("1-second triggers, one input file per batch:", flush=True)
        trigger_runs = [
            side_by_side("Spark parquet sink", "spark", 1.0, 1),
            side_by_side("ours, local, default rollover", "ours", 1.0, 1, rollover={}),
            side_by_side("ours, local", "ours", 1.0, 1),
        ]
        print(f"what readers gain: 1-second triggers, partitioned by {readers.PARTITION}:", flush=True)
        by = [readers.PARTITION]
        part_runs = [
            side_by_side(f"Spark parquet sink, by {readers.PARTITION}", "spark", 1.0, 1, partition_by=by),
            side_by_side(f"ours, local, by {readers.PARTITION}", "ours", 1.0, 1, rollover={}, partition_by=by),
        ]
        figures = readers.measure({name: Path(r.output) for name, r in zip(READER_OUTPUTS, part_runs, strict=True)})
        reader_warnings = readers.disagreements(figures, args.rows)
        for line in reader_warnings:
            print(f"  {line}", flush=True)
        part = Readers(part_runs, figures, reader_warnings)
        print("history (sink driven without Spark, see docs/benchmarks.md):", flush=True)
        histories = history_runs(work, [10, 100, long_history], 1000)
        print("writer memory:", flush=True)
        writers = [writer_memory(work, t, inputs) for t in (64 * MiB, 1024 * MiB)]

        load_end = os.getloadavg()
        wall = time.monotonic() - started
        lines = report(
            args,
            env,
            all_runs,
            input_sizes,
            trigger_runs,
            part,
            histories,
            writers,
            target,
            (load_start, load_end),
            wall,
        )
        print()
        print("\n".join(lines))
        plot(plot_path, all_runs, trigger_runs, part_runs, target)
        write_report(args.report, lines, os.path.relpath(plot_path, args.report.parent))
        print(f"\nwrote {args.report} and {plot_path}")
    finally:
        server.stop()
        if args.keep:
            print(f"work directory kept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
