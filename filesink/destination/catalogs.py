"""What an Iceberg table's catalog properties must give, checked from the options alone (nothing is opened, and
pyiceberg is not imported): before a sink's start takes its state directory, a catalog that cannot keep the table
is refused (:func:`catalog_refusal`), so that a refused start leaves nothing behind.

- an output on object storage needs a catalog: the embedded SQLite catalog lives beside a local table only;
- an in-memory catalog forgets the table, and the sink's marks with it, when the process ends.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from logstore.storage import is_local


def table_location(url: str) -> str:
    """The table's location for the output ``url``: ``file:///<absolute path>`` or ``s3://bucket/prefix``."""
    if "://" not in url or url.startswith("file://"):
        from pathlib import Path

        return "file://" + str(Path(url.removeprefix("file://")).expanduser().absolute()).rstrip("/")
    return url.replace("s3a://", "s3://", 1).rstrip("/")


def needs_catalog(url: str, catalog: Mapping[str, Any] | None) -> bool:
    """Whether a table at ``url`` lacks the catalog it needs: on object storage, with no catalog properties but a
    ``name`` (which names the catalog, and gives none)."""
    return not is_local(url) and not any(key != "name" for key in catalog or {})


def catalog_refusal(identifier: str, url: str, catalog: Mapping[str, Any] | None) -> str | None:
    """Why the catalog properties ``catalog`` cannot keep the Iceberg table ``identifier`` at ``url`` (in the
    Python API's terms), or None."""
    name = f"Iceberg table {identifier} at {table_location(url)}"
    if needs_catalog(url, catalog):
        return (
            f"the {name}: an Iceberg table on object storage needs a catalog (the embedded SQLite catalog lives "
            "beside a local table only). Nothing was written. Give catalog={'uri': 'postgresql+psycopg2://...'} (a "
            "SQL catalog), or a REST or Glue catalog's properties."
        )
    given = dict(catalog or {})
    kind = str(given.get("type") or "").lower()
    if kind in ("in-memory", "memory") or str(given.get("uri") or "").startswith("sqlite:///:memory:"):
        return (
            f"the {name}: an in-memory catalog forgets the table when the process ends (and with it the sink's "
            "marks). Nothing was written. Give a catalog that keeps its tables (SQL, REST, Glue, ...)."
        )
    return None


def cli_catalog_refusal(output: str) -> str:
    """What ``filesink run`` says, in its options' terms, of ``--table-format iceberg`` with an ``--output`` on
    object storage and no ``--catalog``."""
    return (
        f"--table-format iceberg with --output {output} (object storage) needs a catalog that outlives this machine: "
        "the embedded SQLite catalog lives beside a local --output only. Give the catalog's properties with "
        "--catalog KEY=VALUE (repeatable), e.g. --catalog uri=postgresql+psycopg2://user@host/db --catalog "
        "warehouse=s3://bucket/warehouse (a SQL catalog; a SQLite file on a durable disk works too: --catalog "
        "uri=sqlite:////srv/iceberg/catalog.db), or a REST catalog's: --catalog type=rest --catalog "
        "uri=https://catalog.example.com. Nothing was written"
    )
