"""Which columns of a Parquet file get a dictionary: decided from the file's first rows, before writing them.

pyarrow's writer starts every column chunk with a dictionary and, once the dictionary outgrows its page limit
(``DICTIONARY_PAGE_LIMIT``), falls back to plain encoding for the rest of the chunk: a column of mostly
distinct values (ids, timestamps, session keys, free text) pays for hashing every value into a dictionary that
is then dropped. :func:`dictionary_columns` estimates, from a probe of the first rows written, how large each
column's dictionary would grow over a row group, and writes plain from the start the columns whose dictionary
would not fit; every other column keeps the dictionary.

The probe is spread over those rows, not taken from their start. A file's rows are in log store order (vnode,
then epoch), and the vnode is a hash of the key: the first 20,000 rows hold a handful of vnodes' keys, each key
several times, so a key column of a million distinct values looked like one of a few thousand there, kept its
dictionary and dropped it part way through every row group (on the benchmarks' rows, 5 % larger files and up to
a fifth more encoding time).

The estimate counts the probe's distinct values and how many were seen once and twice (Chao1, which tends to
underestimate: when unsure, a column keeps its dictionary, as it would without this module). The choice
depends only on the rows, so a re-written file gets the same bytes.
"""

from __future__ import annotations

import math

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ..arrowvalues import int64_scalar

DICTIONARY_PAGE_LIMIT = 1024 * 1024
"""pyarrow's ``dictionary_pagesize_limit`` default: a dictionary larger than this falls back to plain."""

PROBE_ROWS = 20_000
"""Rows of the first rows written that decide each column's encoding."""

PROBE_RUN = 100
"""The probe is ``PROBE_ROWS // PROBE_RUN`` runs of this many consecutive rows, evenly spaced: runs, not single
rows, because a slice costs nothing and a take of single rows copies from every block of the file's rows."""

_LENGTH_PREFIX = 4
"""Bytes before each binary value in a plain-encoded dictionary page."""

_ONE, _TWO = int64_scalar(1), int64_scalar(2)
"""Not ``pc.equal(counts, 1)``: a Python number makes pyarrow import pandas in the file writers
(:mod:`filesink.arrowvalues`)."""


def dictionary_columns(table: pa.Table, row_group_rows: int) -> bool | list[str]:
    """``use_dictionary`` for a file whose first rows are ``table``: True (every column), or the Parquet
    column paths that keep a dictionary."""
    rows_per_group = min(table.num_rows, row_group_rows)
    probe = spread_probe(table)
    plain = {
        field.name
        for field, column in zip(table.schema, probe.columns, strict=True)
        if _plain_is_better(field.type, column, rows_per_group)
    }
    if not plain:
        return True
    return [path for path in leaf_paths(table.schema) if path not in plain]  # a plain column is a leaf


def spread_probe(table: pa.Table) -> pa.Table:
    """``PROBE_ROWS`` rows of ``table`` in evenly spaced runs of ``PROBE_RUN`` (the whole table when it is no
    larger): which rows depends only on the number of rows, so the same rows give the same choice."""
    if table.num_rows <= PROBE_ROWS:
        return table
    runs = PROBE_ROWS // PROBE_RUN
    step = table.num_rows // runs
    return pa.concat_tables([table.slice(i * step, PROBE_RUN) for i in range(runs)])


def _plain_is_better(kind: pa.DataType, column: pa.ChunkedArray, rows_per_group: int) -> bool:
    if not (pa.types.is_primitive(kind) or _is_binary(kind)) or pa.types.is_boolean(kind):
        return False  # nested and dictionary columns keep pyarrow's default
    values = column.drop_null()
    if len(values) == 0:
        return False
    try:
        counted = pc.value_counts(values)
        counts = counted.field("counts")
        distinct = len(counts)
        once = pc.sum(pc.equal(counts, _ONE)).as_py() or 0
        twice = pc.sum(pc.equal(counts, _TWO)).as_py() or 0
        if _is_binary(kind):
            value_bytes = pc.sum(pc.binary_length(counted.field("values"))).as_py() / distinct + _LENGTH_PREFIX
        else:
            value_bytes = kind.bit_width / 8
    except (pa.ArrowNotImplementedError, ValueError):  # a type the kernels do not count: pyarrow's default
        return False
    estimated = distinct + (once * once / (2 * twice) if twice else once * (once - 1) / 2)
    in_group = estimated * -math.expm1(-rows_per_group / estimated)  # distinct values expected in a row group
    return bool(in_group * value_bytes > DICTIONARY_PAGE_LIMIT)


def _is_binary(kind: pa.DataType) -> bool:
    return bool(
        pa.types.is_string(kind)
        or pa.types.is_large_string(kind)
        or pa.types.is_binary(kind)
        or pa.types.is_large_binary(kind)
    )


def leaf_paths(schema: pa.Schema) -> list[str]:
    """The Parquet column paths (``s.x``, ``l.list.element``) of ``schema``'s leaves, as pyarrow names them."""
    sink = pa.BufferOutputStream()
    with pq.ParquetWriter(sink, schema):
        pass
    parquet_schema = pq.ParquetFile(pa.BufferReader(sink.getvalue())).schema
    return [parquet_schema.column(i).path for i in range(len(parquet_schema))]
