"""Tables end to end: a Spark streaming query into a Delta table and into an Iceberg table (embedded catalog), read
back by the readers of each format; the driver killed (SIGKILL) around a table commit and restarted to the end; a
table of each format on each S3 server (SeaweedFS, moto's, rclone's), through the sink without Spark, and an Iceberg
table on S3 with a PostgreSQL catalog; ``filesink run`` into an Iceberg table on S3 with a SQLite catalog, the endpoint
in ``AWS_ENDPOINT_URL``.

Every check compares exact multisets of rows. A table's commits are counted against the sink's rolls (each roll that
committed files, as the sink's ledger records it): one commit per roll, holding that roll's files, never one per
micro-batch; and the data files a table holds are exactly the Parquet objects under its location (path and size:
nothing rewritten, nothing stray).

Readers: deltalake and Polars (``scan_delta``) for Delta; pyiceberg and Polars (``scan_iceberg``, pyiceberg planning)
for Iceberg. Spark reads neither table here: its Delta and Iceberg sources come with the delta-spark and
iceberg-spark-runtime jars, which this installation does not have (``DATA_SOURCE_NOT_FOUND``); the streaming test
asks Spark anyway, and compares what it reads where it can. ``test_tables_spark.py`` reads the tables with those
connectors, in a pinned Spark of its own (``engines_env.py``).

What each S3 server does with the table formats (measured with SeaweedFS 4.48, moto 5.2.5, rclone 1.75.2, deltalake
1.6.6, pyiceberg 0.12.0, pyarrow 26.0.1, Polars 2.1.0):

- SeaweedFS and moto: both formats are written and read back by every reader.
- rclone's ``serve s3``, Delta: the sink commits, and each commit is one log entry. Its readers built on Rust's
  ``object_store`` (deltalake's ``to_pyarrow_table``, Polars) cannot read the data files: the server answers a ranged
  GET with ``200`` instead of ``206`` (with the range's bytes and a ``Content-Range``), which ``object_store`` refuses
  ("Received non-partial response when range requested"); deltalake's ``to_pyarrow_dataset`` over a pyarrow S3
  filesystem reads the table exactly. rclone also ignores ``If-None-Match: *``, which delta-rs sends with each log
  entry: a writer whose table is at an older version still does not replace an entry (its commit goes to the next
  free version: delta-rs finds the newest version before it writes), but writers racing for the same version
  replace each other's entries (3 threads committing 15 times each: 44 commits acknowledged, 36 versions in the
  log). So the sink probes a Delta table's server for conditional create at start, as it does the log store's, and
  refuses rclone's unless ``single_driver=True``.
- rclone's ``serve s3``, Iceberg: the sink's default file IO for the table's metadata (pyiceberg's fsspec file IO,
  s3fs) commits. With pyarrow's file IO given in the catalog properties (``py-io-impl``) every commit fails: the
  manifest's ``UploadPart`` is sent with a streaming request checksum and no ``Content-Length``, which rclone refuses
  (``411 MissingContentLength``). The files stay pending; the next start without it commits them once. pyarrow does
  not abort the refused upload: it stays in progress under ``metadata/`` (not the sink's: its recovery leaves it
  alone). Polars cannot read the data files (the ranged GETs above); pyiceberg can, with either file IO.
"""

from __future__ import annotations

import datetime as dt
import os
import signal
import subprocess
import sys
import uuid
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
import run_server
from helpers import SUPPORT, kill, support_env, wait_for_exit
from sink_helpers import COLUMNS, append_epoch, batch_rows, input_file, run_query
from sink_job import ICEBERG_TABLE

from filesink import ExactlyOnceParquetSink, Rollover
from filesink.demo.s3server import S3Settings
from filesink.errors import TableCommitFailedError, TableFormatError
from filesink.output import CLAIM_NAME, MARK_NAME
from filesink.output.multipart import list_uploads
from logstore.failpoints import DIR_VAR, ENV_VAR, fired

pytest.importorskip("deltalake")
pytest.importorskip("pyiceberg")

import deltalake
import polars as pl
from pyiceberg.catalog import load_catalog
from pyiceberg.exceptions import NoSuchTableError
from pyiceberg.expressions import EqualTo, GreaterThanOrEqual
from pyiceberg.table import Table

from filesink.destination.delta import storage_options as delta_storage_options
from filesink.destination.iceberg import CATALOG_NAME, EMBEDDED_CATALOG, file_io_properties

ROLLS = Rollover(target_file_size=None, max_epochs=2, max_age_seconds=None)
"""A roll every second epoch: several rolls, each holding two micro-batches."""
PARTITION_BY = ["event_date"]
DAY = "2024-01-02"
"""The partition a filtered read asks for (the rows' dates are 2024-01-01 to 2024-01-03)."""
LATE_ID = 3_000_000
"""A filter on a data column (``id``, or ``ts``, which grows with it) asks for the rows of batch 3 on: the files of
earlier rolls are skipped by their statistics (from the files' footers), and the rows read must be right."""
TABLE = "db.events"
BASE = dt.datetime(2024, 1, 1, tzinfo=dt.UTC)
COLUMNS_TS = [*COLUMNS, "ts"]
"""The streaming test's columns: the input's, and a timestamp Spark adds (``ts``: ``BASE`` + ``id`` ms)."""
METADATA = {"delta": ("_delta_log/",), "iceberg": ("metadata/", EMBEDDED_CATALOG)}
"""Per format, what under a table's location is the table's own metadata (not data files)."""
NON_PARTIAL = "Received non-partial response when range requested"
"""What Rust's object_store says of rclone's answer to a ranged GET (200, not 206)."""
PYARROW_IO = "pyiceberg.io.pyarrow.PyArrowFileIO"
JOB = SUPPORT / "sink_job.py"
JOB_TIMEOUT = 240
"""Seconds a run of the kill test's job may take (Spark's start, recovery, a few batches) on a busy machine."""


# -- rows, rolls, objects ------------------------------------------------------------------------------------


def _rows(table: pa.Table, columns: list[str]) -> Counter:
    return Counter(zip(*(table[c].to_pylist() for c in columns), strict=True))


def _polars_rows(frame: Any, columns: list[str]) -> Counter:
    return Counter(frame.select(columns).collect().iter_rows())


def _with_ts(rows: Counter) -> Counter:
    return Counter({(*r, BASE + dt.timedelta(milliseconds=r[0])): n for r, n in rows.items()})


def _on(day: str, rows: Counter) -> Counter:
    return Counter({r: n for r, n in rows.items() if r[2] == day})


def _late(rows: Counter) -> Counter:
    return Counter({r: n for r, n in rows.items() if r[0] >= LATE_ID})


def _add_ts(stream: Any) -> Any:
    millis = int(BASE.timestamp() * 1000)
    return stream.selectExpr("*", f"timestamp_millis({millis} + id) AS ts")


def _record_rolls(sink: ExactlyOnceParquetSink, monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """The files of each roll that committed files, in order, as the sink's ledger commits them (after the table's
    commit); filled as the sink runs."""
    rolls: list[list[str]] = []
    ledger = sink._ledger
    real = ledger.commit

    def commit(files: Iterable[Any], *args: Any, **kwargs: Any) -> None:
        files = list(files)
        real(files, *args, **kwargs)
        if files:
            rolls.append(sorted(f.name for f in files))

    monkeypatch.setattr(ledger, "commit", commit)
    return rolls


def _objects(location: str, server: S3Settings | None = None) -> dict[str, int]:
    """Every object under a table's location (a directory, or an s3:// URL on ``server``): key -> size."""
    if server is None:
        root = Path(location)
        return {p.relative_to(root).as_posix(): p.stat().st_size for p in root.rglob("*") if p.is_file()}
    fs = server.filesystem()
    root = location.removeprefix("s3://").rstrip("/")
    return {key[len(root) + 1 :]: int(info["size"]) for key, info in fs.find(root, detail=True).items()}


def _uploads(server: S3Settings, location: str) -> list[str]:
    """Multipart uploads in progress under ``location`` (s3://bucket/prefix on ``server``)."""
    bucket, _, prefix = location.removeprefix("s3://").partition("/")
    return sorted(key for key, _ in list_uploads(server.filesystem(), bucket, prefix + "/"))


def _data_objects(objects: dict[str, int], table_format: str) -> dict[str, int]:
    """The objects that are not the table's metadata, nor the sink's claim and commit mark."""
    return {
        k: size
        for k, size in objects.items()
        if k not in (CLAIM_NAME, MARK_NAME) and not k.startswith(METADATA[table_format])
    }


def _epoch_rows(epoch: int) -> list[tuple]:
    return batch_rows(epoch, 60, seed=3)


def _input(epochs: range) -> Counter:
    return Counter(r for e in epochs for r in _epoch_rows(e))


def _epochs(sink: ExactlyOnceParquetSink, epochs: range) -> None:
    """Append and seal ``epochs`` (what the sink does with a Spark batch), rolling after each, as the sink does."""
    for epoch in epochs:
        append_epoch(sink, epoch, _epoch_rows(epoch))
        sink._roll(force=False)


# -- Delta ---------------------------------------------------------------------------------------------------


def _delta(location: str, options: dict[str, Any] | None = None) -> Any:
    return deltalake.DeltaTable(location, storage_options=delta_storage_options(options or {}) or None)


def _delta_commits(table: Any) -> list[list[str]]:
    """The files of each of the sink's commits, oldest first (the table's creation, version 0, names none)."""
    history = sorted(table.history(), key=lambda h: h["version"])
    return [sorted(h["filesink.files"].split(",")) for h in history if "filesink.files" in h]


def _delta_files(table: Any) -> dict[str, int]:
    """The data files the table holds: path (relative to its root) -> size."""
    actions = pa.table(table.get_add_actions(flatten=True))
    return dict(zip(actions["path"].to_pylist(), actions["size_bytes"].to_pylist(), strict=True))


def _check_delta_commits(table: Any, rolls: list[list[str]], objects: dict[str, int]) -> None:
    assert _delta_commits(table) == rolls, "one commit per roll that wrote files, holding that roll's files"
    assert table.version() == len(rolls), "version 0 creates the table, then one version per roll"
    assert _delta_files(table) == _data_objects(objects, "delta"), "the table holds exactly the objects written"


def _check_delta_partition(table: Any, location: str, expected: Counter, columns: list[str], **polars: Any) -> None:
    """A filter on the partition column: the right rows, from that partition's files only."""
    want = _on(DAY, expected)
    uris = table.file_uris(file_pruning_predicate=[("event_date", "=", DAY)])
    assert uris and all(f"/event_date={DAY}/" in u for u in uris), uris
    assert len(uris) == sum(f"event_date={DAY}/" in p for p in _delta_files(table))
    assert _rows(table.to_pyarrow_table(columns=columns, filters=[("event_date", "=", DAY)]), columns) == want
    frame = pl.scan_delta(location, **polars).filter(pl.col("event_date") == DAY)
    assert _polars_rows(frame, columns) == want


def _check_delta_statistics(table: Any, location: str, expected: Counter) -> None:
    """Filters on data columns: files skipped by their statistics, the right rows read."""
    uris = table.file_uris(file_pruning_predicate=[("id", ">=", LATE_ID)])
    assert 0 < len(uris) < len(_delta_files(table)), "the files of the first roll are skipped"
    got = table.to_pyarrow_table(columns=COLUMNS_TS, filters=[("id", ">=", LATE_ID)])
    assert _rows(got, COLUMNS_TS) == _late(expected)
    instant = BASE + dt.timedelta(milliseconds=LATE_ID)
    assert _polars_rows(pl.scan_delta(location).filter(pl.col("ts") >= instant), COLUMNS_TS) == _late(expected)


# -- Iceberg -------------------------------------------------------------------------------------------------


def _embedded(location: Path) -> dict[str, str]:
    """The catalog properties of a local table's embedded catalog, as a reader opens it."""
    return {"type": "sql", "uri": f"sqlite:///{location / EMBEDDED_CATALOG}", "warehouse": f"file://{location}"}


def _iceberg(catalog: dict[str, str], options: dict[str, Any] | None = None, table: str = TABLE) -> Table:
    properties = {**(file_io_properties(options) if options else {}), **catalog}
    name = properties.pop("name", CATALOG_NAME)
    return load_catalog(name, **properties).load_table(table)


def _iceberg_commits(table: Table) -> list[list[str]]:
    """The files of each snapshot, oldest first (the sink's tables start with their first commit's snapshot)."""
    snapshots = sorted(table.metadata.snapshots, key=lambda s: s.sequence_number or 0)
    assert all(s.summary is not None for s in snapshots)
    return [sorted(s.summary.additional_properties["filesink.files"].split(",")) for s in snapshots]


def _iceberg_files(table: Table) -> dict[str, int]:
    """The data files the table holds: path (relative to its location) -> size."""
    root = table.location().rstrip("/") + "/"
    files = table.inspect.files().to_pylist()
    assert all(f["file_path"].startswith(root) for f in files), (root, [f["file_path"] for f in files])
    return {f["file_path"].removeprefix(root): f["file_size_in_bytes"] for f in files}


def _check_iceberg_commits(table: Table, rolls: list[list[str]], objects: dict[str, int]) -> None:
    assert _iceberg_commits(table) == rolls, "one snapshot per roll that wrote files, holding that roll's files"
    assert _iceberg_files(table) == _data_objects(objects, "iceberg"), "the table holds exactly the objects written"


def _check_iceberg_partition(table: Table, expected: Counter, columns: list[str], polars: Any = None) -> None:
    """A filter on the partition column: the right rows, from that partition's files only."""
    want = _on(DAY, expected)
    scan = table.scan(row_filter=EqualTo("event_date", DAY))
    planned = [t.file.file_path for t in scan.plan_files()]
    assert planned and all(f"/event_date={DAY}/" in p for p in planned), planned
    assert _rows(scan.to_arrow(), columns) == want
    if polars is not None:
        frame = pl.scan_iceberg(table, storage_options=polars).filter(pl.col("event_date") == DAY)
        assert _polars_rows(frame, columns) == want


def _check_iceberg_statistics(table: Table, expected: Counter) -> None:
    """Filters on data columns: files skipped by their statistics, the right rows read."""
    instant = BASE + dt.timedelta(milliseconds=LATE_ID)
    for row_filter in (GreaterThanOrEqual("id", LATE_ID), GreaterThanOrEqual("ts", instant.isoformat())):
        scan = table.scan(row_filter=row_filter)
        assert 0 < len(list(scan.plan_files())) < len(_iceberg_files(table)), f"{row_filter}: nothing skipped"
        assert _rows(scan.to_arrow(), COLUMNS_TS) == _late(expected), row_filter
    assert _polars_rows(pl.scan_iceberg(table).filter(pl.col("ts") >= instant), COLUMNS_TS) == _late(expected)


@pytest.fixture(autouse=True)
def _polars_planner(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POLARS_ICEBERG_PLANNER", "pyiceberg")  # without the optional polars_iceberg package


# -- Spark, both formats -------------------------------------------------------------------------------------


def _spark_read(spark: Any, table_format: str, location: str) -> Counter | None:
    """The table's rows as Spark reads them (``ts`` as microseconds), or None when this Spark has no source for the
    format (its jars are not installed)."""
    try:
        frame = spark.read.format(table_format).load(location)
    except Exception as e:
        if "DATA_SOURCE_NOT_FOUND" in str(e):
            return None
        raise
    rows = frame.selectExpr(*COLUMNS, "unix_micros(ts) AS ts").collect()
    return Counter((*r[:-1], BASE + dt.timedelta(microseconds=r[-1] - int(BASE.timestamp() * 1_000_000))) for r in rows)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("table_format", ["delta", "iceberg"])
def test_a_streaming_query_into_a_table(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, table_format: str
) -> None:
    """An available-now query of 5 batches (a Parquet file each, a timestamp column added by Spark) into a table
    partitioned by date, a roll every second batch: 3 rolls (the last one the flush's), so 3 commits."""
    batches = 5
    expected: Counter = Counter()
    for b in range(batches):
        expected += input_file(tmp_path / "input", b, rows=200)
    expected = _with_ts(expected)
    out = tmp_path / "table"
    sink = ExactlyOnceParquetSink(
        str(out),
        str(tmp_path / "state"),
        key_columns=["user_id"],
        vnodes=8,
        parallelism=2,
        partition_by=PARTITION_BY,
        rollover=ROLLS,
        table_format=table_format,
        table=TABLE if table_format == "iceberg" else None,
    )
    rolls = _record_rolls(sink, monkeypatch)
    assert run_query(spark, sink, tmp_path / "input", tmp_path / "checkpoint", fix=_add_ts) is None
    sink.flush()
    sink.close()
    assert sink.stats.batches == batches
    assert len(rolls) == 3, rolls

    objects = _objects(str(out))
    if table_format == "delta":
        table = _delta(str(out))
        _check_delta_commits(table, rolls, objects)
        assert _rows(table.to_pyarrow_table(columns=COLUMNS_TS), COLUMNS_TS) == expected
        assert _polars_rows(pl.scan_delta(str(out)), COLUMNS_TS) == expected
        schema = pa.schema(table.schema().to_arrow())
        assert schema.field("ts").type == pa.timestamp("us", tz="UTC")
        _check_delta_partition(table, str(out), expected, COLUMNS_TS)
        _check_delta_statistics(table, str(out), expected)
        location = str(out)
    else:
        table = _iceberg(_embedded(out))
        _check_iceberg_commits(table, rolls, objects)
        assert _rows(table.scan().to_arrow(), COLUMNS_TS) == expected
        assert _polars_rows(pl.scan_iceberg(table), COLUMNS_TS) == expected
        assert str(table.schema().find_field("ts").field_type) == "timestamptz"
        _check_iceberg_partition(table, expected, COLUMNS_TS, polars={})
        _check_iceberg_statistics(table, expected)
        location = table.metadata_location
    read_by_spark = _spark_read(spark, table_format, location)
    assert read_by_spark is None or read_by_spark == expected  # None: no jars for the format (module docstring)


# -- a driver killed around a table commit -------------------------------------------------------------------


def _job(tmp_path: Path, table_format: str, run: int, failpoints: str | None) -> tuple[int, list[str], str]:
    """Run ``sink_job.py`` into a table of ``table_format`` (partitioned by date) until it ends, or is killed by
    ``failpoints``; then kill what is left of it (a killed driver's JVM and Python workers). Returns its exit code,
    its stdout lines and its stderr."""
    env = support_env(SINK_JOB_TABLE=table_format, SINK_JOB_PARTITION_BY=",".join(PARTITION_BY))
    env.pop(ENV_VAR, None)
    if failpoints:
        env[ENV_VAR] = failpoints
    env[DIR_VAR] = str(tmp_path / "fired")
    (tmp_path / "fired").mkdir(exist_ok=True)
    args = [sys.executable, str(JOB), *(str(tmp_path / d) for d in ("input", "table", "state", "checkpoint")), "2"]
    stdout, stderr = tmp_path / f"run-{run}.out", tmp_path / f"run-{run}.err"
    with stdout.open("w") as out, stderr.open("w") as err:
        proc = subprocess.Popen(args, env=env, stdout=out, stderr=err, text=True, start_new_session=True)
    try:
        code = wait_for_exit(proc, JOB_TIMEOUT, f"run {run} of the job ({failpoints or 'to the end'})")
    finally:
        kill(proc, group=True)
    return code, stdout.read_text().splitlines(), stderr.read_text()


def _table_state(tmp_path: Path, table_format: str) -> tuple[Counter, list[list[str]], dict[str, int]]:
    """The table's rows (read by deltalake or pyiceberg, and checked against Polars), its commits, its files."""
    out = tmp_path / "table"
    if table_format == "delta":
        table = _delta(str(out))
        rows = _rows(table.to_pyarrow_table(columns=COLUMNS), COLUMNS)
        assert _polars_rows(pl.scan_delta(str(out)), COLUMNS) == rows
        return rows, _delta_commits(table), _delta_files(table)
    iceberg = _iceberg(_embedded(out), table=ICEBERG_TABLE)
    rows = _rows(iceberg.scan().to_arrow(), COLUMNS)
    assert _polars_rows(pl.scan_iceberg(iceberg), COLUMNS) == rows
    return rows, _iceberg_commits(iceberg), _iceberg_files(iceberg)


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize(
    "table_format",
    [
        # The failpoint matrix kills the job at every table step on both formats without Spark, in the default
        # tier; with Spark (a minute each) they run in the chaos tier.
        pytest.param("delta", marks=pytest.mark.chaos),
        pytest.param("iceberg", marks=pytest.mark.chaos),
    ],
)
def test_a_driver_killed_around_a_table_commit_restarts_to_exactly_the_input(tmp_path: Path, table_format: str) -> None:
    """``sink_job.py`` (real Spark, a Parquet file per batch, a roll every second batch) into a table:

    1. killed (SIGKILL, a failpoint in the driver) right after its second commit landed in the table, before the
       sink's ledger recorded it;
    2. restarted: recovery finds the roll's files in the table and commits nothing; killed again after the next
       roll's files are written, before their commit;
    3. restarted to the end: recovery commits the written files once, as they are, and the query goes on.

    The table then holds exactly the input, each file in exactly one commit."""
    batches = 8
    per_batch = []
    started = 1_700_000_000
    for b in range(batches):
        per_batch.append(input_file(tmp_path / "input", b, rows=150))
        path = tmp_path / "input" / f"batch-{b:03d}.parquet"
        os.utime(path, (started + b, started + b))  # Spark's file source takes files in modification order
    expected = sum(per_batch, Counter())
    fired_log = str(tmp_path / "fired")

    code, lines, err = _job(tmp_path, table_format, 1, "filesink.table.after=kill@2")
    assert code == -signal.SIGKILL, f"exit {code}\n{err[-3000:]}"
    assert "done" not in lines and [n for n, _pid, _d in fired(fired_log)] == ["filesink.table.after"]
    rows, commits, files = _table_state(tmp_path, table_format)
    assert rows == sum(per_batch[:4], Counter()), "two rolls of two batches each, committed whole"
    assert len(commits) == 2

    code, lines, err = _job(tmp_path, table_format, 2, "filesink.table.before=kill@1")
    assert code == -signal.SIGKILL, f"exit {code}\n{err[-3000:]}"
    assert [n for n, _pid, _d in fired(fired_log)] == ["filesink.table.after", "filesink.table.before"]
    assert _table_state(tmp_path, table_format)[:2] == (rows, commits), "recovery committed nothing again"
    written = {
        k: size for k, size in _data_objects(_objects(str(tmp_path / "table")), table_format).items() if k not in files
    }
    assert written, "the third roll's files were written, and are not in the table"

    code, lines, err = _job(tmp_path, table_format, 3, None)
    assert code == 0 and lines[-1:] == ["done"], f"exit {code}\n{err[-3000:]}"
    rows, commits, files = _table_state(tmp_path, table_format)
    assert rows == expected
    names = [n for c in commits for n in c]
    assert len(names) == len(set(names)), f"a file committed twice: {commits}"
    assert len(commits) == 4, "rolls of batches 0-1 and 2-3, recovery's of 4-5, the roll of 6-7"
    assert files == _data_objects(_objects(str(tmp_path / "table")), table_format)
    assert {k: files.get(k) for k in written} == written, "recovery committed the written files as they were"


# -- each S3 server, without Spark ---------------------------------------------------------------------------


def _s3_sink(
    out: str,
    state: Path,
    options: dict[str, Any],
    table_format: str,
    catalog: dict[str, str] | None = None,
    *,
    single_driver: bool = False,
) -> ExactlyOnceParquetSink:
    return ExactlyOnceParquetSink(
        out,
        str(state),
        vnodes=8,
        parallelism=2,
        partition_by=PARTITION_BY,
        rollover=ROLLS,
        storage_options=options,
        table_format=table_format,
        catalog=catalog,
        table=TABLE if table_format == "iceberg" else None,
        single_driver=single_driver,
    )


def _polars_options(server: S3Settings) -> dict[str, str]:
    return {
        "aws_endpoint_url": server.endpoint,
        "aws_access_key_id": server.access_key,
        "aws_secret_access_key": server.secret_key,
        "aws_region": server.region,
        "aws_allow_http": "true",
    }


def _pyarrow_s3(server: S3Settings, location: str) -> Any:
    """A pyarrow S3 filesystem on ``server``, rooted at ``location``."""
    from pyarrow import fs as pafs

    s3 = pafs.S3FileSystem(
        access_key=server.access_key,
        secret_key=server.secret_key,
        endpoint_override=server.endpoint,
        region=server.region,
        scheme="http",
    )
    return pafs.SubTreeFileSystem(location.removeprefix("s3://"), s3)


@pytest.mark.timeout(240)
def test_a_delta_table_on_each_s3_server(
    tmp_path: Path,
    any_s3_server: S3Settings,
    any_s3_prefix: str,
    monkeypatch: pytest.MonkeyPatch,
    request: pytest.FixtureRequest,
) -> None:
    server, name = any_s3_server, request.node.callspec.params["any_s3_server"]
    out, options = any_s3_prefix + "/table", any_s3_server.storage_options()
    if name == "rclone":  # it ignores If-None-Match: * (module docstring): refused at the start, unless single_driver
        with pytest.raises(TableFormatError, match="conditional create"):
            _s3_sink(out, tmp_path / "state", options, "delta")
        assert not (tmp_path / "state").exists() or not any((tmp_path / "state").iterdir())
    sink = _s3_sink(out, tmp_path / "state", options, "delta", single_driver=name == "rclone")
    rolls = _record_rolls(sink, monkeypatch)
    _epochs(sink, range(5))
    sink.flush()
    sink.close()
    assert len(rolls) == 3, rolls
    expected = _input(range(5))
    table = _delta(out, options)
    _check_delta_commits(table, rolls, _objects(out, server))
    assert _uploads(server, out) == [], "no multipart upload left in progress"
    polars = {"storage_options": delta_storage_options(options)}
    if name == "rclone":  # ranged GETs answered 200: object_store's readers refuse them (module docstring)
        with pytest.raises(OSError, match=NON_PARTIAL):
            table.to_pyarrow_table(columns=COLUMNS)
        with pytest.raises(OSError, match=NON_PARTIAL):
            pl.scan_delta(out, **polars).collect()
        dataset = table.to_pyarrow_dataset(filesystem=_pyarrow_s3(server, out))
        assert _rows(dataset.to_table(columns=COLUMNS), COLUMNS) == expected
        return
    assert _rows(table.to_pyarrow_table(columns=COLUMNS), COLUMNS) == expected
    assert _polars_rows(pl.scan_delta(out, **polars), COLUMNS) == expected
    _check_delta_partition(table, out, expected, COLUMNS, **polars)


@pytest.mark.timeout(240)
def test_an_iceberg_table_on_each_s3_server_with_a_sqlite_catalog(
    tmp_path: Path,
    any_s3_server: S3Settings,
    any_s3_prefix: str,
    monkeypatch: pytest.MonkeyPatch,
    request: pytest.FixtureRequest,
) -> None:
    server, name = any_s3_server, request.node.callspec.params["any_s3_server"]
    out, options = any_s3_prefix + "/table", any_s3_server.storage_options()
    catalog = {"type": "sql", "uri": f"sqlite:///{tmp_path / 'catalog.db'}", "warehouse": any_s3_prefix}
    commits: list[list[str]] = []
    first = 0
    if name == "rclone":  # pyarrow's uploads with a streaming checksum are refused: nothing committed, files pending
        monkeypatch.delenv("AWS_REQUEST_CHECKSUM_CALCULATION", raising=False)
        sink = _s3_sink(out, tmp_path / "state", options, "iceberg", {**catalog, "py-io-impl": PYARROW_IO})
        with pytest.raises(TableCommitFailedError, match="MissingContentLength") as failed:
            _epochs(sink, range(2))  # the roll after epoch 1 commits
        assert "did not land" in str(failed.value)
        pending = sorted(sink._ledger.pending_names())
        assert pending and all(p in str(failed.value) for p in pending)
        sink.close()
        with pytest.raises(NoSuchTableError):
            _iceberg(catalog, options)
        commits.append(pending)  # the next start commits the pending files, once
        first = 2
    sink = _s3_sink(out, tmp_path / "state", options, "iceberg", catalog)
    rolls = _record_rolls(sink, monkeypatch)
    _epochs(sink, range(first, 5))
    sink.flush()
    sink.close()
    expected = _input(range(5))
    assert len(rolls) == (2 if commits else 3), rolls
    table = _iceberg(catalog, options)
    assert table.metadata_location.startswith(out + "/metadata/")
    _check_iceberg_commits(table, commits + rolls, _objects(out, server))
    uploads = _uploads(server, out)
    if commits:  # pyarrow does not abort the upload rclone refused: the manifest's, not one of the sink's files
        assert len(uploads) == 1 and uploads[0].startswith(f"{out.split('/', 3)[3]}/metadata/"), uploads
        assert uploads[0].endswith(".avro"), uploads
    else:
        assert uploads == [], "no multipart upload left in progress"
    assert _rows(table.scan().to_arrow(), COLUMNS) == expected
    if name == "rclone":
        with pytest.raises(OSError, match=NON_PARTIAL):
            pl.scan_iceberg(table, storage_options=_polars_options(server)).collect()
        _check_iceberg_partition(table, expected, COLUMNS)
        return
    assert _polars_rows(pl.scan_iceberg(table, storage_options=_polars_options(server)), COLUMNS) == expected
    _check_iceberg_partition(table, expected, COLUMNS, polars=_polars_options(server))


@pytest.mark.timeout(240)
def test_an_iceberg_table_on_s3_with_a_postgresql_catalog(
    tmp_path: Path,
    s3_server: S3Settings,
    s3_prefix: str,
    postgres_uri: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two runs of the sink on one state: the second reads its marks from the table the PostgreSQL catalog points
    to, and goes on; a reader with its own catalog object reads exactly the input."""
    out, options = s3_prefix + "/table", s3_server.storage_options()
    catalog = {"type": "sql", "uri": postgres_uri, "name": f"c{uuid.uuid4().hex[:8]}"}
    sink = _s3_sink(out, tmp_path / "state", options, "iceberg", catalog)
    first = _record_rolls(sink, monkeypatch)
    _epochs(sink, range(3))
    sink.close()  # epoch 2 stays in the log store: its file is not due yet
    sink = _s3_sink(out, tmp_path / "state", options, "iceberg", catalog)
    second = _record_rolls(sink, monkeypatch)
    _epochs(sink, range(3, 5))
    sink.flush()
    sink.close()
    assert [len(first), len(second)] == [1, 2], (first, second)
    expected = _input(range(5))
    table = _iceberg(catalog, options)
    objects = _objects(out, s3_server)
    assert EMBEDDED_CATALOG not in objects, "no catalog beside a table on S3"
    _check_iceberg_commits(table, first + second, objects)
    assert _uploads(s3_server, out) == []
    assert _rows(table.scan().to_arrow(), COLUMNS) == expected
    assert _polars_rows(pl.scan_iceberg(table, storage_options=_polars_options(s3_server)), COLUMNS) == expected
    _check_iceberg_partition(table, expected, COLUMNS, polars=_polars_options(s3_server))


# -- filesink run into an Iceberg table on S3 ----------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_filesink_run_into_an_iceberg_table_on_s3_with_a_sqlite_catalog(
    tmp_path: Path, s3_server: S3Settings, s3_prefix: str
) -> None:
    """As a user runs it: the endpoint in AWS_ENDPOINT_URL only, and a SQLite catalog. A first run whose catalog
    gives the table's file IO a key the server does not know writes its files and cannot commit them (they stay
    pending); the next run, with the same keys as the sink's own client (the sink gives pyiceberg's file IO the
    endpoint it takes from AWS_ENDPOINT_URL), commits them at its start, and its summary counts them."""
    expected = input_file(tmp_path / "in", 0, 400)
    out = s3_prefix + "/table"
    catalog = {"uri": f"sqlite:///{tmp_path / 'catalog.db'}"}
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(
        AWS_ACCESS_KEY_ID=s3_server.access_key,
        AWS_SECRET_ACCESS_KEY=s3_server.secret_key,
        AWS_ENDPOINT_URL=s3_server.endpoint,
    )
    args = ["run", "--input", str(tmp_path / "in"), "--output", out]
    args += ["--state-dir", str(tmp_path / "state"), "--table-format", "iceberg", "--table", TABLE]
    args += ["--catalog", f"uri={catalog['uri']}", "--available-now", "--parallelism", "2", "--key", "user_id"]
    args += ["--conf", "spark.driver.extraJavaOptions=-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"]

    first = run_server.filesink([*args, "--catalog", "s3.access-key-id=AKIAUNKNOWN"], 200, environ=env)
    assert first.returncode == 1, first.stderr[-3000:]
    error = first.stderr.strip().splitlines()[-1]
    assert error.startswith("error: the commit of 2 files (") and "did not land" in error, error
    assert "access key id you provided does not exist" in error.lower(), error
    assert "s3.access-key-id from the catalog properties" in error and "The files stay pending" in error, error
    with pytest.raises(NoSuchTableError):
        _iceberg(catalog, s3_server.storage_options())

    second = run_server.filesink(args, 200, environ=env)
    assert second.returncode == 0, second.stderr[-3000:]
    lines = second.stdout.splitlines()
    assert "recovery at start: 2 files left pending by the last run resolved (2 commit)" in lines, lines
    done = next(line for line in lines if line.startswith("done: "))
    assert done.startswith(
        "done: 0 rows in (0 batches); files committed 2 by recovery at start (left pending by the last run), none "
        "yet from this run's batches; "
    ), done
    table = _iceberg(catalog, s3_server.storage_options())
    assert table.metadata_location.startswith(out + "/metadata/")
    assert len(table.metadata.snapshots) == 1, "the two files in one commit"
    assert _rows(table.scan().to_arrow(), COLUMNS) == expected
