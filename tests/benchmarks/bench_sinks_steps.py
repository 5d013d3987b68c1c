"""Where a streaming run's time goes: our sink's steps next to Spark's own Parquet sink, on the same input.

Not a test (pytest does not collect it). Run from the repository root::

    python tests/benchmarks/bench_sinks_steps.py [--rows N] [--workload NAME] [--parallelism N] [--target-mib M]

It generates the input of ``bench_sinks.py`` and runs that script's job (``bench_sinks_jobs.run``, the
side-by-side setup: available-now trigger, 2 input files per batch), each in a child process with its own
``local[N]`` Spark session (``--parallelism N``, 2 by default; our sink has N writers), through Spark's Parquet
sink and through ours (local output, ``bench_sinks.py``'s target for the workload, or ``--target-mib``). For
each it prints the run's time (as ``bench_sinks.py`` counts it), Spark's per-batch durations summed over the
run (``addBatch`` is the time in the sink), and how busy the machine's CPUs were over the job, Spark's start-up
included (``/proc/stat``). For ours it also prints the time spent in each step of the sink, measured by wrapping
the sink's methods with timers (the benchmark's own hook; the sink has no such instrumentation).
See ``docs/benchmarks.md``.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import bench_sinks_data as data


def _steps() -> list[tuple[Any, list[str]]]:
    """The timed steps: the batch, its append job and its roll (plan, with the sample encodes of a new sink;
    pre-commit; the file-writing job; commit), seal and garbage collection."""
    import filesink.committer.ledger
    import filesink.sink.face
    import filesink.sink.roll
    import logstore.store

    return [
        (filesink.sink.face.ExactlyOnceParquetSink, ["__call__", "_append", "_roll", "_plan", "_write"]),
        (filesink.sink.roll, ["sample_ratio"]),
        (logstore.store.LogStore, ["seal", "collect_garbage"]),
        (filesink.committer.ledger.Ledger, ["precommit", "commit"]),
    ]


def _cpu() -> tuple[int, int]:
    """(busy, total) jiffies of all CPUs so far."""
    fields = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = fields[3] + fields[4]
    return sum(fields) - idle, sum(fields)


def _timed(owner: Any, name: str, times: collections.Counter[str], calls: collections.Counter[str]) -> None:
    original = getattr(owner, name)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            times[name] += time.perf_counter() - start
            calls[name] += 1

    setattr(owner, name, wrapper)


def _rollover(rows: int, workload: str, target_mib: float | None) -> dict[str, Any]:
    import bench_sinks

    rollover = bench_sinks.side_by_side_rollover(rows, workload)
    if target_mib is not None:
        rollover["target_file_size"] = int(target_mib * bench_sinks.MiB)
    return rollover


def one(
    kind: str,
    input_dir: Path,
    work: Path,
    rows: int,
    workload: str = "events",
    target_mib: float | None = None,
    parallelism: int = 2,
) -> dict[str, Any]:
    """Run the benchmark's job of one sink (``bench_sinks_jobs.run``) in this process; the figures as a dict."""
    import bench_sinks
    import bench_sinks_jobs

    times: collections.Counter[str] = collections.Counter()
    calls: collections.Counter[str] = collections.Counter()
    if kind == "ours":
        for owner, names in _steps():
            for name in names:
                _timed(owner, name, times, calls)
    spec = bench_sinks.job_spec(
        f"steps-{kind}",
        kind,
        work,
        input_dir,
        rows,
        str(work / "out"),
        trigger_seconds=None,
        files_per_batch=bench_sinks.FILES_PER_BATCH,
        rollover=_rollover(rows, workload, target_mib) if kind == "ours" else {},
        workload=workload,
    )
    spec["parallelism"] = parallelism  # Spark's cores (local[N]) and our sink's writers
    busy0, total0 = _cpu()
    result = bench_sinks_jobs.run(spec)
    busy1, total1 = _cpu()
    durations: collections.Counter[str] = collections.Counter()
    for progress in result["progress"]:
        durations.update({k: v / 1000 for k, v in progress["durations_ms"].items()})
    return {
        "seconds": result["t_end"] - result["t_start"],
        "batches": len(result["progress"]),
        "cpu_busy": (busy1 - busy0) / max(1, total1 - total0),
        "durations": dict(durations),
        "steps": {name: [times[name], calls[name]] for name in times},
    }


def run_one(kind: str, work: Path, args: argparse.Namespace) -> dict[str, Any]:
    """One sink's run in a fresh process (see :func:`one`), its figures."""
    out = subprocess.run(
        [
            sys.executable,
            __file__,
            "--rows",
            str(args.rows),
            "--workload",
            args.workload,
            *(["--target-mib", str(args.target_mib)] if args.target_mib is not None else []),
            "--parallelism",
            str(args.parallelism),
            "--one",
            kind,
            str(work / "input"),
            str(work / kind),
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    figures: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return figures


def _medians(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The median of each figure over the runs of one sink (seconds, CPU busy, Spark's durations, our steps)."""

    def median(values: list[float]) -> float:
        return float(statistics.median(values))

    durations = {key for run in runs for key in run["durations"]}
    steps = list(dict.fromkeys(name for run in runs for name in run["steps"]))  # in the order they first ran
    return {
        "seconds": median([run["seconds"] for run in runs]),
        "cpu_busy": median([run["cpu_busy"] for run in runs]),
        "durations": {key: median([run["durations"].get(key, 0.0) for run in runs]) for key in sorted(durations)},
        "steps": {
            name: [median([run["steps"].get(name, [0.0, 0])[i] for run in runs]) for i in (0, 1)] for name in steps
        },
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Our sink's steps next to Spark's Parquet sink.")
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--workload", choices=sorted(data.WORKLOADS), default="events")
    parser.add_argument("--dir", type=Path, default=None, help="work directory (default: a temp dir in the cwd)")
    parser.add_argument("--parallelism", type=int, default=2, help="local[N] and our sink's writers (default 2)")
    parser.add_argument(
        "--target-mib", type=float, default=None, help="our sink's target (default: bench_sinks.py's for the workload)"
    )
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="rounds of both sinks, alternating which runs first; the table shows medians (default 1)",
    )
    parser.add_argument("--one", nargs=3, metavar=("KIND", "INPUT", "WORK"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    if args.one:
        kind, input_dir, work = args.one
        figures = one(kind, Path(input_dir), Path(work), args.rows, args.workload, args.target_mib, args.parallelism)
        print(json.dumps(figures), flush=True)
        return 0
    work = data.work_directory(args.dir, "bench_steps-")
    try:
        data.WORKLOADS[args.workload].generate(work / "input", args.rows)
        rounds: list[dict[str, Any]] = []
        for number in range(args.repeat):
            kinds = ("spark", "ours") if number % 2 == 0 else ("ours", "spark")
            results = {}
            for kind in kinds:
                shutil.rmtree(work / kind, ignore_errors=True)  # a fresh query and sink in every round
                results[kind] = run_one(kind, work, args)
            rounds.append(results)
            if args.repeat > 1:
                a, b = results["spark"]["seconds"], results["ours"]["seconds"]
                print(
                    f"round {number + 1} ({kinds[0]} first): Spark's sink {a:.1f} s, ours {b:.1f} s, "
                    f"ratio {a / b:.2f}; load average {os.getloadavg()[0]:.2f}",
                    flush=True,
                )
        spark, ours = _medians([r["spark"] for r in rounds]), _medians([r["ours"] for r in rounds])
        if args.repeat > 1:
            ratios = sorted(r["spark"]["seconds"] / r["ours"]["seconds"] for r in rounds)
            print(f"ratios {', '.join(f'{x:.2f}' for x in ratios)}; median {statistics.median(ratios):.2f}")
            print(f"medians of {args.repeat} rounds:")
        print(
            f"{args.rows:,} rows of {args.workload}, local[{args.parallelism}], available-now trigger, "
            f"2 input files per batch; load average {os.getloadavg()[0]:.2f} at the end"
        )
        print("| | Spark's sink | ours |")
        print("|---|---:|---:|")
        print(f"| run (s) | {spark['seconds']:.1f} | {ours['seconds']:.1f} |")
        print(f"| rows/s | {args.rows / spark['seconds']:,.0f} | {args.rows / ours['seconds']:,.0f} |")
        print(f"| CPU busy (2 cores) | {spark['cpu_busy']:.0%} | {ours['cpu_busy']:.0%} |")
        for key in sorted(set(spark["durations"]) | set(ours["durations"])):
            a, b = spark["durations"].get(key, 0.0), ours["durations"].get(key, 0.0)
            print(f"| Spark `{key}` (s) | {a:.1f} | {b:.1f} |")
        print("\nour sink's steps (s, calls):")
        for name, (seconds, calls) in ours["steps"].items():
            print(f"  {name:16} {seconds:7.2f}  {calls:g}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
