"""Iceberg tables on S3 servers as the docs set them up, through the whole sink (without Spark: the epochs appended
and sealed as its batches do): a SQLite catalog, the keys in the sink's storage options and nothing else.

- SeaweedFS as docs/quickstart.md runs it (``weed mini`` with no identities: authentication off, keys ``any``) and
  as the tests' session server runs it (authentication on): the sink rolls, each roll is one snapshot, and a reader
  reads every row exactly once. pyiceberg's default file IO for ``s3://`` (pyarrow's S3 client) failed the first
  commit on the open server: its ``UploadPart`` of a manifest carries a streaming checksum, and SeaweedFS looks the
  request's access key up in its identities even with authentication off (``INVALID_ACCESS_KEY_ID``; its log:
  "attempted key 'any' not found. Available keys: 0, Auth enabled: false"). The sink now gives the table pyiceberg's
  fsspec file IO (s3fs, its own S3 client), which the same server takes as it takes the sink's files.
- A ``py-io-impl`` the catalog properties give is kept: pyarrow's, on the open server, fails the commit as above, the
  files stay pending, and the next start without it commits them once.
- Wrong keys on a server with authentication on: in the sink's storage options, the start is refused before it makes
  anything; for the table's file IO only (``s3.*`` catalog properties), the commit fails naming the server's refusal,
  and the next start with the right keys commits the pending files once.
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyiceberg")

from pyiceberg.catalog import load_catalog
from pyiceberg.exceptions import NoSuchTableError
from pyiceberg.table import Table
from s3servers import OpenSeaweedServer
from sink_helpers import COLUMNS, append_epoch, batch_rows

from filesink import ExactlyOnceParquetSink, Rollover
from filesink.demo.s3server import S3Settings
from filesink.destination import open_destination, table_options
from filesink.destination.iceberg import CATALOG_NAME, IcebergDestination, file_io_properties
from filesink.errors import TableCommitFailedError
from filesink.output import OutputLocation
from filesink.output.multipart import list_uploads

pytestmark = pytest.mark.timeout(120)

TABLE = "db.events"
PY_IO_IMPL = "py-io-impl"
FSSPEC_FILE_IO = "pyiceberg.io.fsspec.FsspecFileIO"
PYARROW_FILE_IO = "pyiceberg.io.pyarrow.PyArrowFileIO"
ROLLS = Rollover(target_file_size=None, max_epochs=2, max_age_seconds=None)
"""A roll every second epoch."""


@pytest.fixture(scope="module")
def open_s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Settings]:
    """SeaweedFS as the quickstart runs it: no identities, any key accepted (its settings' keys are ``any``)."""
    with OpenSeaweedServer(tmp_path_factory.mktemp("seaweedfs-open")) as settings:
        other = S3Settings(settings.endpoint, "not-" + uuid.uuid4().hex, "whatever", settings.bucket)
        other.filesystem().pipe(settings.url("auth-is-off"), b"")  # refused if authentication were on
        yield settings


def _sink(out: str, state: Path, options: dict[str, Any], catalog: dict[str, str]) -> ExactlyOnceParquetSink:
    return ExactlyOnceParquetSink(
        out,
        str(state),
        vnodes=4,
        parallelism=1,
        partition_by=["event_date"],
        rollover=ROLLS,
        storage_options=options,
        table_format="iceberg",
        catalog=catalog,
        table=TABLE,
    )


def _rows(epoch: int) -> list[tuple]:
    return batch_rows(epoch, 20, seed=5)


def _epochs(sink: ExactlyOnceParquetSink, epochs: range) -> None:
    """Append and seal each epoch, as a Spark batch does, and roll after it, as the sink does."""
    for epoch in epochs:
        append_epoch(sink, epoch, _rows(epoch))
        sink._roll(force=False)


def _sqlite(tmp_path: Path, prefix: str) -> dict[str, str]:
    return {"type": "sql", "uri": f"sqlite:///{tmp_path / 'catalog.db'}", "warehouse": prefix}


def _table(catalog: dict[str, str], options: dict[str, Any]) -> Table:
    """The table as a reader opens it: its own catalog object (named as the sink's: a SQL catalog keeps its tables
    under its name), pyiceberg's default file IO given the server's settings."""
    return load_catalog(CATALOG_NAME, **catalog, **file_io_properties(options)).load_table(TABLE)


def _check(
    table: Table, epochs: range, commits: list[list[str]], server: S3Settings, out: str, refused_uploads: int = 0
) -> None:
    """Every row of ``epochs`` exactly once; one snapshot per roll, holding the roll's files; no multipart upload
    left but ``refused_uploads`` of the table's metadata files (pyarrow does not abort an upload refused)."""
    got = table.scan().to_arrow()
    assert Counter(zip(*(got[c].to_pylist() for c in COLUMNS), strict=True)) == Counter(
        r for e in epochs for r in _rows(e)
    )
    snapshots = [s.summary.additional_properties for s in table.snapshots() if s.summary is not None]
    assert [sorted(s["filesink.files"].split(",")) for s in snapshots] == commits
    bucket, _, prefix = out.removeprefix("s3://").partition("/")
    uploads = [key for key, _ in list_uploads(server.filesystem(), bucket, prefix + "/")]
    assert len(uploads) == refused_uploads, uploads
    assert all(key.startswith(f"{prefix}/metadata/") and key.endswith(".avro") for key in uploads), uploads


def _record_rolls(sink: ExactlyOnceParquetSink, monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """The files of each roll the ledger commits (after the table's commit), in order."""
    rolls: list[list[str]] = []
    real = sink._ledger.commit

    def commit(files: Any, *args: Any, **kwargs: Any) -> None:
        files = list(files)
        real(files, *args, **kwargs)
        if files:
            rolls.append(sorted(f.name for f in files))

    monkeypatch.setattr(sink._ledger, "commit", commit)
    return rolls


@pytest.mark.parametrize("server", ["open_s3_server", "s3_server"], ids=["auth-off", "auth-on"])
def test_a_sink_commits_to_an_iceberg_table_on_seaweedfs_with_the_docs_settings(
    tmp_path: Path, server: str, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    s3: S3Settings = request.getfixturevalue(server)
    prefix = s3.url(f"test-{uuid.uuid4().hex}")
    out, options, catalog = prefix + "/table", s3.storage_options(), _sqlite(tmp_path, prefix)
    sink = _sink(out, tmp_path / "state", options, catalog)
    rolls = _record_rolls(sink, monkeypatch)
    _epochs(sink, range(3))  # a roll after epoch 1
    sink.flush()  # and one of epoch 2
    sink.close()
    assert len(rolls) == 2, rolls
    _check(_table(catalog, options), range(3), rolls, s3, out)


def test_a_file_io_the_catalog_properties_give_is_kept(
    tmp_path: Path, open_s3_server: S3Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """pyarrow's file IO, given, on the quickstart's SeaweedFS: the commit fails as it did when it was pyiceberg's
    default, nothing is lost, and the next start without it commits the pending files once."""
    prefix = open_s3_server.url(f"test-{uuid.uuid4().hex}")
    out, options = prefix + "/table", open_s3_server.storage_options()
    catalog = _sqlite(tmp_path, prefix)
    sink = _sink(out, tmp_path / "state", options, {**catalog, PY_IO_IMPL: PYARROW_FILE_IO})
    assert sink._destination.catalog().properties[PY_IO_IMPL] == PYARROW_FILE_IO
    with pytest.raises(TableCommitFailedError, match="INVALID_ACCESS_KEY_ID") as failed:
        _epochs(sink, range(2))
    pending = sorted(sink._ledger.pending_names())
    assert pending and all(name in str(failed.value) for name in pending)
    assert "the next start" in str(failed.value)
    assert f"leave that out for the sink's default, {FSSPEC_FILE_IO}" in str(failed.value)
    sink.close()
    with pytest.raises(NoSuchTableError):
        _table(catalog, options)
    sink = _sink(out, tmp_path / "state", options, catalog)
    assert sink._destination.catalog().properties[PY_IO_IMPL] == FSSPEC_FILE_IO
    rolls = _record_rolls(sink, monkeypatch)
    _epochs(sink, range(2, 3))
    sink.flush()
    sink.close()
    _check(_table(catalog, options), range(3), [pending, *rolls], open_s3_server, out, refused_uploads=1)


def test_wrong_keys_are_refused_and_lose_nothing(
    tmp_path: Path, s3_server: S3Settings, s3_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    out, right = s3_prefix + "/table", s3_server.storage_options()
    catalog = _sqlite(tmp_path, s3_prefix)
    wrong = {**right, "key": "not-" + uuid.uuid4().hex, "secret": "wrong"}
    # The sink's keys are wrong: refused at the start, before anything is made (no state directory, nothing on S3)
    with pytest.raises(OSError, match=r"(?i)access key id you provided does not exist"):
        _sink(out, tmp_path / "refused", wrong, catalog)
    assert not (tmp_path / "refused").exists()
    assert s3_server.filesystem().find(s3_prefix) == []
    # The sink's keys are right, the table's file IO is given wrong ones: the commit fails, the files stay pending
    table_keys = {"s3.access-key-id": wrong["key"], "s3.secret-access-key": wrong["secret"]}
    sink = _sink(out, tmp_path / "state", right, {**catalog, **table_keys})
    with pytest.raises(TableCommitFailedError, match="did not land") as failed:
        _epochs(sink, range(2))
    pending = sorted(sink._ledger.pending_names())
    assert pending and all(name in str(failed.value) for name in pending), failed.value
    assert "the next start" in str(failed.value)
    assert f"file IO {FSSPEC_FILE_IO}, to {s3_server.endpoint}" in str(failed.value)
    assert "s3.access-key-id, s3.secret-access-key from the catalog properties" in str(failed.value)
    sink.close()
    sink = _sink(out, tmp_path / "state", right, catalog)
    rolls = _record_rolls(sink, monkeypatch)
    _epochs(sink, range(2, 3))
    sink.flush()
    sink.close()
    _check(_table(catalog, right), range(3), [pending, *rolls], s3_server, out)


def test_the_file_io_given_to_the_catalog(tmp_path: Path) -> None:
    """fsspec's for a table on S3 when the catalog properties name none, with the sink's S3 settings; a given one kept;
    none chosen for a local table (pyiceberg's own for local paths)."""

    def properties(output: str, catalog: dict[str, str], options: dict[str, Any]) -> dict[str, str]:
        d = open_destination(
            table_options("iceberg", catalog, TABLE),
            output=OutputLocation(output, options),
            sink_id="0a1b2c3d",
            partition_by=[],
        )
        assert isinstance(d, IcebergDestination)
        return dict(d.catalog().properties)

    options = {"key": "k", "secret": "s", "client_kwargs": {"endpoint_url": "http://127.0.0.1:8333"}}
    sql = {"type": "sql", "uri": f"sqlite:///{tmp_path / 'catalog.db'}"}
    chosen = properties("s3://bucket/table", sql, options)
    assert chosen[PY_IO_IMPL] == FSSPEC_FILE_IO
    assert (chosen["s3.endpoint"], chosen["s3.access-key-id"], chosen["s3.secret-access-key"]) == (
        "http://127.0.0.1:8333",
        "k",
        "s",
    )
    assert properties("s3://bucket/table", {**sql, PY_IO_IMPL: PYARROW_FILE_IO}, options)[PY_IO_IMPL] == PYARROW_FILE_IO
    assert PY_IO_IMPL not in properties(str(tmp_path / "table"), sql, {})
    more = {
        "profile": "analytics",
        "s3_additional_kwargs": {"ServerSideEncryption": "aws:kms", "SSEKMSKeyId": "key-1"},
        "config_kwargs": {"connect_timeout": 5, "read_timeout": 60, "s3": {"addressing_style": "path"}},
    }
    assert file_io_properties(more) == {
        "s3.profile-name": "analytics",
        "s3.server-side-encryption": "aws:kms",
        "s3.sse-kms-key-id": "key-1",
        "s3.connect-timeout": "5",
        "s3.request-timeout": "60",
        "s3.force-virtual-addressing": "false",
    }
    assert file_io_properties({"anon": True}) == {"s3.anonymous": "true"}
