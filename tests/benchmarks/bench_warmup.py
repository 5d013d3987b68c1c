"""What the Python workers' warm-up (:mod:`filesink.cli.warmup`) saves at each start of ``filesink run``: the same
short run (``--available-now``, a fresh state each time) with and without it, alternating, side by side.

Not a test (pytest does not collect it). Run from the repository root::

    python tests/benchmarks/bench_warmup.py                  # 200,000 rows of events, 5 rounds
    python tests/benchmarks/bench_warmup.py --rows 1000000 --rounds 3

Each run is ``filesink run`` in a process of its own (``local[2]``); "without" replaces the warm-up by a function
that starts nothing, in that process only. Measured: the command's seconds from its start to its end, and the
seconds from the query's start to the end of its first batch (the first append included), read from the query's
progress. Prints the machine's load before and after every run, the medians and their ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import bench_sinks_data as data

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
VARIANTS = ("with", "without")
DEADLINE_SECONDS = 600

_JOB = """
import json, sys, time
import filesink.cli.run as run_module
from filesink.cli.main import main
if sys.argv[1] == "without":
    run_module.start_python_workers = lambda spark, tasks: None
started = time.monotonic()
code = main(sys.argv[2:])
print(json.dumps({"seconds": time.monotonic() - started, "code": code}))
"""


def load() -> float:
    return os.getloadavg()[0]


def one_run(variant: str, input_dir: Path, work: Path) -> dict[str, float]:
    work.mkdir()
    args = [
        *("run", "--input", str(input_dir), "--output", str(work / "out")),
        *("--state-dir", str(work / "state"), "--checkpoint", str(work / "checkpoint")),
        *("--available-now", "--parallelism", "2"),
    ]
    env = dict(os.environ, PYTHONPATH=str(REPO))
    done = subprocess.run(
        [sys.executable, "-c", _JOB, variant, *args], capture_output=True, text=True, env=env, timeout=DEADLINE_SECONDS
    )
    if done.returncode != 0:
        raise SystemExit(f"{variant}: filesink run failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    first = _first_batch_seconds(work / "checkpoint")
    return {"seconds": result["seconds"], "first_batch": first}


def _first_batch_seconds(checkpoint: Path) -> float:
    """Seconds from the query's start to the end of batch 0: the commit file's time less the offsets file's
    (Spark writes ``offsets/0`` when it plans the batch, ``commits/0`` when the batch has been written)."""
    return (checkpoint / "commits" / "0").stat().st_mtime - (checkpoint / "offsets" / "0").stat().st_mtime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    print(f"{os.cpu_count()} CPU(s); load {load():.1f}", flush=True)
    runs: dict[str, list[dict[str, float]]] = {v: [] for v in VARIANTS}
    with tempfile.TemporaryDirectory(prefix="bench-warmup-") as tmp:
        root = Path(tmp)
        data.generate(root / "input", args.rows)
        for r in range(args.rounds):
            order = VARIANTS if r % 2 == 0 else VARIANTS[::-1]
            for variant in order:
                before = load()
                t = time.monotonic()
                figures = one_run(variant, root / "input", root / f"{variant}-{r}")
                runs[variant].append(figures)
                print(
                    f"  {variant:8} round {r + 1}: {figures['seconds']:.2f} s, first batch "
                    f"{figures['first_batch']:.2f} s; load {before:.1f} -> {load():.1f} "
                    f"({time.monotonic() - t:.0f} s with the interpreter's start)",
                    flush=True,
                )
    print(f"load at the end {load():.1f}")
    for key in ("seconds", "first_batch"):
        medians = {v: statistics.median(f[key] for f in runs[v]) for v in VARIANTS}
        print(
            f"{key}: with {medians['with']:.2f} s, without {medians['without']:.2f} s, "
            f"with / without {medians['with'] / medians['without']:.3f}"
        )


if __name__ == "__main__":
    main()
