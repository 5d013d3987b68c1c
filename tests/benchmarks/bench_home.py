"""What the durable home costs, with the log store on S3: requests and milliseconds per epoch, throughput with
and without it, and how many objects it keeps as the history grows.

Not a test (pytest does not collect it). Run from the repository root::

    python tests/benchmarks/bench_home.py            # 4 rounds of 2 epoch sizes, a 10,000-epoch count: ~40 min
    python tests/benchmarks/bench_home.py --quick    # 1 round, a 1,000-epoch count: a smoke run, ~5 min
    python tests/benchmarks/bench_home.py --skip cost --skip count   # the reads part alone

The sink is :class:`ExactlyOnceParquetSink` driven without Spark (as ``bench_sinks_direct.py`` does): its append
step is done in this process with the log store's ``append_segment``, one segment per writer (what each Spark
task of the append job runs, here one after the other), and with no Spark session its files are written in this
process (what each Spark file-writing task runs). Everything else is the sink's own code: replay check, seal,
plan, pre-commit, write, commit, garbage collection, start-up recovery. The log store and the output are on S3:
a SeaweedFS server the script starts on 127.0.0.1 (``filesink.demo.s3server.SeaweedServer``), or the server
the test suite's ``FILESINK_TEST_S3_*`` variables name (MinIO, ...). The state directory is local, as in
production. 256 vnodes, 2 writers, ``Rollover(max_epochs=10)``: 1 epoch in 10 writes two files.

Two variants run side by side, on fresh locations in each round:

- **home**: the sink as it is;
- **no home**: the same sink with :class:`logstore.home.DurableHome` replaced, for its ``LogStore``, by
  :class:`NoHome`, whose record reads, writes and deletes and term checks are no-ops. File writers still
  publish and check ``writers/term`` (that fencing is older than the home), so this is the sink without what
  the durable home added. The substitution is done in this script only.

In a round both sinks take the same epochs, epoch by epoch, one right after the other, the first alternating
(from epoch to epoch, and from one epoch that writes files to the next), so that a change in the machine's load
hits both; the round after starts with the other variant. Throughput is rows over the summed time of the epochs
(``sink(batch, epoch)``); the ratio is home / no home per round, and its median over the rounds is reported.

S3 requests are counted by wrapping aiobotocore's ``_make_api_call`` (every call s3fs makes, paginated listings
included; retries inside botocore are not counted again), by verb (GET, PUT, LIST, DELETE, HEAD, and MPU for the
output's multipart uploads), by step of the epoch (append, seal, roll) and by what the key is (home records,
``writers/term``, segments, output, ...).

The count runs take one sink (with the home) through 10,000 epochs of 100 rows and list ``home/`` and
``writers/`` after 100 epochs and at the end, and at every epoch of the 20 before each (the sink prunes the home
at its garbage sweep, every 20 epochs). 10,000 epochs with the log store on S3 took hours here when writing a file
read its rows block by block, one GET each, so that run's log store is a local directory (the same records;
``--count-on-s3`` to put it on S3), and a short count run of 200 epochs on S3 shows the same figures there.

The reads part compares the log store on S3 with the log store in a local directory (output on S3 for both):
two sinks with the home take the same epochs side by side, and for each roll that writes files it reports the
S3 requests of reading the log segments (GET and HEAD of the log store's segments in the roll step), against
the least a roll needs (one ranged GET per segment and file writer), and the roll's seconds.

See ``docs/benchmarks.md``.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import datetime
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from bench_sinks_data import make_batch

import logstore.store
from filesink import ExactlyOnceParquetSink, Rollover
from filesink.demo.s3server import S3Settings, SeaweedServer, ensure_bucket, settings_from_env
from logstore import VNODE_COLUMN, LogLocation, SegmentDescriptor, append_segment
from logstore.home import HOME, TERM_FILE, DurableHome

VNODES = 256
PARALLELISM = 2
MAX_EPOCHS = 10
ROLLOVER = Rollover(target_file_size=None, max_epochs=MAX_EPOCHS, max_age_seconds=None)
"""Each of the 2 writers writes a file every 10 epochs: 1 epoch in 10 writes files, 9 write none."""
THROUGHPUT_GOAL = 0.95
COUNT_GOAL = 1.1
SWEEP_WINDOW = 20
"""The sink lists the log store (and prunes the home) every 20 epochs: the count is looked at over that many."""

VERBS = ("GET", "PUT", "LIST", "DELETE", "HEAD", "MPU")
_VERB = {
    "GetObject": "GET",
    "PutObject": "PUT",
    "ListObjectsV2": "LIST",
    "ListObjects": "LIST",
    "ListMultipartUploads": "LIST",
    "DeleteObject": "DELETE",
    "DeleteObjects": "DELETE",
    "HeadObject": "HEAD",
    "HeadBucket": "HEAD",
    "CreateMultipartUpload": "MPU",
    "UploadPart": "MPU",
    "CompleteMultipartUpload": "MPU",
    "AbortMultipartUpload": "MPU",
}


# -- counting S3 requests ----------------------------------------------------------------------------------


class RequestCounter:
    """Counts the S3 calls of this process by (step, what, verb); :meth:`take` returns and resets the counts."""

    def __init__(self) -> None:
        self.counts: collections.Counter[tuple[str, str, str]] = collections.Counter()
        self.step = "other"
        self.enabled = True
        self.logs: list[str] = []
        self.outputs: list[str] = []

    def install(self) -> None:
        from aiobotocore.client import AioBaseClient  # type: ignore[import-untyped]

        original = AioBaseClient._make_api_call
        counter = self

        async def counted(client: Any, operation: str, params: dict[str, Any]) -> Any:
            if counter.enabled:
                key = str(params.get("Key", params.get("Prefix", "")))
                what = counter.what(key)
                counter.counts[(counter.step, what, _VERB.get(operation, operation))] += 1
                body = params.get("Body")
                if operation == "PutObject" and isinstance(body, bytes | bytearray | memoryview):
                    counter.counts[(counter.step, what, "bytes")] += len(body)
            return await original(client, operation, params)

        AioBaseClient._make_api_call = counted

    def watch(self, bucket: str, log_prefix: str, output_prefix: str) -> None:
        """Classify keys under these prefixes (``s3://bucket/prefix`` URLs' keys) from now on."""
        self.logs.append(log_prefix.removeprefix(f"s3://{bucket}/").rstrip("/"))
        self.outputs.append(output_prefix.removeprefix(f"s3://{bucket}/").rstrip("/"))

    def what(self, key: str) -> str:
        for log in self.logs:
            if key.startswith(f"{log}/{HOME}/"):
                return "home"
            if key == f"{log}/{TERM_FILE}":
                return "writers/term"
            if key.startswith(f"{log}/writers/"):
                return "writer records"
            if key == f"{log}/sink.json":
                return "claim"
            if key == log or key.startswith(f"{log}/"):
                return "log segments"
        if any(key == out or key.startswith(f"{out}/") for out in self.outputs):
            return "output"
        return "other"

    @contextlib.contextmanager
    def in_step(self, step: str) -> Iterator[None]:
        before, self.step = self.step, step
        try:
            yield
        finally:
            self.step = before

    def take(self) -> collections.Counter[tuple[str, str, str]]:
        counts, self.counts = self.counts, collections.Counter()
        return counts


COUNTER = RequestCounter()


# -- the variant without the durable home (this script only) -------------------------------------------------


class NoHome(DurableHome):
    """A durable home that keeps nothing: no record is read, written or deleted, no term is checked. Terms are
    still taken (one above the database's) so that the sink runs as it did before the home."""

    def read(self, relpath: str) -> Any:
        return None

    def write(self, relpath: str, record: Any) -> None:
        return None

    def create(self, relpath: str, record: Any) -> bool:
        return True

    def delete(self, relpath: str) -> None:
        return None

    def names(self, prefix: str) -> list[str]:
        return []

    def exists(self) -> bool:
        return False

    def published_term(self) -> int | None:
        return None

    def publish_term(self, term: int) -> None:
        return None

    def delete_records(self, relpaths: Iterable[str]) -> None:
        return None

    def take_term(self, at_least: int, extra: Any = None) -> int:
        return at_least + 1  # no term record, so none to read back


@contextlib.contextmanager
def home_variant(home: bool) -> Iterator[None]:
    """The sink as it is (``home``), or with :class:`NoHome` for every ``LogStore`` opened inside (a log store
    makes its ``DurableHome`` when it opens, so the sink keeps its variant after this)."""
    if home:
        yield
        return
    module: Any = logstore.store
    saved = module.DurableHome
    module.DurableHome = NoHome
    try:
        yield
    finally:
        module.DurableHome = saved


# -- the sink without Spark --------------------------------------------------------------------------------


class Batch:
    """What the sink uses of a Spark DataFrame (its schema), plus the rows with their vnode column."""

    sparkSession = None

    def __init__(self, table: pa.Table) -> None:
        from pyspark.sql.types import DoubleType, LongType, StringType, StructField, StructType, TimestampType

        types = {"id": LongType(), "user_id": LongType(), "ts": TimestampType(), "amount": DoubleType()}
        self.schema = StructType([StructField(n, types.get(n, StringType())) for n in table.column_names])
        vnode = pc.cast(pc.bit_wise_and(table["user_id"], VNODES - 1), pa.int32())
        self.table = table.append_column(VNODE_COLUMN, vnode)
        self.num_rows = table.num_rows


class DirectSink(ExactlyOnceParquetSink):
    """The sink with its append done here: one segment per writer, as the append job's tasks write them."""

    def _append(self, df: Any, epoch: int, version: Any = None) -> list[SegmentDescriptor]:
        table, n = df.table, df.table.num_rows
        found = []
        for i in range(PARALLELISM):
            lo, hi = i * n // PARALLELISM, (i + 1) * n // PARALLELISM
            writer = self._store.writer_id(f"p{i}-a0")
            descriptor = append_segment(self._store.target, epoch, table.slice(lo, hi - lo), writer_id=writer)
            if descriptor is not None:
                found.append(descriptor)
        return found


@dataclass
class Epoch:
    """One epoch's figures."""

    files: bool
    seconds: float
    steps: dict[str, float]
    requests: collections.Counter[tuple[str, str, str]]


@dataclass
class Run:
    """One variant's run of a number of epochs."""

    home: bool
    rows: int
    seconds: float = 0.0
    start_seconds: float = 0.0
    start_requests: collections.Counter[tuple[str, str, str]] = field(default_factory=collections.Counter)
    epochs: list[Epoch] = field(default_factory=list)

    def select(self, files: bool) -> list[Epoch]:
        return [e for e in self.epochs if e.files == files]


class Locations:
    """Fresh S3 (or local) locations for one sink: log store, output, and a local state directory."""

    def __init__(self, settings: S3Settings | None, work: Path, log_local: bool = False) -> None:
        run = f"bench-home-{uuid.uuid4().hex[:12]}"
        self.state = work / run / "state"
        self.options: dict[str, Any] = settings.storage_options() if settings else {}
        if settings is None:
            self.log, self.output = str(work / run / "log"), str(work / run / "out")
        else:
            self.output = settings.url(run, "out")
            self.log = str(work / run / "log") if log_local else settings.url(run, "log")
            COUNTER.watch(settings.bucket, settings.url(run, "log"), self.output)


def open_sink(where: Locations) -> DirectSink:
    return DirectSink(
        where.output,
        where.state,
        log_store=where.log,
        key_columns=["user_id"],
        vnodes=VNODES,
        parallelism=PARALLELISM,
        rollover=ROLLOVER,
        storage_options=where.options,
    )


def _timed_steps(sink: DirectSink, steps: dict[str, float]) -> None:
    """Time the sink's append, seal and roll (and attribute their S3 calls to them): the benchmark's own
    wrappers on this sink object, the sink has no instrumentation."""

    def wrap(owner: Any, name: str, step: str) -> None:
        original: Callable[..., Any] = getattr(owner, name)

        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                with COUNTER.in_step(step):
                    return original(*args, **kwargs)
            finally:
                steps[step] = steps.get(step, 0.0) + time.perf_counter() - start

        setattr(owner, name, timed)

    wrap(sink, "_append", "append")
    wrap(sink.log_store, "seal", "seal")
    wrap(sink, "_roll", "roll")


class Variant:
    """One variant's sink at fresh locations, its epochs timed and their S3 requests counted."""

    def __init__(self, home: bool, where: Locations) -> None:
        self.run = Run(home, rows=0)
        COUNTER.take()
        started = time.perf_counter()
        with home_variant(home), COUNTER.in_step("start"):
            self.sink = open_sink(where)
        self.run.start_seconds = time.perf_counter() - started
        self.run.start_requests = COUNTER.take()
        self.steps: dict[str, float] = {}
        _timed_steps(self.sink, self.steps)

    def epoch(self, batch: Batch, epoch: int) -> None:
        files_before = self.sink.stats.files_committed
        self.steps.clear()
        COUNTER.take()
        start = time.perf_counter()
        self.sink(batch, epoch)
        seconds = time.perf_counter() - start
        wrote = self.sink.stats.files_committed > files_before
        self.run.epochs.append(Epoch(wrote, seconds, dict(self.steps), COUNTER.take()))
        self.run.rows += batch.num_rows
        self.run.seconds += seconds

    def close(self) -> None:
        self.sink.close()


def run_round(settings: S3Settings, work: Path, batches: list[Batch], epochs: int, home_first: bool) -> list[Run]:
    """Both variants side by side at fresh locations: epoch by epoch, each epoch done by one variant and then
    the other, which goes first alternating (``home_first``: the home at epoch 0). Returns [home, no home]."""
    variants = {home: Variant(home, Locations(settings, work)) for home in (home_first, not home_first)}
    try:
        for epoch in range(epochs):
            # The first alternates from epoch to epoch, and also from one epoch that writes files to the next.
            first = home_first != ((epoch + epoch // MAX_EPOCHS) % 2 == 1)
            for home in (first, not first):
                variants[home].epoch(batches[epoch % len(batches)], epoch)
    finally:
        for variant in variants.values():
            variant.close()
    return [variants[True].run, variants[False].run]


# -- figures -----------------------------------------------------------------------------------------------


def per_epoch(
    epochs: list[Epoch], *, step: str | None = None, what: str | None = None, verbs: tuple[str, ...] = VERBS
) -> dict[str, float]:
    """Mean S3 requests per epoch by verb (of one step, of one kind of key, or all); ``bytes``: bytes PUT."""
    totals: collections.Counter[str] = collections.Counter()
    for e in epochs:
        for (s, w, verb), n in e.requests.items():
            if (step is None or s == step) and (what is None or w == what):
                totals[verb] += n
    return {v: totals[v] / max(1, len(epochs)) for v in verbs}


def median_ms(epochs: list[Epoch], steps: tuple[str, ...]) -> float:
    return 1000 * statistics.median(sum(e.steps.get(s, 0.0) for s in steps) for e in epochs) if epochs else 0.0


def fmt_requests(counts: dict[str, float]) -> str:
    return " ".join(f"{counts[v]:6.2f}" for v in VERBS) + f" | {sum(counts.values()):6.2f}"


def load() -> str:
    one, five, fifteen = os.getloadavg()
    try:
        proc = Path("/proc/loadavg").read_text().strip()
    except OSError:
        proc = "?"
    return f"load average {one:.2f} {five:.2f} {fifteen:.2f} (/proc/loadavg: {proc}), {os.cpu_count()} CPU(s)"


def throughput(settings: S3Settings, work: Path, rows: int, epochs: int, rounds: int) -> tuple[float, list[list[Run]]]:
    """Rounds of both variants side by side, alternating which goes first; the median over the rounds of the
    ratio of throughputs (home / no home, rows per second of epoch time), and the runs of each round."""
    batches = [Batch(make_batch(i * rows, rows, seed=100 + i)) for i in range(8)]
    done: list[list[Run]] = []
    ratios: list[float] = []
    quiet_ratios: list[float] = []
    print(f"\n{rows:,} rows per epoch, {epochs} epochs per variant and round, {rounds} round(s)")
    print(
        f"{'round':>5} {'first':>8} | {'home rows/s':>12} {'no home rows/s':>15} {'ratio':>6} | "
        f"{'ratio, epochs without files':>27} | {'load (1 min)':>12}"
    )
    for r in range(rounds):
        home_first = r % 2 == 0
        home, other = run_round(settings, work, batches, epochs, home_first)
        done.append([home, other])
        ratios.append(other.seconds / home.seconds)
        quiet = sum(e.seconds for e in other.select(False)) / sum(e.seconds for e in home.select(False))
        quiet_ratios.append(quiet)
        first = "home" if home_first else "no home"
        print(
            f"{r + 1:>5} {first:>8} | {home.rows / home.seconds:>12,.0f} {other.rows / other.seconds:>15,.0f} "
            f"{ratios[-1]:>6.3f} | {quiet:>27.3f} | {os.getloadavg()[0]:>12.2f}",
            flush=True,
        )
    ratio = statistics.median(ratios)
    goal = "holds" if ratio >= THROUGHPUT_GOAL else "does NOT hold"
    print(
        f"median ratio home / no home: {ratio:.3f} (goal >= {THROUGHPUT_GOAL}: {goal}); epochs without files "
        f"only: {statistics.median(quiet_ratios):.3f}"
    )
    return ratio, done


def paired_ms(rounds: list[list[Run]], files: bool, steps: tuple[str, ...]) -> float:
    """Median over the epochs (of every round) of home minus no home, each epoch number against itself (the
    two ran one right after the other)."""
    diffs = [
        1000 * (sum(a.steps.get(s, 0.0) for s in steps) - sum(b.steps.get(s, 0.0) for s in steps))
        for home, other in rounds
        for a, b in zip(home.epochs, other.epochs, strict=True)
        if a.files == files
    ]
    return statistics.median(diffs) if diffs else 0.0


def report_costs(rounds: list[list[Run]], rows: int) -> None:
    """Per-epoch requests and milliseconds of both variants, for epochs without and with files."""
    runs = [run for pair in rounds for run in pair]
    print(f"\nper epoch, {rows:,} rows per epoch (S3 requests: mean over the epochs of every round)")
    header = " ".join(f"{v:>6}" for v in VERBS) + " |  total"
    for files in (False, True):
        label = "epochs that write files" if files else "epochs with no file written"
        by = {home: [e for run in runs if run.home == home for e in run.select(files)] for home in (True, False)}
        if not by[True]:
            continue
        print(f"\n  {label} ({len(by[True])} per variant)")
        print(f"  {'S3 requests':<34} {header}")
        with_home, without = per_epoch(by[True]), per_epoch(by[False])
        print(f"  {'home':<34} {fmt_requests(with_home)}")
        print(f"  {'no home':<34} {fmt_requests(without)}")
        print(f"  {'extra':<34} {fmt_requests({v: with_home[v] - without[v] for v in VERBS})}")
        for step in ("append", "seal", "roll"):
            for what in ("home", "writers/term", "log segments", "claim", "writer records", "output"):
                a, b = per_epoch(by[True], step=step, what=what), per_epoch(by[False], step=step, what=what)
                extra = {v: a[v] - b[v] for v in VERBS}
                if any(abs(x) > 1e-9 for x in extra.values()):
                    print(f"    {f'of which {step}, {what}':<32} {fmt_requests(extra)}")
        written = {home: per_epoch(by[home], what="home", verbs=("bytes",))["bytes"] for home in (True, False)}
        print(f"  bytes written to home/ per epoch: {written[True]:,.0f} (no home: {written[False]:,.0f})")
        print(f"  {'ms (median)':<34} {'append':>8} {'seal':>8} {'roll':>8} {'seal+roll':>10} {'epoch':>8}")
        for home in (True, False):
            ms = [median_ms(by[home], (s,)) for s in ("append", "seal", "roll")]
            both = median_ms(by[home], ("seal", "roll"))
            epoch = 1000 * statistics.median(e.seconds for e in by[home])
            name = "home" if home else "no home"
            print(f"  {name:<34} {ms[0]:>8.1f} {ms[1]:>8.1f} {ms[2]:>8.1f} {both:>10.1f} {epoch:>8.1f}")
        seal, roll, both = (paired_ms(rounds, files, s) for s in (("seal",), ("roll",), ("seal", "roll")))
        print(f"  {'extra ms, paired by epoch':<34} {'':>8} {seal:>8.1f} {roll:>8.1f} {both:>10.1f}")
    print("\n  start-up (open the sink: lock, state database, recovery), median ms and S3 requests by verb:")
    for home in (True, False):
        starts = [run for run in runs if run.home == home]
        start_ms = 1000 * statistics.median(r.start_seconds for r in starts)
        counts: collections.Counter[str] = collections.Counter()
        for (_, _, verb), n in starts[0].start_requests.items():
            counts[verb] += n
        shown = ", ".join(f"{v} {counts[v]}" for v in VERBS if counts[v])
        print(f"    {'home' if home else 'no home':<8} {start_ms:7.0f} ms  {shown}")


def listing(location: LogLocation) -> dict[str, tuple[int, int]]:
    """Objects and bytes under ``home/`` and ``writers/`` of the log store (and in all)."""
    found: dict[str, list[int]] = {"home": [0, 0], "writers": [0, 0]}
    COUNTER.enabled = False
    try:
        for relpath, size in location.open().list_files():
            top = relpath.split("/", 1)[0]
            if top in found:
                found[top][0] += 1
                found[top][1] += size
    finally:
        COUNTER.enabled = True
    found["both"] = [found["home"][0] + found["writers"][0], found["home"][1] + found["writers"][1]]
    return {k: (v[0], v[1]) for k, v in found.items()}


def count_objects(
    settings: S3Settings | None, work: Path, epochs: int, rows: int, *, local: bool
) -> tuple[float, float]:
    """One sink through ``epochs`` small epochs; ``home/`` and ``writers/`` at 100 epochs and at the end (and
    their peaks over the last ``SWEEP_WINDOW`` epochs before each). Returns the count and bytes ratios."""
    where = Locations(settings, work, log_local=local)
    location = LogLocation(where.log, where.options if not local else {})
    batches = [Batch(make_batch(i * rows, rows, seed=500 + i)) for i in range(8)]
    checkpoints = (100, epochs)
    seen: dict[int, dict[str, tuple[int, int]]] = {}
    peaks: dict[int, dict[str, tuple[int, int]]] = {}
    where_log = "a local directory" if local else "S3"
    print(f"\nobjects of the durable home: one sink, {epochs:,} epochs of {rows:,} rows, log store on {where_log}")
    sink = open_sink(where)
    began = time.perf_counter()
    try:
        for epoch in range(epochs):
            sink(batches[epoch % len(batches)], epoch)
            done = epoch + 1
            for cp in checkpoints:
                if cp - SWEEP_WINDOW < done <= cp:
                    now = listing(location)
                    peak = peaks.setdefault(cp, now)
                    peaks[cp] = {k: (max(peak[k][0], now[k][0]), max(peak[k][1], now[k][1])) for k in now}
                    if done == cp:
                        seen[cp] = now
            if done % 1000 == 0:
                rate = done / (time.perf_counter() - began)
                print(f"  {done:,} epochs ({rate:.1f} epochs/s), {load()}", flush=True)
        COUNTER.take()
    finally:
        sink.close()
    print(f"  {epochs:,} epochs in {time.perf_counter() - began:.0f} s; files committed: {sink.stats.files_committed}")
    print(
        f"  {'after':>8} | {'home/':>18} | {'writers/':>16} | {'both':>18} | peak over the last {SWEEP_WINDOW} epochs"
    )
    for cp in checkpoints:
        s, p = seen[cp], peaks[cp]
        home, writers, both = s["home"], s["writers"], s["both"]
        print(
            f"  {cp:>8,} | {home[0]:>4} obj {home[1]:>9,} B | {writers[0]:>3} obj {writers[1]:>7,} B"
            f" | {both[0]:>4} obj {both[1]:>9,} B | {p['both'][0]} obj {p['both'][1]:,} B"
        )
    first, last = seen[checkpoints[0]]["both"], seen[checkpoints[1]]["both"]
    count_ratio, bytes_ratio = last[0] / first[0], last[1] / first[1]
    peak_first, peak_last = peaks[checkpoints[0]]["both"], peaks[checkpoints[1]]["both"]
    peak_ratio = peak_last[0] / peak_first[0], peak_last[1] / peak_first[1]
    held = all(r <= COUNT_GOAL for r in (count_ratio, bytes_ratio, *peak_ratio))
    print(
        f"  ratio {epochs:,} / 100 epochs: objects {count_ratio:.2f}, bytes {bytes_ratio:.2f} (peaks: objects "
        f"{peak_ratio[0]:.2f}, bytes {peak_ratio[1]:.2f}); goal <= {COUNT_GOAL}: {'holds' if held else 'does NOT hold'}"
    )
    return count_ratio, bytes_ratio


# -- reading the log back: log store on S3 against a local directory -----------------------------------------


def compare_reads(settings: S3Settings, work: Path, rows: int, epochs: int) -> dict[str, float]:
    """Two sinks side by side, the log store of one on S3 and of the other in a local directory (output on S3 for
    both); per roll that writes files: S3 requests of reading the log segments, and seconds. Returns the figures."""
    batches = [Batch(make_batch(i * rows, rows, seed=300 + i)) for i in range(8)]
    places = ("s3", "local")
    variants = {place: Variant(True, Locations(settings, work, log_local=place == "local")) for place in places}
    try:
        for epoch in range(epochs):
            first = (epoch + epoch // MAX_EPOCHS) % 2  # which goes first alternates, as in run_round
            for place in (places[first], places[1 - first]):
                variants[place].epoch(batches[epoch % len(batches)], epoch)
    finally:
        for variant in variants.values():
            variant.close()
    segments = MAX_EPOCHS * PARALLELISM  # what each file reads: every writer's segment of each of its epochs
    least = segments * PARALLELISM  # one ranged GET per segment and file writer
    print(
        f"\nreading the log back, {rows:,} rows per epoch, {epochs} epochs per sink: a roll writes {PARALLELISM} "
        f"files, each reading {segments} segments (least: {least} GETs per roll)"
    )
    print(
        f"  {'log store':<10} {'rolls':>5} | {'GET/roll':>9} {'HEAD/roll':>9} | {'roll s (median)':>15} "
        f"{'roll s (mean)':>13} | {'rows/s':>9}"
    )
    figures: dict[str, float] = {}
    for place in places:
        run = variants[place].run
        rolls = run.select(True)
        reads = per_epoch(rolls, step="roll", what="log segments")
        roll_seconds = [e.steps.get("roll", 0.0) for e in rolls]
        median_s = statistics.median(roll_seconds) if roll_seconds else 0.0
        mean_s = statistics.fmean(roll_seconds) if roll_seconds else 0.0
        figures[f"{place} roll s"] = median_s
        figures[f"{place} rows/s"] = run.rows / run.seconds
        figures[f"{place} GET/roll"] = reads["GET"]
        print(
            f"  {place:<10} {len(rolls):>5} | {reads['GET']:>9.1f} {reads['HEAD']:>9.1f} | {median_s:>15.2f} "
            f"{mean_s:>13.2f} | {run.rows / run.seconds:>9,.0f}"
        )
    ratio = figures["s3 roll s"] / figures["local roll s"] if figures["local roll s"] else float("nan")
    slower = figures["local rows/s"] / figures["s3 rows/s"]
    print(f"  roll time S3 / local: {ratio:.2f}x (median); whole run, local rows/s / S3 rows/s: {slower:.2f}x")
    print(f"  {load()}")
    return figures


# -- main ------------------------------------------------------------------------------------------------


@contextlib.contextmanager
def s3_server(work: Path) -> Iterator[S3Settings]:
    external = settings_from_env()
    if external is not None:
        ensure_bucket(external)
        yield external
        return
    server = SeaweedServer(work / "seaweedfs", bucket="bench-home")
    settings = server.start()
    try:
        yield settings
    finally:
        server.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="What the durable home costs, with the log store on S3.")
    parser.add_argument("--quick", action="store_true", help="a smoke run: 1 round, short runs, short counts")
    parser.add_argument("--rounds", type=int, default=None, help="rounds of both variants per epoch size (default 4)")
    parser.add_argument(
        "--epochs", type=int, default=None, help="epochs per variant and round (default 30; 20 above 10,000 rows)"
    )
    parser.add_argument("--rows", type=int, nargs="+", default=[1_000, 100_000], help="rows per epoch, each a setting")
    parser.add_argument("--count-epochs", type=int, default=None, help="epochs of the long count run (default 10,000)")
    parser.add_argument("--count-on-s3", action="store_true", help="the long count run's log store on S3, not local")
    parser.add_argument(
        "--s3-count-epochs", type=int, default=None, help="epochs of the short count run on S3 (default 200, 0: none)"
    )
    parser.add_argument("--count-rows", type=int, default=100, help="rows per epoch of the count runs (default 100)")
    parser.add_argument(
        "--skip", choices=("cost", "count", "reads"), action="append", default=[], help="leave a part out"
    )
    parser.add_argument(
        "--read-epochs", type=int, default=None, help="epochs per sink of the reads part (default 30; quick: 20)"
    )
    parser.add_argument("--dir", type=Path, default=None, help="work directory (default: a temp dir in the cwd)")
    args = parser.parse_args(argv)
    rounds = args.rounds or (1 if args.quick else 4)
    count_epochs = args.count_epochs or (1_000 if args.quick else 10_000)
    s3_count_epochs = args.s3_count_epochs if args.s3_count_epochs is not None else (120 if args.quick else 200)
    if count_epochs < 100 + SWEEP_WINDOW or 0 < s3_count_epochs < 100 + SWEEP_WINDOW:
        parser.error("--count-epochs and --s3-count-epochs must be at least 120 (or 0 for the latter)")
    if any(r < 1 for r in args.rows) or rounds < 1 or (args.epochs is not None and args.epochs < 2):
        parser.error("--rows and --rounds must be at least 1, --epochs at least 2")

    print(f"durable home benchmark, {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC")
    print(f"command line: python {' '.join([Path(sys.argv[0]).as_posix(), *sys.argv[1:]])}")
    print(f"python {platform.python_version()}, pyarrow {pa.__version__}; start: {load()}")
    print(
        f"sink: {VNODES} vnodes, {PARALLELISM} writers (one segment each per epoch, appended in this process), "
        f"Rollover(max_epochs={MAX_EPOCHS}), no Spark; log store and output on S3, state directory local"
    )
    COUNTER.install()
    if args.dir is not None:
        args.dir.mkdir(parents=True, exist_ok=True)  # a work directory that does not exist yet is made
    work = Path(tempfile.mkdtemp(prefix="bench_home-", dir=args.dir or Path.cwd()))
    try:
        with s3_server(work) as settings:
            print(f"S3: {settings.endpoint} (bucket {settings.bucket})")
            # Warm-up, not counted: the first sinks in a process pay for imports and the S3 client's start.
            run_round(settings, work, [Batch(make_batch(0, 100, seed=1))], 3, True)
            results = []
            if "cost" not in args.skip:
                for rows in args.rows:
                    epochs = args.epochs or (20 if args.quick else 30)
                    if rows > 10_000 and args.epochs is None:
                        epochs = 10 if args.quick else 20
                    ratio, runs = throughput(settings, work, rows, epochs, rounds)
                    report_costs(runs, rows)
                    results.append((rows, ratio))
                    print(f"  {load()}")
            if "reads" not in args.skip:
                read_epochs = args.read_epochs or (20 if args.quick else 30)
                for rows in args.rows:
                    compare_reads(settings, work, rows, read_epochs)
            if "count" not in args.skip:
                count_objects(settings, work, count_epochs, args.count_rows, local=not args.count_on_s3)
                if s3_count_epochs and not args.count_on_s3:
                    count_objects(settings, work, s3_count_epochs, args.count_rows, local=False)
            if results:
                print("\nthroughput ratios (home / no home, median of rounds): ", end="")
                print(", ".join(f"{rows:,} rows/epoch {ratio:.3f}" for rows, ratio in results))
            print(f"end: {load()}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
