"""Where a roll's files become visible to readers: the one interface between the sink core and its output.

The sink core (seal, plan, pre-commit, recovery) writes a planned file so that no reader sees it, then makes a
roll's files visible, and at recovery asks whether a pre-committed file is visible. Only "visible" differs:

- ``directory`` (:mod:`.directory`): the transaction happens in each file-writing task, where an object is visible
  once it is published (renamed into place, or its multipart upload completed); a file is visible when its objects
  are listed in the output.
- ``delta`` (:mod:`.delta`): in the driver, after every file of the roll is written, one Delta log entry adds
  them all; a file is visible when the table's application transactions say, per vnode, that its committed files
  reach its end epoch.
- ``iceberg`` (:mod:`.iceberg`): in the driver, after every file of the roll is written, one snapshot appends them
  all; a file is visible when the newest snapshot of this sink says so, per vnode, the same way.

In the table formats a file written under the table's location is not in the table until the roll's commit
holds it. Nothing outside a destination's module imports its format's library (an extra:
``pip install 'exactly-once-parquet-sink[delta]'`` or ``[iceberg]``).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from typing import Any

from ..errors import TableFormatError
from .base import Destination, TableFormat, TableOptions, marks_of
from .catalogs import catalog_refusal
from .directory import DirectoryDestination

__all__ = [
    "Destination",
    "DirectoryDestination",
    "TableFormat",
    "TableOptions",
    "marks_of",
    "open_destination",
    "table_options",
]


def table_options(
    table_format: str | TableFormat = TableFormat.DIRECTORY,
    catalog: Mapping[str, Any] | None = None,
    table: str | None = None,
    path: str | None = None,
) -> TableOptions:
    """The sink's table options, checked: :class:`TableFormatError` names what is wrong and what to do. With the
    output's ``path``, an Iceberg catalog that cannot keep the table is refused too (:func:`.catalogs.catalog_refusal`:
    before the sink's start touches its state directory)."""
    try:
        kind = TableFormat(str(table_format).lower())
    except ValueError:
        choices = ", ".join(repr(f.value) for f in TableFormat)
        raise TableFormatError(f"table_format {table_format!r} is not one of {choices}") from None
    if kind is not TableFormat.ICEBERG and (catalog or table):
        raise TableFormatError(
            f"catalog and table are options of table_format='iceberg', not of {kind.value!r}: "
            + (
                "a Delta table is named by its path alone"
                if kind is TableFormat.DELTA
                else "give table_format='iceberg', or leave them out"
            )
        )
    if kind is TableFormat.ICEBERG and not table:
        raise TableFormatError(
            "table_format='iceberg' needs table='<namespace>.<name>' (e.g. table='db.events'), the table's "
            "identifier in the catalog"
        )
    if kind is TableFormat.ICEBERG and path is not None:
        refusal = catalog_refusal(str(table), path, catalog)
        if refusal is not None:
            raise TableFormatError(refusal)
    library = {TableFormat.DELTA: ("deltalake", "delta"), TableFormat.ICEBERG: ("pyiceberg", "iceberg")}.get(kind)
    if library is not None and importlib.util.find_spec(library[0]) is None:
        raise TableFormatError(
            f"table_format={kind.value!r} needs the {library[0]} package, which is not installed here: "
            f"pip install 'exactly-once-parquet-sink[{library[1]}]'. Nothing was created."
        )
    return TableOptions(kind, tuple(sorted((str(k), str(v)) for k, v in (catalog or {}).items())), table)


def open_destination(options: TableOptions, **kwargs: Any) -> Destination:
    """The destination of ``options`` (its format's library imported only here, on first use)."""
    if options.format is TableFormat.DIRECTORY:
        return DirectoryDestination(options, **kwargs)
    if options.format is TableFormat.DELTA:
        try:
            from .delta import DeltaDestination
        except ImportError as e:
            raise TableFormatError(
                f"table_format='delta' needs the deltalake package ({e}): "
                "pip install 'exactly-once-parquet-sink[delta]'"
            ) from e
        return DeltaDestination(options, **kwargs)
    try:
        from .iceberg import IcebergDestination
    except ImportError as e:
        raise TableFormatError(
            f"table_format='iceberg' needs the pyiceberg package ({e}): "
            "pip install 'exactly-once-parquet-sink[iceberg]'"
        ) from e
    destination: Destination = IcebergDestination(options, **kwargs)
    return destination
