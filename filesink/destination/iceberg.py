"""The Apache Iceberg destination: a roll's files are appended to an Iceberg table in one snapshot (pyiceberg).

- **The catalog** is pyiceberg's, from the sink's catalog properties (``type``, ``uri``, ``warehouse``, ...; a
  ``name`` property names the catalog, default ``filesink``). With none given and a local output, an embedded SQL
  catalog on SQLite beside the table, ``<output>/_filesink_iceberg_catalog.db`` (readers skip names starting with
  ``_``); an S3 output needs a catalog that outlives the machine (PostgreSQL, REST, Glue, ...), and an in-memory
  catalog is refused (:mod:`.catalogs`: from the options alone, before the sink's start makes anything).
- **The table's file IO** (what writes and reads its metadata files, manifests and manifest lists) for a table on S3
  is pyiceberg's ``FsspecFileIO`` unless the catalog properties name another (``py-io-impl``): s3fs, the sink's own
  S3 client, so the table's requests are the kind the sink's files already get through (pyiceberg's default,
  pyarrow's S3 client, sends uploads that SeaweedFS without identities and rclone refuse; :data:`FSSPEC_FILE_IO`).
  The sink's S3 settings (endpoint and region, also those its S3 client takes from ``AWS_ENDPOINT_URL`` and
  ``AWS_REGION``; credentials; the addressing style; ...) are given to it as ``s3.*`` properties, unless the catalog
  properties set them (:func:`catalog_open_properties`, :func:`file_io_properties`).
- **The table** is at the output (its metadata under ``<output>/metadata/``), created at the first commit from the
  sink's schema with an identity partition spec on the partition columns; timestamps with any zone are
  ``timestamptz`` (the instants are kept, the zone's name is not). The sink's files hold no field ids, so the
  table carries a name mapping (``schema.name-mapping.default``) by which readers find the files' columns.
- **A roll's commit** is one snapshot (an append of a data file per object: its partition values from its
  directories, its statistics from its footer) whose transaction also sets the table property
  ``filesink.<sink id>.marks``: this sink's cumulative marks, per vnode the epoch its committed files reach, as
  compact JSON. Properties outlive snapshot expiry, which is why the marks are there and not only in the
  snapshot's summary (which names the sink, the files and their epochs, for people). Every commit asserts the
  snapshot it was built on, so two runs of one sink cannot both commit the same vnode's epochs: the second fails,
  reads the table again and finds its files held.
- **Is a file visible?** Every vnode it holds has a mark at or past its end epoch (:func:`.base.held_files`). A
  file without rows is not committed (the table would only list an empty file).
- **Retries**: pyiceberg retries a transaction that lost a race by re-applying its updates on the newer table, which
  would re-apply marks computed from the older one; this module turns that off for its own commits (in memory, the
  table is not changed) and retries itself: it reads the table again, drops the files now held, and builds the
  commit anew (:data:`COMMIT_ATTEMPTS`).
- **The commit itself** (a table of format version 2 that exists) is built here and sent with the catalog's
  ``commit_table``: a manifest of the roll's files, a manifest list of it and the current snapshot's manifests, and
  the updates (the marks, the snapshot, the ``main`` branch moved to it, the oldest snapshots removed) with two
  requirements, the table's uuid and the snapshot it was built on. pyiceberg's transaction sends the same, but
  deep-copies the whole table metadata at each of its ~20 reads of it, which was most of a commit's time. The
  table's creation and other format versions go through pyiceberg's transaction.
- **History:** each commit removes, in the same compare-and-swap, the oldest snapshots beyond
  :data:`KEEP_SNAPSHOTS` (:meth:`IcebergDestination.maintain` expires what other commits leave), so the metadata
  stays the same size; its metadata log is bounded and old metadata files are deleted after each commit
  (:data:`TABLE_PROPERTIES`); manifests are merged in tiers (:data:`MERGE_TIERS`), so a commit reads and writes a
  bounded manifest list and a merge rewrites a bounded number of entries. A table created elsewhere keeps its own
  settings (without ``commit.manifest-merge.enabled`` nothing is merged). Expiry leaves the files of the expired
  snapshots (manifest lists, merged manifests) in ``metadata/``: removing them is left to the table's orphan file
  clean-up.

pyiceberg 0.12 cannot itself read a file whose stored Arrow schema labels a timestamp with a zone other than UTC
(other readers, polars' among them, read them as ``timestamptz``).
"""

from __future__ import annotations

import decimal
import json
import logging
import uuid
from collections.abc import Mapping, Sequence
from datetime import UTC, date, datetime, timedelta
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from pyiceberg.catalog import Catalog, load_catalog
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.exceptions import CommitFailedException, NoSuchTableError, TableAlreadyExistsError
from pyiceberg.io.pyarrow import (
    _ConvertToIcebergWithoutIDs,
    compute_statistics_plan,
    data_file_statistics_from_parquet_metadata,
    parquet_path_to_id_mapping,
    visit_pyarrow,
)
from pyiceberg.manifest import (
    DataFile,
    DataFileContent,
    FileFormat,
    ManifestContent,
    ManifestEntry,
    ManifestEntryStatus,
    ManifestFile,
    ManifestWriter,
    write_manifest,
    write_manifest_list,
)
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema, assign_fresh_schema_ids
from pyiceberg.table import Table, TableProperties, Transaction
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.refs import MAIN_BRANCH, SnapshotRefType
from pyiceberg.table.snapshots import Operation, Snapshot, SnapshotSummaryCollector, Summary, update_snapshot_summaries
from pyiceberg.table.update import (
    AddSnapshotUpdate,
    AssertRefSnapshotId,
    AssertTableUUID,
    RemoveSnapshotsUpdate,
    SetPropertiesUpdate,
    SetSnapshotRefUpdate,
    TableRequirement,
    TableUpdate,
)
from pyiceberg.transforms import IdentityTransform
from pyiceberg.typedef import Record
from pyiceberg.types import DecimalType, IcebergType, ListType, MapType, StructType
from pyiceberg.utils.datetime import date_to_days, datetime_to_micros
from pyiceberg.utils.properties import property_as_bool, property_as_int

from logstore.diagnosis import told

from ..errors import TableCommitFailedError, TableFormatError
from ..schema.evolution import upgradable
from .base import Destination, TableFormat, held_files, marks_of, s3_settings
from .catalogs import catalog_refusal, table_location
from .partitions import partition_texts, typed_value

if TYPE_CHECKING:
    from ..committer.ledger import PlannedFile
    from ..tasks.writer import WrittenObject

log = logging.getLogger(__name__)

CATALOG_NAME = "filesink"
"""The catalog's name when the catalog properties give none (SQL catalogs keep their tables under it)."""
EMBEDDED_CATALOG = "_filesink_iceberg_catalog.db"
"""The embedded catalog's SQLite file, in a local output's root."""
KEEP_SNAPSHOTS = 100
"""Snapshots a table keeps (the newest; readers can travel back that many commits): a roll's commit removes the
oldest beyond them."""
EXPIRE_BATCH = 20
"""The most snapshots one commit removes (a longer history, from a table from elsewhere, shrinks by that many per
commit); :meth:`IcebergDestination.maintain` expires once there are that many beyond :data:`KEEP_SNAPSHOTS`."""
COMMIT_ATTEMPTS = 4
"""Commits of one roll that lose a race (another commit landed first) before the roll's commit fails."""
TABLE_PROPERTIES = {
    "commit.manifest-merge.enabled": "true",
    "write.metadata.delete-after-commit.enabled": "true",
    "write.metadata.previous-versions-max": "100",
}
"""The properties a new table is created with: manifests are merged (the Java library's default, not pyiceberg's:
without it a table has a manifest per commit, and planning a scan reads them all; :data:`MERGE_TIERS` says how the
sink merges), old metadata files are deleted (the newest 100 kept)."""
MERGE_TIERS = ((10, 10), (100, 10), (1_000, 10))
"""How a roll's commit merges a table's manifests (when ``commit.manifest-merge.enabled``): per tier, (files, count):
once the commit would leave ``count`` data manifests each listing fewer than ``files`` files (and at least the tier
before's), it writes them as one. A commit makes a small manifest (its own files); 10 of them become one of at least
10 files, 10 of those one of at least 100, 10 of those one of at least 1,000, which is never merged again. A merge
rewrites what it merges, so its cost is bounded (about 1,000 files' entries once per 1,000 commits, 100 once per
100, 10 once per 10) and never grows with the table, and a commit's manifest list holds at most 28 manifests plus
one per 1,000 files (every commit reads it and writes it again: about 0.2 ms a manifest)."""
NAME_MAPPING = "schema.name-mapping.default"
_NO_RETRIES = {"commit.retry.num-retries": "0"}
STALE_UPLOAD_SECONDS = 3600.0
"""A multipart upload under a table's ``metadata/`` on S3 older than this is a leftover and is aborted by
:meth:`IcebergDestination.maintain` (a file IO can leave one when a request of its upload fails: pyarrow's, given
as ``py-io-impl``, uploads every file in parts; an incomplete upload is kept, and billed, until someone aborts it).
A metadata file's upload takes seconds."""
PY_IO_IMPL = "py-io-impl"
"""The catalog property naming the class of pyiceberg's file IO."""
FSSPEC_FILE_IO = "pyiceberg.io.fsspec.FsspecFileIO"
"""The table's file IO on S3 unless the catalog properties name one: pyiceberg's over fsspec, which for ``s3://`` is
s3fs, the client the sink writes its files and its log store with. pyiceberg's own default, ``PyArrowFileIO``
(pyarrow's S3 client, the AWS C++ SDK), uploads every metadata file in parts, each with a streaming checksum (the
SDK's default; ``AWS_REQUEST_CHECKSUM_CALCULATION=WHEN_REQUIRED`` turns it off): SeaweedFS looks such a request's
access key up in its identities even with authentication off (``INVALID_ACCESS_KEY_ID`` during ``UploadPart`` with
any key on a server without identities, while the same keys write the sink's files), and rclone's ``serve s3``
refuses the part without a length (``411 MissingContentLength``)."""
S3_SCHEMES = ("s3://", "s3a://", "s3n://")


def marks_property(sink_id: str) -> str:
    """The table property holding this sink's marks."""
    return f"filesink.{sink_id}.marks"


def file_io_properties(options: Mapping[str, Any]) -> dict[str, str]:
    """pyiceberg's S3 file IO properties for the sink's s3fs options (:func:`.base.s3_settings`): the endpoint and
    region (also those the sink's S3 client takes from ``AWS_ENDPOINT_URL`` and ``AWS_REGION``, which pyarrow's S3
    client does not read), credentials (or none, and pyiceberg's S3 client finds them in the standard AWS variables
    and files), the addressing style (``s3.force-virtual-addressing``, pyiceberg's name for what the Java
    library calls ``s3.path-style-access``, the other way round), and, when the options give them, the AWS profile
    (``profile``), anonymous access (``anon``), server-side encryption (``s3_additional_kwargs``) and the timeouts
    (``config_kwargs``). Both of pyiceberg's S3 file IOs (fsspec's, the sink's default, and pyarrow's) and readers
    of the table read them."""
    names = {
        "endpoint": "s3.endpoint",
        "region": "s3.region",
        "key": "s3.access-key-id",
        "secret": "s3.secret-access-key",
        "token": "s3.session-token",
    }
    settings = s3_settings(options)
    out = {names[k]: v for k, v in settings.items() if k in names}
    if "addressing" in settings:
        out["s3.force-virtual-addressing"] = "true" if settings["addressing"] == "virtual" else "false"
    # What else of the sink's S3 client pyiceberg's S3 file IOs take: a profile, anonymous access, encryption, timeouts
    if options.get("profile"):
        out["s3.profile-name"] = str(options["profile"])
    if options.get("anon"):
        out["s3.anonymous"] = "true"
    extra = options.get("s3_additional_kwargs") or {}
    for name, prop in (("ServerSideEncryption", "s3.server-side-encryption"), ("SSEKMSKeyId", "s3.sse-kms-key-id")):
        if extra.get(name):
            out[prop] = str(extra[name])
    config = options.get("config_kwargs") or {}
    for name, prop in (("connect_timeout", "s3.connect-timeout"), ("read_timeout", "s3.request-timeout")):
        if config.get(name) is not None:
            out[prop] = str(config[name])
    return out


def catalog_open_properties(given: Mapping[str, str], options: Mapping[str, Any], location: str) -> dict[str, str]:
    """The properties the catalog is opened with, for a table at ``location`` (``s3://...`` or ``file://...``):
    the catalog properties ``given``; for a table on S3, also the file IO (:data:`FSSPEC_FILE_IO`) unless they name
    one (``py-io-impl``), and the sink's S3 settings (:func:`file_io_properties` of its storage ``options``) unless
    they set them. A local table's file IO is pyiceberg's own choice."""
    if not location.startswith(S3_SCHEMES):
        return dict(given)
    return {PY_IO_IMPL: FSSPEC_FILE_IO, **file_io_properties(options), **given}


# -- schemas -------------------------------------------------------------------------------------------------


def _utc(t: pa.DataType) -> pa.DataType:
    if pa.types.is_timestamp(t) and t.tz is not None:
        return pa.timestamp(t.unit, tz="UTC")
    if pa.types.is_struct(t):
        return pa.struct([f.with_type(_utc(f.type)) for f in t])
    if pa.types.is_list(t):
        return pa.list_(t.value_field.with_type(_utc(t.value_type)))
    if pa.types.is_large_list(t):
        return pa.large_list(t.value_field.with_type(_utc(t.value_type)))
    if pa.types.is_map(t):
        return pa.map_(t.key_field.with_type(_utc(t.key_type)), t.item_field.with_type(_utc(t.item_type)))
    return t


def iceberg_arrow_schema(schema: pa.Schema) -> pa.Schema:
    """The files' Arrow schema as the table takes it: every timestamp with a zone in UTC (``timestamptz``), every
    column optional, no metadata."""
    return pa.schema([f.with_type(_utc(f.type)).with_nullable(True) for f in schema])


def _refused(t: pa.DataType) -> str | None:
    """Why an Iceberg (format version 2) table cannot hold values of ``t`` as the sink's files store them, or None;
    pyiceberg's conversion refuses the rest (durations, intervals, nulls, ...)."""
    if pa.types.is_unsigned_integer(t):
        return "Iceberg has no unsigned integers"
    if pa.types.is_float16(t):
        return "Iceberg has no half-precision floats"
    if pa.types.is_timestamp(t) and t.unit == "ns":
        return "Iceberg (format version 2) keeps timestamps to the microsecond"
    if pa.types.is_time(t) and t.unit != "us":
        return "Iceberg's time is in microseconds"
    if pa.types.is_decimal(t) and (not isinstance(t, pa.Decimal128Type) or t.precision > 38):
        return "Iceberg's decimals have at most 38 digits"
    if pa.types.is_dictionary(t):
        return "a dictionary type has no Iceberg type"
    if pa.types.is_struct(t):
        return next((r for r in (_refused(f.type) for f in t) if r), None)
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return _refused(t.value_type)
    if pa.types.is_map(t):
        return _refused(t.key_type) or _refused(t.item_type)
    return None


def iceberg_schema(schema: pa.Schema) -> Schema:
    """The table's Iceberg schema for the files' Arrow schema, with fresh field ids (pyiceberg's conversion, as its
    ``create_table`` does it for an Arrow schema: the Arrow fields carry no ids)."""
    converted = visit_pyarrow(iceberg_arrow_schema(schema), _ConvertToIcebergWithoutIDs(format_version=2))
    if not isinstance(converted, Schema):
        raise TypeError(f"pyiceberg converted an Arrow schema to {type(converted).__name__}, not a Schema")
    return assign_fresh_schema_ids(converted)


def _shape(t: IcebergType) -> str:
    """A type as text without field ids or optionality, to compare an existing table's columns with the sink's."""
    if isinstance(t, StructType):
        return "struct<" + ", ".join(f"{f.name}: {_shape(f.field_type)}" for f in t.fields) + ">"
    if isinstance(t, ListType):
        return f"list<{_shape(t.element_type)}>"
    if isinstance(t, MapType):
        return f"map<{_shape(t.key_type)}, {_shape(t.value_type)}>"
    return str(t)


_PARTITION_TYPES = (
    pa.types.is_string,
    pa.types.is_large_string,
    pa.types.is_integer,
    pa.types.is_boolean,
    pa.types.is_floating,
    pa.types.is_decimal,
    pa.types.is_date32,
    pa.types.is_timestamp,
)


def _differs(current: Schema, schema: pa.Schema) -> bool:
    """Whether the table's schema ``current`` is not the sink's files' ``schema`` (as Iceberg types)."""
    want = iceberg_schema(schema)
    return [(f.name, _shape(f.field_type)) for f in current.fields] != [
        (f.name, _shape(f.field_type)) for f in want.fields
    ]


def _older_columns(have: Schema, want: Schema) -> set[str]:
    """The columns whose type in the table ``have`` is an older one of the sink's ``want`` (fields added inside,
    types widened as the sink takes them): the next commit evolves the table."""
    table, sink = have.as_arrow(), want.as_arrow()
    return {f.name for f in sink if table.get_field_index(f.name) >= 0 and upgradable(table.field(f.name).type, f.type)}


def _partition_value(value: object, scale: int | None) -> object:
    """A partition value as Iceberg's partition records hold it: days for a date, microseconds for a timestamp."""
    if isinstance(value, datetime):
        return datetime_to_micros(value)
    if isinstance(value, date):
        return date_to_days(value)
    if isinstance(value, decimal.Decimal) and scale is not None:
        return value.quantize(decimal.Decimal(1).scaleb(-scale))
    return value


def _delete(table: Table, paths: Sequence[str]) -> None:
    """Delete files of the table's metadata that nothing refers to; a failure is logged (they are only left over)."""
    for path in paths:
        try:
            table.io.delete(path)
        except Exception as e:
            log.warning("cannot delete %s, which the table no longer refers to: %s", path, e)


def _files(manifest: ManifestFile) -> int:
    return (manifest.added_files_count or 0) + (manifest.existing_files_count or 0)


def _tier(manifest: ManifestFile, spec_id: int) -> int | None:
    """The :data:`MERGE_TIERS` tier of a manifest, or None if it is not merged (a delete manifest, one of another
    partition spec, one as large as the last tier's merges make)."""
    if manifest.content != ManifestContent.DATA or manifest.partition_spec_id != spec_id:
        return None
    return next((i for i, (files, _) in enumerate(MERGE_TIERS) if _files(manifest) < files), None)


def _rewrite(writer: ManifestWriter, manifests: Sequence[ManifestFile], table: Table) -> None:
    """Write the live entries of ``manifests`` (files added or kept, with their snapshot and sequence numbers) as
    existing entries of the manifest ``writer`` writes; as pyiceberg's own merge of manifests does."""
    for manifest in manifests:
        for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True):
            writer.existing(entry)


def _check_merge(writer: ManifestWriter, merged: Sequence[ManifestFile], added: int, table: str) -> None:
    """A merged manifest lists every file the manifests it replaces listed, or the commit stops before it is made."""
    written = writer.to_manifest_file()
    if written.added_files_count != added or written.existing_files_count != sum(_files(m) for m in merged):
        raise TableFormatError(
            f"the {table}: merging {len(merged)} manifests wrote {written.existing_files_count} existing files' "
            f"entries, and they list {sum(_files(m) for m in merged)}. Nothing was committed; the files stay pending. "
            "Turn merging off (commit.manifest-merge.enabled=false) and report this."
        )


def _without_retries(table: Table) -> Table:
    """The same table, with pyiceberg's own commit retries off for transactions started on it. The property is set
    on this in-memory copy only: a commit sends its updates and requirements, never the properties read here."""
    metadata = table.metadata.model_copy(update={"properties": {**table.metadata.properties, **_NO_RETRIES}})
    return Table(table.name(), metadata, table.metadata_location, table.io, table.catalog, table.config)


class IcebergDestination(Destination):
    format = TableFormat.ICEBERG
    transaction = (
        "in the driver, after every file of a roll is written: one Iceberg snapshot appends them all, and sets the "
        "table property with this sink's marks (per vnode: the epoch its committed files reach)"
    )
    keep_snapshots = KEEP_SNAPSHOTS
    expire_batch = EXPIRE_BATCH

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if not self.options.table:
            raise TableFormatError("table_format='iceberg' needs table='<namespace>.<name>'")
        self.identifier: str = self.options.table
        self.location = table_location(self.output.url)
        self._catalog: Catalog | None = None
        self._table: Table | None = None
        self._uploads_swept = False

    @property
    def name(self) -> str:
        return f"Iceberg table {self.identifier} at {self.location}"

    # -- the catalog -------------------------------------------------------------------------------------------

    def catalog(self) -> Catalog:
        """The catalog (opened once). Raises :class:`TableFormatError` for a catalog that cannot be used."""
        if self._catalog is not None:
            return self._catalog
        given = self.options.catalog_properties()
        refusal = catalog_refusal(self.identifier, self.output.url, given)
        if refusal is not None:
            raise TableFormatError(refusal)
        name = given.pop("name", CATALOG_NAME)
        if not given:
            root = self.output.local_root()
            root.mkdir(parents=True, exist_ok=True)
            props = {"uri": f"sqlite:///{root / EMBEDDED_CATALOG}", "warehouse": self.location}
            try:
                self._catalog = SqlCatalog(name, **props)
            except Exception as e:
                raise TableFormatError(f"cannot open the embedded catalog {root / EMBEDDED_CATALOG}: {e}") from e
            return self._catalog
        props = catalog_open_properties(given, self.output.storage_options, self.location)
        try:
            self._catalog = load_catalog(name, **props)
        except Exception as e:
            raise TableFormatError(
                f"cannot open the Iceberg catalog {name!r} ({type(e).__name__}: {e}). Nothing was written. Check "
                "the catalog properties (type, uri, credentials) and that the catalog is reachable."
            ) from e
        return self._catalog

    def _file_io_hint(self, error: OSError) -> OSError:
        """``error``, an S3 error of the table's file IO (reading or writing the table's metadata), with what to
        check: which file IO, which server, where its settings came from, what to change. The same type, caused by
        ``error``; a missing file, or the error of a local table, as it is."""
        if not self.location.startswith(S3_SCHEMES) or self._catalog is None or isinstance(error, FileNotFoundError):
            return error
        props, given = self._catalog.properties, self.options.catalog_properties()
        io = props.get(PY_IO_IMPL, FSSPEC_FILE_IO)
        overridden = sorted(k for k in given if k.startswith("s3."))
        settings = "the sink's S3 settings" + (
            f" but {', '.join(overridden)} from the catalog properties" if overridden else ""
        )
        if given.get(PY_IO_IMPL, FSSPEC_FILE_IO) != FSSPEC_FILE_IO:
            what = (
                f"it was chosen with the catalog property py-io-impl: leave that out for the sink's default, "
                f"{FSSPEC_FILE_IO} (s3fs, the client that writes the sink's files), or check that the server takes "
                "this client's requests"
            )
        else:
            what = "check the endpoint and the keys" + (
                "" if overridden else "; the catalog properties s3.endpoint, s3.access-key-id, ... set them apart"
            )
        text = (
            f"{error} (the table's metadata goes through pyiceberg's file IO {io}, to "
            f"{props.get('s3.endpoint') or 'AWS S3'}, with {settings}: {what})"
        )
        try:
            hinted = type(error)(text)
        except Exception:
            hinted = OSError(text)
        hinted.__cause__ = error
        return hinted

    # -- reading the table -------------------------------------------------------------------------------------

    def _load(self) -> Table | None:
        """The table as the catalog has it now, or None if there is none yet."""
        try:
            self._table = self.catalog().load_table(self.identifier)
        except NoSuchTableError:
            self._table = None
        return self._table

    def _read(self, action: str) -> Table | None:
        try:
            return self._load()
        except OSError as e:
            raise self._file_io_hint(e) from e
        except TableFormatError:
            raise
        except Exception as e:  # catalogs raise their own exceptions (SQLAlchemy's, REST errors, ...)
            self._table = None
            raise OSError(f"{self.name}: cannot {action}: {type(e).__name__}: {e}") from e

    def reach(self, table: Table) -> dict[int, int]:
        """Per vnode, the newest mark of this sink the table holds (all vnodes)."""
        text = table.metadata.properties.get(marks_property(self.sink_id))
        if not text:
            return {}
        try:
            return {int(v): int(e) for v, e in json.loads(text).items()}
        except (ValueError, TypeError, AttributeError) as e:
            raise TableFormatError(
                f"the {self.name}: its property {marks_property(self.sink_id)} is not this sink's marks ({e}): "
                "something other than the sink changed it. Nothing was written or deleted."
            ) from e

    def held(self, files: Sequence[PlannedFile]) -> set[str] | None:
        table = self._read("read the table's marks")
        if table is None:
            return set()
        return held_files(files, self.reach(table), self.name)

    # -- checks ------------------------------------------------------------------------------------------------

    def check_schema(self, schema: pa.Schema) -> str | None:
        for field in schema:
            why = _refused(field.type)
            if why is None:
                try:
                    iceberg_schema(pa.schema([field]))
                except Exception as e:
                    why = str(e)
            if why is not None:
                return f"column {field.name!r} of type {field.type}: an Iceberg table cannot hold it ({why})"
        for column in self.partition_by:
            index = schema.get_field_index(column)
            type_ = schema.field(column).type if index >= 0 else None
            if type_ is None or not any(accepts(type_) for accepts in _PARTITION_TYPES):
                return f"partition column {column!r} of type {type_}: an Iceberg partition value cannot hold it"
        return None

    def check(self, schema: pa.Schema | None) -> None:
        table = self._read("open the table")
        if table is None:
            return
        if table.location().rstrip("/") != self.location:
            raise TableFormatError(
                f"the Iceberg table {self.identifier} exists at {table.location()}, and this sink writes its files "
                f"to {self.location}. Nothing was written. Give the sink the table's location as its output, or "
                "another table name."
            )
        columns = self._partition_columns(table)
        if columns != list(self.partition_by):
            raise TableFormatError(
                f"the {self.name} exists, partitioned by {columns}, and this sink partitions by "
                f"{list(self.partition_by)}. Nothing was written. Give partition_by={columns} (identity partitions "
                "only), or another table."
            )
        if schema is None:
            return
        have = {f.name: _shape(f.field_type) for f in table.schema().fields}
        want = {f.name: _shape(f.field_type) for f in iceberg_schema(schema).fields}
        older = _older_columns(table.schema(), iceberg_schema(schema))  # the sink's older schema: evolved at the commit
        different = [
            f"{c} ({have[c]} in the table, {t} here)"
            for c, t in want.items()
            if c in have and have[c] != t and c not in older
        ]
        extra = [f"{c} (only in the table)" for c in have if c not in want]
        if different or extra:
            raise TableFormatError(
                f"the {self.name} exists with other columns than this sink's: {'; '.join(different + extra)}. "
                "Nothing was written. Give the sink another table, or write the columns the table has."
            )

    def _partition_columns(self, table: Table) -> list[str]:
        schema = table.schema()
        columns: list[str] = []
        for field in table.spec().fields:
            source = schema.find_column_name(field.source_id) or f"<field {field.source_id}>"
            columns.append(source if isinstance(field.transform, IdentityTransform) else f"{field.transform}({source})")
        return columns

    # -- committing --------------------------------------------------------------------------------------------

    def _data_file(self, obj: WrittenObject, metadata: TableMetadata, schema: pa.Schema) -> DataFile:
        table_schema = metadata.schema()
        values: list[object] = []
        for column, text in zip(self.partition_by, partition_texts(obj.key, self.partition_by), strict=True):
            field = table_schema.find_field(column)
            scale = field.field_type.scale if isinstance(field.field_type, DecimalType) else None
            values.append(_partition_value(typed_value(text, schema.field(column).type, column), scale))
        stats = data_file_statistics_from_parquet_metadata(
            parquet_metadata=self.footer(obj.key, obj.footer),
            stats_columns=compute_statistics_plan(table_schema, metadata.properties),
            parquet_column_mapping=parquet_path_to_id_mapping(table_schema),
        )
        return DataFile.from_args(
            content=DataFileContent.DATA,
            file_path=f"{self.location}/{obj.key}",
            file_format=FileFormat.PARQUET,
            partition=Record(*values),
            file_size_in_bytes=obj.size,
            sort_order_id=None,
            spec_id=metadata.default_spec_id,
            equality_ids=None,
            key_metadata=None,
            **stats.to_serialized_dict(),
        )

    def _begin(self, table: Table | None, schema: pa.Schema) -> Transaction:
        """A transaction on the table, or one that creates it (with its first snapshot: nothing is visible before)."""
        if table is not None:
            return _without_retries(table).transaction()
        catalog = self.catalog()
        ice = iceberg_schema(schema)
        spec = PartitionSpec(
            *(
                PartitionField(
                    source_id=ice.find_field(column).field_id,
                    field_id=1000 + i,
                    transform=IdentityTransform(),
                    name=column,
                )
                for i, column in enumerate(self.partition_by)
            )
        )
        namespace = Catalog.namespace_from(self.identifier)
        if namespace:
            catalog.create_namespace_if_not_exists(namespace)
        return catalog.create_table_transaction(
            self.identifier, schema=ice, location=self.location, partition_spec=spec, properties=dict(TABLE_PROPERTIES)
        )

    def _evolve(self, tx: Transaction, schema: pa.Schema) -> None:
        """The sink's newer schema (:mod:`filesink.schema.evolution`) in the commit's transaction, before the snapshot
        of the first files that hold its new columns: new columns and fields get new ids, wider types are Iceberg's
        promotions (int to long, float to double, a decimal's precision). Nothing when the table has it already."""
        if not _differs(tx.table_metadata.schema(), schema):
            return
        with tx.update_schema() as update:
            update.union_by_name(iceberg_schema(schema))

    def make_visible(
        self, files: Sequence[PlannedFile], written: Mapping[str, Sequence[WrittenObject]], schema: pa.Schema
    ) -> None:
        error: Exception | None = None
        for attempt in range(COMMIT_ATTEMPTS):
            try:
                table = self._read("read the table before a commit")
            except OSError as e:
                raise TableCommitFailedError(
                    f"{told(e)}. Nothing was committed; the files stay pending and the next start commits them."
                ) from e
            reach = self.reach(table) if table is not None else {}
            held = held_files(files, reach, self.name)
            pending = [f for f in files if f.starts and f.name not in held]  # a file without rows: nothing to read
            if not pending:
                return
            try:
                self._commit(table, pending, written, schema, reach)
                return
            except (CommitFailedException, TableAlreadyExistsError) as e:
                # Not committed: another commit landed first. Read the table again and build the commit anew.
                log.info("%s: commit attempt %d lost a race (%s), reading the table again", self.name, attempt + 1, e)
                error = e
            except (TableFormatError, TableCommitFailedError):
                raise
            except Exception as e:
                self._table = None
                failure = self._file_io_hint(e) if isinstance(e, OSError) else e
                self.after_failure(pending, failure, leave_alone=f"the table property {marks_property(self.sink_id)}")
                return
        names = [f.name for f in files]
        raise TableCommitFailedError(
            f"the commit of {len(names)} files ({', '.join(names)}) to the {self.name} lost {COMMIT_ATTEMPTS} races "
            f"with other commits ({error}). The files stay pending: the next start, or filesink recover apply, commits "
            "them once. Does another writer commit to this table that often?"
        ) from error

    def _commit(
        self,
        table: Table | None,
        pending: Sequence[PlannedFile],
        written: Mapping[str, Sequence[WrittenObject]],
        schema: pa.Schema,
        reach: Mapping[int, int],
    ) -> None:
        """One roll's commit: the append and the marks in one compare-and-swap of the table's metadata. A table of
        format version 2 is committed directly (:meth:`_append`); the first commit (which creates the table) and
        other format versions go through a pyiceberg transaction."""
        tx: Transaction | None = None
        manifests: list[ManifestFile] | None = None
        metadata: TableMetadata
        try:
            marks = dict(reach)
            for f in pending:
                for v, e in marks_of(f).items():
                    marks[v] = max(marks.get(v, -1), e)
            # A commit that changes the table's schema (rare: the sink's schema evolved) goes through the transaction
            evolving = table is not None and _differs(table.schema(), schema)
            if table is not None and table.metadata.format_version == 2 and not evolving:
                metadata = table.metadata  # as loaded, no copy; nothing here changes it
                manifests = self._live_manifests(table)
            if manifests is None:
                tx = self._begin(table, schema)
                if evolving:
                    self._evolve(tx, schema)
                metadata = tx.table_metadata  # a deep copy at each read (pyiceberg 0.12): read once
            data_files = [self._data_file(obj, metadata, schema) for f in pending for obj in written[f.name]]
        except (CommitFailedException, TableAlreadyExistsError, TableFormatError):
            raise
        except Exception as e:
            raise TableCommitFailedError(
                f"cannot prepare the commit of {len(pending)} files to the {self.name}: {type(e).__name__}: {e}. "
                "Nothing was committed; the files stay pending and the next start commits them."
            ) from e
        properties = {marks_property(self.sink_id): json.dumps(dict(sorted(marks.items())), separators=(",", ":"))}
        if NAME_MAPPING not in metadata.properties:
            properties[NAME_MAPPING] = metadata.schema().name_mapping.model_dump_json()
        summary = {
            "filesink.sink.face-id": self.sink_id,
            "filesink.files": ",".join(f.name for f in pending),
            "filesink.epochs": f"{min(min(f.starts.values(), default=f.end_epoch) for f in pending)}-"
            f"{max(f.end_epoch for f in pending)}",
        }
        if tx is None:
            assert table is not None and manifests is not None
            self._append(table, data_files, manifests, properties, summary)
            return
        tx.set_properties(properties)
        # merge_append is a fast append unless the table has commit.manifest-merge.enabled (TABLE_PROPERTIES)
        with tx.update_snapshot(snapshot_properties=summary).merge_append() as append:
            for data_file in data_files:
                append.append_data_file(data_file)
        self._table = tx.commit_transaction()

    def _live_manifests(self, table: Table) -> list[ManifestFile]:
        """The manifests of the table's current snapshot that a fast append keeps (those listing files)."""
        current = table.metadata.snapshot_by_name(MAIN_BRANCH)
        if current is None:
            return []
        return [m for m in current.manifests(table.io) if m.has_added_files() or m.has_existing_files()]

    def _expired(self, metadata: TableMetadata, adding: int) -> list[int]:
        """The ids of the oldest snapshots beyond :attr:`keep_snapshots` once ``adding`` more are added, never one a
        branch or tag points at, at most :attr:`expire_batch`."""
        protected = {ref.snapshot_id for ref in metadata.refs.values()}
        snapshots = sorted(metadata.snapshots, key=lambda s: (s.sequence_number or 0, s.timestamp_ms))
        old = snapshots[: max(0, len(snapshots) + adding - self.keep_snapshots)]
        return [s.snapshot_id for s in old if s.snapshot_id not in protected][: self.expire_batch]

    def _append(
        self,
        table: Table,
        data_files: Sequence[DataFile],
        manifests: Sequence[ManifestFile],
        properties: Mapping[str, str],
        summary: Mapping[str, str],
    ) -> None:
        """Commit ``data_files`` as one snapshot (a fast append: a manifest of them, and a manifest list of it and
        ``manifests``, the current snapshot's), with the table ``properties`` set and the oldest snapshots beyond
        :attr:`keep_snapshots` removed, in one call of the catalog's ``commit_table``: it asserts the table and the
        snapshot the commit was built on, so a commit that lost a race fails (``CommitFailedException``) and changes
        nothing. pyiceberg's transaction would build the same updates, copying the table's metadata at each of its
        reads (its cost, not the append's, was most of a commit)."""
        metadata = table.metadata
        parent = metadata.snapshot_by_name(MAIN_BRANCH)
        parent_id = parent.snapshot_id if parent is not None else None
        snapshot_id = metadata.new_snapshot_id()
        sequence_number = metadata.next_sequence_number()
        compression = metadata.properties.get(
            TableProperties.WRITE_AVRO_COMPRESSION, TableProperties.WRITE_AVRO_COMPRESSION_DEFAULT
        )
        spec, ice_schema = metadata.spec(), metadata.schema()
        where = table.location_provider()
        commit_uuid = uuid.uuid4()
        paths: list[str] = []

        def new_manifest() -> ManifestWriter:
            paths.append(where.new_metadata_location(f"{commit_uuid}-m{len(paths)}.avro"))
            return write_manifest(
                format_version=2,
                spec=spec,
                schema=ice_schema,
                output_file=table.io.new_output(paths[-1]),
                snapshot_id=snapshot_id,
                avro_compression=compression,  # type: ignore[arg-type]
            )

        merging = property_as_bool(
            metadata.properties, TableProperties.MANIFEST_MERGE_ENABLED, TableProperties.MANIFEST_MERGE_ENABLED_DEFAULT
        )
        tiers = [_tier(m, spec.spec_id) for m in manifests] if merging else [None] * len(manifests)
        small = [m for m, t in zip(manifests, tiers, strict=True) if t == 0]
        merged = small if len(small) + 1 >= MERGE_TIERS[0][1] else []  # with the new manifest
        with new_manifest() as writer:
            for data_file in data_files:
                writer.add(
                    ManifestEntry.from_args(
                        status=ManifestEntryStatus.ADDED, snapshot_id=snapshot_id, data_file=data_file
                    )
                )
            _rewrite(writer, merged, table)
        kept = [writer.to_manifest_file(), *(m for m in manifests if m not in merged)]
        _check_merge(writer, merged, len(data_files), self.name)
        for tier, (_, count) in enumerate(MERGE_TIERS[1:], start=1):
            group = [m for m, t in zip(manifests, tiers, strict=True) if t == tier]
            if not merged and len(group) >= count:
                with new_manifest() as tier_writer:
                    _rewrite(tier_writer, group, table)
                _check_merge(tier_writer, group, 0, self.name)
                kept = [m for m in kept if m not in group] + [tier_writer.to_manifest_file()]
                merged = group
        list_path = where.new_metadata_location(f"snap-{snapshot_id}-0-{commit_uuid}.avro")
        paths.append(list_path)
        with write_manifest_list(
            format_version=2,
            output_file=table.io.new_output(list_path),
            snapshot_id=snapshot_id,
            parent_snapshot_id=parent_id,
            sequence_number=sequence_number,
            avro_compression=compression,  # type: ignore[arg-type]
        ) as list_writer:
            list_writer.add_manifests(kept)
        collector = SnapshotSummaryCollector(
            partition_summary_limit=property_as_int(
                metadata.properties,
                TableProperties.WRITE_PARTITION_SUMMARY_LIMIT,
                TableProperties.WRITE_PARTITION_SUMMARY_LIMIT_DEFAULT,
            )
            or 0
        )
        for data_file in data_files:
            collector.add_file(data_file, schema=ice_schema, partition_spec=spec)
        # pyiceberg's models take their fields' names as well as their aliases (mypy only sees the aliases)
        snapshot = Snapshot(  # type: ignore[call-arg]
            snapshot_id=snapshot_id,
            parent_snapshot_id=parent_id,
            sequence_number=sequence_number,
            manifest_list=list_path,
            summary=update_snapshot_summaries(
                summary=Summary(operation=Operation.APPEND, **collector.build(), **summary),
                previous_summary=parent.summary if parent is not None else None,
            ),
            schema_id=metadata.current_schema_id,
        )
        updates: list[TableUpdate] = [SetPropertiesUpdate(updates=dict(properties))]
        expired = self._expired(metadata, adding=1)
        if expired:
            updates.append(RemoveSnapshotsUpdate(snapshot_ids=expired))  # type: ignore[call-arg]
        updates += [
            AddSnapshotUpdate(snapshot=snapshot),
            SetSnapshotRefUpdate(  # type: ignore[call-arg]
                ref_name=MAIN_BRANCH, type=SnapshotRefType.BRANCH, snapshot_id=snapshot_id
            ),
        ]
        requirements: tuple[TableRequirement, ...] = (
            AssertTableUUID(uuid=metadata.table_uuid),
            AssertRefSnapshotId(ref=MAIN_BRANCH, snapshot_id=parent_id),  # type: ignore[call-arg]
        )
        try:
            response = table.catalog.commit_table(table, requirements, tuple(updates))
        except CommitFailedException:
            _delete(table, paths)  # refused: nothing refers to them
            raise
        self._committed(table, response.metadata, response.metadata_location)

    def _committed(self, table: Table, metadata: TableMetadata, location: str) -> None:
        """After a direct commit: the table as committed, and the metadata files that fell out of its metadata log
        deleted if the table says so (``write.metadata.delete-after-commit.enabled``), as pyiceberg's commits do."""
        if property_as_bool(
            metadata.properties,
            TableProperties.METADATA_DELETE_AFTER_COMMIT_ENABLED,
            TableProperties.METADATA_DELETE_AFTER_COMMIT_ENABLED_DEFAULT,
        ):
            kept = {entry.metadata_file for entry in metadata.metadata_log}
            _delete(table, [e.metadata_file for e in table.metadata.metadata_log if e.metadata_file not in kept])
        self._table = Table(table.name(), metadata, location, table.io, table.catalog, table.config)

    # -- history -----------------------------------------------------------------------------------------------

    def maintain(self) -> None:
        """Expire the oldest snapshots beyond :attr:`keep_snapshots` once there are :attr:`expire_batch` of them (at
        most that many at once). A roll's direct commit expires them itself (:meth:`_append`); this is for the
        history other commits leave (the table's creation, a manifest merge, another format version, a longer
        history from elsewhere). A failure is logged, not raised: the next call tries again, and a longer history
        only costs time. The first call of a run also aborts leftover uploads of metadata files
        (:data:`STALE_UPLOAD_SECONDS`)."""
        if not self._uploads_swept:
            self._uploads_swept = True
            self.abort_stale_metadata_uploads()
        try:
            table = self._table if self._table is not None else self._load()
            if table is None:
                return
            old = self._expired(table.metadata, adding=0)
            if len(old) < self.expire_batch:
                return
            current = table.metadata.snapshot_by_name(MAIN_BRANCH)
            requirements = (
                AssertTableUUID(uuid=table.metadata.table_uuid),
                AssertRefSnapshotId(  # type: ignore[call-arg]
                    ref=MAIN_BRANCH, snapshot_id=current.snapshot_id if current else None
                ),
            )
            response = table.catalog.commit_table(table, requirements, (RemoveSnapshotsUpdate(snapshot_ids=old),))  # type: ignore[call-arg]
            self._committed(table, response.metadata, response.metadata_location)
        except Exception as e:
            self._table = None
            log.warning(
                "%s: expiring old snapshots failed (%s: %s); the next commit tries again",
                self.name,
                type(e).__name__,
                e,
            )

    def abort_stale_metadata_uploads(self) -> int:
        """Abort the multipart uploads under the table's ``metadata/`` on S3 initiated more than
        :data:`STALE_UPLOAD_SECONDS` ago; how many. Logged, never raised: a leftover upload costs storage, not
        correctness. Nothing on a local table."""
        if self.output.is_local:
            return 0
        from ..output.location import filesystem, upload_prefix
        from ..output.multipart import abort_upload, list_uploads

        aborted = 0
        try:
            fs, root = filesystem(self.output)
            bucket, prefix = upload_prefix(fs, root)
            before = datetime.now(UTC) - timedelta(seconds=STALE_UPLOAD_SECONDS)
            for key, upload_id in list_uploads(fs, bucket, prefix + "metadata/", initiated_before=before):
                aborted += abort_upload(fs, bucket, key, upload_id)
        except Exception as e:
            log.warning(
                "%s: could not abort leftover multipart uploads under metadata/ (%s: %s); the next run tries again, "
                "and a bucket lifecycle rule AbortIncompleteMultipartUpload removes them too",
                self.name,
                type(e).__name__,
                e,
            )
        if aborted:
            log.info("%s: aborted %d leftover multipart uploads of metadata files", self.name, aborted)
        return aborted

    def status(self) -> dict[str, Any]:
        out = super().status()
        out["table"] = self.identifier
        try:
            table = self._load()
        except Exception as e:
            out["error"] = str(e)
            return out
        if table is None:
            out["snapshot"] = None
            return out
        current = table.current_snapshot()
        out["snapshot"] = current.snapshot_id if current is not None else None
        out["snapshots"] = len(table.metadata.snapshots)
        out["metadata"] = table.metadata_location
        out["vnodes_marked"] = len(self.reach(table))
        return out
