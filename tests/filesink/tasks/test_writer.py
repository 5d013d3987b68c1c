"""The Parquet file writer: rows and order read back by pyarrow and DuckDB, Hive partitions, byte-identical
re-runs, streaming row groups, nothing partial visible after a failure, and the visibility listing."""

from __future__ import annotations

import os
import pickle
import random
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
from s3servers import S3_SERVERS

from filesink.errors import FileWriteError
from filesink.output import OutputLocation, object_key, object_keys, objects
from filesink.output.multipart import list_uploads
from filesink.output.naming import dir_digest
from filesink.schema.partitioning import partition_dir
from filesink.tasks import writer
from filesink.tasks.writer import FileTask, WrittenObject, write_file
from logstore import LogStore, ReadItem, SegmentMissingError, append_segment, read_plan

VNODES = 8
NAME = "part-0a1b2c3d-00000000000000000000-00000000000000000003-00000-00008-5f3e2a1c"
SCHEMA = pa.schema([("id", pa.int64()), ("p", pa.string()), ("q", pa.int32()), ("payload", pa.string())])
P_VALUES = [None, "", "a/b", "..", "plain", "k=v", "café"]


# -- log store data ------------------------------------------------------------------------------------------


def make_rows(rng: random.Random, first_id: int, count: int, p_values: list[Any] | None = None) -> pa.Table:
    """Rows of SCHEMA plus the vnode column; every 10th row repeats the previous one exactly (a duplicate)."""
    p_values = P_VALUES if p_values is None else p_values
    rows: list[dict[str, Any]] = []
    for i in range(first_id, first_id + count):
        if rows and i % 10 == 0:
            rows.append(dict(rows[-1]))
            continue
        rows.append(
            {
                "id": i,
                "p": rng.choice(p_values),
                "q": rng.randrange(2),
                "payload": f"row-{i}" * rng.randrange(1, 4),
                "__vnode": rng.randrange(VNODES),
            }
        )
    return pa.Table.from_pylist(rows, schema=SCHEMA.append(pa.field("__vnode", pa.int32())))


def build_log(state_dir: Path, epochs: dict[int, list[pa.Table]]) -> tuple[LogStore, tuple[ReadItem, ...]]:
    """Append and seal ``epochs`` (epoch -> tables, one segment each); return the store and a plan of it all."""
    store = LogStore.open(state_dir, vnodes=VNODES)
    for epoch in sorted(epochs):
        descs = [append_segment(store.target, epoch, t, writer_id=f"w{i}") for i, t in enumerate(epochs[epoch])]
        store.seal(epoch, descs)
    return store, tuple(store.plan_read({v: -1 for v in range(VNODES)}, max(epochs)))


@pytest.fixture
def log(tmp_path: Path) -> Iterator[tuple[LogStore, tuple[ReadItem, ...]]]:
    """Four epochs (one empty), several segments each, every partition value, rows in 8 vnodes."""
    rng = random.Random(7)
    epochs = {
        0: [make_rows(rng, 0, 300), make_rows(rng, 300, 200)],
        1: [make_rows(rng, 500, 250)],
        2: [],
        3: [make_rows(rng, 750, 120), make_rows(rng, 870, 130), make_rows(rng, 1000, 50)],
    }
    store, plan = build_log(tmp_path / "state", epochs)
    yield store, plan
    store.close()


def task_for(store: LogStore, plan: tuple[ReadItem, ...], **kwargs: Any) -> FileTask:
    kwargs.setdefault("schema_bytes", SCHEMA.serialize().to_pybytes())
    return FileTask(name=kwargs.pop("name", NAME), log=store.location, plan=plan, **kwargs)


def log_rows(store: LogStore, plan: tuple[ReadItem, ...]) -> list[dict[str, Any]]:
    """The plan's rows in the log store's read order (vnode, epoch, segment, row)."""
    return [row for item in read_plan(store.storage, plan) for row in item.batch.to_pylist()]


def as_tuples(rows: list[dict[str, Any]], columns: list[str]) -> list[tuple[Any, ...]]:
    return [tuple(r[c] for c in columns) for r in rows]


def multiset(rows: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """Rows sorted (None first), duplicates kept."""
    return sorted(rows, key=lambda r: tuple((v is not None, v) for v in r))


# -- outputs -------------------------------------------------------------------------------------------------


@pytest.fixture(params=["local", "s3", "moto", "rclone"])
def output(request: pytest.FixtureRequest, tmp_path: Path) -> OutputLocation:
    """A local output, or one on each S3 server ("s3": SeaweedFS)."""
    if request.param == "local":
        return OutputLocation(str(tmp_path / "out" / "table"))
    if request.param == "s3":
        return OutputLocation(request.getfixturevalue("s3_prefix") + "/table", request.getfixturevalue("s3_options"))
    server = request.getfixturevalue(S3_SERVERS[request.param])
    return OutputLocation(server.url(f"test-{uuid.uuid4().hex}", "table"), server.storage_options())


def fresh_fs(output: OutputLocation) -> Any:
    """A filesystem of the output's server that shares no cache with the writer's."""
    import s3fs

    return s3fs.S3FileSystem(skip_instance_cache=True, **output.storage_options)


def s3_path(output: OutputLocation) -> str:
    return output.url.removeprefix("s3://").rstrip("/")


def listed(output: OutputLocation) -> dict[str, int]:
    """Every file under the output root (relative key -> size), straight from the storage; but the temp files in
    a local output's staging directory ``_filesink_staging/``, which readers skip (``staging_files`` lists them)."""
    if output.is_local:
        root = output.local_root()
        found = (p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())
        return {k: (root / k).stat().st_size for k in found if not k.startswith("_filesink_staging/")}
    fs = fresh_fs(output)
    root = s3_path(output)
    found = fs.find(root, detail=True)
    return {k[len(root) + 1 :]: v["size"] for k, v in found.items() if v["type"] != "directory"}


def read_bytes(output: OutputLocation, key: str) -> bytes:
    if output.is_local:
        return (output.local_root() / key).read_bytes()
    data: bytes = fresh_fs(output).cat_file(f"{s3_path(output)}/{key}")
    return data


def file_rows(output: OutputLocation, key: str) -> list[dict[str, Any]]:
    return list(pq.read_table(pa.BufferReader(read_bytes(output, key))).to_pylist())


def pyarrow_rows(output: OutputLocation, partition_by: tuple[str, ...]) -> list[dict[str, Any]]:
    hive = ds.partitioning(pa.schema([(c, pa.string()) for c in partition_by]), flavor="hive")
    if output.is_local:
        dataset = ds.dataset(output.local_root(), format="parquet", partitioning=hive)
    else:
        dataset = ds.dataset(s3_path(output), format="parquet", partitioning=hive, filesystem=fresh_fs(output))
    return list(dataset.to_table().to_pylist())


def duckdb_rows(output: OutputLocation, partition_by: tuple[str, ...]) -> list[dict[str, Any]]:
    con = duckdb.connect()
    if output.is_local:
        glob = f"{output.local_root()}/**/*.parquet"
    else:
        con.register_filesystem(fresh_fs(output))  # fsspec, so no httpfs extension is needed
        glob = f"{output.url}/**/*.parquet"
    types = "{" + ", ".join(f"'{c}': 'VARCHAR'" for c in partition_by) + "}"
    hive = f", hive_types={types}" if partition_by else ""
    relation = con.sql(f"SELECT * FROM read_parquet('{glob}', hive_partitioning={bool(partition_by)}{hive})")
    columns = relation.columns
    return [dict(zip(columns, row, strict=True)) for row in relation.fetchall()]


def expected_files(rows: list[dict[str, Any]], partition_by: tuple[str, ...]) -> dict[str, list[dict[str, Any]]]:
    """Per object key, the rows it must hold, in order, without the partition columns (computed row by row)."""
    out: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        directory = partition_dir(partition_by, [row[c] for c in partition_by])
        key = object_key(directory, NAME)
        out.setdefault(key, []).append({c: v for c, v in row.items() if c not in partition_by})
    return out


def staging_files(output: OutputLocation) -> list[str]:
    staging = output.local_staging()
    return sorted(p.name for p in staging.iterdir()) if staging.exists() else []


def s3_uploads(output: OutputLocation) -> list[str]:
    """Keys of multipart uploads in progress under the output root."""
    bucket, _, prefix = s3_path(output).partition("/")
    # list_uploads: rclone's server answers NoSuchUpload when there are none
    return [key for key, _ in list_uploads(fresh_fs(output), bucket, prefix + "/") if key.startswith(prefix + "/")]


# -- 1. round trip -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("partition_by", [(), ("p",)], ids=["unpartitioned", "by-p"])
def test_round_trip(log, output, partition_by):
    store, plan = log
    rows = log_rows(store, plan)
    assert len(rows) == 1050
    written = write_file(output, task_for(store, plan, partition_by=partition_by))

    expected = expected_files(rows, partition_by)
    assert [w.key for w in written] == sorted(expected)
    assert listed(output) == {w.key: w.size for w in written}
    if not partition_by:
        assert [w.key for w in written] == [f"{NAME}.parquet"]
    for w in written:  # each file holds its rows in the log store's read order
        assert file_rows(output, w.key) == expected[w.key]
        assert w.rows == len(expected[w.key])

    columns = SCHEMA.names
    if partition_by:  # a partition value "" reads back as null
        rows = [{**r, "p": r["p"] or None} for r in rows]
    want = multiset(as_tuples(rows, columns))
    for reader in (pyarrow_rows, duckdb_rows):
        got = reader(output, partition_by)
        assert len(got) == len(rows), reader.__name__
        assert multiset(as_tuples(got, columns)) == want, reader.__name__


# -- 2. partitions -------------------------------------------------------------------------------------------


def test_partition_keys_and_values(log, tmp_path):
    store, plan = log
    rows = log_rows(store, plan)
    partition_by = ("p", "q")
    output = OutputLocation(str(tmp_path / "out"))
    written = write_file(output, task_for(store, plan, partition_by=partition_by))

    keys = [w.key for w in written]
    assert keys == sorted(expected_files(rows, partition_by))
    dirs = {k.rsplit("/", 1)[0] for k in keys}
    assert {d.split("/")[0] for d in dirs} == {
        "p=__HIVE_DEFAULT_PARTITION__",  # None and "" share it
        "p=a%2Fb",
        "p=..",  # one path component with the column name: never a relative one
        "p=plain",
        "p=k%3Dv",
        "p=café",
    }
    assert {d.split("/")[1] for d in dirs} == {"q=0", "q=1"}
    for w in written:  # partition columns are not in the files
        assert pq.ParquetFile(output.local_root() / w.key).schema_arrow.names == ["id", "payload"]
    assert sum(w.rows for w in written) == len(rows)

    want = multiset([(r["id"], r["p"] or None, str(r["q"]), r["payload"]) for r in rows])
    for reader in (pyarrow_rows, duckdb_rows):
        got = reader(output, partition_by)
        assert multiset(as_tuples(got, ["id", "p", "q", "payload"])) == want, reader.__name__
        assert {r["p"] for r in got} == {None, "a/b", "..", "plain", "k=v", "café"}, reader.__name__


# -- 3. determinism ------------------------------------------------------------------------------------------

_RERUN = """
import pickle, sys
from filesink.tasks.writer import write_file
output, task = pickle.loads(sys.stdin.buffer.read())
print(len(write_file(output, task)))
"""


def test_same_task_same_bytes(log, tmp_path, s3_prefix, s3_options):
    store, plan = log
    task = task_for(store, plan, partition_by=("p",), row_group_rows=200)
    first, second = OutputLocation(str(tmp_path / "one")), OutputLocation(str(tmp_path / "two"))
    written = write_file(first, task)
    assert len(written) > 1
    files = {w.key: read_bytes(first, w.key) for w in written}

    assert write_file(second, task) == written
    assert {k: read_bytes(second, k) for k in listed(second)} == files

    assert write_file(first, task) == written  # again, over the visible objects
    assert {k: read_bytes(first, k) for k in listed(first)} == files
    assert staging_files(first) == []

    remote = OutputLocation(s3_prefix + "/table", s3_options)
    assert write_file(remote, task) == written
    assert {k: read_bytes(remote, k) for k in listed(remote)} == files

    third = OutputLocation(str(tmp_path / "three"))  # another process, another hash seed
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    subprocess.run([sys.executable, "-c", _RERUN], input=pickle.dumps((third, task)), env=env, check=True, timeout=120)
    assert {k: read_bytes(third, k) for k in listed(third)} == files


def test_different_data_different_bytes(log, tmp_path):
    """The byte comparison above can fail: a plan with one segment less gives other bytes."""
    store, plan = log
    a, b = OutputLocation(str(tmp_path / "a")), OutputLocation(str(tmp_path / "b"))
    write_file(a, task_for(store, plan))
    write_file(b, task_for(store, plan[:-1]))
    assert read_bytes(a, f"{NAME}.parquet") != read_bytes(b, f"{NAME}.parquet")


# -- 4. row groups -------------------------------------------------------------------------------------------


def test_row_groups_are_written_as_partitions_fill(tmp_path):
    rng = random.Random(3)
    # batches of 137 rows (and the log's vnode blocks) never line up with the row groups
    epochs = {e: [make_rows(rng, 1000 * e + 137 * i, 137, ["a"]) for i in range(2)] for e in range(3)}
    epochs[3] = [make_rows(rng, 5000, 1000 - 6 * 137, ["a"]), make_rows(rng, 6000, 250, ["b"])]
    store, plan = build_log(tmp_path / "state", epochs)
    output = OutputLocation(str(tmp_path / "out"))
    written = write_file(output, task_for(store, plan, partition_by=("p",), row_group_rows=100))
    assert [(w.key, w.rows) for w in written] == [(object_key("p=a", NAME), 1000), (object_key("p=b", NAME), 250)]

    a = pq.ParquetFile(output.local_root() / written[0].key).metadata
    assert a.num_row_groups == 10
    assert [a.row_group(i).num_rows for i in range(10)] == [100] * 10
    b = pq.ParquetFile(output.local_root() / written[1].key).metadata
    assert [b.row_group(i).num_rows for i in range(b.num_row_groups)] == [100, 100, 50]
    rows = log_rows(store, plan)
    assert file_rows(output, written[0].key) == expected_files(rows, ("p",))[written[0].key]
    store.close()


def test_buffered_rows_never_reach_a_row_group(tmp_path, monkeypatch):
    """Streaming: a row group is written as soon as a partition has row_group_rows rows, before the end."""
    rng = random.Random(4)
    store, plan = build_log(tmp_path / "state", {e: [make_rows(rng, 1000 * e, 300, ["a"])] for e in range(5)})
    largest = []
    real_add = writer._PartitionWriter.add

    def add(self, batch):
        real_add(self, batch)
        largest.append(self._buffered)

    monkeypatch.setattr(writer._PartitionWriter, "add", add)
    write_file(OutputLocation(str(tmp_path / "out")), task_for(store, plan, row_group_rows=100))
    assert largest and max(largest) < 100
    store.close()


# -- 5. nothing partial visible ------------------------------------------------------------------------------


def failing_log(tmp_path: Path, big: bool) -> tuple[LogStore, tuple[ReadItem, ...], str]:
    """A log whose plan ends with a segment of vnode 7 alone (deleted afterwards, so reading it fails)."""
    rng = random.Random(5)
    if big:  # > 5 MiB of incompressible data in one partition, so that s3fs starts a multipart upload
        schema = pa.schema([("id", pa.int64()), ("p", pa.string()), ("blob", pa.binary()), ("__vnode", pa.int32())])
        n = 7000
        first = pa.table(
            {
                "id": range(n),
                "p": ["b" if i % 10 == 0 else "a" for i in range(n)],  # 6,300 rows (6.3 MB) in p=a
                "blob": [rng.randbytes(1000) for _ in range(n)],
                "__vnode": [rng.randrange(VNODES) for _ in range(n)],
            },
            schema=schema,
        )
        last = first.slice(0, 10).set_column(3, "__vnode", pa.array([7] * 10, pa.int32()))
    else:
        first = make_rows(rng, 0, 500)
        last = make_rows(rng, 500, 20).set_column(4, "__vnode", pa.array([7] * 20, pa.int32()))
    store, plan = build_log(tmp_path / "state", {0: [first], 1: [last]})
    assert plan[-1].segment_vnodes == (7,) and all(item.segment != plan[-1].segment for item in plan[:-1])
    os.unlink(tmp_path / "state" / "log" / plan[-1].segment)
    return store, plan, first.schema.remove(first.schema.get_field_index("__vnode")).serialize().to_pybytes()


@pytest.mark.parametrize("where", ["local", "s3", "moto", "rclone"])
def test_failure_mid_task_leaves_nothing(tmp_path, monkeypatch, where, request):
    big = where != "local"
    store, plan, schema_bytes = failing_log(tmp_path, big)
    if where == "local":
        output = OutputLocation(str(tmp_path / "out"))
    else:
        server = request.getfixturevalue(S3_SERVERS["seaweedfs" if where == "s3" else where])
        url = server.url(f"test-{uuid.uuid4().hex}", "table")
        output = OutputLocation(url, server.storage_options(), part_size=5 * 2**20)

    at_failure: dict[str, Any] = {}
    real_read_plan = writer.read_plan

    def spied(storage, items):
        try:
            yield from real_read_plan(storage, items)
        except SegmentMissingError:  # what was in progress when the log store failed
            at_failure["listed"] = listed(output)
            at_failure["staged"] = staging_files(output) if output.is_local else []
            at_failure["uploads"] = [] if output.is_local else s3_uploads(output)
            raise

    monkeypatch.setattr(writer, "read_plan", spied)
    # small row groups, so that every partition's writer is open (local) or uploading (S3) at the failure
    task = task_for(store, plan, schema_bytes=schema_bytes, partition_by=("p",), row_group_rows=500 if big else 20)
    with pytest.raises(SegmentMissingError):
        write_file(output, task)

    assert at_failure["listed"] == {}
    if output.is_local:
        assert len(at_failure["staged"]) >= 5  # every partition's temp file was being written
        assert staging_files(output) == []
        assert [p.name for p in output.local_root().iterdir()] == ["_filesink_staging"]  # empty now
    else:
        assert at_failure["uploads"], "the test must fail while a multipart upload is in progress"
        assert s3_uploads(output) == []
    assert listed(output) == {}

    # the same task over the repaired log writes everything
    store2, plan2, _ = failing_log(tmp_path / "again", big)
    done = write_file(output, task_for(store2, plan2[:-1], schema_bytes=schema_bytes, partition_by=("p",)))
    assert listed(output) == {w.key: w.size for w in done}
    store.close()
    store2.close()


def test_write_errors_name_the_file_and_key_and_clean_up(log, tmp_path):
    store, plan = log
    output = OutputLocation(str(tmp_path / "out"))
    with pytest.raises(FileWriteError) as e:
        write_file(output, task_for(store, plan, partition_by=("p",), compression="no-such-codec"))
    assert NAME in str(e.value) and "p=" in str(e.value)
    assert e.value.__cause__ is not None
    assert staging_files(output) == []
    assert [p.name for p in output.local_root().iterdir()] == ["_filesink_staging"]  # empty now


def test_publish_waits_for_every_object(log, tmp_path, monkeypatch):
    """Objects are renamed into place only after all of them are complete, then in sorted key order."""
    store, plan = log
    output = OutputLocation(str(tmp_path / "out"))
    events: list[tuple[str, str]] = []
    real_finish, real_publish = objects.LocalObject.finish, objects.LocalObject.publish

    def finish(self):
        events.append(("finish", self.key))
        assert listed(output) == {}
        return real_finish(self)

    def publish(self):
        events.append(("publish", self.key))
        real_publish(self)

    monkeypatch.setattr(objects.LocalObject, "finish", finish)
    monkeypatch.setattr(objects.LocalObject, "publish", publish)
    written = write_file(output, task_for(store, plan, partition_by=("p",)))
    keys = [w.key for w in written]
    assert events == [("finish", k) for k in keys] + [("publish", k) for k in keys]
    assert keys == sorted(keys)


# -- 6. object_keys ------------------------------------------------------------------------------------------


def test_object_keys_lists_the_written_objects_only(log, output):
    store, plan = log
    assert object_keys(output, NAME) == []
    written = write_file(output, task_for(store, plan, partition_by=("p",)))
    unrelated = [
        f"other-{NAME}.parquet",
        f"p=plain/{NAME}.parquet.tmp",
        f"p=plain/{NAME}",
        f"p=plain/x{NAME}.parquet",
        f"deep/er/{NAME}.parquetx",
        f"p=plain/{NAME}-0123456789abcdeg.parquet",  # not a digest
        f"p=plain/{NAME}-0123456789abcdef0.parquet",
        f"p=plain/{NAME}-{dir_digest('p=plain')}.parquet.tmp",
    ]
    sibling = OutputLocation(output.url + "2", output.storage_options)  # a prefix of the root is not the root
    if output.is_local:
        for key in unrelated:
            path = output.local_root() / key
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(b"x")
        (sibling.local_root() / "p=a").mkdir(parents=True)
        (sibling.local_root() / "p=a" / f"{NAME}.parquet").write_bytes(b"x")
    else:
        fs = fresh_fs(output)
        for key in unrelated:
            fs.pipe_file(f"{s3_path(output)}/{key}", b"x")
        fs.pipe_file(f"{s3_path(sibling)}/p=a/{NAME}.parquet", b"x")
    assert object_keys(output, NAME) == [(w.key, w.size) for w in written]
    assert all(w.key == object_key(w.key.rsplit("/", 1)[0], NAME) for w in written)
    assert object_keys(output, "part-unknown") == []
    # An object named as earlier versions named every object of a file is found too (a sink upgraded with files
    # pending), and the new names differ per directory, after case folding too.
    legacy = f"p=legacy/{NAME}.parquet"
    if output.is_local:
        (output.local_root() / "p=legacy").mkdir()
        (output.local_root() / legacy).write_bytes(b"old")
    else:
        fresh_fs(output).pipe_file(f"{s3_path(output)}/{legacy}", b"old")
    assert object_keys(output, NAME) == sorted([(w.key, w.size) for w in written] + [(legacy, 3)])
    names = [w.key.rsplit("/", 1)[-1].casefold() for w in written]
    assert len(set(names)) == len(names) > 1


# -- 7. schema mismatch --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("schema", "column"),
    [
        (SCHEMA.set(0, pa.field("id", pa.int32())), "id"),
        (SCHEMA.remove(3), "payload"),
        (
            SCHEMA.set(3, pa.field("payload", pa.string(), nullable=False)).set(1, pa.field("p", pa.string(), False)),
            "p",
        ),
    ],
    ids=["narrower-type", "extra-in-log", "nulls-in-not-null"],
)
def test_schema_mismatch_names_the_column(log, tmp_path, schema, column):
    store, plan = log
    output = OutputLocation(str(tmp_path / "out"))
    with pytest.raises(FileWriteError, match=f"file {NAME}: .*column '{column}'"):
        write_file(output, task_for(store, plan, schema_bytes=schema.serialize().to_pybytes()))
    assert listed(output) == {} and staging_files(output) == []


def test_rows_of_an_older_schema_are_written_under_the_task_schema(log, tmp_path):
    """A column the log's rows lack (a newer schema version, filesink.schema.evolution) is written as nulls."""
    store, plan = log
    schema = SCHEMA.append(pa.field("extra", pa.string()))
    before, after = OutputLocation(str(tmp_path / "before")), OutputLocation(str(tmp_path / "after"))
    [plain] = write_file(before, task_for(store, plan))
    [evolved] = write_file(after, task_for(store, plan, schema_bytes=schema.serialize().to_pybytes()))
    old = pq.read_table(before.local_root() / plain.key)
    new = pq.read_table(after.local_root() / evolved.key)
    assert new.schema.names == [*SCHEMA.names, "extra"] and new.num_rows == old.num_rows > 0
    assert new.column("extra").null_count == new.num_rows
    assert new.drop_columns(["extra"]).equals(old)


def test_nullability_and_metadata_come_from_the_task_schema(log, tmp_path):
    store, plan = log
    schema = SCHEMA.set(0, pa.field("id", pa.int64(), nullable=False, metadata={"k": "v"})).with_metadata({"a": "b"})
    output = OutputLocation(str(tmp_path / "out"))
    [w] = write_file(output, task_for(store, plan, schema_bytes=schema.serialize().to_pybytes()))
    assert pq.read_schema(output.local_root() / w.key).equals(schema, check_metadata=True)


# -- options -------------------------------------------------------------------------------------------------


def test_default_staging_dir_is_inside_the_output_where_readers_skip_it(tmp_path):
    assert OutputLocation(str(tmp_path / "t")).local_staging() == tmp_path / "t" / "_filesink_staging"
    assert OutputLocation(f"file://{tmp_path}/t/").local_staging() == tmp_path / "t" / "_filesink_staging"
    with pytest.raises(ValueError, match="inside the output"):
        OutputLocation(str(tmp_path / "t"), staging_dir=str(tmp_path / "t" / "tmp")).local_staging()


def test_empty_plan_writes_one_object_without_partitioning(log, tmp_path):
    store, _ = log
    out = OutputLocation(str(tmp_path / "out"), staging_dir=str(tmp_path / "stage"))
    [w] = write_file(out, task_for(store, ()))
    assert w == WrittenObject(f"{NAME}.parquet", w.size, 0)
    assert pq.read_table(out.local_root() / w.key).schema.equals(SCHEMA)
    assert write_file(OutputLocation(str(tmp_path / "out2")), task_for(store, (), partition_by=("p",))) == []
    assert (tmp_path / "stage").is_dir() and staging_files(out) == []


def test_tasks_pickle(log):
    store, plan = log
    task = task_for(store, plan, partition_by=("p",))
    assert pickle.loads(pickle.dumps(task)) == task
    output = OutputLocation("s3://bucket/table", {"key": "k"}, None)
    assert pickle.loads(pickle.dumps(output)) == output


def test_unsupported_protocol_is_refused(log):
    store, plan = log
    with pytest.raises(ValueError, match="memory"):
        write_file(OutputLocation("memory://table"), task_for(store, plan))
