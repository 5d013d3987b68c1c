"""The kill campaigns' checker for a table output (Delta or Iceberg): the table is the truth, read from the table
itself (deltalake, pyiceberg), never from a listing of its directory.

After every kill (:meth:`TableWatch.step`) and at the end (:meth:`TableWatch.final`):

- the table's rows are input rows, none twice (exact multisets; at the end every input row, once);
- the table's files are the ones the sink's commits added, each in exactly one commit, and the table has had no
  other commit (Delta: version 0 creates the table, then one version per commit, but for the creation written again
  by delta-rs when the answer to its first write was lost; Iceberg: one snapshot per commit);
- every file the table holds is an object in its directory, of the size the table records, and stays the object
  it was when the table first held it (same size, and the same inode and mtime, or S3 ETag and LastModified): the
  table's files are the files the sink wrote, never rewritten or replaced;
- every log entry, checkpoint and ``_last_checkpoint`` (Delta), every metadata file of the catalog's current one
  and its log, manifest list and manifest (Iceberg) new since the last check conforms to the format's specification
  (:mod:`conformance`'s checks, with a cursor kept from one check to the next);
- everything else in the directory but the table's metadata (``_delta_log/``; ``metadata/`` and the embedded
  catalog) and the sink's claim and commit mark is a whole, readable Parquet file named like the sink's files.

The directory may hold files the table does not (yet): a roll's files between their write and the table's commit,
or until the next start if the driver dies in between (docs/delta.md and docs/iceberg.md, "What a reader sees, and
when"). The next start's recovery commits them (a file whose objects are whole is added to the table) or drops what
has no object. So after a run that recovered (printed ``started``) is killed, every file the directory held outside
the table before that run started must be in the table; at the end, every file in the directory is in the table.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from checker import Report, compare
from conformance import cursor
from iceberg_conformance import IcebergConformance
from sink_helpers import COLUMNS, _fs

from filesink.output import CLAIM_NAME, MARK_NAME, is_file_name
from filesink.output.naming import file_of

EMBEDDED_CATALOG = "_filesink_iceberg_catalog.db"
"""The embedded SQLite catalog beside a local Iceberg table (``filesink.destination.iceberg.EMBEDDED_CATALOG``:
not imported, so that this module does not need pyiceberg for Delta)."""
METADATA = {"delta": ("_delta_log/",), "iceberg": ("metadata/", EMBEDDED_CATALOG)}
"""Per format, what under a table's location is the table's own (the embedded catalog's SQLite journal too)."""
SUFFIX = ".parquet"


@dataclass(frozen=True)
class TableTarget:
    """A table output of the kill job (``sink_job.py``): its format, and for Iceberg the table and its catalog."""

    format: str
    """``delta`` or ``iceberg``."""
    table: str = "kill.events"
    """Iceberg: the table's identifier (``sink_job.ICEBERG_TABLE`` by default)."""
    catalog: tuple[tuple[str, str], ...] = ()
    """Iceberg: the catalog's properties; none: the embedded catalog beside a local table."""

    def env(self) -> dict[str, str]:
        """The job's variables for this table."""
        env = {"SINK_JOB_TABLE": self.format}
        if self.format == "iceberg":
            env["SINK_JOB_ICEBERG_TABLE"] = self.table
            if self.catalog:
                env["SINK_JOB_CATALOG"] = json.dumps(dict(self.catalog))
        return env

    def describe(self) -> str:
        return self.format if self.format == "delta" else f"iceberg {self.table}"


@dataclass
class TableView:
    """What a table holds now, read from the table."""

    rows: Counter[Any] = field(default_factory=Counter)
    files: dict[str, int] = field(default_factory=dict)
    """The data objects the table holds (a partitioned file has one per partition): key (relative to the table's
    root) -> size the table records."""
    commits: list[list[str]] = field(default_factory=list)
    """The sink's commits, oldest first: the names of each one's files."""
    versions: int = 0
    """Commits the table has had: Delta, its newest version (version 0 creates it); Iceberg, its snapshots."""
    sink_id: str | None = None
    """The sink that committed (from its commits' metadata), once there is a commit."""
    metadata_location: str | None = None
    """Iceberg: the catalog's current metadata file."""
    recreated: int = 0
    """Delta: versions after the first that are the table's creation again, by the same sink (delta-rs's
    ``DeltaTable.create`` did that after a lost answer; the sink now writes version 0 with its own conditional
    create, so the checker requires none)."""


def _rows(table: pa.Table) -> Counter[Any]:
    return Counter(zip(*(table[c].to_pylist() for c in COLUMNS), strict=True))


def read_delta(path: str, options: dict[str, Any] | None) -> TableView:
    import deltalake
    from deltalake.exceptions import TableNotFoundError

    from filesink.destination.delta import storage_options

    try:
        table = deltalake.DeltaTable(path, storage_options=storage_options(options or {}) or None)
    except TableNotFoundError:
        return TableView()
    history = sorted(table.history(), key=lambda h: h["version"])
    ours = [h for h in history if "filesink.files" in h]
    creator = history[0].get("filesink.sink_id") if history else None
    again = [h for h in history[1:] if h.get("operation") == "CREATE TABLE" and h.get("filesink.sink_id") == creator]
    actions = pa.table(table.get_add_actions(flatten=True))
    return TableView(
        rows=_rows(table.to_pyarrow_table(columns=COLUMNS)),
        files=dict(zip(actions["path"].to_pylist(), actions["size_bytes"].to_pylist(), strict=True)),
        commits=[h["filesink.files"].split(",") for h in ours],
        versions=table.version(),
        sink_id=ours[0]["filesink.sink_id"] if ours else None,
        recreated=len(again),
    )


def _uri(path: str) -> str:
    """``file:/x`` (how Hadoop, so Spark's Iceberg writers, name a local file) as ``file:///x`` (pyiceberg's)."""
    if path.startswith("file:/") and not path.startswith("file://"):
        return "file://" + path.removeprefix("file:")
    return path


def read_iceberg(path: str, options: dict[str, Any] | None, target: TableTarget) -> TableView:
    from pyiceberg.catalog import load_catalog
    from pyiceberg.exceptions import NoSuchTableError

    from filesink.destination.iceberg import CATALOG_NAME, file_io_properties

    if target.catalog:
        properties = {**(file_io_properties(options) if options else {}), **dict(target.catalog)}
    else:  # the embedded catalog beside a local table, as a reader opens it (docs/iceberg.md)
        properties = {"type": "sql", "uri": f"sqlite:///{path}/{EMBEDDED_CATALOG}", "warehouse": f"file://{path}"}
    name = properties.pop("name", CATALOG_NAME)
    try:
        table = load_catalog(name, **properties).load_table(target.table)
    except NoSuchTableError:
        return TableView()
    snapshots = sorted(table.metadata.snapshots, key=lambda s: s.sequence_number or 0)
    summaries = [s.summary.additional_properties if s.summary is not None else {} for s in snapshots]
    ours = [s for s in summaries if "filesink.files" in s]
    root = _uri(table.location()).rstrip("/") + "/"
    files = table.inspect.files().to_pylist()
    outside = [f["file_path"] for f in files if not _uri(f["file_path"]).startswith(root)]
    assert not outside, f"the table holds files outside its location {root}: {outside[:5]}"
    return TableView(
        rows=_rows(table.scan().to_arrow()),
        files={_uri(f["file_path"]).removeprefix(root): f["file_size_in_bytes"] for f in files},
        commits=[s["filesink.files"].split(",") for s in ours],
        versions=len(snapshots),
        sink_id=ours[0]["filesink.sink.face-id"] if ours else None,
        metadata_location=table.metadata_location,
    )


def read_table(target: TableTarget, path: str, options: dict[str, Any] | None) -> TableView:
    """What the table of ``target`` at ``path`` (a directory or an s3:// URL) holds now; empty before its first
    commit."""
    if target.format == "delta":
        return read_delta(path, options)
    return read_iceberg(path, options, target)


def _identity(info: dict[str, Any]) -> tuple[Any, ...]:
    """What tells an object from another written in its place: size, and inode and mtime (local) or ETag and
    LastModified (S3)."""
    return tuple(info.get(k) for k in ("size", "ino", "mtime", "ETag", "LastModified"))


def data_objects(target: TableTarget, path: str, options: dict[str, Any] | None) -> dict[str, dict[str, Any]]:
    """Every object under the table's location but its metadata, the sink's claim and commit mark: key -> info."""
    fs, root = _fs(path, options)
    if not fs.exists(root):
        return {}
    prefix = root.rstrip("/") + "/"
    found = {}
    for full, info in fs.find(root, detail=True).items():
        key = full[len(prefix) :] if full.startswith(prefix) else full.rsplit("/", 1)[-1]
        if key in (CLAIM_NAME, MARK_NAME) or key.startswith(METADATA[target.format]):
            continue
        found[key] = info
    return found


def _whole(fs: Any, full: str) -> bool:
    try:
        with fs.open(full, "rb") as f:
            pq.ParquetFile(f).metadata  # noqa: B018  (whole and readable)
    except Exception:
        return False
    return True


class TableWatch:
    """The checks of a campaign into a table, kept from one kill to the next (see the module's docstring)."""

    def __init__(
        self, target: TableTarget, path: str, options: dict[str, Any] | None, expected: Counter[Any], seed: int
    ):
        self.target, self.path, self.options, self.expected, self.seed = target, path, options, expected, seed
        self.held: dict[str, tuple[Any, ...]] = {}
        """Every file the table has held, and its object's identity when the table first held it."""
        self.checked: dict[str, tuple[Any, ...]] = {}
        """Objects found whole and named like the sink's files, by identity (read once)."""
        self.outside: set[str] = set()
        """The files in the directory that the table did not hold, at the last check with nothing running."""
        self.settled = 0
        """Files found outside the table after a kill, then in it after the next run that recovered."""
        self.view = TableView()
        self.conformance = cursor(target.format, path, options=options)
        """The specification checks of the table's log (Delta) or metadata (Iceberg), from one check to the next."""

    def _fail(self, what: str, problem: str) -> str:
        return f"seed {self.seed}: {what}: {problem} ({self.target.describe()} at {self.path})"

    def _look(self, what: str) -> tuple[TableView, dict[str, dict[str, Any]], list[str]]:
        """Read the table, then list its directory; check the table's commits and files against the objects.
        Returns the view, the objects and the stray ones (not whole Parquet files named like the sink's)."""
        view = read_table(self.target, self.path, self.options)
        objects = data_objects(self.target, self.path, self.options)
        try:  # every entry or metadata file new since the last check conforms to the format's specification
            if isinstance(self.conformance, IcebergConformance):
                if view.metadata_location is not None:
                    self.conformance.check(view.metadata_location)
            else:
                self.conformance.check()
        except AssertionError as e:
            raise AssertionError(self._fail(what, str(e))) from None
        names = [n for commit in view.commits for n in commit]
        twice = sorted(n for n, k in Counter(names).items() if k > 1)
        assert not twice, self._fail(what, f"files in more than one commit: {twice[:5]}")
        assert all(view.commits), self._fail(what, "a commit of the sink without files")
        held = {file_of(key.rsplit("/", 1)[-1]) for key in view.files}  # a partitioned file: an object per partition
        assert set(names) == held, self._fail(
            what,
            f"the table's files are not those its sink's commits added: {sorted(set(names) ^ held, key=str)[:5]}",
        )
        kind = "versions after its creation" if self.target.format == "delta" else "snapshots"
        assert not view.recreated, self._fail(
            what, f"the table's creation is in {1 + view.recreated} versions (the sink writes version 0 once)"
        )
        assert view.versions == len(view.commits), self._fail(
            what, f"the table has {view.versions} {kind}, {len(view.commits)} of them the sink's commits"
        )
        gone = sorted(set(self.held) - set(view.files))
        assert not gone, self._fail(what, f"files the table held are no longer in it: {gone[:5]}")
        for key, size in view.files.items():
            info = objects.get(key)
            assert info is not None, self._fail(what, f"the table holds {key}, which is not in its directory")
            assert info["size"] == size, self._fail(what, f"{key} is {info['size']} bytes, the table says {size}")
            first = self.held.setdefault(key, _identity(info))
            assert _identity(info) == first, self._fail(
                what, f"{key}, held by the table, was written again since ({first} then, {_identity(info)} now)"
            )
        fs, root = _fs(self.path, self.options)
        stray = []
        for key, info in sorted(objects.items()):
            if self.checked.get(key) == _identity(info):
                continue
            base = key.rsplit("/", 1)[-1]
            named = is_file_name(view.sink_id, base) if view.sink_id else base.startswith("part-")
            if named and base.endswith(SUFFIX) and _whole(fs, f"{root.rstrip('/')}/{key}"):
                self.checked[key] = _identity(info)
            else:
                stray.append(key)
        return view, objects, stray

    def outside_now(self) -> set[str]:
        """The objects in the table's directory (but its metadata) that the table does not hold now."""
        held = read_table(self.target, self.path, self.options).files
        return set(data_objects(self.target, self.path, self.options)) - set(held)

    def step(self, what: str, *, quiet: bool, recovered: bool) -> None:
        """The checks after a kill: ``quiet`` when no run is left running; ``recovered`` when a run that recovered
        (printed ``started``) ran since the last quiet check."""
        view, objects, stray = self._look(what)
        lost, duplicated, unexpected = compare(self.expected, view.rows)
        assert (duplicated, unexpected) == (0, 0), self._fail(
            what, f"the table has {duplicated} rows duplicated, {unexpected} unexpected ({lost} not there yet)"
        )
        assert not stray, self._fail(what, f"stray objects in the table's directory: {stray[:5]}")
        if quiet:
            left = sorted(self.outside - set(view.files))
            if recovered:
                assert not left, self._fail(
                    what,
                    f"files outside the table before a run that recovered are still outside it: {left[:5]} "
                    "(recovery commits a file whose objects are whole)",
                )
                self.settled += len(self.outside)
            self.outside = set(objects) - set(view.files)
        self.view = view

    def final(self) -> Report:
        """The end of the campaign (the last run done): every input row once in the table, every file in the
        directory in the table."""
        view, objects, stray = self._look("at the end")
        lost, duplicated, unexpected = compare(self.expected, view.rows)
        self.view = view
        outside = sorted(set(objects) - set(view.files))
        self.settled += len(self.outside - set(outside))  # the last run recovered them (or they are reported)
        return Report(sum(self.expected.values()), lost, duplicated, unexpected, stray, self.target.format, outside)
