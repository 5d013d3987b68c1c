"""The Grafana dashboard's panels (docs/grafana-dashboard.json) drawn over a real run, into docs/observability.png.

Starts ``filesink run`` (local directories) with ``--metrics-port``, feeds its landing directory a generated Parquet
file every few seconds for most of ``--seconds``, scrapes ``http://127.0.0.1:PORT/metrics`` every second (each
scrape and the whole run have deadlines), stops the run with Ctrl-C, saves the scraped series as JSON and plots the
dashboard's panels from them with matplotlib. ``--from-json FILE`` plots a saved run again without running anything.
The expressions are evaluated here as Prometheus would over a window of ``WINDOW`` seconds (``rate``, ``increase``,
``histogram_quantile``); :data:`PANELS` names the same titles and metrics as the dashboard (a test checks it).

Needs the ``metrics`` and ``bench`` extras (prometheus_client, matplotlib) and Java for Spark; ``--s3`` also the
``demo`` extra (SeaweedFS), for a run whose output and log store are on S3, so that the storage panels have
requests to show::

    python tests/benchmarks/render_dashboard.py --s3 --json run.json  # ~4 minutes: run, scrape, plot
    python tests/benchmarks/render_dashboard.py --from-json run.json  # plot a saved run again
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import itertools
import json
import math
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
PNG = ROOT / "docs" / "observability.png"
WINDOW = 10.0
"""Seconds of the window of rates, increases and quantiles (the dashboard's ``$__rate_interval``)."""
STARTUP_DEADLINE = 240.0
"""Seconds for ``filesink run`` to start Spark and serve its first scrape."""
SCRAPE_TIMEOUT = 2.0


@dataclass(frozen=True)
class Series:
    """One expression of a panel: ``kind`` is ``rate``, ``increase``, ``gauge`` or a quantile (``p50``, ``p95``,
    ``p99``) of a histogram; summed (gauges: the max) over the labels not in ``by``; times ``scale``."""

    kind: str
    metric: str
    by: tuple[str, ...] = ("sink",)
    legend: str = ""
    scale: float = 1.0
    right: bool = False
    """Drawn against a second axis on the right (the dashboard's override of the series' unit)."""


def _quantiles(metric: str) -> list[Series]:
    return [Series(f"p{q}", metric, ("sink",), f"p{q}") for q in (50, 95, 99)]


PANELS: list[tuple[str, str, list[Series]]] = [
    (
        "Rows appended and committed",
        "rows/s",
        [
            Series("rate", "filesink_rows_appended_total", legend="appended"),
            Series("rate", "filesink_rows_committed_total", legend="committed"),
        ],
    ),
    ("Visibility lag", "s", [Series("gauge", "filesink_oldest_held_epoch_age_seconds", legend="oldest held epoch")]),
    ("Rows held", "rows", [Series("gauge", "filesink_rows_held", legend="rows")]),
    (
        "Log bytes and epochs held",
        "bytes / epochs",
        [
            Series("gauge", "filesink_log_bytes_held", legend="bytes"),
            Series("gauge", "filesink_epochs_held", legend="epochs", right=True),
        ],
    ),
    (
        "Files and bytes committed",
        "files/min / bytes/s",
        [
            Series("rate", "filesink_files_committed_total", legend="files/min", scale=60.0),
            Series("rate", "filesink_bytes_committed_total", legend="bytes/s", right=True),
        ],
    ),
    (
        "Pending files and writer term",
        "",
        [
            Series("gauge", "filesink_pending_files", legend="pending"),
            Series("gauge", "filesink_writer_term", legend="term"),
        ],
    ),
    ("Append latency", "s", _quantiles("filesink_append_seconds")),
    ("Roll latency", "s", _quantiles("filesink_roll_seconds")),
    ("Table commit latency", "s", _quantiles("filesink_table_commit_seconds")),
    (
        "Storage requests by store and kind",
        "req/s",
        [Series("rate", "filesink_storage_requests_total", ("sink", "store", "kind"))],
    ),
    (
        "Storage errors by store and kind",
        "req/s",
        [Series("rate", "filesink_storage_errors_total", ("sink", "store", "kind"))],
    ),
    (
        "Retries, refusals, fencings and restarts",
        f"per {WINDOW:.0f} s",
        [
            Series("increase", "filesink_retries_total", legend="retries"),
            Series("increase", "filesink_refusals_total", ("sink", "reason"), "refused"),
            Series("increase", "filesink_fenced_total", legend="fenced"),
            Series("increase", "filesink_query_restarts_total", legend="query restarted"),
        ],
    ),
]
"""The dashboard's panels, in its order: title, the y axis, the series."""

Sample = tuple[str, dict[str, str], float]
Scrape = tuple[float, list[Sample]]


# -- evaluation ----------------------------------------------------------------------------------------


def _grouped(samples: Iterable[Sample], name: str, by: tuple[str, ...], extra: str | None = None) -> dict[tuple, Any]:
    """Samples named ``name`` by the values of ``by`` (and of ``extra``, e.g. ``le``), summed within a group."""
    out: dict[tuple, float] = {}
    for sample, labels, value in samples:
        if sample != name:
            continue
        key = tuple(labels.get(b, "") for b in by) + ((labels.get(extra, ""),) if extra else ())
        out[key] = out.get(key, 0.0) + value
    return out


def _increase(values: list[tuple[float, float]]) -> float:
    """The increase of a counter over consecutive ``(t, value)`` points, a reset (a new run) counted as from 0."""
    total = 0.0
    for (_, a), (_, b) in itertools.pairwise(values):
        total += b - a if b >= a else b
    return total


def counter_series(scrapes: list[Scrape], name: str, by: tuple[str, ...], per_second: bool) -> dict[tuple, list]:
    """``rate(name[WINDOW])`` (``per_second``) or ``increase(name[WINDOW])`` summed by ``by``: ``key -> [(t, v)]``."""
    grouped = [(t, _grouped(samples, name, by)) for t, samples in scrapes]
    keys = sorted({k for _, g in grouped for k in g})
    out: dict[tuple, list] = {k: [] for k in keys}
    for i, (t, _) in enumerate(grouped):
        window = [g for g in grouped[: i + 1] if g[0] >= t - WINDOW]
        if len(window) < 2:
            continue
        span = window[-1][0] - window[0][0]
        for k in keys:
            points = [(wt, g[k]) for wt, g in window if k in g]
            if len(points) < 2:
                continue
            inc = _increase(points)
            out[k].append((t, inc / span if per_second and span > 0 else inc))
    return out


def gauge_series(scrapes: list[Scrape], name: str, by: tuple[str, ...]) -> dict[tuple, list]:
    """``max by (by) (name)``: ``key -> [(t, v)]``."""
    out: dict[tuple, list] = {}
    for t, samples in scrapes:
        best: dict[tuple, float] = {}
        for sample, labels, value in samples:
            if sample == name:
                key = tuple(labels.get(b, "") for b in by)
                best[key] = max(best.get(key, value), value)
        for k, v in best.items():
            out.setdefault(k, []).append((t, v))
    return out


def histogram_quantile(q: float, buckets: dict[float, float]) -> float:
    """Prometheus's ``histogram_quantile``: ``buckets`` maps each upper bound (``inf`` last) to a cumulative count;
    the quantile is interpolated linearly within its bucket (the highest finite bound if it falls in ``+Inf``)."""
    bounds = sorted(buckets)
    if not bounds or buckets[bounds[-1]] <= 0:
        return math.nan
    total = buckets[bounds[-1]]
    rank = q * total
    i = bisect.bisect_left([buckets[b] for b in bounds], rank)
    i = min(i, len(bounds) - 1)
    if math.isinf(bounds[i]):
        return bounds[-2] if len(bounds) > 1 else math.nan
    lower = bounds[i - 1] if i > 0 else 0.0
    below = buckets[bounds[i - 1]] if i > 0 else 0.0
    inside = buckets[bounds[i]] - below
    return lower + (bounds[i] - lower) * ((rank - below) / inside if inside > 0 else 1.0)


def quantile_series(scrapes: list[Scrape], q: float, metric: str, by: tuple[str, ...]) -> dict[tuple, list]:
    """``histogram_quantile(q, sum by (by, le) (rate(metric_bucket[WINDOW])))``: ``key -> [(t, v)]`` (no point
    while the window saw no observation)."""
    name = f"{metric}_bucket"
    increases = counter_series(scrapes, name, (*by, "le"), per_second=False)
    out: dict[tuple, list] = {}
    by_time: dict[tuple, dict[float, dict[float, float]]] = {}
    for key, points in increases.items():
        group, le = key[:-1], float(key[-1])
        for t, v in points:
            by_time.setdefault(group, {}).setdefault(t, {})[le] = v
    for group, times in by_time.items():
        for t in sorted(times):
            value = histogram_quantile(q, times[t])
            if not math.isnan(value):
                out.setdefault(group, []).append((t, value))
    return out


def evaluate(scrapes: list[Scrape], series: Series) -> dict[tuple, list]:
    if series.kind == "rate":
        found = counter_series(scrapes, series.metric, series.by, per_second=True)
    elif series.kind == "increase":
        found = counter_series(scrapes, series.metric, series.by, per_second=False)
    elif series.kind == "gauge":
        found = gauge_series(scrapes, series.metric, series.by)
    else:
        found = quantile_series(scrapes, int(series.kind[1:]) / 100, series.metric, series.by)
    return {k: [(t, v * series.scale) for t, v in points] for k, points in found.items()}


# -- plotting ------------------------------------------------------------------------------------------


def _broken(points: list[tuple[float, float]]) -> tuple[list[float], list[float]]:
    """The points with a gap (NaN) where no value was found for more than two seconds, as Grafana leaves it."""
    ts: list[float] = []
    vs: list[float] = []
    for t, v in points:
        if ts and t - ts[-1] > 2.0:
            ts.append(t)
            vs.append(math.nan)
        ts.append(t)
        vs.append(v)
    return ts, vs


def plot(scrapes: list[Scrape], png: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = 3
    rows = math.ceil(len(PANELS) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(6 * cols, 3.4 * rows), squeeze=False)
    sinks = {labels.get("sink", "") for _, samples in scrapes for _, labels, _ in samples}
    for ax, (name, unit, panel_series) in zip(axes.flat, PANELS, strict=False):
        lines: list[Any] = []
        twin = ax.twinx() if any(s.right for s in panel_series) else None
        for n, series in enumerate(panel_series):
            target = twin if series.right and twin is not None else ax
            for key, points in sorted(evaluate(scrapes, series).items()):
                if not points:
                    continue
                labels = [v for v in key[1:] if v] if len(sinks) <= 1 else [v for v in key if v]
                legend = " ".join([series.legend, *labels]).strip() or series.metric
                ts, vs = _broken(points)
                color = None if len(panel_series) == 1 else f"C{n}"
                lines += target.plot(ts, vs, label=legend, linewidth=1.2, color=color)
        ax.set_title(name, fontsize=10)
        ax.set_ylabel(unit, fontsize=8)
        ax.set_xlabel("seconds since the first rows were appended", fontsize=8)
        for a in (ax, twin) if twin is not None else (ax,):
            a.tick_params(labelsize=7)
            a.set_ylim(bottom=0)
        if lines:
            ax.legend(lines, [line.get_label() for line in lines], fontsize=6, loc="upper left", ncol=2)
        else:
            ax.text(0.5, 0.5, "none in this run", ha="center", va="center", transform=ax.transAxes, fontsize=8)
    for ax in list(axes.flat)[len(PANELS) :]:
        ax.axis("off")
    fig.suptitle(title, fontsize=12)
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=90)
    plt.close(fig)


# -- a real run ----------------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _land(directory: Path, n: int, rows: int, rng: random.Random) -> None:
    """A Parquet file of ``rows`` generated rows, renamed into the landing directory whole."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    first = n * rows
    table = pa.table(
        {
            "id": pa.array(range(first, first + rows), pa.int64()),
            "user_id": pa.array([rng.randrange(100_000) for _ in range(rows)], pa.int64()),
            "event_date": pa.array([f"2026-01-{1 + rng.randrange(3):02d}" for _ in range(rows)]),
            "amount": pa.array([rng.random() * 100 for _ in range(rows)], pa.float64()),
            "payload": pa.array([f"event-{rng.getrandbits(64):016x}" for _ in range(rows)]),
        }
    )
    hidden = directory / f".part-{n:05d}.parquet"
    pq.write_table(table, hidden)
    hidden.rename(directory / f"part-{n:05d}.parquet")


def scrape(url: str) -> list[Sample]:
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(url, timeout=SCRAPE_TIMEOUT) as answer:
        text = answer.read().decode()
    return [
        (s.name, dict(s.labels), float(s.value))
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name.startswith("filesink_")
    ]


def _appended(samples: list[Sample]) -> float:
    return sum(v for name, _, v in samples if name == "filesink_rows_appended_total")


@contextlib.contextmanager
def _locations(workdir: Path, s3: bool) -> Iterator[tuple[list[str], dict[str, str]]]:
    """The run's output and log store options and environment: local directories, or (``s3``) a SeaweedFS S3
    server started on 127.0.0.1 for the run (stopped after), so that the storage panels have requests to show."""
    if not s3:
        yield ["--output", str(workdir / "out")], {}
        return
    from filesink.demo.s3server import SeaweedServer

    server = SeaweedServer(workdir / "s3", bucket="dashboard")
    settings = server.start()
    try:
        env = {
            "AWS_ACCESS_KEY_ID": settings.access_key,
            "AWS_SECRET_ACCESS_KEY": settings.secret_key,
            "AWS_DEFAULT_REGION": settings.region,
        }
        where = ["--output", settings.url("events"), "--log-store", settings.url("events-log")]
        yield [*where, "--s3-endpoint", settings.endpoint], env
    finally:
        server.stop()


def record(workdir: Path, seconds: float, rows_per_file: int, every: float, s3: bool) -> dict[str, Any]:
    """Run ``filesink run`` with ``--metrics-port`` for about ``seconds`` from its first appended rows (a file lands
    every ``every`` seconds for the first three quarters, then the last rows are rolled by age), scraping every
    second; its scrapes and command."""
    landing, port = workdir / "in", _free_port()
    landing.mkdir(parents=True)
    with _locations(workdir, s3) as (where, env):
        command = [
            *(sys.executable, "-m", "filesink", "run", "--input", str(landing), *where),
            *("--state-dir", str(workdir / "state"), "--key", "user_id", "--trigger", "2s"),
            *("--max-file-age", "20s", "--target-file-size", "4MiB", "--parallelism", "2"),
            *("--metrics-port", str(port)),
        ]
        scrapes = _scrape_run(command, dict(os.environ, **env), workdir, port, seconds, rows_per_file, every)
    return {
        "command": ["filesink", *command[3:]],
        "storage": "s3 (SeaweedFS on 127.0.0.1)" if s3 else "local directories",
        "files_landed": len(list(landing.glob("part-*.parquet"))),
        "rows_per_file": rows_per_file,
        "window_seconds": WINDOW,
        "scrapes": [{"t": t, "samples": [list(x) for x in samples]} for t, samples in scrapes],
    }


def _scrape_run(
    command: list[str], env: dict[str, str], workdir: Path, port: int, seconds: float, rows: int, every: float
) -> list[Scrape]:
    url = f"http://127.0.0.1:{port}/metrics"
    log = (workdir / "run.log").open("w")
    proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=ROOT, env=env)
    rng, scrapes, landed = random.Random(7), [], 0
    try:
        _land(workdir / "in", landed, rows, rng)
        landed += 1
        started = time.monotonic()
        while True:  # Spark starts, and appends the first file: the clock starts there
            if proc.poll() is not None:
                raise SystemExit(f"filesink run exited with {proc.returncode} before its first batch: see {log.name}")
            if time.monotonic() - started > STARTUP_DEADLINE:
                raise SystemExit(f"no rows appended at {url} within {STARTUP_DEADLINE:.0f} s: see {log.name}")
            with contextlib.suppress(urllib.error.URLError, ConnectionError, TimeoutError):
                first = scrape(url)
                if _appended(first) > 0:
                    break
            time.sleep(1)
        t0 = time.monotonic()
        scrapes.append((0.0, first))
        next_file = t0
        while (now := time.monotonic()) - t0 < seconds:
            if proc.poll() is not None:
                raise SystemExit(f"filesink run exited with {proc.returncode} during the run: see {log.name}")
            if now - t0 < 0.75 * seconds and now >= next_file:
                _land(workdir / "in", landed, rows, rng)
                landed += 1
                next_file += every
            try:
                scrapes.append((round(time.monotonic() - t0, 3), scrape(url)))
            except (urllib.error.URLError, ConnectionError, TimeoutError) as e:
                print(f"scrape failed: {e}", file=sys.stderr)
            time.sleep(max(0.0, 1.0 - (time.monotonic() - now)))
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGINT)  # a clean stop: the sink closes
            try:
                proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)
        log.close()
    return scrapes


def load(path: Path) -> tuple[list[Scrape], dict[str, Any]]:
    saved = json.loads(path.read_text())
    scrapes = [
        (float(s["t"]), [(n, dict(labels), float(v)) for n, labels, v in s["samples"]]) for s in saved["scrapes"]
    ]
    return scrapes, saved


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--from-json", type=Path, metavar="FILE", help="plot a saved run; run nothing")
    parser.add_argument("--json", type=Path, metavar="FILE", help="where to save the scraped series")
    parser.add_argument("--png", type=Path, default=PNG, help=f"the picture (default {PNG.relative_to(ROOT)})")
    parser.add_argument("--seconds", type=float, default=150.0, help="how long to scrape the run (default 150)")
    parser.add_argument("--rows-per-file", type=int, default=40_000, help="rows of each landed file")
    parser.add_argument("--every", type=float, default=2.0, help="seconds between landed files")
    parser.add_argument("--workdir", type=Path, help="the run's directories (default: a new temporary one)")
    parser.add_argument(
        "--s3", action="store_true", help="output and log store on a SeaweedFS S3 server started on 127.0.0.1"
    )
    parser.add_argument("--title", help="the picture's title (default: says what ran)")
    args = parser.parse_args(argv)
    if args.from_json:
        scrapes, saved = load(args.from_json)
    else:
        workdir = args.workdir or Path(tempfile.mkdtemp(prefix="filesink-dashboard-"))
        saved = record(workdir, args.seconds, args.rows_per_file, args.every, args.s3)
        path = args.json or workdir / "dashboard-run.json"
        path.write_text(json.dumps(saved))
        print(f"saved {len(saved['scrapes'])} scrapes to {path}")
        scrapes, saved = load(path)
    landed = saved.get("files_landed")
    title = args.title or "filesink dashboard panels over a real run" + (
        f" ({landed} files of {saved['rows_per_file']:,} rows landed; {saved.get('storage', 'local directories')})"
        if landed
        else ""
    )
    plot(scrapes, args.png, title)
    print(f"wrote {args.png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
