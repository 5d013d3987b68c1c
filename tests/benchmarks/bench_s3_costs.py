"""What the sink costs on S3: every S3 request of a real run, counted by operation, per GB landed, per roll and per
epoch, turned into a monthly bill at 1 TB landed a day; next to Delta's Spark streaming sink with a scheduled
OPTIMIZE, counted the same way.

Not a test (pytest does not collect it). Run from the repository root::

    python tests/benchmarks/bench_s3_costs.py                 # 2,000,000 rows of `events`, the four variants
    python tests/benchmarks/bench_s3_costs.py --rows 400000   # a smoke run
    python tests/benchmarks/bench_s3_costs.py --variants ours-directory,delta-spark

It starts one SeaweedFS server on 127.0.0.1 (``filesink.demo.s3server.SeaweedServer``) and, in front of it, a
counting HTTP proxy on loopback (:class:`CountingProxy`): every client (s3fs in the driver and the Python workers,
Hadoop's S3A in the JVM) talks to the proxy, which forwards each request unchanged (its ``Host`` header too, so the
signatures hold) and counts it by operation, from the method, the query and the headers: PUT, COPY, PART (an
upload part), MPU (a multipart upload's create or complete), GET, HEAD, LIST, DELETE, BULK-DELETE (one
``DeleteObjects`` request) and the bytes sent and received, by the run's top-level prefix (``log``, ``out``,
``checkpoint``). A proxy rather than SeaweedFS's own Prometheus metrics (``weed mini -metricsPort``): those count
by coarse type only (a HEAD is a GET, a part and a plain upload are both PUT, a bulk delete is one DELETE), which
is not what AWS bills by.

The variants run one after the other, each a job process of its own in the pinned Spark of
``tests/support/engines_env.py`` (pyspark 4.1.1 with delta-spark and hadoop-aws; the sink from this checkout on
``PYTHONPATH``), ``local[2]``, reading the same generated input (``bench_sinks_data``, 2 input files per
micro-batch, available-now trigger), with the streaming checkpoint on S3 through S3A in every variant:

- ``ours-directory``, ``ours-delta``, ``ours-iceberg``: ``ExactlyOnceParquetSink`` with its log store on S3
  (``log_store=`` an S3 URL, the durable home's records included), the output on S3, ``table_format`` directory,
  delta or iceberg (Iceberg's catalog: a local SQLite file, not S3), a ``Rollover`` of ``--target-mib`` MiB;
- ``delta-spark``: Spark's own Delta sink (``writeStream.format("delta")``) to an ``s3a://`` table, then, in a
  second job process, one ``OPTIMIZE`` of the table (what a scheduled compaction does, counted apart).

Each run's output is checked against the input's row count (our sink: the Parquet footers of the committed files;
Delta: the table read back). It prints per variant the requests by operation and prefix, per epoch, per roll (our
sink) and per GB landed (the input's Parquet bytes), and the monthly bill at 1 TB a day, with the load average
before and after each run. See ``docs/costs.md``.
"""

from __future__ import annotations

import argparse
import collections
import http.client
import http.server
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
SUPPORT = REPO / "tests" / "support"
VARIANTS = ("ours-directory", "ours-delta", "ours-iceberg", "delta-spark")
DEADLINE_SECONDS = 1800.0
GB = 10**9

# AWS S3 Standard, us-east-1, list prices as of November 2026 (USD)
PRICE_TIER1 = 0.005 / 1000
"""PUT, COPY, POST (a multipart upload's create and complete), LIST, an upload part."""
PRICE_TIER2 = 0.0004 / 1000
"""GET, HEAD and every other request."""
PRICE_STORAGE = 0.023
"""Per GB-month (the first 50 TB)."""
TIER1 = ("PUT", "COPY", "PART", "MPU", "LIST")
TIER2 = ("GET", "HEAD")
FREE = ("DELETE", "BULK-DELETE", "ABORT")
"""DELETE (single and ``DeleteObjects``) and a multipart upload's abort: free."""
OPERATIONS = TIER1 + TIER2 + FREE
DAY_GB = 1000.0
"""1 TB landed a day."""
MONTH_DAYS = 30


# -- the counting proxy -------------------------------------------------------------------------------------


def operation(method: str, path: str, query: dict[str, list[str]], headers: Any) -> str:
    """The billed operation of one S3 request (path-style addressing: ``/bucket/key``)."""
    key = path.lstrip("/").partition("/")[2]
    if method == "HEAD":
        return "HEAD"
    if method == "GET":
        return "GET" if key and "uploadId" not in query else "LIST"
    if method == "PUT":
        if "partNumber" in query:
            return "PART"
        return "COPY" if headers.get("x-amz-copy-source") else "PUT"
    if method == "POST":
        return "BULK-DELETE" if "delete" in query else "MPU"
    if method == "DELETE":
        return "ABORT" if "uploadId" in query else "DELETE"
    return method


class CountingProxy(http.server.ThreadingHTTPServer):
    """An HTTP proxy on 127.0.0.1 in front of one S3 endpoint, counting each request by (run, prefix, operation)
    and its bytes both ways."""

    daemon_threads = True

    def __init__(self, upstream: str) -> None:
        parts = urlsplit(upstream)
        self.upstream = (parts.hostname or "127.0.0.1", parts.port or 80)
        self.lock = threading.Lock()
        self.counts: collections.Counter[tuple[str, str, str]] = collections.Counter()
        self.sent: collections.Counter[tuple[str, str]] = collections.Counter()
        self.received: collections.Counter[tuple[str, str]] = collections.Counter()
        super().__init__(("127.0.0.1", 0), _Handler)
        self.thread = threading.Thread(target=self.serve_forever, daemon=True)
        self.thread.start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def record(self, path: str, op: str, sent: int, received: int) -> None:
        """``path`` is ``/bucket/key``; a request on the bucket (a listing, a bulk delete) is counted under the
        key its ``prefix`` names (or its first key), passed as ``path`` by the caller."""
        parts = path.lstrip("/").split("/")
        run = parts[1] if len(parts) > 1 else ""
        prefix = parts[2] if len(parts) > 2 else ""
        with self.lock:
            self.counts[(run, prefix, op)] += 1
            self.sent[(run, prefix)] += sent
            self.received[(run, prefix)] += received

    def of_run(self, run: str) -> tuple[collections.Counter[tuple[str, str]], dict[str, int]]:
        """The counts of one run by (prefix, operation), and its bytes up and down."""
        with self.lock:
            counts = collections.Counter({(p, op): n for (r, p, op), n in self.counts.items() if r == run})
            up = sum(n for (r, _), n in self.sent.items() if r == run)
            down = sum(n for (r, _), n in self.received.items() if r == run)
        return counts, {"up": up, "down": down}

    def stop(self) -> None:
        self.shutdown()
        self.server_close()


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: CountingProxy

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return b"".join(chunks)
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _forward(self) -> None:
        body = self._body()
        headers = {k: v for k, v in self.headers.items() if k.lower() not in ("transfer-encoding", "connection")}
        if body or self.command in ("PUT", "POST"):
            headers["Content-Length"] = str(len(body))
        parts = urlsplit(self.path)
        conn = http.client.HTTPConnection(*self.server.upstream, timeout=300)
        try:
            conn.putrequest(self.command, self.path, skip_host=True, skip_accept_encoding=True)
            for k, v in headers.items():
                conn.putheader(k, v)
            conn.endheaders(body or None)
            response = conn.getresponse()
            data = response.read()
            self.send_response_only(response.status, response.reason)
            for k, v in response.getheaders():
                if k.lower() not in ("transfer-encoding", "connection", "content-length"):
                    self.send_header(k, v)
            length = response.getheader("Content-Length") if self.command == "HEAD" else str(len(data))
            self.send_header("Content-Length", length or "0")
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)
        finally:
            conn.close()
        query = parse_qs(parts.query, keep_blank_values=True)
        path = parts.path
        bucket, _, key = path.lstrip("/").partition("/")
        if not key:  # a listing (its prefix) or a bulk delete (its first key): counted under the run it names
            found = re.search(rb"<Key>([^<]*)</Key>", body) if "delete" in query else None
            named = found.group(1).decode() if found else (query.get("prefix") or [""])[0]
            path = f"/{bucket}/{named}"
        self.server.record(path, operation(self.command, parts.path, query, self.headers), len(body), len(data))

    do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _forward


# -- the job (runs in the pinned Spark) ---------------------------------------------------------------------


def job(spec: dict[str, Any]) -> dict[str, Any]:
    from pyspark.sql import SparkSession

    s3 = spec["s3"]
    builder = (
        SparkSession.builder.master("local[2]")
        .appName(f"bench-costs-{spec['variant']}")
        .config("spark.jars", ",".join(spec["jars"]))
        .config("spark.sql.extensions", "io.delta.sql.DeltaSparkSessionExtension")
        .config("spark.sql.catalog.spark_catalog", "org.apache.spark.sql.delta.catalog.DeltaCatalog")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.memory", "3g")
    )
    for key, value in {
        "fs.s3a.endpoint": s3["endpoint"],
        "fs.s3a.endpoint.region": s3["region"],
        "fs.s3a.path.style.access": "true",
        "fs.s3a.connection.ssl.enabled": "false",
        "fs.s3a.access.key": s3["access_key"],
        "fs.s3a.secret.key": s3["secret_key"],
        "fs.s3a.aws.credentials.provider": "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider",
    }.items():
        builder = builder.config(f"spark.hadoop.{key}", value)
    spark = builder.getOrCreate()
    result: dict[str, Any] = {}
    if spec["variant"] == "delta-optimize":
        t = time.time()
        metrics = spark.sql(f"OPTIMIZE delta.`{spec['output_s3a']}`").collect()
        result["optimize_seconds"] = time.time() - t
        result["optimize"] = str(metrics[0]["metrics"]) if metrics else ""
        result["rows"] = spark.read.format("delta").load(spec["output_s3a"]).count()
        spark.stop()
        return result
    schema = spec["schema"]
    stream = (
        spark.readStream.schema(schema).option("maxFilesPerTrigger", spec["files_per_batch"]).parquet(spec["input"])
    )
    rolls = []
    if spec["variant"] == "delta-spark":
        writer = stream.writeStream.format("delta").option("path", spec["output_s3a"])
        handler = None
    else:
        from filesink import ExactlyOnceParquetSink, Rollover

        options = {
            "key": s3["access_key"],
            "secret": s3["secret_key"],
            "client_kwargs": {"endpoint_url": s3["endpoint"], "region_name": s3["region"]},
        }
        table_format = spec["variant"].removeprefix("ours-")
        extra: dict[str, Any] = {}
        if table_format == "iceberg":
            extra = {"table": "bench.events", "catalog": {"type": "sql", "uri": f"sqlite:///{spec['catalog']}"}}
        handler = ExactlyOnceParquetSink(
            spec["output"],
            spec["state"],
            log_store=spec["log"],
            key_columns=["user_id"],
            parallelism=2,
            rollover=Rollover(target_file_size=spec["target_bytes"], max_age_seconds=3600.0),
            storage_options=options,
            table_format=table_format,
            **extra,
        )
        roll = handler._roll

        def counted_roll(*args: Any, **kwargs: Any) -> Any:  # the benchmark's own hook: counts the rolls
            before = handler.stats.files_committed
            try:
                return roll(*args, **kwargs)
            finally:
                if handler.stats.files_committed > before:
                    rolls.append(handler.stats.files_committed - before)

        handler._roll = counted_roll  # type: ignore[method-assign]
        writer = stream.writeStream.foreachBatch(handler)
    query = writer.option("checkpointLocation", spec["checkpoint"]).trigger(availableNow=True).start()
    query.awaitTermination()
    if query.exception() is not None:
        raise SystemExit(f"query failed: {query.exception()}")
    result["epochs"] = len([p for p in query.recentProgress if p.numInputRows > 0])
    if handler is not None:
        handler.flush()
        handler.close()
        result["files"] = handler.stats.files_committed
        result["rolls"] = len(rolls)
    else:
        result["rows"] = spark.read.format("delta").load(spec["output_s3a"]).count()
    spark.stop()
    return result


# -- the benchmark ------------------------------------------------------------------------------------------


@dataclass
class Run:
    variant: str
    seconds: float
    result: dict[str, Any]
    counts: collections.Counter[tuple[str, str]]
    bytes: dict[str, int]
    load: tuple[float, float]
    optimize: collections.Counter[tuple[str, str]] = field(default_factory=collections.Counter)

    def by_op(self, counts: collections.Counter[tuple[str, str]] | None = None) -> collections.Counter[str]:
        out: collections.Counter[str] = collections.Counter()
        for (_, op), n in (self.counts if counts is None else counts).items():
            out[op] += n
        return out


def bill(ops: collections.Counter[str]) -> float:
    return sum(n * PRICE_TIER1 for op, n in ops.items() if op in TIER1) + sum(
        n * PRICE_TIER2 for op, n in ops.items() if op in TIER2
    )


def run_job(engines: Any, spec: dict[str, Any], job_dir: Path) -> dict[str, Any]:
    spec_path = job_dir / f"{spec['variant']}.json"
    spec_path.write_text(json.dumps(spec))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(HERE)])
    env["PYSPARK_PYTHON"] = env["PYSPARK_DRIVER_PYTHON"] = str(engines.python)  # the workers in the same venv
    log = job_dir / f"{spec['variant']}.log"
    with open(log, "wb") as out:
        try:
            subprocess.run(
                [str(engines.python), __file__, "--job", str(spec_path)],
                cwd=REPO,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                timeout=DEADLINE_SECONDS,
                check=True,
            )
        except (subprocess.TimeoutExpired, subprocess.CalledProcessError) as e:
            raise SystemExit(f"the {spec['variant']} job failed or passed its deadline ({e}); its log: {log}") from None
    result: dict[str, Any] = json.loads(spec_path.with_suffix(".result.json").read_text())
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--job", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--target-mib", type=int, default=16, help="our sink's target file size")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    parser.add_argument("--json", type=Path, default=None, help="write each run's counts to this JSON file")
    args = parser.parse_args(argv)
    if args.job:
        spec = json.loads(args.job.read_text())
        args.job.with_suffix(".result.json").write_text(json.dumps(job(spec)))
        return 0

    sys.path[:0] = [str(SUPPORT), str(HERE)]
    import bench_sinks_data as data
    import pyarrow.parquet as pq
    from engines_env import pinned_engines

    from filesink.demo.s3server import SeaweedServer

    engines, reason = pinned_engines()
    if engines is None:
        raise SystemExit(f"no pinned Spark with delta-spark and hadoop-aws: {reason}")
    work = Path(tempfile.mkdtemp(prefix="bench-s3-costs-"))
    print(f"{os.cpu_count()} CPU(s); load average {os.getloadavg()}", flush=True)
    input_dir = work / "input"
    paths = data.generate(input_dir, args.rows)
    landed = sum(p.stat().st_size for p in paths)
    print(f"input: {args.rows:,} rows in {len(paths)} files, {landed / 1e6:.1f} MB of Parquet", flush=True)
    server = SeaweedServer(str(work / "s3"))
    settings = server.start()
    proxy = CountingProxy(settings.endpoint)
    settings = replace(settings, endpoint=proxy.endpoint)
    runs: list[Run] = []
    try:
        for variant in args.variants.split(","):
            name = f"{variant}-{uuid.uuid4().hex[:8]}"
            job_dir = work / name
            job_dir.mkdir()
            s3 = {
                "endpoint": settings.endpoint,
                "access_key": settings.access_key,
                "secret_key": settings.secret_key,
                "region": settings.region or "us-east-1",
            }
            spec = {
                "variant": variant,
                "jars": [str(j) for j in engines.jars],
                "s3": s3,
                "input": str(input_dir),
                "schema": data.spark_schema(input_dir),
                "files_per_batch": 2,
                "checkpoint": f"s3a://{settings.bucket}/{name}/checkpoint",
                "output": settings.url(name, "out"),
                "output_s3a": f"s3a://{settings.bucket}/{name}/out",
                "log": settings.url(name, "log"),
                "state": str(job_dir / "state"),
                "catalog": str(job_dir / "catalog.db"),
                "target_bytes": args.target_mib * 2**20,
            }
            load0 = os.getloadavg()[0]
            start = time.perf_counter()
            try:
                result = run_job(engines, spec, job_dir)
            except SystemExit as e:  # reported, the other variants still run
                print(f"  {variant}: {e}", flush=True)
                continue
            seconds = time.perf_counter() - start
            counts, sizes = proxy.of_run(name)
            run = Run(variant, seconds, result, counts, sizes, (load0, os.getloadavg()[0]))
            if variant == "delta-spark":
                result.update(run_job(engines, {**spec, "variant": "delta-optimize"}, job_dir))
                after, sizes = proxy.of_run(name)
                run.optimize = after - counts
                run.bytes = sizes
                rows = result["rows"]
            else:
                fs = settings.filesystem()
                files = [f for f in fs.find(spec["output"]) if f.endswith(".parquet")]
                rows = 0
                for f in files:
                    with fs.open(f, "rb") as handle:
                        rows += pq.ParquetFile(handle).metadata.num_rows
            if rows != args.rows:
                raise SystemExit(f"{variant}: the output holds {rows:,} rows, the input {args.rows:,} ({job_dir})")
            print(
                f"  {variant}: {seconds:.0f} s, {result['epochs']} epochs, rows checked {rows:,}; "
                f"load {run.load[0]:.1f} -> {run.load[1]:.1f}",
                flush=True,
            )
            runs.append(run)
    finally:
        proxy.stop()
        server.stop()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    print()
    print("\n".join(report(runs, landed, args)))
    if args.json:
        args.json.write_text(
            json.dumps(
                [
                    {
                        **r.__dict__,
                        "counts": [[*k, n] for k, n in r.counts.items()],
                        "optimize": [[*k, n] for k, n in r.optimize.items()],
                    }
                    for r in runs
                ]
            )
        )
    print(f"\nload average after: {os.getloadavg()}")
    return 0


EPOCH_SECONDS = 60.0
"""The scenario's trigger: one epoch a minute, 1,440 a day (at 1 TB a day, about 694 MB an epoch)."""
SCENARIO_FILE = 128 * 2**20
"""The scenario's output files: the sink's default target size, 128 MiB."""
PART = 50 * 2**20
"""s3fs's block size: an object of more than this is a multipart upload of parts of this size."""


def per_unit(r: Run) -> tuple[collections.Counter[str], collections.Counter[str]]:
    """The run's requests per epoch (the Spark checkpoint, the log store and its home) and per output file (the
    output's requests, over the files written; for Delta's sink every epoch writes its own files and commit, so
    the output's requests are counted per epoch too)."""
    epoch: collections.Counter[str] = collections.Counter()
    per_file: collections.Counter[str] = collections.Counter()
    for (prefix, op), n in r.counts.items():
        if prefix == "out" and r.variant != "delta-spark":
            per_file[op] += n
        else:
            epoch[op] += n
    epochs = max(1, r.result["epochs"])
    files = max(1, r.result.get("files") or 1)
    return (
        collections.Counter({op: n / epochs for op, n in epoch.items()}),
        collections.Counter({op: n / files for op, n in per_file.items()}),
    )


def month_bill(r: Run) -> tuple[float, float]:
    """The scenario's monthly request bill (USD) and requests: the measured requests per epoch times the epochs of
    a month at one a minute, plus the measured requests per output file times the 128 MiB files of 30 TB, plus the
    upload parts of objects above s3fs's 50 MiB block (the scenario's files and log segments are large; the run's
    were not). Storage is apart (the same for every variant)."""
    epoch, per_file = per_unit(r)
    epochs = MONTH_DAYS * 86_400 / EPOCH_SECONDS
    files = DAY_GB * GB * MONTH_DAYS / SCENARIO_FILE
    parts_per_copy = DAY_GB * GB * MONTH_DAYS / PART
    copies = 1 if r.variant == "delta-spark" else 2  # ours writes each byte twice: the log segment, the file
    requests = sum(epoch.values()) * epochs + sum(per_file.values()) * files + parts_per_copy * copies
    usd = bill(epoch) * epochs + bill(per_file) * files + parts_per_copy * copies * PRICE_TIER1
    return usd, requests


def report(runs: list[Run], landed: int, args: argparse.Namespace) -> list[str]:
    gb = landed / GB
    lines = [
        f"{args.rows:,} rows of `events`, {landed / 1e6:.1f} MB of Parquet landed; our sink's target file size "
        f"{args.target_mib} MiB; 2 input files per epoch; local[2]",
        "",
        "Requests by operation (whole run; delta-spark: the stream, then its OPTIMIZE apart):",
        "",
        "| variant | " + " | ".join(OPERATIONS) + " | total | epochs | rolls | files | MB up | MB down |",
        "|---" * (len(OPERATIONS) + 7) + "|",
    ]
    for r in runs:
        ops = r.by_op()
        lines.append(
            f"| {r.variant} | "
            + " | ".join(str(ops[o]) for o in OPERATIONS)
            + f" | {sum(ops.values())} | {r.result['epochs']} | {r.result.get('rolls', '')} | "
            f"{r.result.get('files', '')} | {r.bytes['up'] / 1e6:.1f} | {r.bytes['down'] / 1e6:.1f} |"
        )
        if r.optimize:
            ops = r.by_op(r.optimize)
            lines.append(
                "| ... its OPTIMIZE | " + " | ".join(str(ops[o]) for o in OPERATIONS) + f" | {sum(ops.values())} |"
                " | | | | |"
            )
    lines += ["", "Requests by prefix and operation (whole run):", ""]
    for r in runs:
        lines.append(
            f"- {r.variant}: " + ", ".join(f"{p or '(bucket)'}/{op} {n}" for (p, op), n in sorted(r.counts.items()))
        )
    lines += [
        "",
        "Per epoch (checkpoint, log store, home; Delta: its output too), per output file, per GB landed in this run:",
        "",
        "| variant | requests/epoch | of them tier-1 | requests/output file | requests/GB (this run) |",
        "|---|---|---|---|---|",
    ]
    for r in runs:
        epoch, per_file = per_unit(r)
        tier1 = sum(n for op, n in epoch.items() if op in TIER1)
        lines.append(
            f"| {r.variant} | {sum(epoch.values()):.1f} | {tier1:.1f} | {sum(per_file.values()):.1f} | "
            f"{sum(r.by_op().values()) / gb:,.0f} |"
        )
    storage = DAY_GB * MONTH_DAYS * PRICE_STORAGE
    lines += [
        "",
        f"A month at 1 TB landed a day: one epoch every {EPOCH_SECONDS:.0f} s, output files of "
        f"{SCENARIO_FILE // 2**20} MiB, parts of {PART // 2**20} MiB; storage of 30 days of output "
        f"(30 TB): USD {storage:,.0f} a month for every variant:",
        "",
        "| variant | requests/month | USD/month requests |",
        "|---|---|---|",
    ]
    for r in runs:
        usd, requests = month_bill(r)
        lines.append(f"| {r.variant} | {requests:,.0f} | {usd:,.2f} |")
        if r.optimize:
            ops = r.by_op(r.optimize)
            per_day = bill(ops) * 24
            lines.append(
                f"| ... its OPTIMIZE, hourly (as measured here, {sum(ops.values())} requests a run) | "
                f"{sum(ops.values()) * 24 * MONTH_DAYS:,.0f} | {per_day * MONTH_DAYS:,.2f} |"
            )
    return lines


if __name__ == "__main__":
    raise SystemExit(main())
