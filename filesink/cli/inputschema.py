"""The schema ``filesink run`` reads a landing directory of Parquet files with: the files' footers merged by the
sink's own rules (:func:`filesink.schema.evolution.evolve`), before Spark starts.

The files are taken in the order they landed: by modification time, then path (the order Spark's file source
reads them in). Each file's schema is compared with the union of the files before it as the sink compares a
batch's schema with its own: new columns and struct fields, and wider types, are taken; a narrower type, another
type change, or a column the files before it have and it lacks (unless the sink fills missing columns) refuse the
file, naming it (:func:`merge_footers`). The union is then compared with the schema the sink recorded, the way its
next batch will be (:func:`check_against_sink`): a change the sink would refuse stops the run there, naming the
newest file that has the column.

The union's columns are the sink's, in its recorded order, then the new ones in the order they appeared (the first
file's order, then each file's new columns). Spark reads every file with it: a file without a column or struct
field reads nulls there, a narrower integer or float is widened. Each column's Spark type is Spark's own reading of
the newest file that has it (:func:`spark_schema`): pyarrow and Spark name some Parquet types differently (INT96
timestamps, unsigned integers), so the comparison here maps them as Spark reads them (:func:`as_spark_reads`), and
the sink compares the Spark schema itself again before the query starts.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from ..errors import InputError, SchemaMismatchError
from ..schema.conform import file_schema
from ..schema.evolution import evolve
from ..sink.schema_versions import TAKEN

if TYPE_CHECKING:
    from ..sink.face import ExactlyOnceParquetSink


@dataclass(frozen=True)
class Footer:
    """One input file's schema, as Spark reads it and the sink's files would hold it (every field nullable)."""

    path: Path
    schema: pa.Schema
    landed: float
    """Its modification time."""


@dataclass(frozen=True)
class MergedInput:
    """The schema to read a directory's Parquet files with (:func:`merge_footers`)."""

    schema: pa.Schema
    sources: tuple[tuple[str, Path], ...]
    """Each column, in ``schema``'s order, and the newest file that has it (whose type the union has)."""
    files: int


def read_footer(path: Path) -> Footer:
    """The schema of the Parquet file ``path``, or :class:`InputError` naming it."""
    import pyarrow.parquet as pq

    try:
        with pq.ParquetFile(path) as parquet:
            schema, int96 = parquet.schema_arrow, _int96_paths(parquet.schema)
        landed = os.stat(path).st_mtime
    except Exception as e:
        raise InputError(
            f"the input file {path} is not a readable Parquet file ({e}). Move it out of the input directory "
            "(or fix it) and run again; nothing has been read or written yet."
        ) from e
    fields = [f.with_type(as_spark_reads(f.type, f.name, int96)) for f in schema]
    return Footer(path, file_schema(pa.schema(fields)), landed)


def _int96_paths(schema: Any) -> set[str]:
    """The dotted paths of a Parquet schema's INT96 columns (Spark reads them as timestamps with a zone)."""
    return {schema.column(i).path for i in range(len(schema)) if schema.column(i).physical_type == "INT96"}


_UNSIGNED = {
    pa.uint8(): pa.int16(),
    pa.uint16(): pa.int32(),
    pa.uint32(): pa.int64(),
    pa.uint64(): pa.decimal128(20, 0),
}


def as_spark_reads(t: pa.DataType, path: str = "", int96: set[str] | frozenset[str] = frozenset()) -> pa.DataType:
    """The Arrow type of a Parquet footer's column (at the dotted ``path``) as Spark reads it and sends it to the
    sink: timestamps in microseconds (INT96 ones, listed in ``int96``, with a zone), unsigned integers in the next
    wider signed type (``uint64`` as ``decimal(20,0)``), dictionaries as their values, fixed-size binary as binary."""
    if pa.types.is_timestamp(t):
        return pa.timestamp("us", "UTC" if path in int96 else t.tz)
    if t in _UNSIGNED:
        return _UNSIGNED[t]
    if pa.types.is_dictionary(t):
        return as_spark_reads(t.value_type, path, int96)
    if pa.types.is_fixed_size_binary(t):
        return pa.binary()
    if pa.types.is_date64(t):
        return pa.date32()
    if pa.types.is_decimal256(t) and t.precision <= 38:
        return pa.decimal128(t.precision, t.scale)
    if pa.types.is_struct(t):
        return pa.struct([f.with_type(as_spark_reads(f.type, f"{path}.{f.name}", int96)) for f in t])
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return pa.list_(t.value_field.with_type(as_spark_reads(t.value_type, "", int96)))
    if pa.types.is_map(t):
        return pa.map_(
            t.key_field.with_type(as_spark_reads(t.key_type, "", int96)),
            t.item_field.with_type(as_spark_reads(t.item_type, "", int96)),
        )
    return t


def merge_footers(
    footers: Sequence[Footer], directory: Path, *, fill_missing: bool = False, keep: tuple[str, ...] = ()
) -> MergedInput | None:
    """The union of the files' schemas in the order they landed, or :class:`InputError` naming the first file
    whose schema the sink would not take after the files before it; None without files. ``fill_missing``: a file
    may lack columns of the files before it (read as nulls), but those named in ``keep`` (key and partition
    columns, which the sink never fills)."""
    ordered = sorted(footers, key=lambda f: (f.landed, str(f.path)))
    if not ordered:
        return None
    union = ordered[0].schema
    sources = {name: ordered[0].path for name in union.names}
    for footer in ordered[1:]:
        schema = footer.schema
        if fill_missing:
            schema = pa.schema([*schema, *(f for f in union if f.name not in schema.names and f.name not in keep)])
        evolution = evolve(union, schema)
        if evolution.problems:
            before = ordered[: ordered.index(footer)]
            others = f" and {len(before) - 1} more" if len(before) > 1 else ""
            raise InputError(
                f"schema mismatch in the input: the file {footer.path} changes the schema of the files that landed "
                f"before it ({before[0].path.name}{others}) in a way the sink does not take: "
                f"{'; '.join(evolution.problems)}. Nothing has been read or written yet. {TAKEN} Files are taken in "
                f"the order they landed (by modification time): move {footer.path.name} out of {directory} (to the "
                "input directory of another sink), or replace it with a file the sink takes"
                + ("" if fill_missing else " (a file without some columns is taken with --fill-missing-columns)")
                + "."
            )
        sources.update((name, footer.path) for name in footer.schema.names)
        union = _in_order(evolution.schema, union.names)
    return MergedInput(union, tuple((name, sources[name]) for name in union.names), len(ordered))


def _in_order(schema: pa.Schema, first: Iterable[str]) -> pa.Schema:
    """``schema`` with the columns named in ``first`` first, in that order, then the others in their order."""
    names = [n for n in first if n in schema.names]
    names += [n for n in schema.names if n not in names]
    return pa.schema([schema.field(n) for n in names], metadata=schema.metadata)


def check_against_sink(merged: MergedInput, sink: ExactlyOnceParquetSink, directory: Path) -> MergedInput:
    """``merged`` with the sink's columns first, in its recorded order; :class:`SchemaMismatchError` if the sink
    would refuse batches of it, in the sink's words, each problem with the newest file that has its column."""
    proposed = sink.propose_schema(merged.schema)
    recorded = [name for name, _ in sink.recorded_spark_schema() or []]
    if proposed is not None and proposed.evolution.problems:
        fixed = (*(sink.key_columns or ()), *sink.partition_by)
        sources = dict(merged.sources)
        said = []
        for problem in proposed.evolution.problems:
            columns = [
                name
                for name in merged.schema.names
                if name in proposed.recorded.names
                and problem
                in evolve(
                    pa.schema([proposed.recorded.field(name)]), pa.schema([merged.schema.field(name)]), fixed=fixed
                ).problems
            ]
            where = f" (in {sources[columns[0]]}, the newest file with {columns[0]})" if columns else ""
            said.append(problem + where)
        raise SchemaMismatchError(
            f"the files in {directory} change the sink's schema (version {proposed.version}) in a way the sink does "
            f"not take: {'; '.join(said)}. Nothing has been read or written yet. {TAKEN} Move the files named out "
            f"of {directory} (to the input directory of another sink), or replace them with files the sink takes."
        )
    schema = _in_order(merged.schema, recorded)
    order = {name: i for i, name in enumerate(schema.names)}
    return replace(merged, schema=schema, sources=tuple(sorted(merged.sources, key=lambda s: order[s[0]])))


def spark_schema(merged: MergedInput, read: Any) -> Any:
    """The Spark schema of ``merged``: each column as Spark reads it from the newest file that has it (one footer
    read per such file); ``read(path)`` is Spark's batch reader of the input's format."""
    from pyspark.sql import types as T

    read_here: dict[Path, Any] = {}
    fields = []
    for name, path in merged.sources:
        if path not in read_here:
            read_here[path] = read(str(path)).schema
        fields.append(read_here[path][name])
    return T.StructType(fields)


def in_sink_order(df: Any, recorded: list[str] | None) -> Any:
    """``df`` with the sink's recorded columns first, in their order, then its others in theirs (a ``--schema`` in
    another order, or CSV read by position): the sink would otherwise record the new order as a new version."""
    if not recorded:
        return df
    names = [n for n in recorded if n in df.columns]
    names += [n for n in df.columns if n not in names]
    if names == list(df.columns):
        return df
    from pyspark.sql import functions as F

    return df.select(*(F.col("`" + n.replace("`", "``") + "`") for n in names))
