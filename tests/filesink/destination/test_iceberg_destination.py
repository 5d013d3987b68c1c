"""The Iceberg destination without Spark: small Parquet objects written at keys like the sink's (the partition
columns only in the Hive directories), committed with ``make_visible``, read back with pyiceberg and polars."""

from __future__ import annotations

import datetime as dt
import decimal
import json
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

pytest.importorskip("pyiceberg")

from conformance import check_table
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.table import Table

from filesink import ExactlyOnceParquetSink
from filesink.committer.ledger import PlannedFile
from filesink.destination import iceberg as iceberg_module
from filesink.destination import open_destination, table_options
from filesink.destination.iceberg import EMBEDDED_CATALOG, IcebergDestination, file_io_properties, marks_property
from filesink.errors import TableCommitFailedError, TableCommitUnknownError, TableFormatError
from filesink.output import OutputLocation
from filesink.schema.partitioning import partition_dirs
from filesink.tasks.writer import WrittenObject

pytestmark = pytest.mark.timeout(120)

SINK = "0a1b2c3d"
TABLE = "db.events"
NESTED = pa.struct([pa.field("a", pa.int32()), pa.field("b", pa.string())])
SCHEMA = pa.schema(
    [
        pa.field("id", pa.int64()),
        pa.field("country", pa.string()),
        pa.field("small", pa.int8()),
        pa.field("flag", pa.bool_()),
        pa.field("ratio", pa.float32()),
        pa.field("amount", pa.decimal128(18, 4)),
        pa.field("day", pa.date32()),
        pa.field("ts", pa.timestamp("us", tz="UTC")),
        pa.field("local", pa.timestamp("us")),
        pa.field("blob", pa.binary()),
        pa.field("tags", pa.list_(pa.string())),
        pa.field("attrs", pa.map_(pa.string(), pa.int32())),
        pa.field("nested", NESTED),
    ]
)
BASE = dt.datetime(2024, 3, 1, tzinfo=dt.UTC)


def rows(first: int, n: int, country: str | None, schema: pa.Schema = SCHEMA) -> pa.Table:
    ts_type = schema.field("ts").type
    return pa.table(
        {
            "id": pa.array(range(first, first + n), pa.int64()),
            "country": pa.array([country] * n, pa.string()),
            "small": pa.array([i % 100 for i in range(first, first + n)], pa.int8()),
            "flag": pa.array([(first + i) % 2 == 0 for i in range(n)]),
            "ratio": pa.array([i / 4 for i in range(n)], pa.float32()),
            "amount": pa.array([decimal.Decimal(first + i) / 8 for i in range(n)], pa.decimal128(18, 4)),
            "day": pa.array([dt.date(2024, 3, 1) + dt.timedelta(days=(first + i) % 3) for i in range(n)], pa.date32()),
            "ts": pa.array([BASE + dt.timedelta(seconds=first + i) for i in range(n)], ts_type),
            "local": pa.array(
                [dt.datetime(2024, 3, 1) + dt.timedelta(minutes=i) for i in range(n)], pa.timestamp("us")
            ),
            "blob": pa.array([bytes([i % 256]) * 3 for i in range(n)], pa.binary()),
            "tags": pa.array([["x", str(i)] for i in range(n)], pa.list_(pa.string())),
            "attrs": pa.array([[("k", first + i)] for i in range(n)], pa.map_(pa.string(), pa.int32())),
            "nested": pa.array([{"a": first + i, "b": f"b{i}"} for i in range(n)], NESTED),
        },
        schema=schema,
    )


class Writer:
    """Writes objects like the sink's writer (zstd, format 2.6, statistics, the Arrow schema stored) under an output
    root, local or S3, and records what a roll's commit is given."""

    def __init__(self, root: str, fs: Any = None, partition_by: tuple[str, ...] = ("country",)) -> None:
        self.root = root.rstrip("/")
        self.fs = fs
        self.partition_by = partition_by
        self.written: dict[str, list[WrittenObject]] = {}
        self.expected: list[dict[str, Any]] = []

    def file(
        self, name: str, starts: dict[int, int], end: int, parts: list[pa.Table], footer: bool = True
    ) -> PlannedFile:
        objects = []
        for table in parts:
            if self.partition_by:  # the directories as the sink's writer names them
                key = f"{partition_dirs(table.slice(0, 1), self.partition_by)[0]}/{name}-{uuid.uuid4().hex[:8]}.parquet"
            else:
                key = f"{name}.parquet"
            data = table.drop_columns(list(self.partition_by))
            collector: list[pq.FileMetaData] = []
            path = f"{self.root}/{key}"
            if self.fs is None:
                Path(path).parent.mkdir(parents=True, exist_ok=True)
            with pq.ParquetWriter(
                path,
                data.schema,
                filesystem=self.fs,
                version="2.6",
                store_schema=True,
                compression="zstd",
                write_statistics=True,
                metadata_collector=collector,
            ) as w:
                w.write_table(data)
            size = self.fs.get_file_info(path).size if self.fs is not None else Path(path).stat().st_size
            objects.append(WrittenObject(key, size, table.num_rows, collector[-1] if footer else None))
            self.expected.extend(table.to_pylist())
        self.written[name] = objects
        return PlannedFile(
            name=name,
            vnode_lo=min(starts),
            vnode_hi=max(starts),
            starts=starts,
            end_epoch=end,
            rows=sum(t.num_rows for t in parts),
            log_bytes=0,
            reason="test",
        )


def destination(
    output: str,
    catalog: dict[str, str] | None = None,
    partition_by: tuple[str, ...] = ("country",),
    storage_options: dict[str, Any] | None = None,
    sink_id: str = SINK,
) -> IcebergDestination:
    d = open_destination(
        table_options("iceberg", catalog, TABLE),
        output=OutputLocation(output, storage_options or {}),
        sink_id=sink_id,
        partition_by=list(partition_by),
    )
    assert isinstance(d, IcebergDestination)
    return d


def normal(value: Any) -> Any:
    """A value as pyarrow's to_pylist gives it, whoever read it (maps as lists of pairs, structs as dicts)."""
    if isinstance(value, list):
        if value and all(isinstance(v, dict) and set(v) == {"key", "value"} for v in value):
            return [(v["key"], normal(v["value"])) for v in value]
        return [normal(v) for v in value]
    if isinstance(value, dict):
        return {k: normal(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return tuple(normal(v) for v in value)
    return value


def multiset(records: list[dict[str, Any]], columns: list[str]) -> Counter[str]:
    return Counter(json.dumps([normal(r[c]) for c in columns], default=repr) for r in records)


def summary(table: Table) -> dict[str, str]:
    """The current snapshot's summary properties."""
    snapshot = table.current_snapshot()
    assert snapshot is not None and snapshot.summary is not None
    return dict(snapshot.summary.additional_properties)


def scanned(d: IcebergDestination, row_filter: str | None = None) -> list[dict[str, Any]]:
    table = d.catalog().load_table(TABLE)
    scan = table.scan(row_filter=row_filter) if row_filter else table.scan()
    return scan.to_arrow().to_pylist()  # type: ignore[no-any-return]


def polars_rows(
    d: IcebergDestination, storage_options: dict[str, str] | None = None, country: str | None = None
) -> list[dict[str, Any]]:
    pl = pytest.importorskip("polars")
    frame = pl.scan_iceberg(d.catalog().load_table(TABLE), storage_options=storage_options)
    if country is not None:
        frame = frame.filter(pl.col("country") == country)
    got: list[dict[str, Any]] = frame.collect().to_arrow().to_pylist()
    return got


@pytest.fixture(autouse=True)
def _polars_planner(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POLARS_ICEBERG_PLANNER", "pyiceberg")  # without the optional polars_iceberg package


COLUMNS = SCHEMA.names


def test_commit_with_the_embedded_catalog_reads_back_exactly(tmp_path: Path) -> None:
    out = tmp_path / "out"
    w = Writer(str(out))
    a = w.file("part-a", {0: 1, 1: 2}, 5, [rows(0, 7, "DE"), rows(100, 5, "FR")])
    b = w.file("part-b", {2: 1}, 5, [rows(200, 4, "DE")])
    d = destination(str(out))
    d.check(SCHEMA)
    assert d.check_schema(SCHEMA) is None
    assert d.held([a, b]) == set()

    d.make_visible([a, b], w.written, SCHEMA)

    assert d.held([a, b]) == {"part-a", "part-b"}
    assert (out / EMBEDDED_CATALOG).is_file()
    assert list((out / "metadata").glob("*.metadata.json"))
    table = d.catalog().load_table(TABLE)
    assert len(table.metadata.snapshots) == 1
    assert table.location() == f"file://{out}"
    assert summary(table)["filesink.sink.face-id"] == SINK and summary(table)["filesink.files"] == "part-a,part-b"
    assert json.loads(table.properties[marks_property(SINK)]) == {"0": 5, "1": 5, "2": 5}
    assert "commit.retry.num-retries" not in table.properties  # turned off in memory only
    partitions = sorted(r["partition"]["country"] for r in table.inspect.files().to_pylist())
    assert partitions == ["DE", "DE", "FR"]  # from the directories, though no file holds the column

    assert multiset(scanned(d), COLUMNS) == multiset(w.expected, COLUMNS)
    assert multiset(polars_rows(d), COLUMNS) == multiset(w.expected, COLUMNS)
    french = [r for r in w.expected if r["country"] == "FR"]
    assert multiset(scanned(d, "country = 'FR'"), COLUMNS) == multiset(french, COLUMNS)
    assert multiset(polars_rows(d, country="FR"), COLUMNS) == multiset(french, COLUMNS)
    assert len(scanned(d, "country = 'IT'")) == 0
    assert {r["id"] for r in scanned(d, "id >= 200")} == set(range(200, 204))

    # A new destination (a restart) reads the same from the table alone; committing again commits nothing.
    again = destination(str(out))
    again.check(SCHEMA)
    assert again.held([a, b]) == {"part-a", "part-b"}
    again.make_visible([a, b], w.written, SCHEMA)
    assert len(again.catalog().load_table(TABLE).metadata.snapshots) == 1
    assert again.status()["snapshots"] == 1
    check_table("iceberg", str(out))  # every metadata file and manifest conforms; DuckDB reads the same rows


def test_unpartitioned_table_and_footer_read_from_storage(tmp_path: Path) -> None:
    out = tmp_path / "out"
    w = Writer(str(out), partition_by=())
    first = w.file("part-1", {3: 1}, 2, [rows(0, 5, None)], footer=False)
    d = destination(str(out), partition_by=())
    d.make_visible([first], w.written, SCHEMA)
    second = w.file("part-2", {3: 3, 4: 1}, 4, [rows(50, 6, "X")])
    assert d.held([first, second]) == {"part-1"}
    d.make_visible([first, second], w.written, SCHEMA)
    assert d.held([first, second]) == {"part-1", "part-2"}
    table = d.catalog().load_table(TABLE)
    assert len(table.metadata.snapshots) == 2
    assert summary(table)["filesink.files"] == "part-2"
    assert multiset(scanned(d), COLUMNS) == multiset(w.expected, COLUMNS)
    check_table("iceberg", str(out), duckdb=False)


def test_typed_partition_values_and_null(tmp_path: Path) -> None:
    out = tmp_path / "out"
    columns = ("day", "ts", "amount", "flag", "small", "country")
    w = Writer(str(out), partition_by=columns)
    parts = [rows(i, 1, None if i == 3 else "DE") for i in range(5)]
    a = w.file("part-a", {0: 1}, 1, parts)
    d = destination(str(out), partition_by=columns)
    assert d.check_schema(SCHEMA) is None
    d.make_visible([a], w.written, SCHEMA)
    table = d.catalog().load_table(TABLE)
    assert [f.name for f in table.spec().fields] == list(columns)
    recorded = sorted((r["partition"] for r in table.inspect.files().to_pylist()), key=lambda p: p["small"])
    assert recorded == [{c: r[c] for c in columns} for r in sorted(w.expected, key=lambda r: r["small"])]
    assert multiset(scanned(d), COLUMNS) == multiset(w.expected, COLUMNS)
    for row_filter, ids in [
        ("small = 2", [2]),
        ("day = '2024-03-02'", [1, 4]),
        ("amount = 0.2500", [2]),  # the literal's scale is the column's
        ("flag = false", [1, 3]),
        ("country is null", [3]),
        (f"ts >= '{(BASE + dt.timedelta(seconds=3)).isoformat()}'", [3, 4]),
    ]:
        assert sorted(r["id"] for r in scanned(d, row_filter)) == ids, row_filter
    check_table("iceberg", str(out))  # typed partition tuples of the spec's types; DuckDB reads the same rows


def test_a_file_overlapping_the_marks_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "out"
    w = Writer(str(out))
    a = w.file("part-a", {0: 1}, 5, [rows(0, 3, "DE")])
    d = destination(str(out))
    d.make_visible([a], w.written, SCHEMA)
    overlapping = w.file("part-c", {0: 3}, 7, [rows(10, 3, "DE")])
    with pytest.raises(TableFormatError, match="part-c"):
        d.held([overlapping])
    with pytest.raises(TableFormatError, match="part-c"):
        d.make_visible([overlapping], w.written, SCHEMA)
    assert len(d.catalog().load_table(TABLE).metadata.snapshots) == 1
    # Another sink's marks are its own: the same vnodes and epochs are new to it.
    other = destination(str(out), sink_id="ffffeeee")
    assert other.held([overlapping]) == set()


def test_an_existing_table_with_other_columns_or_partitions_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "out"
    w = Writer(str(out))
    a = w.file("part-a", {0: 1}, 1, [rows(0, 3, "DE")])
    destination(str(out)).make_visible([a], w.written, SCHEMA)

    d = destination(str(out))
    d.check(SCHEMA)
    d.check(None)
    wider = SCHEMA.set(SCHEMA.get_field_index("small"), pa.field("small", pa.int64()))
    d.check(wider)  # the table has an older schema of the sink's (a widened column): the next commit evolves it
    other = SCHEMA.set(SCHEMA.get_field_index("flag"), pa.field("flag", pa.string()))
    with pytest.raises(TableFormatError, match=r"flag \(boolean in the table, string here\)"):
        d.check(other)
    with pytest.raises(TableFormatError, match=r"blob \(only in the table\)"):
        d.check(SCHEMA.remove(SCHEMA.get_field_index("blob")))
    with pytest.raises(TableFormatError, match=r"partitioned by \['country'\]"):
        destination(str(out), partition_by=("day",)).check(SCHEMA)
    with pytest.raises(TableFormatError, match="exists at"):
        # the same catalog (a file of its own, by URI), another output
        destination(
            str(tmp_path / "elsewhere"), catalog={"type": "sql", "uri": f"sqlite:///{out / EMBEDDED_CATALOG}"}
        ).check(SCHEMA)


def test_catalogs_that_cannot_keep_the_table_are_refused(tmp_path: Path) -> None:
    with pytest.raises(TableFormatError, match="needs a catalog"):
        destination("s3://bucket/table").check(SCHEMA)
    with pytest.raises(TableFormatError, match="in-memory"):
        destination(str(tmp_path / "out"), catalog={"type": "in-memory"}).check(SCHEMA)
    with pytest.raises(TableFormatError, match="cannot open the Iceberg catalog"):
        destination(str(tmp_path / "out"), catalog={"type": "no-such-kind"}).check(SCHEMA)


def test_a_sink_whose_catalog_cannot_keep_the_table_is_refused_before_its_state_is_made(
    tmp_path: Path, s3_server: Any, s3_prefix: str, s3_options: dict[str, Any]
) -> None:
    """Refused from the options alone, in the Python API's terms: no state directory, no lock, nothing on S3 (not
    the log store's claim either)."""

    def sink(output: str, catalog: dict[str, str] | None, log_store: str | None = None) -> None:
        ExactlyOnceParquetSink(
            output,
            str(tmp_path / "state"),
            log_store=log_store,
            storage_options=s3_options,
            table_format="iceberg",
            table=TABLE,
            catalog=catalog,
        )

    for catalog in (None, {"name": "prod"}):
        with pytest.raises(TableFormatError) as refused:
            sink(s3_prefix + "/table", catalog, log_store=s3_prefix + "/log")
        assert str(refused.value) == (
            f"the Iceberg table {TABLE} at {s3_prefix}/table: an Iceberg table on object storage needs a catalog (the "
            "embedded SQLite catalog lives beside a local table only). Nothing was written. Give catalog={'uri': "
            "'postgresql+psycopg2://...'} (a SQL catalog), or a REST or Glue catalog's properties."
        )
    with pytest.raises(TableFormatError, match="in-memory catalog forgets the table"):
        sink(str(tmp_path / "out"), {"type": "in-memory"})
    assert not (tmp_path / "state").exists() and not (tmp_path / "out").exists()
    assert s3_server.filesystem().find(s3_prefix) == []


def test_file_io_properties_reach_the_server_the_sinks_client_reaches(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The endpoint and region the sink's S3 client takes from the AWS variables (pyarrow's reads no endpoint
    variable), the keys and the addressing style; catalog properties given by the user win."""
    for name in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_REGION", "AWS_DEFAULT_REGION"):
        monkeypatch.delenv(name, raising=False)
    keys = {"key": "AKIAEXAMPLE", "secret": "s3cr3t"}
    assert file_io_properties(keys) == {"s3.access-key-id": "AKIAEXAMPLE", "s3.secret-access-key": "s3cr3t"}
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:8333")
    assert file_io_properties(keys) == {
        "s3.endpoint": "http://127.0.0.1:8333",
        "s3.region": "us-east-1",
        "s3.access-key-id": "AKIAEXAMPLE",
        "s3.secret-access-key": "s3cr3t",
    }
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "http://127.0.0.1:9000")  # botocore's order: the S3 one first
    monkeypatch.setenv("AWS_DEFAULT_REGION", "eu-west-3")
    got = file_io_properties({})
    assert (got["s3.endpoint"], got["s3.region"]) == ("http://127.0.0.1:9000", "eu-west-3")
    given = {"client_kwargs": {"endpoint_url": "https://s3.example.com", "region_name": "auto"}}
    assert file_io_properties(given) == {"s3.endpoint": "https://s3.example.com", "s3.region": "auto"}
    monkeypatch.setenv("AWS_IGNORE_CONFIGURED_ENDPOINT_URLS", "true")
    assert "s3.endpoint" not in file_io_properties({})
    for style, virtual in (("virtual", "true"), ("path", "false")):
        options = {"config_kwargs": {"s3": {"addressing_style": style}}}
        assert file_io_properties(options)["s3.force-virtual-addressing"] == virtual
    catalog = {"type": "sql", "uri": f"sqlite:///{tmp_path / 'catalog.db'}", "s3.access-key-id": "from-catalog"}
    properties = destination("s3://bucket/table", catalog=catalog, storage_options=keys).catalog().properties
    assert properties["s3.access-key-id"] == "from-catalog" and properties["s3.secret-access-key"] == "s3cr3t"


def test_check_schema_names_what_iceberg_cannot_hold(tmp_path: Path) -> None:
    d = destination(str(tmp_path / "out"))
    zoned = SCHEMA.set(SCHEMA.get_field_index("ts"), pa.field("ts", pa.timestamp("us", tz="Europe/Berlin")))
    assert d.check_schema(zoned) is None
    assert d.check_schema(SCHEMA.append(pa.field("t", pa.time64("us")))) is None
    for field, words in [
        (pa.field("u", pa.uint32()), "unsigned"),
        (pa.field("span", pa.duration("us")), "span"),
        (pa.field("n", pa.timestamp("ns")), "microsecond"),
        (pa.field("nothing", pa.null()), "nothing"),
        (pa.field("deep", pa.struct([pa.field("x", pa.list_(pa.uint64()))])), "unsigned"),
        (pa.field("big", pa.decimal256(50, 2)), "38 digits"),
    ]:
        problem = d.check_schema(SCHEMA.append(field))
        assert problem is not None and repr(field.name) in problem and words in problem, problem
    binary_part = destination(str(tmp_path / "out"), partition_by=("blob",))
    assert "partition column 'blob'" in (binary_part.check_schema(SCHEMA) or "")


def test_timestamps_in_another_zone_are_timestamptz(tmp_path: Path) -> None:
    """A zone other than UTC is kept by the files (their stored Arrow schema): the table's column is timestamptz,
    the instants read back with polars, and the statistics are in UTC. pyiceberg 0.12's own reader refuses such
    files (the zone's name is not UTC): see the module's docstring."""
    out = tmp_path / "out"
    zoned = SCHEMA.set(SCHEMA.get_field_index("ts"), pa.field("ts", pa.timestamp("us", tz="Europe/Berlin")))
    w = Writer(str(out))
    a = w.file("part-a", {0: 1}, 1, [rows(0, 4, "DE", zoned)])
    d = destination(str(out))
    d.make_visible([a], w.written, zoned)
    table = d.catalog().load_table(TABLE)
    assert str(table.schema().find_field("ts").field_type) == "timestamptz"
    [entry] = table.inspect.files().to_pylist()
    assert entry["readable_metrics"]["ts"]["lower_bound"] == BASE
    got = sorted((r["id"], r["ts"]) for r in polars_rows(d))
    assert got == [(i, BASE + dt.timedelta(seconds=i)) for i in range(4)]


def test_a_commit_that_lost_a_race_is_built_again_and_never_twice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "out"
    w = Writer(str(out))
    first = w.file("part-1", {0: 1}, 1, [rows(0, 2, "DE")])
    second = w.file("part-2", {0: 2}, 2, [rows(10, 2, "DE")])
    d1, d2 = destination(str(out)), destination(str(out))
    d1.make_visible([first], w.written, SCHEMA)
    stale = d2._load()  # another run of the sink read the table before the first run's commit of part-2
    d1.make_visible([second], w.written, SCHEMA)
    reads = iter([stale])
    real = d2._read
    monkeypatch.setattr(d2, "_read", lambda action: next(reads, None) or real(action))

    d2.make_visible([second], w.written, SCHEMA)  # built on the stale table: refused, read again, found held

    table = d1.catalog().load_table(TABLE)
    assert len(table.metadata.snapshots) == 2
    assert sorted(r["id"] for r in scanned(d1)) == [0, 1, 10, 11]
    # a manifest and a manifest list per commit: the refused attempt's were deleted
    assert len(list((out / "metadata").glob("*.avro"))) == 4
    check_table("iceberg", str(out), duckdb=False)


def test_after_an_error_the_table_decides(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The catalog's commit_table is where both commit paths (a pyiceberg transaction, a direct append) commit."""
    out = tmp_path / "out"
    w = Writer(str(out))
    files = [w.file(f"part-{i}", {0: i}, i, [rows(10 * i, 2, "DE")]) for i in range(1, 5)]
    d = destination(str(out))
    d.make_visible(files[:1], w.written, SCHEMA)
    real = SqlCatalog.commit_table

    def landed_then_lost(self: SqlCatalog, *args: Any) -> Any:
        real(self, *args)
        raise ConnectionError("the response was lost")

    monkeypatch.setattr(SqlCatalog, "commit_table", landed_then_lost)
    d.make_visible(files[1:2], w.written, SCHEMA)  # landed: done
    assert d.held(files[1:2]) == {"part-2"}

    def refused(self: SqlCatalog, *args: Any) -> Any:
        raise ConnectionError("the catalog is away")

    monkeypatch.setattr(SqlCatalog, "commit_table", refused)
    with pytest.raises(TableCommitFailedError, match="did not land"):
        d.make_visible(files[2:3], w.written, SCHEMA)

    real_load = d._load

    def unreadable_after_commit(self: SqlCatalog, *args: Any) -> Any:
        monkeypatch.setattr(d, "_load", lambda: (_ for _ in ()).throw(ConnectionError("no route")))
        raise ConnectionError("the catalog is away")

    monkeypatch.setattr(SqlCatalog, "commit_table", unreadable_after_commit)
    with pytest.raises(TableCommitUnknownError, match="could not be read again"):
        d.make_visible(files[3:4], w.written, SCHEMA)
    monkeypatch.setattr(d, "_load", real_load)
    monkeypatch.setattr(SqlCatalog, "commit_table", real)
    assert d.held(files) == {"part-1", "part-2"}
    d.make_visible(files, w.written, SCHEMA)
    assert d.held(files) == {f.name for f in files}
    assert sorted(r["id"] for r in scanned(d)) == [10, 11, 20, 21, 30, 31, 40, 41]
    check_table("iceberg", str(out), duckdb=False)


@pytest.mark.timeout(180)
def test_maintain_keeps_the_history_bounded_and_the_marks(tmp_path: Path) -> None:
    out = tmp_path / "out"
    w = Writer(str(out))
    d = destination(str(out))
    d.keep_snapshots, d.expire_batch = 5, 3
    files = []
    for i in range(1, 31):
        f = w.file(f"part-{i:02d}", {i % 4: i}, i, [rows(i * 10, 2, "DE" if i % 2 else "FR")])
        files.append(f)
        d.make_visible([f], w.written, SCHEMA)
        d.maintain()
        assert len(d.catalog().load_table(TABLE).metadata.snapshots) <= 7  # fewer than keep + batch
    table = d.catalog().load_table(TABLE)
    assert len(table.metadata.snapshots) >= 5
    assert destination(str(out)).held(files) == {f.name for f in files}  # the marks outlive the snapshots
    assert multiset(scanned(d), COLUMNS) == multiset(w.expected, COLUMNS)
    assert len(list((out / "metadata").glob("*.metadata.json"))) <= 101
    check_table("iceberg", str(out), duckdb=False)


def test_postgres_catalog(tmp_path: Path, postgres_uri: str) -> None:
    out = tmp_path / "out"
    catalog = {"uri": postgres_uri, "name": f"c{uuid.uuid4().hex[:8]}"}
    w = Writer(str(out))
    a = w.file("part-a", {0: 1, 5: 1}, 3, [rows(0, 3, "DE"), rows(10, 2, "NL")])
    d = destination(str(out), catalog=catalog)
    d.check(SCHEMA)
    d.make_visible([a], w.written, SCHEMA)
    assert not (out / EMBEDDED_CATALOG).exists()
    again = destination(str(out), catalog=catalog)
    assert again.held([a]) == {"part-a"}
    again.make_visible([a], w.written, SCHEMA)
    assert len(again.catalog().load_table(TABLE).metadata.snapshots) == 1
    assert multiset(scanned(again, "country = 'NL'"), COLUMNS) == multiset(
        [r for r in w.expected if r["country"] == "NL"], COLUMNS
    )
    check_table("iceberg", str(out), duckdb=False)


def test_table_on_s3(tmp_path: Path, s3_server: Any, s3_prefix: str, s3_options: dict[str, Any]) -> None:
    from pyarrow import fs as pafs

    fs = pafs.S3FileSystem(
        access_key=s3_server.access_key,
        secret_key=s3_server.secret_key,
        endpoint_override=s3_server.endpoint,
        region=s3_server.region,
    )
    output = s3_prefix + "/table"
    w = Writer(output.removeprefix("s3://"), fs=fs)
    a = w.file("part-a", {0: 1}, 2, [rows(0, 3, "DE"), rows(10, 4, "FR")], footer=False)
    catalog = {"type": "sql", "uri": f"sqlite:///{tmp_path / 'catalog.db'}"}
    d = destination(output, catalog=catalog, storage_options=s3_options)
    d.check(SCHEMA)
    d.make_visible([a], w.written, SCHEMA)
    assert destination(output, catalog=catalog, storage_options=s3_options).held([a]) == {"part-a"}
    table = d.catalog().load_table(TABLE)
    assert table.metadata_location.startswith(output + "/metadata/")
    assert multiset(scanned(d), COLUMNS) == multiset(w.expected, COLUMNS)
    assert multiset(scanned(d, "country = 'FR'"), COLUMNS) == multiset(
        [r for r in w.expected if r["country"] == "FR"], COLUMNS
    )
    polars_options = {
        "aws_endpoint_url": s3_server.endpoint,
        "aws_access_key_id": s3_server.access_key,
        "aws_secret_access_key": s3_server.secret_key,
        "aws_region": s3_server.region,
        "aws_allow_http": "true",
    }
    assert multiset(polars_rows(d, polars_options, country="DE"), COLUMNS) == multiset(
        [r for r in w.expected if r["country"] == "DE"], COLUMNS
    )
    check_table("iceberg", output, options=s3_options, metadata_location=table.metadata_location)


def test_table_on_s3_with_the_endpoint_from_aws_endpoint_url(
    tmp_path: Path, s3_server: Any, s3_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A SQLite catalog, and the endpoint only in AWS_ENDPOINT_URL (as the sink's own S3 client takes it): the table's
    file IO (the sink's, fsspec's, given the endpoint as s3.endpoint) reaches the same server with the same keys, and
    so does a reader's pyiceberg with its default file IO (pyarrow's, which reads no endpoint variable) given the
    same properties."""
    from pyarrow import fs as pafs

    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server.endpoint)
    keys = {"key": s3_server.access_key, "secret": s3_server.secret_key}
    fs = pafs.S3FileSystem(
        access_key=s3_server.access_key,
        secret_key=s3_server.secret_key,
        endpoint_override=s3_server.endpoint,
        region=s3_server.region,
    )
    output = s3_prefix + "/table"
    w = Writer(output.removeprefix("s3://"), fs=fs)
    a = w.file("part-a", {0: 1}, 2, [rows(0, 3, "DE"), rows(10, 4, "FR")], footer=False)
    catalog = {"uri": f"sqlite:///{tmp_path / 'catalog.db'}"}
    d = destination(output, catalog=catalog, storage_options=keys)
    d.check(SCHEMA)
    d.make_visible([a], w.written, SCHEMA)
    table = destination(output, catalog=catalog, storage_options=keys).catalog().load_table(TABLE)
    assert table.metadata_location.startswith(output + "/metadata/")
    assert multiset(table.scan().to_arrow().to_pylist(), COLUMNS) == multiset(w.expected, COLUMNS)
    reader = SqlCatalog("filesink", **catalog, **file_io_properties(keys)).load_table(TABLE)
    assert multiset(reader.scan().to_arrow().to_pylist(), COLUMNS) == multiset(w.expected, COLUMNS)


def test_the_embedded_catalog_is_a_plain_sql_catalog(tmp_path: Path) -> None:
    """Readers open the table with pyiceberg's SQL catalog on the embedded file, under the catalog name."""
    out = tmp_path / "out"
    w = Writer(str(out))
    a = w.file("part-a", {0: 1}, 1, [rows(0, 3, "DE")])
    destination(str(out)).make_visible([a], w.written, SCHEMA)
    reader = SqlCatalog(iceberg_module.CATALOG_NAME, uri=f"sqlite:///{out / EMBEDDED_CATALOG}")
    assert reader.load_table(TABLE).scan().to_arrow().num_rows == 3


@pytest.mark.timeout(180)
def test_long_history_stays_bounded_and_reads_exactly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Many direct commits (smaller settings than the sink's, same code): the snapshots, the metadata log, the
    metadata files and the manifests stay bounded; merged manifests list every file once; the marks outlive every
    expired snapshot."""
    monkeypatch.setattr(iceberg_module, "MERGE_TIERS", ((3, 4), (10, 3)))
    monkeypatch.setattr(
        iceberg_module,
        "TABLE_PROPERTIES",
        {**iceberg_module.TABLE_PROPERTIES, "write.metadata.previous-versions-max": "4"},
    )
    out = tmp_path / "out"
    w = Writer(str(out))
    d = destination(str(out))
    d.keep_snapshots, d.expire_batch = 5, 3
    files, most = [], 0
    for i in range(1, 27):
        f = w.file(f"part-{i:02d}", {i % 3: i}, i, [rows(i * 10, 2, "DE" if i % 2 else "FR")])
        files.append(f)
        d.make_visible([f], w.written, SCHEMA)
        d.maintain()
        table = d.catalog().load_table(TABLE)
        current = table.current_snapshot()
        assert current is not None
        manifests = current.manifests(table.io)
        assert sum((m.added_files_count or 0) + (m.existing_files_count or 0) for m in manifests) == i
        most = max(most, len(manifests))
        assert len(table.metadata.snapshots) <= 5
        assert len(table.metadata.metadata_log) <= 4
        check_table("iceberg", str(out), duckdb=False)  # each commit's metadata, merged manifests included
    assert most <= 3 + 2 + 26 // 12 + 1  # small ones, once-merged ones, twice-merged ones, the new one
    assert max((m.existing_files_count or 0) for m in manifests) >= 12  # merged twice
    assert len(table.metadata.snapshots) == 5
    assert len(list((out / "metadata").glob("*.metadata.json"))) == 5  # the current one and the log's
    entries = table.inspect.entries().to_pylist()
    assert sorted(e["data_file"]["file_path"] for e in entries) == sorted(
        f"{d.location}/{o.key}" for objs in w.written.values() for o in objs
    )
    assert {e["status"] for e in entries} == {0, 1}  # existing (merged) and added, none deleted
    again = destination(str(out))
    assert again.held(files) == {f.name for f in files}  # the marks outlive the snapshots
    assert again.reach(table) == {0: 24, 1: 25, 2: 26}
    assert multiset(scanned(again), COLUMNS) == multiset(w.expected, COLUMNS)
    assert multiset(scanned(again, "country = 'FR'"), COLUMNS) == multiset(
        [r for r in w.expected if r["country"] == "FR"], COLUMNS
    )
    assert multiset(polars_rows(again), COLUMNS) == multiset(w.expected, COLUMNS)


def test_maintain_shortens_a_longer_history_a_batch_at_a_time(tmp_path: Path) -> None:
    out = tmp_path / "out"
    w = Writer(str(out))
    d = destination(str(out))
    files = [w.file(f"part-{i}", {i % 2: i}, i, [rows(i * 10, 2, "DE")]) for i in range(1, 9)]
    for f in files:
        d.make_visible([f], w.written, SCHEMA)
    d.keep_snapshots, d.expire_batch = 3, 2  # a history longer than the sink keeps (a table from elsewhere)

    def count() -> int:
        return len(d.catalog().load_table(TABLE).metadata.snapshots)

    counts = []
    for _ in range(3):
        d.maintain()
        counts.append(count())
    assert counts == [6, 4, 4]  # a batch at a time, and not for fewer than a batch
    more = w.file("part-9", {0: 9}, 9, [rows(90, 2, "FR")])
    d.make_visible([more], w.written, SCHEMA)
    assert count() == 3  # the commit removes what is beyond the newest 3 (itself included)
    assert destination(str(out)).held([*files, more]) == {f.name for f in [*files, more]}
    assert multiset(scanned(d), COLUMNS) == multiset(w.expected, COLUMNS)
    check_table("iceberg", str(out), duckdb=False)


def test_leftover_uploads_of_metadata_files_are_aborted_once_stale(
    tmp_path: Path, s3_server: Any, s3_prefix: str, s3_options: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """pyiceberg's file IO can leave a multipart upload under metadata/ when one of its requests fails. The first
    maintain() of a run aborts those older than STALE_UPLOAD_SECONDS, and no other upload."""
    from filesink.destination import iceberg
    from filesink.output.multipart import list_uploads

    output = s3_prefix + "/table"
    bucket, _, prefix = output.removeprefix("s3://").partition("/")
    fs = s3_server.filesystem()
    for key in ("metadata/00007-left.metadata.json", "data/a-file.parquet", "metadata-not/x.json"):
        fs.call_s3("create_multipart_upload", Bucket=bucket, Key=f"{prefix}/{key}")

    def uploads() -> list[str]:
        return sorted(k.removeprefix(prefix + "/") for k, _ in list_uploads(fs, bucket, prefix + "/"))

    catalog = {"type": "sql", "uri": f"sqlite:///{tmp_path / 'catalog.db'}"}
    d = destination(output, catalog=catalog, storage_options=s3_options)
    assert d.abort_stale_metadata_uploads() == 0, "an upload of a moment ago may be a writer's, in progress"
    assert len(uploads()) == 3
    monkeypatch.setattr(iceberg, "STALE_UPLOAD_SECONDS", -60.0)  # every upload counts as old
    d.maintain()
    assert uploads() == ["data/a-file.parquet", "metadata-not/x.json"]
    fs.call_s3("create_multipart_upload", Bucket=bucket, Key=f"{prefix}/metadata/00008-left.metadata.json")
    d.maintain()
    assert "metadata/00008-left.metadata.json" in uploads(), "only the first maintain() of a run sweeps"
