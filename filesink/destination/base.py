"""The destination interface (:class:`Destination`), its options, and the per-vnode marks the table formats commit.

A table destination commits, with every roll's files, a **mark** per vnode the files hold rows of: the file's end
epoch. A vnode's files hold disjoint, rising epoch ranges (a file starts right after its vnode's truncate point),
so the newest mark of a vnode is the epoch its committed files reach, and a pending file is in the table exactly
when every vnode it holds has a mark at or past its end epoch. A mark at or past a file's first epoch but before
its end means another file of those epochs was committed: a divergence that no run of this sink causes, refused.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any, ClassVar

from logstore.diagnosis import told

from ..errors import TableCommitFailedError, TableCommitUnknownError, TableFormatError

if TYPE_CHECKING:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from ..committer.ledger import PlannedFile
    from ..output import OutputLocation
    from ..schema.evolution import Change
    from ..tasks.writer import WrittenObject


class TableFormat(StrEnum):
    DIRECTORY = "directory"
    """Plain Parquet files under the output directory, visible once published (the default)."""
    DELTA = "delta"
    """A Delta Lake table at the output path, committed with deltalake (delta-rs)."""
    ICEBERG = "iceberg"
    """An Apache Iceberg table in a catalog, its data at the output path, committed with pyiceberg."""


@dataclass(frozen=True)
class TableOptions:
    """How the output is a table. Picklable; the catalog's properties are (key, value) pairs."""

    format: TableFormat = TableFormat.DIRECTORY
    catalog: tuple[tuple[str, str], ...] = ()
    """Iceberg only: pyiceberg's catalog properties (``type``, ``uri``, ``warehouse``, ...)."""
    table: str | None = None
    """Iceberg only: the table's identifier in the catalog, ``<namespace>.<name>``."""

    @property
    def is_table(self) -> bool:
        return self.format is not TableFormat.DIRECTORY

    def catalog_properties(self) -> dict[str, str]:
        return dict(self.catalog)


def marks_of(f: PlannedFile) -> dict[int, int]:
    """The marks a table commit of ``f`` records: its end epoch for every vnode it holds rows of."""
    return {v: f.end_epoch for v in f.starts}


def s3_settings(options: Mapping[str, Any], environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The S3 settings in the sink's s3fs storage options, by role (``endpoint``, ``region``, ``key``, ``secret``,
    ``token``, ``addressing``; those not given are left out, and a table's library finds them in the standard AWS
    variables): what each table format's library is given under its own names, so that it reaches the server the
    sink's own S3 client reaches, with the same keys.

    - The endpoint and region the options do not give are the ones the sink's S3 client (botocore) takes from
      ``environ``: ``AWS_ENDPOINT_URL_S3`` or ``AWS_ENDPOINT_URL``, ``AWS_REGION`` or ``AWS_DEFAULT_REGION``.
      pyarrow's S3 client (pyiceberg's default file IO) reads no endpoint variable: without them it would send the
      table's requests to AWS S3. An endpoint without a region gets ``us-east-1``.
    - ``addressing`` is ``config_kwargs.s3.addressing_style`` when the options set it (``path`` or ``virtual``).
    """
    env = os.environ if environ is None else environ
    client = dict(options.get("client_kwargs") or {})
    configured = str(env.get("AWS_IGNORE_CONFIGURED_ENDPOINT_URLS", "")).lower() != "true"
    found = {
        "endpoint": options.get("endpoint_url")
        or client.get("endpoint_url")
        or (configured and (env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL"))),
        "region": client.get("region_name")
        or options.get("region_name")
        or env.get("AWS_REGION")
        or env.get("AWS_DEFAULT_REGION"),
        "key": options.get("key"),
        "secret": options.get("secret"),
        "token": options.get("token"),
    }
    out = {k: str(v) for k, v in found.items() if v}
    if "endpoint" in out and "region" not in out:
        out["region"] = "us-east-1"
    addressing = ((options.get("config_kwargs") or {}).get("s3") or {}).get("addressing_style")
    if addressing in ("path", "virtual"):
        out["addressing"] = str(addressing)
    return out


def held_files(files: Sequence[PlannedFile], reach: Mapping[int, int], table: str) -> set[str]:
    """The names of ``files`` the table holds, from ``reach`` (per vnode, the newest mark the table holds).

    Raises :class:`TableFormatError` for a file only partly held, or overlapped by a mark of another file."""
    held: set[str] = set()
    for f in files:
        if not f.starts:
            continue  # no rows: nothing to hold (committed again at worst, an empty file)
        at = {v: reach.get(v, -1) for v in f.starts}
        if all(e >= f.end_epoch for e in at.values()):
            held.add(f.name)
            continue
        overlapped = sorted(v for v, e in at.items() if e >= f.starts[v])
        if overlapped:
            v = overlapped[0]
            raise TableFormatError(
                f"the table {table} holds rows of vnode {v} through epoch {at[v]}, but the pending file {f.name} "
                f"holds epochs {f.starts[v]} to {f.end_epoch} of it, which the table does not hold whole: the table "
                "and the sink's state disagree (another writer committed to the table under this sink's marks, or "
                "the table was restored from an older copy than the state). Nothing was written or deleted. Restore "
                "the table and the state directory from the same point in time, or start a new sink on a new table."
            )
    return held


class Destination(ABC):
    """Where a roll's files become visible (see the package's docstring for the three formats).

    The file-writing tasks write every file under the output location the same way for every format
    (:func:`filesink.tasks.writer.write_file`); for the directory that write is also what makes it visible."""

    format: ClassVar[TableFormat]
    transaction: ClassVar[str]
    """Where the destination's transaction happens (shown by ``filesink recover status``)."""

    def __init__(self, options: TableOptions, *, output: OutputLocation, sink_id: str, partition_by: Sequence[str]):
        self.options = options
        self.output = output
        self.sink_id = sink_id
        self.partition_by = tuple(partition_by)

    @property
    def name(self) -> str:
        """The table (or directory) as users name it, for messages."""
        return self.output.url

    def check_schema(self, schema: pa.Schema) -> str | None:
        """Why the format cannot hold columns of ``schema`` (naming the column and its type), or None. Asked before a
        batch is sealed, so such rows are refused while Spark still holds them."""
        return None

    def evolution_problems(self, changes: Sequence[Change]) -> list[str]:
        """Which of a new schema's changes (:mod:`filesink.schema.evolution`) the format cannot take, each naming the
        column and what to do. Asked before the batch that makes them is written."""
        return []

    def check(self, schema: pa.Schema | None) -> None:
        """At start, before anything is written: the table, if it exists, is one this sink can commit to.
        Raises :class:`TableFormatError`."""
        return None

    @abstractmethod
    def held(self, files: Sequence[PlannedFile]) -> set[str] | None:
        """The names of ``files`` the destination holds (committed), read from the destination alone; None when
        visibility is decided by listing each file's objects (the directory)."""

    @abstractmethod
    def make_visible(
        self, files: Sequence[PlannedFile], written: Mapping[str, Sequence[WrittenObject]], schema: pa.Schema
    ) -> None:
        """Make ``files`` visible together (every object in ``written``, keyed by file name), unless the destination
        holds them already. Raises :class:`TableCommitFailedError` (not committed) or
        :class:`TableCommitUnknownError` (could not tell); either way the files stay pending."""

    def footer(self, key: str, footer: pq.FileMetaData | None) -> pq.FileMetaData:
        """The Parquet footer of the object ``key``: ``footer`` as its writer returned it, or read from the output
        (recovery commits objects an earlier run wrote)."""
        import pyarrow.parquet as pq

        from ..output.location import filesystem

        if footer is not None:
            return footer
        if self.output.is_local:
            return pq.read_metadata(self.output.local_root() / key)
        fs, root = filesystem(self.output)
        with fs.open(f"{root}/{key}", "rb") as f:
            return pq.read_metadata(f)

    def check_written(self, written: Mapping[str, Sequence[WrittenObject]]) -> None:
        """Before a roll's commit: every object in ``written`` is still in the output at the size written. Another
        writer's clean-up of the files a table does not hold (Delta's ``VACUUM`` with a retention shorter than the
        time from a roll's write to its commit, Iceberg's ``remove_orphan_files`` with a recent ``older_than``)
        deletes a roll's files before its commit: committed, the table would name files that are gone, and the log
        store would be truncated past their rows. Raises :class:`TableCommitFailedError` naming them instead: the
        files stay pending, and the next start writes them again from the log store. One ``stat`` (local) or
        ``HEAD`` (S3) per object."""
        from ..output.visibility import missing_objects

        objects = [o for objs in written.values() for o in objs]
        gone = missing_objects(self.output, {o.key: o.size for o in objects})
        if gone:
            raise TableCommitFailedError(
                f"{len(gone)} of the {len(objects)} objects written for this roll are no longer in {self.output.url} "
                f"at the size written ({', '.join(gone[:5])}): something deleted them before the "
                f"{self.name}'s commit, such as Delta's VACUUM with a retention shorter than the time from a roll's "
                "write to its commit, or Iceberg's remove_orphan_files with a recent older_than. Nothing was "
                "committed; the files stay pending and the next start writes them again from the log store. Keep "
                "such clean-ups' retention at hours or days (Delta's default is 7 days)."
            )

    def after_failure(self, pending: Sequence[PlannedFile], error: Exception, *, leave_alone: str) -> None:
        """After a commit raised ``error``, read the table again: it landed after all (return), it did not
        (:class:`TableCommitFailedError`), or no one can tell (:class:`TableCommitUnknownError`). ``leave_alone``
        names what another writer of the table must not touch (the format's marks)."""
        names = [f.name for f in pending]
        try:
            now = self.held(pending) or set()
        except Exception as e:
            raise TableCommitUnknownError(
                f"the commit of {len(names)} files ({', '.join(names)}) to the {self.name} failed ({error}), and the "
                f"table could not be read again to tell whether it landed ({e}). The files stay pending: the next "
                "start, or filesink recover apply, decides from the table alone and commits them once."
            ) from error
        if now == set(names):
            return
        raise TableCommitFailedError(
            f"the commit of {len(names)} files ({', '.join(names)}) to the {self.name} did not land: "
            f"{type(error).__name__}: {told(error)}. The files stay pending: the next start, or filesink recover "
            f"apply, commits them once. If another writer commits to this table, make sure it leaves {leave_alone} "
            "alone."
        ) from error

    def maintain(self) -> None:
        """Keep the table's history bounded (checkpoints, log clean-up, snapshot expiry); after a commit. What it
        starts in the background (a Delta checkpoint) is waited for by :meth:`settle`."""
        return None

    def settle(self, timeout: float | None = None) -> bool:
        """Wait for the maintenance running in the background to end (at most ``timeout`` seconds); whether it
        did. The destination stays usable. The sink calls it when it closes."""
        return True

    def status(self) -> dict[str, Any]:
        """What ``filesink recover status`` shows of the destination."""
        return {"format": self.format.value, "where": self.name, "transaction": self.transaction}
