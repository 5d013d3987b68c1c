"""The log store on S3 next to the log store on local disk, with the output on S3 in both, through a real Spark
streaming query: throughput, visibility latency and the S3 requests of each roll.

Not a test (pytest does not collect it). Run from the repository root::

    python tests/benchmarks/bench_s3_log_store.py                       # 2,500,000 rows, 2 rounds, both workloads
    python tests/benchmarks/bench_s3_log_store.py --quick               # a smoke run: 200,000 rows, 1 round
    python tests/benchmarks/bench_s3_log_store.py --workload strings --rounds 4
    python tests/benchmarks/bench_s3_log_store.py --plot docs/benchmarks-s3-log-store.png

It starts one SeaweedFS server on 127.0.0.1 (``filesink.demo.s3server.SeaweedServer``), generates each
workload's input once (``bench_sinks_data``, ``events`` and ``strings``), and streams it, in a job process of its
own with ``local[2]`` Spark (``bench_sinks_jobs.run``, the side-by-side setup of ``bench_sinks.py``: 2 input files
per micro-batch, available-now or ``--trigger`` seconds), into ``ExactlyOnceParquetSink`` with the output on S3:
once with ``log_store=`` an S3 URL and once with the log store in a local directory (the default, under the state
directory), alternating which goes first from round to round (and from workload to workload), each run at fresh
locations. Both runs use the same ``Rollover`` (``bench_sinks.side_by_side_rollover``: the workload's target
size, a 60-second age rule).

Per run it reports:

- seconds from ``writeStream...start()`` until every row is in a committed file (the query's end, then the
  sink's ``flush()`` and ``close()``), and rows/s;
- the visibility latency: for each batch, the seconds from the end of its ``foreachBatch`` call to the moment
  every writer has a file in the output that holds it, as ``bench_sinks.py`` measures it (this process lists the
  output every 0.1 s); the median over the batches. Files roll by the size and age rules, so this is mostly the
  wait for the next roll, and both runs have the same rules;
- the S3 requests, by process, by kind of key (log segments, output files, home records, ``writers/term``, ...)
  and by call, per roll (a roll: a call of the sink's roll step that committed files, the final flush included).
  Requests are counted by wrapping aiobotocore's ``_make_api_call`` (as ``bench_home.py`` does) in the driver
  (the job process) and in the executors' Python workers: the job's Spark runs this module as its Python daemon
  (``spark.python.daemon.module``), which installs the same counter before it starts ``pyspark.daemon``, so every
  worker it forks counts its calls and writes its counts to a file of the run after each call. The JVM makes no
  S3 call (the input is local). The listings of this process (the latency poller, the row count) are not counted.

It checks each run's output against the input: the rows in the Parquet footers of the committed files must be
the input's rows, or the script stops with an error. Then it prints, per workload, the figures of both runs side
by side and the ratios S3 / local (median over the rounds), with the load average before and after each run and
the CPU count. Goals (reported, not asserted): throughput with the log store on S3 at least 0.9x the local one;
visibility latency at most 1.2x. See ``docs/benchmarks.md``.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import datetime
import json
import os
import platform
import runpy
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import bench_home as home
import bench_sinks as sinks
import bench_sinks_data as data
import bench_sinks_monitor as monitor

from logstore.home import TERMS

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
MODULE = Path(__file__).stem
FULL_ROWS = 2_500_000
QUICK_ROWS = 200_000
WORKLOADS = ("events", "strings")
PLACES = ("S3", "local")
"""Where the log store is; the output is on S3 in both."""
COMPRESSION_ENV = "BENCH_LOG_COMPRESSION"
"""The job sets ``logstore.append.OBJECT_STORE_COMPRESSION`` from it (``none``: uncompressed); benchmark only."""
VARIANTS = {
    "uncached": ("the segment cache off", {"FILESINK_SEGMENT_CACHE_BYTES": "0"}),
    "lz4": ("the log's blocks in lz4 instead of zstd", {COMPRESSION_ENV: "lz4"}),
    "uncompressed": ("the log's blocks not compressed", {COMPRESSION_ENV: "none"}),
    "ipc-zstd": ("the log's blocks compressed buffer by buffer (format 1)", {COMPRESSION_ENV: "ipc:zstd"}),
}
"""``--variant NAME``: one more run per round, the log store on S3 with these variables set in its job."""
GOAL_THROUGHPUT = 0.9
GOAL_LATENCY = 1.2
REQUESTS_ENV = "BENCH_S3_LOG_STORE_REQUESTS"
"""The directory the counters of a run's processes write their counts into (set for the job's process tree)."""
WATCH_ENV = "BENCH_S3_LOG_STORE_WATCH"
"""JSON ``[bucket, log store URL, output URL]``: how the counters tell the keys apart."""
COLUMNS = ("GET", "PUT", "parts", "MPU", "LIST", "DELETE", "HEAD")
"""Columns of the request tables: ``parts`` are ``UploadPart``, ``MPU`` the other multipart calls."""


def column(operation: str) -> str:
    return "parts" if operation == "UploadPart" else home._VERB.get(operation, operation)


# -- counting S3 requests, in the driver and in the Python workers ------------------------------------------


class Counter(home.RequestCounter):
    """``bench_home``'s counter, by (step, kind of key, operation): the operation's own name (``UploadPart`` apart
    from the other multipart calls), the seconds its calls took, and the output's Parquet objects apart from its
    other keys. After every call it writes its counts to ``<directory>/<role>-<pid>.json``: a Python worker ends
    with ``os._exit``, so nothing would be written at its end."""

    def __init__(self, directory: Path, role: str) -> None:
        super().__init__()
        self.directory = directory
        self.role = role
        self.spent: collections.defaultdict[tuple[str, str, str], list[float]] = collections.defaultdict(lambda: [0, 0])
        """Seconds the calls took (summed) and bytes sent (PUT, parts) or received (GET)."""

    def install(self) -> None:
        from aiobotocore.client import AioBaseClient  # type: ignore[import-untyped]

        original = AioBaseClient._make_api_call
        counter = self

        async def counted(client: Any, operation: str, params: dict[str, Any]) -> Any:
            key = (counter.step, counter.what(str(params.get("Key", params.get("Prefix", "")))), operation)
            body = params.get("Body")  # before the call: botocore replaces it in params
            size = len(body) if isinstance(body, bytes | bytearray | memoryview) else 0
            started = time.perf_counter()
            try:
                response = await original(client, operation, params)
                if operation == "GetObject":
                    size = int(response.get("ContentLength") or 0)
                return response
            finally:
                counter.counts[key] += 1
                spent = counter.spent[key]
                spent[0] += time.perf_counter() - started
                spent[1] += size
                counter.dump()

        AioBaseClient._make_api_call = counted

    def what(self, key: str) -> str:
        kind = super().what(key)
        if kind == "output":
            return "output files" if key.endswith(".parquet") else "output, other"
        if kind == "home" and any(key.startswith(f"{log}/{TERMS}") for log in self.logs):
            return "home: terms"  # term records: taken at the start, listed by every term check
        return kind

    def dump(self) -> None:
        path = self.directory / f"{self.role}-{os.getpid()}.json"
        rows = [[*key, n, *self.spent[key]] for key, n in self.counts.items()]
        tmp = path.with_suffix(f".{threading.get_ident()}.tmp")
        tmp.write_text(json.dumps(rows))
        os.replace(tmp, path)


def counter_from_env(role: str) -> Counter:
    counter = Counter(Path(os.environ[REQUESTS_ENV]), role)
    bucket, log_url, output_url = json.loads(os.environ[WATCH_ENV])
    counter.watch(bucket, log_url, output_url)
    counter.install()
    return counter


def daemon() -> None:
    """The job's Python daemon (``spark.python.daemon.module``): the counter, then ``pyspark.daemon`` itself, whose
    forked workers inherit it. Nothing may go to stdout before the daemon writes its port there."""
    counter_from_env("worker")
    runpy.run_module("pyspark.daemon", run_name="__main__", alter_sys=True)


# -- the job process (the driver) ---------------------------------------------------------------------------


def _per_call(owner: Any, name: str, calls: list[dict[str, float]], sink: Any) -> None:
    """Record every call of ``owner.name``: when it started, its seconds, the files the sink committed in it, and
    the length of what it returned (the append's segments)."""
    original: Callable[..., Any] = getattr(owner, name)

    def recorded(*args: Any, **kwargs: Any) -> Any:
        files, started = sink.stats.files_committed, time.perf_counter()
        result = original(*args, **kwargs)
        calls.append(
            {
                "at": time.time(),
                "seconds": time.perf_counter() - started,
                "files": sink.stats.files_committed - files,
                "returned": len(result) if isinstance(result, list) else 0,
            }
        )
        return result

    setattr(owner, name, recorded)


def job(spec_path: Path) -> None:
    """Run ``bench_sinks_jobs.run`` with our sink's log store where the spec says, its S3 calls counted and its
    steps timed (the benchmark's own wrappers on the sink object)."""
    import bench_sinks_jobs as jobs

    import filesink

    spec = json.loads(spec_path.read_text())
    compression = os.environ.get(COMPRESSION_ENV)
    if compression:
        import logstore.append

        logstore.append.OBJECT_STORE_COMPRESSION = None if compression == "none" else compression
    counter = counter_from_env("driver")
    home.COUNTER = counter  # bench_home's step timer attributes requests to the steps of this counter
    steps: dict[str, float] = {}
    calls: dict[str, list[dict[str, float]]] = {"append": [], "roll": [], "plan": [], "write": []}
    real = filesink.ExactlyOnceParquetSink

    def sink_with_log_store(*args: Any, **kwargs: Any) -> Any:
        kwargs["log_store"] = spec["log_store"]
        with counter.in_step("start"):
            sink: Any = real(*args, **kwargs)
        home._timed_steps(sink, steps)  # append, seal, roll: seconds and the steps of the driver's requests
        for name in calls:
            _per_call(sink, f"_{name}", calls[name], sink)
        return sink

    module: Any = filesink
    module.ExactlyOnceParquetSink = sink_with_log_store  # bench_sinks_jobs.OurSinkBatches makes the sink from here
    result = jobs.run(spec)
    result.update(steps=steps, calls=calls)
    spec_path.with_suffix(".result.json").write_text(json.dumps(result))


# -- one run, seen from this process ------------------------------------------------------------------------


@dataclass
class Run:
    workload: str
    place: str
    round: int
    rows: int
    seconds: float
    latencies: list[float]
    batches: int
    files: list[int]
    rolls: list[dict[str, float]]
    segments: int
    steps: dict[str, float]
    calls: dict[str, list[dict[str, float]]]
    load: tuple[float, float]
    requests: dict[str, collections.Counter[tuple[str, str, str]]] = field(default_factory=dict)
    """By role (``driver``, ``worker``): counts by (step, kind of key, operation)."""
    request_spent: dict[str, dict[tuple[str, str, str], tuple[float, float]]] = field(default_factory=dict)
    """By role: seconds (summed) and bytes of the requests."""
    workers: int = 0
    """Python worker processes that made S3 calls."""
    server_cpu: float = float("nan")
    """CPU seconds the S3 server spent during the run (user + system)."""
    job_cpu: dict[str, float] = field(default_factory=dict)
    """CPU seconds of the job's processes from the query's start to its end, by role (:data:`CPU_ROLES`)."""

    @property
    def rows_per_second(self) -> float:
        return self.rows / self.seconds

    @property
    def latency(self) -> float:
        return statistics.median(self.latencies) if self.latencies else float("nan")

    def total(self, *, start: bool = False) -> int:
        """Requests of the run after the sink's start-up (or of the start-up alone)."""
        return sum(n for counts in self.requests.values() for key, n in counts.items() if (key[0] == "start") == start)

    def spent_in(self, role: str, what: str, col: str) -> tuple[int, float, float]:
        """Calls, summed seconds (calls in flight together add up) and bytes of one role's requests of a kind of key
        and column."""
        n, s, b = 0, 0.0, 0.0
        for key, count in self.requests.get(role, {}).items():
            if key[1] == what and column(key[2]) == col:
                n += count
                s += self.request_spent[role][key][0]
                b += self.request_spent[role][key][1]
        return n, s, b


Key = tuple[str, str, str]


def read_requests(
    directory: Path,
) -> tuple[dict[str, collections.Counter[Key]], dict[str, dict[Key, tuple[float, float]]]]:
    """The counts, seconds and bytes the run's processes wrote (``<role>-<pid>.json``), summed by role."""
    counts: dict[str, collections.Counter[Key]] = {}
    spent: dict[str, dict[Key, tuple[float, float]]] = {}
    for path in sorted(directory.glob("*.json")):
        role = path.name.split("-", 1)[0]
        for step, what, operation, n, seconds, size in json.loads(path.read_text()):
            key = (step, what, operation)
            counts.setdefault(role, collections.Counter())[key] += n
            by_key = spent.setdefault(role, {})
            before = by_key.get(key, (0.0, 0.0))
            by_key[key] = (before[0] + seconds, before[1] + size)
    return counts, spent


SERVER_PID: int | None = None
"""The S3 server's process, whose CPU time each run reports."""


def _stat(pid: int | str) -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` after the command's name (state first); None where there is none."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()
    except OSError:
        return None


def process_cpu(pid: int | None) -> float:
    """User + system CPU seconds of process ``pid`` so far (NaN where there is none)."""
    fields = _stat(pid) if pid is not None else None
    return float("nan") if fields is None else (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


CPU_ROLES = ("driver", "JVM", "Python workers")
"""The job's processes, by what they run: the job's Python (the driver's side of the sink), Spark's JVM, and the
Python workers (and their daemon) that run the append and file-writing tasks."""


def _role(pid: int) -> str:
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return "driver"
    if argv and argv[0].endswith(b"java"):
        return "JVM"
    return "Python workers" if b"--job" not in argv else "driver"


class SessionCpu(threading.Thread):
    """CPU seconds of the processes of a session (the job, its JVM and Python workers: the JVM is not waited for by
    the job, so ``RUSAGE_CHILDREN`` would miss it), sampled from ``/proc`` every ``interval`` seconds, by role
    (:data:`CPU_ROLES`); a process's last interval before it ends is not seen."""

    def __init__(self, sid: int, interval: float = 0.5) -> None:
        super().__init__(daemon=True)
        self.sid, self.interval = sid, interval
        self.samples: list[tuple[float, dict[int, float]]] = []
        self.roles: dict[int, str] = {}
        self._done = threading.Event()

    def sample(self) -> None:
        tick = os.sysconf("SC_CLK_TCK")
        now, seen = time.time(), {}
        for entry in os.listdir("/proc"):
            fields = _stat(entry) if entry.isdigit() else None
            if fields is not None and int(fields[3]) == self.sid:
                pid = int(entry)
                seen[pid] = (int(fields[11]) + int(fields[12])) / tick
                self.roles[pid] = _role(pid)  # again each time: the JVM starts as spark-submit's shell
        self.samples.append((now, seen))

    def run(self) -> None:
        while not self._done.wait(self.interval):
            self.sample()

    def stop(self) -> None:
        self._done.set()
        self.join(timeout=10)

    def _at(self, when: float) -> dict[int, float]:
        """Each process's CPU seconds at the last sample at or before ``when`` (a process that ended before: its last
        sample's)."""
        at: dict[int, float] = {}
        for t, seen in self.samples:
            if t > when:
                break
            at.update(seen)
        return at

    def between(self, start: float, end: float) -> dict[str, float]:
        """CPU seconds by role from ``start`` to ``end`` (seconds since the epoch)."""
        before, after = self._at(start), self._at(end)
        spent = dict.fromkeys(CPU_ROLES, 0.0)
        for pid, cpu in after.items():
            spent[self.roles.get(pid, "driver")] += cpu - before.get(pid, 0.0)
        return spent


def _stop(child: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(child.pid, signal.SIGKILL)  # the job, its JVM and its Python workers (a session of their own)
    child.wait(timeout=60)


def run_once(
    args: argparse.Namespace, s3: Any, work: Path, input_dir: Path, workload: str, place: str, round_: int
) -> Run:
    name = f"{workload}-{place.lower()}-r{round_}-{uuid.uuid4().hex[:8]}"
    job_dir = work / name
    job_dir.mkdir(parents=True)
    output = sinks.Output(s3.url(name, "out"), s3)
    log_url = s3.url(name, "log")
    spec = sinks.job_spec(
        f"ours, log store {place}",
        "ours",
        job_dir,
        input_dir,
        args.rows,
        output.url,
        trigger_seconds=args.trigger,
        files_per_batch=sinks.FILES_PER_BATCH,
        rollover=sinks.side_by_side_rollover(args.rows, workload),
        storage_options=s3.storage_options(),
        workload=workload,
    )
    spec["log_store"] = log_url if place.startswith("S3") else None  # None: a directory in the state directory
    spec["spark_conf"] = {"spark.python.daemon.module": MODULE}
    spec_path = job_dir / "spec.json"
    spec_path.write_text(json.dumps(spec))
    requests_dir = job_dir / "requests"
    requests_dir.mkdir()
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(HERE), env.get("PYTHONPATH", "")) if p)
    env[REQUESTS_ENV] = str(requests_dir)
    if place.startswith("S3-"):
        env.update(VARIANTS[place.removeprefix("S3-")][1])
    env[WATCH_ENV] = json.dumps([s3.bucket, log_url, output.url])
    log = job_dir / "job.log"
    load_before = os.getloadavg()[0]
    server_before = process_cpu(SERVER_PID)
    with open(log, "wb") as out:
        child = subprocess.Popen(
            [sys.executable, __file__, "--job", str(spec_path)],
            cwd=REPO,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    cpu = SessionCpu(child.pid)
    cpu.start()
    try:
        with monitor.Poller(output.lister(), sinks.POLL_SECONDS) as poller:
            child.wait(timeout=args.timeout)
        cpu.sample()  # the JVM and the Python workers that outlive the job's process
    except subprocess.TimeoutExpired:
        _stop(child)
        raise sinks._fail(f"the {name} job (stopped after its {args.timeout:.0f} s deadline)", log) from None
    except BaseException:
        _stop(child)
        raise
    if child.returncode != 0:
        raise sinks._fail(f"the {name} job", log)
    load = (load_before, os.getloadavg()[0])
    cpu.stop()
    result = json.loads(spec_path.with_suffix(".result.json").read_text())
    server_cpu = process_cpu(SERVER_PID) - server_before
    job_cpu = cpu.between(result["t_start"], result["t_end"])
    files = output.parquet_files()
    rows_out = output.rows(list(files))
    if rows_out != args.rows:
        raise SystemExit(
            f"{name}: the output holds {rows_out:,} rows in {len(files)} files, the input {args.rows:,}: the sink "
            f"lost or duplicated rows (its job log: {log})"
        )
    counts, spent = read_requests(requests_dir)
    rolls = [c for c in result["calls"]["roll"] if c["files"] > 0]
    run = Run(
        workload=workload,
        place=place,
        round=round_,
        rows=args.rows,
        seconds=result["t_end"] - result["t_start"],
        latencies=sinks._batch_latencies("ours", result, poller.seen.first_seen, output),
        batches=sum(1 for p in result["progress"] if p["rows"] > 0),
        files=sorted(files.values()),
        rolls=rolls,
        segments=int(sum(c["returned"] for c in result["calls"]["append"])),
        steps=result["steps"],
        calls=result["calls"],
        load=load,
        requests=counts,
        request_spent=spent,
        workers=len(list(requests_dir.glob("worker-*.json"))),
        server_cpu=server_cpu,
        job_cpu=job_cpu,
    )
    print(
        f"  {workload}, log store {place}, round {round_}: {run.seconds:.1f} s, {run.rows_per_second:,.0f} rows/s, "
        f"visible after batch end {run.latency:.2f} s (median of {len(run.latencies)}), {run.batches} batches, "
        f"{len(run.files)} files in {len(rolls)} rolls, rows checked {rows_out:,}; CPU s in the run: job "
        f"{sum(job_cpu.values()):.1f} ({', '.join(f'{k} {v:.1f}' for k, v in job_cpu.items())}), "
        f"S3 server {server_cpu:.1f}; "
        f"load {load[0]:.1f} -> {load[1]:.1f}",
        flush=True,
    )
    if not args.keep:
        shutil.rmtree(job_dir, ignore_errors=True)
        with contextlib.suppress(FileNotFoundError):
            s3.filesystem().rm(f"{s3.bucket}/{name}", recursive=True)
    return run


# -- the report ----------------------------------------------------------------------------------------------


def _median(values: list[float]) -> float:
    values = [v for v in values if v == v]  # without NaN
    return statistics.median(values) if values else float("nan")


def _ratio(a: float, b: float) -> float:
    return a / b if b > 0 and a == a else float("nan")


def _verdict(holds: bool) -> str:
    return "holds" if holds else "does NOT hold"


def _roll_steps(run: Run) -> dict[str, float]:
    """Median seconds of a roll that committed files, and of its plan and file-writing job (the calls of the same
    roll: the file-writing job is the only ``_write`` of a roll with files)."""
    writes = [c["seconds"] for c in run.calls["write"]]
    return {
        "roll": _median([c["seconds"] for c in run.rolls]),
        "write job": _median(writes),
        "append": _median([c["seconds"] for c in run.calls["append"]]),
    }


def _cpu_of(role: str) -> Callable[[Run], float]:
    return lambda r: r.job_cpu.get(role, 0.0)


def report_workload(workload: str, runs: list[Run], rounds: int) -> list[str]:
    by = {place: [r for r in runs if r.place == place] for place in PLACES}
    ratios_tp = []
    ratios_lat = []
    for rnd in range(rounds):
        pair = {r.place: r for r in runs if r.round == rnd}
        ratios_tp.append(_ratio(pair["S3"].rows_per_second, pair["local"].rows_per_second))
        ratios_lat.append(_ratio(pair["S3"].latency, pair["local"].latency))
    tp, lat = _median(ratios_tp), _median(ratios_lat)

    def med(place: str, f: Callable[[Run], float]) -> float:
        return _median([f(r) for r in by[place]])

    def row(label: str, f: Callable[[Run], float], fmt: str) -> str:
        s3, local = med("S3", f), med("local", f)
        return f"| {label} | {s3:{fmt}} | {local:{fmt}} | {_ratio(s3, local):.2f}x |"

    lines = [
        f"`{workload}` ({rounds} round(s); medians over the rounds; S3 / local of the medians, the goals' ratios are "
        "medians of each round's ratio):",
        "",
        "| | log store on S3 | log store local | S3 / local |",
        "|---|---:|---:|---:|",
        row("seconds, start to all rows committed", lambda r: r.seconds, ".1f"),
        row("rows/s", lambda r: r.rows_per_second, ",.0f"),
        row("visible after batch end, s (median over batches)", lambda r: r.latency, ".2f"),
        row("visible after batch end, s (p90 over batches)", lambda r: sinks._percentile(r.latencies, 0.9), ".2f"),
        "| batches / files / rolls (each run) | "
        + " | ".join(", ".join(f"{r.batches} / {len(r.files)} / {len(r.rolls)}" for r in by[p]) for p in PLACES)
        + " | |",
        row("append step, s (median per batch)", lambda r: _roll_steps(r)["append"], ".2f"),
        row("roll with files, s (median)", lambda r: _roll_steps(r)["roll"], ".2f"),
        row("of which the file-writing job, s (median)", lambda r: _roll_steps(r)["write job"], ".2f"),
        row("S3 requests per roll (driver + workers)", lambda r: r.total() / max(1, len(r.rolls)), ".1f"),
        row("S3 requests of the sink's start-up", lambda r: r.total(start=True), ".0f"),
        row("CPU s of the job's processes in the run, all", lambda r: sum(r.job_cpu.values()), ".1f"),
        *(row(f"... of which {role}", _cpu_of(role), ".1f") for role in CPU_ROLES),
        row("CPU s of the S3 server (start-up of the job included)", lambda r: r.server_cpu, ".1f"),
        "| load average, 1 min, before -> after each run | "
        + " | ".join(", ".join(f"{r.load[0]:.1f} -> {r.load[1]:.1f}" for r in by[p]) for p in PLACES)
        + " | |",
        "",
    ]
    lines += [
        f"Throughput S3 / local by round: {', '.join(f'{x:.2f}' for x in ratios_tp)}; median **{tp:.2f}** (goal "
        f">= {GOAL_THROUGHPUT}: {_verdict(tp >= GOAL_THROUGHPUT)}). Visibility latency S3 / local by round: "
        f"{', '.join(f'{x:.2f}' for x in ratios_lat)}; median **{lat:.2f}** (goal <= {GOAL_LATENCY}: "
        f"{_verdict(lat <= GOAL_LATENCY)}).",
        "",
    ]
    for place in PLACES:
        lines += requests_table(workload, place, by[place])
    lines += floor_lines(by["S3"])
    for variant, (what, _) in VARIANTS.items():
        place = f"S3-{variant}"
        if any(r.place == place for r in runs):
            lines += variant_lines(workload, runs, rounds, place, what)
            lines += requests_table(workload, f"S3, {what}", [r for r in runs if r.place == place])
    return lines


def variant_lines(workload: str, runs: list[Run], rounds: int, place: str, what: str) -> list[str]:
    """A variant's effect: the log store on S3 as it is and as the variant has it, each next to the local run of
    its round."""
    to_variant, variant_local, latency = [], [], []
    for rnd in range(rounds):
        by = {r.place: r for r in runs if r.round == rnd}
        to_variant.append(_ratio(by["S3"].rows_per_second, by[place].rows_per_second))
        variant_local.append(_ratio(by[place].rows_per_second, by["local"].rows_per_second))
        latency.append(_ratio(by["S3"].latency, by[place].latency))
    mine = [r for r in runs if r.place == place]
    steps = [_roll_steps(r) for r in mine]

    def med(f: Callable[[Run], float]) -> float:
        return _median([f(r) for r in mine])

    return [
        f"`{workload}`, log store on S3 with {what}: {med(lambda r: r.seconds):.1f} s, "
        f"{med(lambda r: r.rows_per_second):,.0f} rows/s, visible after batch end {med(lambda r: r.latency):.2f} s, "
        f"append step {_median([s['append'] for s in steps]):.2f} s, roll {_median([s['roll'] for s in steps]):.2f} s, "
        f"file-writing job {_median([s['write job'] for s in steps]):.2f} s, CPU s: job "
        f"{med(lambda r: sum(r.job_cpu.values())):.1f}, S3 server {med(lambda r: r.server_cpu):.1f} (medians). "
        f"Throughput as it is / with {what}, by round: {', '.join(f'{x:.2f}' for x in to_variant)}; median "
        f"**{_median(to_variant):.2f}**. "
        f"With {what} / local, by round: {', '.join(f'{x:.2f}' for x in variant_local)}; median "
        f"**{_median(variant_local):.2f}**. Visibility latency as it is / with {what}: median {_median(latency):.2f}.",
        "",
    ]


def requests_table(workload: str, place: str, runs: list[Run]) -> list[str]:
    """S3 requests per roll by process and kind of key (mean over the runs), and per batch."""
    keys = sorted({(role, key[1]) for r in runs for role in r.requests for key in r.requests[role]})
    rolls = sum(len(r.rolls) for r in runs)
    batches = sum(r.batches for r in runs)
    lines = [
        f"S3 requests per roll, `{workload}`, log store {place} ({rolls} rolls and {batches} batches in "
        f"{len(runs)} run(s), the final flush included, the sink's start-up not; the column per batch divides the "
        "same requests by the batches instead):",
        "",
        "| process | key | " + " | ".join(COLUMNS) + " | total | per batch |",
        "|---|---|" + "---:|" * (len(COLUMNS) + 2),
    ]
    for role, what in keys:
        totals = collections.Counter[str]()
        for r in runs:
            for (step, w, operation), n in r.requests.get(role, {}).items():
                if w == what and step != "start":
                    totals[column(operation)] += n
        if not totals:
            continue
        cells = [f"{totals[c] / max(1, rolls):.1f}" if totals[c] else "" for c in COLUMNS]
        total = sum(totals.values())
        lines.append(
            f"| {role} | {what} | {' | '.join(cells)} | {total / max(1, rolls):.1f} | {total / max(1, batches):.1f} |"
        )
    all_total = sum(r.total() for r in runs)
    start: collections.Counter[str] = collections.Counter()
    for r in runs:
        for counts in r.requests.values():
            for (step, _, operation), n in counts.items():
                if step == "start":
                    start[column(operation)] += n
    lines += [
        f"| all | | {' | '.join('' for _ in COLUMNS)} | **{all_total / max(1, rolls):.1f}** | "
        f"{all_total / max(1, batches):.1f} |",
        "",
        f"The sink's start-up (once per run, mean): {sum(start.values()) / len(runs):.0f} requests ("
        + ", ".join(f"{c} {start[c] / len(runs):.0f}" for c in COLUMNS if start[c])
        + ").",
        "",
    ]
    return lines


def floor_lines(runs: list[Run]) -> list[str]:
    """The least a roll needs with the log store on S3: each file writer reads each segment once (one ranged GET;
    every segment holds rows of both writers' vnodes here), and the output's data requests (one PUT per small
    file, or create + parts + complete)."""
    if not runs:
        return []
    rolls = sum(len(r.rolls) for r in runs)
    segments = sum(r.segments for r in runs)
    reads = segments * sinks.PARALLELISM
    data_calls = 0
    segment_gets = 0
    for r in runs:
        for role, counts in r.requests.items():
            for (step, what, operation), n in counts.items():
                if step == "start":
                    continue
                if what == "output files" and column(operation) in ("PUT", "parts", "MPU"):
                    data_calls += n
                if what == "log segments" and operation == "GetObject" and role == "worker":
                    segment_gets += n
    total = sum(r.total() for r in runs)
    floor = (reads + data_calls) / max(1, rolls)
    worker = {
        label: [r.spent_in(role, what, col) for r in runs]
        for label, role, what, col in (
            ("segment PUTs", "worker", "log segments", "PUT"),
            ("segment GETs", "worker", "log segments", "GET"),
            ("segment HEADs (the segment cache's checks)", "worker", "log segments", "HEAD"),
            ("output parts", "worker", "output files", "parts"),
            ("and in the driver, segment GETs (the size rule's sample)", "driver", "log segments", "GET"),
        )
    }
    spent = "; ".join(
        f"{label} {sum(n for n, _, _ in figures) / len(runs):,.0f} calls, "
        f"{sum(b for _, _, b in figures) / len(runs) / 1e6:,.0f} MB, {sum(s for _, s, _ in figures) / len(runs):.1f} s"
        for label, figures in worker.items()
    )
    return [
        f"The floor with the log store on S3: {segments / len(runs):.0f} segments per run read once by each of the "
        f"{sinks.PARALLELISM} file writers ({reads / max(1, rolls):.1f} GETs per roll; the workers sent "
        f"{segment_gets / max(1, rolls):.1f}) plus the output's data calls ({data_calls / max(1, rolls):.1f} per "
        f"roll) = **{floor:.1f}** per roll; measured **{total / max(1, rolls):.1f}**, "
        f"{total / max(1, rolls) - floor:.1f} above it (the rest of the table: the segments' PUTs of every batch, "
        "home records, term checks, listings, garbage collection).",
        "",
        f"The workers' S3 calls per run (mean; seconds summed over the calls, so calls in flight together add up): "
        f"{spent}.",
        "",
    ]


# -- main ------------------------------------------------------------------------------------------------


def plot(path: Path, runs: list[Run]) -> None:
    """Rows per second of every run, and S3 requests per roll, by workload: the log store on S3 (and each
    variant) next to the local one."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workloads = list(dict.fromkeys(r.workload for r in runs))
    places = list(dict.fromkeys(r.place for r in runs))
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4.5))
    width = 0.8 / len(places)
    for i, place in enumerate(places):
        xs = [w + (i - (len(places) - 1) / 2) * width for w in range(len(workloads))]
        mine = [[r for r in runs if r.workload == w and r.place == place] for w in workloads]
        left.bar(xs, [statistics.median(r.rows_per_second for r in m) / 1e3 for m in mine], width, label=place)
        for x, m in zip(xs, mine, strict=True):
            left.plot([x] * len(m), [r.rows_per_second / 1e3 for r in m], "k.", markersize=4)
        per_roll = [statistics.median(r.total() / max(1, len(r.rolls)) for r in m) for m in mine]
        right.bar(xs, per_roll, width, label=place)
    for ax, title in ((left, "thousand rows/s (bar: median; dots: rounds)"), (right, "S3 requests per roll (median)")):
        ax.set_xticks(range(len(workloads)), workloads)
        ax.set_title(title)
        ax.legend(title="log store", fontsize=8)
    fig.suptitle("The log store on S3 next to the local one (output on S3 in both)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="The log store on S3 next to the local log store, output on S3.")
    parser.add_argument("--rows", type=int, default=None, help=f"input rows (default {FULL_ROWS:,})")
    parser.add_argument("--rounds", type=int, default=None, help="rounds of both runs per workload (default 2)")
    parser.add_argument("--quick", action="store_true", help=f"a smoke run: {QUICK_ROWS:,} rows, 1 round")
    parser.add_argument("--workload", choices=WORKLOADS, action="append", help="one workload (default: both)")
    parser.add_argument(
        "--trigger", type=float, default=None, help="processing-time trigger seconds (default: available now)"
    )
    parser.add_argument("--timeout", type=float, default=900.0, help="deadline of each run, seconds (default 900)")
    parser.add_argument("--dir", type=Path, default=None, help="work directory (default: a temp dir in the cwd)")
    parser.add_argument("--keep", action="store_true", help="keep the work directory and the runs' S3 objects")
    parser.add_argument("--plot", type=Path, default=None, help="write a PNG plot of throughput and requests per roll")
    parser.add_argument(
        "--variant",
        choices=sorted(VARIANTS),
        action="append",
        default=[],
        help="one more run per round, the log store on S3 with "
        + "; ".join(f"{k}: {w}" for k, (w, _) in VARIANTS.items())
        + " (repeatable)",
    )
    parser.add_argument("--job", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.job is not None:
        job(args.job)
        return 0
    args.rows = args.rows or (QUICK_ROWS if args.quick else FULL_ROWS)
    rounds = args.rounds or (1 if args.quick else 2)
    workloads = args.workload or list(WORKLOADS)
    if args.rows < 1 or rounds < 1:
        parser.error("--rows and --rounds must be at least 1")

    started = time.monotonic()
    load_start = os.getloadavg()
    import pyarrow as pa

    print(f"S3 log store benchmark, {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC")
    print(f"command line: python tests/benchmarks/{Path(__file__).name} {' '.join(sinks.without_paths(sys.argv[1:]))}")
    print(
        f"python {platform.python_version()}, pyarrow {pa.__version__}; {os.cpu_count()} CPU(s); load average "
        f"{' '.join(f'{x:.2f}' for x in load_start)}"
    )
    print(
        f"{args.rows:,} rows, {rounds} round(s), local[{sinks.PARALLELISM}], {sinks.FILES_PER_BATCH} input files per "
        f"batch, trigger {'available now' if args.trigger is None else f'{args.trigger:g} s'}; output on S3 in both "
        "runs",
        flush=True,
    )
    from logstore.segment_cache import BYTES_VAR, cache_root, configured_limit

    limit = configured_limit()
    print(
        f"segment cache (log store on S3): {f'on, {limit / 2**20:,.0f} MiB in {cache_root()}' if limit else 'off'} "
        f"({BYTES_VAR}={os.environ.get(BYTES_VAR, '')!r})",
        flush=True,
    )
    work = data.work_directory(args.dir, "bench_s3_log_store-")
    from filesink.demo.s3server import SeaweedServer

    server = SeaweedServer(work / "seaweedfs", bucket="bench-s3-log")
    lines: list[str] = []
    all_runs: list[Run] = []
    try:
        s3 = server.start()
        global SERVER_PID
        SERVER_PID = server.pid
        print(f"S3: SeaweedFS on {s3.endpoint}", flush=True)
        for w_index, workload in enumerate(workloads):
            input_dir = work / f"input-{workload}"
            paths = data.WORKLOADS[workload].generate(input_dir, args.rows)
            size = sum(p.stat().st_size for p in paths)
            rollover = sinks.side_by_side_rollover(args.rows, workload)
            print(
                f"{workload}: {len(paths)} input files, {size / 1e6:.1f} MB; Rollover(target_file_size="
                f"{rollover['target_file_size'] / sinks.MiB:g} MiB, max_age_seconds={rollover['max_age_seconds']:g})",
                flush=True,
            )
            runs = []
            for rnd in range(rounds):
                places = (*PLACES, *(f"S3-{v}" for v in args.variant))
                first = (rnd + w_index) % len(places)
                for place in places[first:] + places[:first]:
                    runs.append(run_once(args, s3, work, input_dir, workload, place, rnd))
            if not args.keep:
                shutil.rmtree(input_dir, ignore_errors=True)
            lines += report_workload(workload, runs, rounds)
            all_runs += runs
    finally:
        server.stop()
        if args.keep:
            print(f"work directory kept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    load_end = os.getloadavg()
    print()
    print("\n".join(lines))
    if args.plot is not None:
        plot(args.plot, all_runs)
        print(f"\nwrote {args.plot}")
    print(
        f"{os.cpu_count()} CPU(s); load average (1/5/15 min) at the start {'/'.join(f'{x:.2f}' for x in load_start)}, "
        f"at the end {'/'.join(f'{x:.2f}' for x in load_end)}; {(time.monotonic() - started) / 60:.1f} minutes."
    )
    return 0


if __name__ == "__main__":
    if os.environ.get(REQUESTS_ENV) and "--job" not in sys.argv:
        daemon()  # started by the job's Spark as ``python -m bench_s3_log_store [worker module]``
    else:
        sys.exit(main())
