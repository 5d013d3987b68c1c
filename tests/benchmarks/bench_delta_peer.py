"""Our sink next to the Python peer that reaches the same end state: Delta's path (``toArrow()`` and a delta-rs
append per batch, with the batch id as its application transaction) followed by one delta-rs
``optimize.compact()`` to our target file size, timed from the query's start to the compacted table; and our sink
writing a directory, a Delta table and an Iceberg table (``table_format=``) side by side.

Not a test (pytest does not collect it). Run from the repository root with the ``bench`` extra installed::

    python tests/benchmarks/bench_delta_peer.py                    # 2,500,000 rows, 2 rounds, events and strings
    python tests/benchmarks/bench_delta_peer.py --quick            # 200,000 rows, 1 round: a smoke run
    python tests/benchmarks/bench_delta_peer.py --workload strings --rounds 3 --rows 5000000
    python tests/benchmarks/bench_delta_peer.py --variants ours,ours-unix,delta+compact   # and over Unix sockets

Each run is a job process of its own with ``local[2]`` Spark (``bench_sinks_jobs.run``, the side-by-side setup of
``bench_sinks.py``: 2 input files per micro-batch, available-now trigger), writing to a local directory: our sink
with its local log store and the side-by-side rollover (``bench_sinks.side_by_side_rollover``), and the peer with
the same target size for its compaction. The order alternates from round to round. Each run's output is checked:
ours by the rows in the footers of its Parquet files, the peer's by the rows of the Delta table's files, both
against the input. It prints the medians, each round's ratio (the peer's seconds over ours: above 1.0 we are
ahead) and the machine's load before and after each run. Goal (issue: at least 1.0x, aiming for 1.2x), reported,
not asserted. Every job's session talks to its Python workers over TCP, Spark's default; the ``ours-unix``
variant is our sink with them on Unix domain sockets. See ``docs/benchmarks.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import bench_sinks as sinks
import bench_sinks_data as data
import pyarrow.parquet as pq

from filesink.cli.localspark import UNIX_SOCKETS

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
JOB = HERE / "bench_sinks_jobs.py"
VARIANTS = ("ours", "ours-delta", "ours-iceberg", "delta+compact", "ours-unix")
TABLE_FORMATS = {"ours-delta": "delta", "ours-iceberg": "iceberg"}
LABELS = {
    "ours": "ours, directory",
    "ours-delta": "ours, Delta table",
    "ours-iceberg": "ours, Iceberg table",
    "delta+compact": "Delta path + compaction",
    "ours-unix": "ours, directory, Python workers over Unix sockets",
}
DEADLINE_SECONDS = 1800


@dataclass
class Run:
    variant: str
    round: int
    seconds: float
    query_seconds: float
    files: int
    load: tuple[float, float]


def output_rows(variant: str, out: Path) -> tuple[int, int]:
    """(rows, files) of a run's end state: our Parquet files, or the Delta table's active files."""
    if variant in ("ours", "ours-unix"):
        files = [p for p in out.rglob("*.parquet") if not any(part.startswith(("_", ".")) for part in p.parts[-3:])]
        return sum(pq.ParquetFile(p).metadata.num_rows for p in files), len(files)
    if variant == "ours-iceberg":
        from pyiceberg.catalog.sql import SqlCatalog

        from filesink.destination.iceberg import CATALOG_NAME, EMBEDDED_CATALOG

        catalog = SqlCatalog(CATALOG_NAME, uri=f"sqlite:///{out}/{EMBEDDED_CATALOG}", warehouse=f"file://{out}")
        scan = catalog.load_table("bench.events").scan()
        return scan.to_arrow().num_rows, len(list(scan.plan_files()))
    from deltalake import DeltaTable

    table = DeltaTable(str(out))
    return table.to_pyarrow_dataset().count_rows(), len(table.file_uris())


def run_once(args: argparse.Namespace, work: Path, input_dir: Path, workload: str, variant: str, round_: int) -> Run:
    name = f"{workload}-{variant.replace('+', '-')}-r{round_}"
    job_dir = work / name
    job_dir.mkdir(parents=True)
    rollover = sinks.side_by_side_rollover(args.rows, workload)
    out = job_dir / "out"
    spec = sinks.job_spec(
        variant,
        "delta" if variant == "delta+compact" else "ours",
        job_dir,
        input_dir,
        args.rows,
        str(out),
        trigger_seconds=None,
        files_per_batch=sinks.FILES_PER_BATCH,
        rollover=rollover if variant != "delta+compact" else {},
        workload=workload,
    )
    if variant == "delta+compact":
        spec["compact_to"] = rollover["target_file_size"]
    if variant == "ours-unix":
        # its Python workers on Unix domain sockets; every other variant has them on TCP (Spark's default)
        spec["spark_conf"] = {**spec.get("spark_conf", {}), UNIX_SOCKETS: "true"}
    if variant in TABLE_FORMATS:
        spec["table_format"] = TABLE_FORMATS[variant]
        spec["table"] = "bench.events" if variant == "ours-iceberg" else None
    spec_path = job_dir / "spec.json"
    spec_path.write_text(json.dumps(spec))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(HERE), env.get("PYTHONPATH", "")) if p)
    log = job_dir / "job.log"
    load_before = os.getloadavg()[0]
    with open(log, "wb") as sink_log:
        try:
            subprocess.run(
                [sys.executable, str(JOB), str(spec_path)],
                cwd=REPO,
                env=env,
                stdout=sink_log,
                stderr=subprocess.STDOUT,
                timeout=DEADLINE_SECONDS,
                check=True,
            )
        except (subprocess.TimeoutExpired, subprocess.CalledProcessError) as e:
            raise SystemExit(f"{name}: the job failed or passed its deadline ({e}); its log: {log}") from None
    result = json.loads(spec_path.with_suffix(".result.json").read_text())
    rows, files = output_rows(variant, out)
    if rows != args.rows:
        raise SystemExit(f"{name}: the end state holds {rows:,} rows in {files} files, the input {args.rows:,} ({log})")
    run = Run(
        variant,
        round_,
        result["t_end"] - result["t_start"],
        result["t_query_end"] - result["t_start"],
        files,
        (load_before, os.getloadavg()[0]),
    )
    print(
        f"  {workload}, {variant}, round {round_}: {run.seconds:.1f} s (query {run.query_seconds:.1f} s), "
        f"{files} files, rows checked {rows:,}; load {run.load[0]:.1f} -> {run.load[1]:.1f}",
        flush=True,
    )
    if not args.keep:
        shutil.rmtree(job_dir, ignore_errors=True)
    return run


def _by_round(runs: list[Run]) -> dict[int, float]:
    return {r.round: r.seconds for r in runs}


def _ratios(numerator: list[Run], denominator: list[Run]) -> list[float]:
    """Per round, the numerator's seconds over the denominator's (rounds both have)."""
    top, bottom = _by_round(numerator), _by_round(denominator)
    return [top[k] / bottom[k] for k in sorted(top) if k in bottom]


def report(workload: str, runs: list[Run], rows: int, variants: tuple[str, ...]) -> list[str]:
    by = {v: [r for r in runs if r.variant == v] for v in variants}
    med = {v: statistics.median(r.seconds for r in by[v]) for v in variants}
    lines = [
        f"`{workload}`, {rows:,} rows ({args_rounds(by)} round(s); medians):",
        "",
        "| | " + " | ".join(LABELS[v] for v in variants) + " |",
        "|---|" + "---:|" * len(variants),
        "| seconds, query start to the end state | " + " | ".join(f"{med[v]:.1f}" for v in variants) + " |",
        "| of which the query, s | "
        + " | ".join(f"{statistics.median(r.query_seconds for r in by[v]):.1f}" for v in variants)
        + " |",
        "| rows/s | " + " | ".join(f"{rows / med[v]:,.0f}" for v in variants) + " |",
        "| files at the end | " + " | ".join(", ".join(str(r.files) for r in by[v]) for v in variants) + " |",
        "| load average, 1 min, before -> after each run | "
        + " | ".join(", ".join(f"{r.load[0]:.1f} -> {r.load[1]:.1f}" for r in by[v]) for v in variants)
        + " |",
        "",
    ]
    if "delta+compact" in by:
        for ours in [v for v in variants if v != "delta+compact"]:
            ratios = _ratios(by["delta+compact"], by[ours])
            verdict = "holds" if statistics.median(ratios) >= 1.0 else "does NOT hold"
            lines.append(
                f"- Peer's seconds over {LABELS[ours]}'s by round: {', '.join(f'{x:.2f}' for x in ratios)}; median "
                f"**{statistics.median(ratios):.2f}** (goal >= 1.0, aim 1.2: {verdict})."
            )
    if "ours" in by and "ours-unix" in by:
        ratios = _ratios(by["ours-unix"], by["ours"])
        lines.append(
            f"- Ours over Unix sockets' seconds over ours' (TCP) by round: {', '.join(f'{x:.2f}' for x in ratios)}; "
            f"median **{statistics.median(ratios):.2f}**."
        )
    if "ours" in by:
        for table in [v for v in variants if v in TABLE_FORMATS]:
            ratios = _ratios(by[table], by["ours"])
            verdict = "holds" if statistics.median(ratios) <= 1.05 else "does NOT hold"
            lines.append(
                f"- {LABELS[table]}'s seconds over the directory's by round: {', '.join(f'{x:.2f}' for x in ratios)}; "
                f"median **{statistics.median(ratios):.2f}** (goal <= 1.05: {verdict})."
            )
    return [*lines, ""]


def args_rounds(by: dict[str, list[Run]]) -> int:
    return max(len(r) for r in by.values())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=2_500_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--workload", action="append", choices=sorted(data.WORKLOADS), help="repeatable")
    parser.add_argument("--quick", action="store_true", help="200,000 rows, 1 round")
    parser.add_argument("--dir", type=Path, default=None, help="where the runs' files go (a temp directory)")
    parser.add_argument("--keep", action="store_true", help="keep each run's files")
    parser.add_argument(
        "--variants",
        default=",".join(v for v in VARIANTS if v != "ours-unix"),
        help=f"comma-separated, of {', '.join(VARIANTS)} (default: all but ours-unix)",
    )
    args = parser.parse_args(argv)
    variants = tuple(v for v in VARIANTS if v in args.variants.split(","))
    if args.quick:
        args.rows, args.rounds = 200_000, 1
    try:
        import deltalake
    except ImportError:
        raise SystemExit("this benchmark needs deltalake: pip install -e '.[bench]'") from None
    workloads = args.workload or ["events", "strings"]
    started, load = time.monotonic(), os.getloadavg()
    work = data.work_directory(args.dir, "bench-delta-peer-")
    print(f"deltalake {deltalake.__version__}; {os.cpu_count()} CPU(s); work in {work}", flush=True)
    lines: list[str] = []
    try:
        for k, workload in enumerate(workloads):
            input_dir = work / f"input-{workload}"
            data.generate(input_dir, args.rows, data.WORKLOADS[workload])
            runs = []
            for round_ in range(1, args.rounds + 1):
                order = variants if (round_ + k) % 2 else variants[::-1]
                runs += [run_once(args, work, input_dir, workload, v, round_) for v in order]
            lines += report(workload, runs, args.rows, variants)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    end = os.getloadavg()
    print("\n".join(["", *lines]))
    print(
        f"{os.cpu_count()} CPU(s); load average (1/5/15 min) at the start {load[0]:.2f}/{load[1]:.2f}/{load[2]:.2f}, "
        f"at the end {end[0]:.2f}/{end[1]:.2f}/{end[2]:.2f}; {(time.monotonic() - started) / 60:.1f} minutes."
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
