"""Partition paths that always work: a value whose directory or key the output cannot hold is refused before its
batch is sealed (nothing of it in the log store, the message names the column, the value's start and the limit),
and the query resumes once the user shortens or filters the value; a file's objects have names unique across its
partition directories (a case-insensitive file system keeps them all); files an earlier version named with one
name in every directory are still found, and rewritten with their own names, by recovery."""

from __future__ import annotations

import dataclasses
import math
import unicodedata
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
from sink_helpers import COLUMNS, STREAM_SCHEMA, TYPES, append_epoch, parquet_files, read_pyarrow, run_query

from filesink import ExactlyOnceParquetSink, Rollover
from filesink.errors import BatchRefusedError
from filesink.output import is_file_name, is_object_of, object_key
from filesink.schema.partitioning import legacy_partition_dir
from logstore.failpoints import ENV_VAR, FailpointError
from recovery.resolve import Action

NO_AGE = Rollover(target_file_size=None, max_age_seconds=None, max_epochs=1000)
PARTS = ("event_date",)


def _sink(path: str, tmp_path: Path, options: dict | None = None) -> ExactlyOnceParquetSink:
    return ExactlyOnceParquetSink(
        path,
        tmp_path / "state",
        key_columns=["user_id"],
        vnodes=8,
        parallelism=2,
        partition_by=list(PARTS),
        rollover=NO_AGE,
        storage_options=options,
    )


def _rows(batch: int, dates: list[str]) -> list[tuple]:
    return [(batch * 1000 + i, i % 5, d, float(i)) for i, d in enumerate(dates)]


def _write_input(directory: Path, batch: int, rows: list[tuple]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    columns = list(zip(*rows, strict=True))
    table = pa.table({c: pa.array(v, t) for c, v, t in zip(COLUMNS, columns, TYPES, strict=True)})
    pq.write_table(table, directory / f"batch-{batch:03d}.parquet")


def _nothing_of(sink: ExactlyOnceParquetSink, epoch: int) -> None:
    """Nothing of ``epoch`` is in the log store: not sealed, no segment recorded or left on disk."""
    store = sink.log_store
    assert store.last_sealed_epoch == epoch - 1
    assert store.segments(epoch) == []
    on_disk = sorted(p for p, _ in store.storage.list_files() if p.endswith(".seg"))
    assert on_disk == sorted(store.segments()), "the refused batch's segments were discarded"


def _df(spark, rows: list[tuple]):
    return spark.createDataFrame(rows, STREAM_SCHEMA)


@pytest.mark.timeout(400)
def test_a_long_partition_value_is_refused_before_the_seal_and_the_fixed_query_resumes(spark, tmp_path):
    """The issue's case through a streaming query on local disk: batch 1 has one 300-character value (a 311-byte
    directory name, over the file system's 255). Before, the file's other objects were published and the long
    one failed at every restart, holding back every row of that writer's file."""
    source, checkpoint, path = tmp_path / "in", tmp_path / "checkpoint", str(tmp_path / "out")
    long_value = "L" * 300
    batches = [_rows(0, ["2024-01-01", "2024-01-02"] * 50), _rows(1, ["2024-01-01"] * 60 + [long_value] + ["x"] * 39)]
    for b, rows in enumerate(batches):
        _write_input(source, b, rows)

    sink = _sink(path, tmp_path)
    error = run_query(spark, sink, source, checkpoint)
    assert error is not None
    message = str(error)
    assert "BatchRefusedError" in message and "batch 1 was refused before it was sealed" in message
    assert "partition column 'event_date' has a value of 300 characters, 'LLLLLLLLLL" in message
    assert "311 bytes long, over the 255 bytes a path component may have on the file system" in message
    assert "substring(event_date, 1, 100)" in message
    _nothing_of(sink, 1)
    sink.flush()  # batch 0 is whole, and nothing of batch 1 is written
    assert read_pyarrow(path, None, PARTS) == Counter(batches[0])
    sink.close()

    # The user's fix: shorten the values in the query. Spark runs batch 1 again, with the fix.
    from pyspark.sql import functions as F

    sink = _sink(path, tmp_path)
    error = run_query(
        spark, sink, source, checkpoint, fix=lambda s: s.withColumn("event_date", F.substring("event_date", 1, 100))
    )
    assert error is None, error
    sink.flush()
    sink.close()
    fixed = [(i, u, d[:100], a) for i, u, d, a in batches[1]]
    assert read_pyarrow(path, None, PARTS) == Counter(batches[0]) + Counter(fixed)
    assert f"event_date={'L' * 100}" in {k.split("/")[0] for k in parquet_files(path)}


@pytest.mark.timeout(300)
def test_on_s3_the_whole_key_counts_from_the_output_prefix(spark, tmp_path, s3_prefix, s3_options):
    """On S3 a key part may have 255 bytes (MinIO, file-backed servers) and a key 1,024 (S3): an output prefix
    of about 840 bytes leaves little room, and the message says how the key adds up. Each refusal happens
    before the seal; the values that fit go through and the output is exact."""
    prefix = s3_prefix + "".join(f"/{c * 200}" for c in "abcd")
    key_prefix = prefix.split("/", 3)[3]
    sink = _sink(prefix, tmp_path, s3_options)
    sink(_df(spark, _rows(0, ["d0", "d1"] * 10)), 0)

    refused = _rows(1, ["ok"] * 5 + ["v" * 300])
    with pytest.raises(BatchRefusedError, match=r"partition column 'event_date' has a value of 300 characters") as e:
        sink(_df(spark, refused), 1)
    assert "over the 255 bytes the sink allows a part of an S3 key to have" in str(e.value)
    _nothing_of(sink, 1)

    shortened = _rows(1, ["ok"] * 5 + ["v" * 240])  # a 251-byte directory fits the part limit, not the key's
    with pytest.raises(BatchRefusedError) as e:
        sink(_df(spark, shortened), 1)
    message = str(e.value)
    expected_length = len(key_prefix) + 1 + len("event_date=") + 240 + 1 + 101
    assert (
        f"make its object's key {expected_length} bytes long ({len(key_prefix) + 1} bytes of output prefix" in message
    )
    assert "event_date='vvvvvvvvvvvvvvvvvvvv...' (251 bytes)" in message
    assert "over the 1024 bytes an S3 key may have" in message and s3_prefix in message
    _nothing_of(sink, 1)

    fitting = _rows(1, ["ok"] * 5 + ["v" * 50])
    sink(_df(spark, fitting), 1)
    sink.flush()
    sink.close()
    assert read_pyarrow(prefix, s3_options, PARTS) == Counter(_rows(0, ["d0", "d1"] * 10)) + Counter(fitting)


@pytest.mark.timeout(300)
def test_a_local_path_longer_than_path_max_is_refused(spark, tmp_path):
    """Each component fits, the whole path does not: a deep output directory plus a long value."""
    deep = tmp_path.joinpath(*[c * 250 for c in "abcdefghijklmno"])  # about 3,800 bytes
    deep.mkdir(parents=True)
    path = str(deep / "out")
    sink = _sink(path, tmp_path)
    value = "w" * 240
    with pytest.raises(BatchRefusedError, match=r"over the 4095 bytes a path may have on the file system") as e:
        sink(_df(spark, _rows(0, ["a", value])), 0)
    assert "event_date='wwwwwwwwwwwwwwwwwwww...' (251 bytes)" in str(e.value)
    _nothing_of(sink, 0)
    fitting = _rows(0, ["a", "w" * 10])
    sink(_df(spark, fitting), 0)
    sink.flush()
    sink.close()
    assert read_pyarrow(path, None, PARTS) == Counter(fitting)


# -- unique object names across partition directories ----------------------------------------------------------


@pytest.mark.timeout(300)
def test_objects_of_directories_that_one_file_system_would_merge_have_different_names(spark, tmp_path):
    """On a case-insensitive file system (macOS, SMB) ``p=A`` and ``p=a`` are one directory, as are the NFC and
    NFD spellings of ``é`` on macOS: a file's objects there must not share a name, or the second rename would
    replace the first (rows lost). This machine has no such file system: the names are checked after case folding
    and normalization, and every row arrives."""
    path = str(tmp_path / "out")
    values = ["A", "a", "É", "é", unicodedata.normalize("NFD", "é"), "Straße", "STRASSE"]
    rows = _rows(0, values * 20)
    sink = ExactlyOnceParquetSink(
        path, tmp_path / "state", vnodes=1, parallelism=1, partition_by=list(PARTS), rollover=NO_AGE
    )
    sink(_df(spark, rows), 0)
    sink.flush()
    sink.close()
    keys = parquet_files(path)
    assert len(keys) == len(values), "one file, one object per directory"
    folded = {unicodedata.normalize("NFC", k.rsplit("/", 1)[-1]).casefold() for k in keys}
    assert len(folded) == len(keys), keys
    dirs = {unicodedata.normalize("NFC", k.rsplit("/", 1)[0]).casefold() for k in keys}
    assert len(dirs) == 3, "there they would be 3 directories"
    assert read_pyarrow(path, None, PARTS) == Counter(rows)


@pytest.mark.timeout(300)
def test_on_a_case_insensitive_file_system_every_row_arrives(tmp_path, monkeypatch):
    """For real, on a case-insensitive, case-preserving file system (a FUSE file system, tests/support/casefs.py):
    ``event_date=A`` and ``event_date=a`` are one directory there. With one object name in every directory (as
    before) the second rename replaces the first object and rows are lost; with names unique across directories
    every row arrives (in the directory first created: readers see ``a``'s rows under ``A``)."""
    import casefs

    why = casefs.unavailable()
    if why is not None:
        pytest.skip(why)
    rows = [(i, i % 3, ["A", "a", "É", "é"][i % 4], float(i)) for i in range(40)]

    def run(name: str, legacy: bool) -> list[int]:
        with casefs.mounted(tmp_path / f"{name}-backing", tmp_path / f"{name}-mount") as mount:
            output = str(mount / "out")
            sink = ExactlyOnceParquetSink(
                output, tmp_path / f"{name}-state", vnodes=4, parallelism=1, partition_by=list(PARTS), rollover=NO_AGE
            )
            append_epoch(sink, 0, rows)
            with monkeypatch.context() as m:
                if legacy:  # how objects were named before: one name in every directory
                    original = ExactlyOnceParquetSink._file_task
                    m.setattr(
                        ExactlyOnceParquetSink,
                        "_file_task",
                        lambda self, f, term: dataclasses.replace(original(self, f, term), legacy_names=True),
                    )
                sink.flush()
            sink.close()
            assert sorted(p.name for p in Path(output).iterdir() if p.is_dir() and p.name != "_filesink_staging") == [
                "event_date=A",
                "event_date=É",
            ], "the file system merged the directories"
            return list(ds.dataset(output, format="parquet").to_table(columns=["id"])["id"].to_pylist())

    before = run("shared", legacy=True)
    assert len(before) < len(rows), "with one name, the objects of a and é replaced those of A and É"
    now = run("unique", legacy=False)
    assert Counter(now) == Counter(r[0] for r in rows)


def test_earlier_names_are_the_sinks_names_too():
    sink_id = "0a1b2c3d" + "0" * 24
    name = "part-0a1b2c3d-00000000000000000000-00000000000000000003-00000-00008-5f3e2a1c"
    for key in (f"{name}.parquet", f"p=a/{name}.parquet", object_key("p=a", name)):
        base = key.rsplit("/", 1)[-1]
        assert is_file_name(sink_id, base) and is_object_of(name, base)
    assert not is_file_name(sink_id, f"{name}-xyz.parquet")
    assert not is_object_of(name, f"{name}-{'0' * 15}.parquet")
    assert object_key("", name) == f"{name}.parquet", "an unpartitioned file keeps its one name"


@pytest.mark.timeout(300)
def test_a_file_an_earlier_version_left_pending_is_rewritten_with_its_own_keys(tmp_path, monkeypatch):
    """A sink upgraded with a pending file written by a version that named every object of a file alike, with
    its directory text (``nan`` and ``10000000000.0``, not ``NaN`` and ``1.0E10``): recovery finds its visible
    object and writes the file again with the same keys, so no object is there twice under two names; every row
    arrives once."""
    path = str(tmp_path / "out")

    def sink_by_amount() -> ExactlyOnceParquetSink:
        return ExactlyOnceParquetSink(
            path, tmp_path / "state", vnodes=8, parallelism=2, partition_by=["amount"], rollover=NO_AGE
        )

    sink = sink_by_amount()
    amounts = [math.nan, 1e10, 2.5]
    rows = [(i, i % 5, "2024-01-01", amounts[i % 3]) for i in range(60)]
    append_epoch(sink, 0, rows)
    # The earlier version: one name in every directory; its write fails after its first object is published.
    original = ExactlyOnceParquetSink._file_task
    monkeypatch.setattr(
        ExactlyOnceParquetSink,
        "_file_task",
        lambda self, f, term: dataclasses.replace(original(self, f, term), legacy_names=True),
    )
    monkeypatch.setattr("logstore.failpoints._hits", {})
    monkeypatch.setenv(ENV_VAR, "filesink.write.publish.before=raise@2")
    with pytest.raises(FailpointError):
        sink.flush()
    monkeypatch.delenv(ENV_VAR)
    monkeypatch.setattr(ExactlyOnceParquetSink, "_file_task", original)
    [visible] = parquet_files(path)
    [partial] = [f.name for f in sink.ledger.pending() if visible.endswith(f"/{f.name}.parquet")]
    legacy_dirs = {legacy_partition_dir(["amount"], [a]) for a in amounts}
    assert legacy_dirs == {"amount=nan", "amount=10000000000.0", "amount=2.5"}
    assert visible.split("/")[0] in legacy_dirs
    sink.close()

    sink = sink_by_amount()
    assert sink.recovered is not None
    actions = {r.file.name: r.action for r in sink.recovered.files}
    assert actions[partial] is Action.REWRITE, actions
    sink.flush()
    sink.close()
    keys = parquet_files(path)
    of_partial = [k for k in keys if is_object_of(partial, k.rsplit("/", 1)[-1])]
    assert {k.split("/")[0] for k in of_partial} <= legacy_dirs and len(of_partial) > 1, keys
    assert all(k.endswith(f"/{partial}.parquet") for k in of_partial), "rewritten with the earlier names"
    others = [k for k in keys if k not in of_partial]
    assert others and {k.split("/")[0] for k in others} <= {"amount=NaN", "amount=1.0E10", "amount=2.5"}, keys
    ids = ds.dataset(path, format="parquet").to_table(columns=["id"])["id"].to_pylist()
    assert Counter(ids) == Counter(r[0] for r in rows)
