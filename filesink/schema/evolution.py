"""Schema evolution: which changes of a batch's schema the sink takes without a new sink, and the files' schema after.

A sink's files have one Arrow schema at a time (:mod:`filesink.schema.conform`). When a batch's schema differs from it,
:func:`evolve` compares the two, field by field and at every depth (by name), and either returns the next files'
schema with the changes it makes, or the problems that refuse the batch before anything of it is written:

- **taken:** a new column, or a new field inside a struct (also inside lists and map values), at any depth: rows
  written before it get nulls; a wider type of the same kind (``tinyint`` to ``smallint`` to ``int`` to
  ``bigint``, ``float`` to ``double``, a decimal's precision up at the same scale): values are widened, never
  changed; a column that was not nullable becoming nullable (the files' fields are all nullable already).
- **refused:** a narrower type, any other type change (``string`` to ``int``, ``date`` to ``timestamp``: Spark's own
  writer does not widen a date either), a column or field that is gone (unless the sink fills missing columns with
  nulls, ``fill_missing_columns=True``), a change to a key or partition column, a column that looks renamed (one
  gone and one new of the same type: a rename is a drop plus an add).

The next files' schema keeps every field it had (in the batch's order, where the batch has it) with its recorded
type where the batch's is the same up to what :func:`filesink.schema.conform.conformable` allows (a zone label, string
widths), the widened type where it is wider, and each new field as the batch has it. Rows sealed under an older
schema are written under the newest when their file is written (:func:`upgrade`): a file never mixes schemas.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa

from .conform import assembled, conformable

_INTS = [pa.int8(), pa.int16(), pa.int32(), pa.int64()]


@dataclass(frozen=True)
class Change:
    """One change a new schema makes: ``column`` is a dotted path (``.element`` in a list, ``.value`` in a map)."""

    column: str
    kind: str
    """``added`` or ``widened``."""
    old: str | None
    new: str

    def __str__(self) -> str:
        if self.kind == "added":
            return f"{self.column} ({self.new}) added"
        return f"{self.column} widened from {self.old} to {self.new}"


@dataclass(frozen=True)
class Evolution:
    """What :func:`evolve` found: the next files' schema and its changes, or the problems that refuse it."""

    schema: pa.Schema
    changes: tuple[Change, ...]
    problems: tuple[str, ...]


_NAMES = {
    pa.int8(): "tinyint",
    pa.int16(): "smallint",
    pa.int32(): "int",
    pa.int64(): "bigint",
    pa.float32(): "float",
    pa.float64(): "double",
    pa.bool_(): "boolean",
    pa.string(): "string",
    pa.large_string(): "string",
    pa.binary(): "binary",
    pa.large_binary(): "binary",
    pa.date32(): "date",
}


def spark_name(t: pa.DataType) -> str:
    """An Arrow type of the files as Spark names it (``int``, ``bigint``, ``struct<a:int>``), for messages."""
    if t in _NAMES:
        return _NAMES[t]
    if pa.types.is_decimal(t):
        return f"decimal({t.precision},{t.scale})"
    if pa.types.is_timestamp(t):
        return "timestamp" if t.tz is not None else "timestamp_ntz"
    if pa.types.is_struct(t):
        return "struct<" + ",".join(f"{f.name}:{spark_name(f.type)}" for f in t) + ">"
    if _lists(t):
        return f"array<{spark_name(t.value_type)}>"
    if pa.types.is_map(t):
        return f"map<{spark_name(t.key_type)},{spark_name(t.item_type)}>"
    return str(t)


def widens(old: pa.DataType, new: pa.DataType) -> bool:
    """Whether every value of ``old`` is a value of ``new`` unchanged, and the change is one the sink takes."""
    if old in _INTS and new in _INTS:
        return _INTS.index(new) > _INTS.index(old)
    if pa.types.is_float32(old) and pa.types.is_float64(new):
        return True
    if pa.types.is_decimal(old) and pa.types.is_decimal(new):
        return bool(new.scale == old.scale and new.precision > old.precision)
    return False


def _narrows(old: pa.DataType, new: pa.DataType) -> bool:
    return widens(new, old)


def evolve(
    old: pa.Schema,
    new: pa.Schema,
    *,
    fixed: tuple[str, ...] = (),
) -> Evolution:
    """Compare the files' schema ``old`` with a batch's ``new`` (both as :func:`filesink.schema.conform.file_schema`
    makes them); ``fixed`` names the columns whose type may not change (key and partition columns)."""
    changes: list[Change] = []
    problems: list[str] = []
    merged = _fields(list(old), list(new), "", changes, problems, fixed=fixed)
    return Evolution(pa.schema(merged, metadata=old.metadata), tuple(changes), tuple(problems))


def _fields(
    old: list[pa.Field],
    new: list[pa.Field],
    prefix: str,
    changes: list[Change],
    problems: list[str],
    *,
    fixed: tuple[str, ...] = (),
) -> list[pa.Field]:
    before = {f.name: f for f in old}
    now = {f.name: f for f in new}
    gone = [f for f in old if f.name not in now]
    added = [f for f in new if f.name not in before]
    for f in gone:
        alike = [a.name for a in added if conformable(a.type, f.type)]
        shown = spark_name(f.type)
        if alike:
            problems.append(
                f"{prefix}{f.name} ({shown}) is gone and {prefix}{alike[0]} of the same type is new: this looks like "
                "a rename, which the sink takes as a removed column plus a new one, and a removed column is refused. "
                f"Keep the old name (alias {alike[0]} as {f.name} in the query), or write to a new sink"
            )
        else:
            problems.append(
                f"{prefix}{f.name} ({shown}) is gone: a removed column or field is refused. Keep it in the query "
                + (
                    "(as a null of its type: lit(None).cast(...)), or let the sink fill missing columns with nulls "
                    "(fill_missing_columns=True)"
                    if not prefix
                    else "(a null of its type inside the struct)"
                )
            )
    merged: list[pa.Field] = []
    for field in new:
        path = f"{prefix}{field.name}"
        if field.name not in before:
            changes.append(Change(path, "added", None, spark_name(field.type)))
            merged.append(field)
            continue
        recorded = before[field.name]
        if field.name in fixed and not conformable(field.type, recorded.type):
            problems.append(
                f"{path} changed from {spark_name(recorded.type)} to {spark_name(field.type)}, and it is a key or "
                "partition column, whose type a sink keeps for life (its values decide where rows go). Cast it back "
                "in the query"
            )
            merged.append(recorded)
            continue
        merged.append(recorded.with_type(_type(recorded.type, field.type, path, changes, problems)))
    return merged


def _type(old: pa.DataType, new: pa.DataType, path: str, changes: list[Change], problems: list[str]) -> pa.DataType:
    """The merged type of one field, recording what changed or what is refused (then ``old`` is returned)."""
    if conformable(new, old):
        return old
    if widens(old, new):
        changes.append(Change(path, "widened", spark_name(old), spark_name(new)))
        return new
    if pa.types.is_struct(old) and pa.types.is_struct(new):
        fields = _fields(list(old), list(new), f"{path}.", changes, problems)
        return pa.struct(fields)
    if _lists(old) and _lists(new) and old.id == new.id:
        item = _type(old.value_type, new.value_type, f"{path}.element", changes, problems)
        return (
            pa.large_list(old.value_field.with_type(item))
            if pa.types.is_large_list(old)
            else pa.list_(old.value_field.with_type(item))
        )
    if pa.types.is_map(old) and pa.types.is_map(new):
        if not conformable(new.key_type, old.key_type):
            problems.append(
                f"{path}.key changed from {spark_name(old.key_type)} to {spark_name(new.key_type)}: a map's key "
                "type is kept for life"
            )
            return old
        item = _type(old.item_type, new.item_type, f"{path}.value", changes, problems)
        return pa.map_(old.key_field, old.item_field.with_type(item), old.keys_sorted)
    was, now = spark_name(old), spark_name(new)
    if _narrows(old, new):
        problems.append(
            f"{path} narrowed from {was} to {now}: values already written may not fit. Cast it back to {was} in the "
            "query"
        )
    elif pa.types.is_date(old) and pa.types.is_timestamp(new):
        problems.append(
            f"{path} changed from {was} to {now}: a date is not widened to a timestamp (Spark's own writer does not "
            f"do it either). Cast it back to a date in the query, or write the timestamp as a new column"
        )
    else:
        problems.append(
            f"{path} changed from {was} to {now}, which is not a widening the sink takes (new nullable columns and "
            "fields, tinyint to smallint to int to bigint, float to double, a decimal's precision up at the same "
            f"scale). Cast it back to {was} in the query, or write it as a new column"
        )
    return old


def _lists(t: pa.DataType) -> bool:
    return bool(pa.types.is_list(t) or pa.types.is_large_list(t))


# -- rows written under a newer schema ------------------------------------------------------------------------


def upgradable(got: pa.DataType, expected: pa.DataType) -> bool:
    """Whether values of ``got`` (an older schema's) become ``expected`` (a newer one's) with nothing dropped or
    changed: the same up to :func:`filesink.schema.conform.conformable`, widened, or with fields added (structs, at any
    depth). A cast alone would also drop a struct's fields silently: this is checked first."""
    if conformable(got, expected) or widens(got, expected):
        return True
    if pa.types.is_struct(got) and pa.types.is_struct(expected):
        names = [expected.field(i).name for i in range(expected.num_fields)]
        for i in range(got.num_fields):
            field = got.field(i)
            if field.name not in names or not upgradable(field.type, expected.field(field.name).type):
                return False
        return True
    if _lists(got) and _lists(expected):
        return upgradable(got.value_type, expected.value_type)
    if pa.types.is_map(got) and pa.types.is_map(expected):
        return conformable(got.key_type, expected.key_type) and upgradable(got.item_type, expected.item_type)
    return False


def upgrade(batch: pa.RecordBatch, schema: pa.Schema, *, keep: tuple[str, ...] = ()) -> pa.RecordBatch | None:
    """``batch``, of an older schema, with the columns of ``schema`` in its order: nulls for columns it lacks,
    values widened, struct fields added; None when some column of the batch has no place in ``schema`` (a
    column that is not there, a type that is not :func:`upgradable`), for the caller's error."""
    names = [n for n in batch.schema.names if n not in keep]
    if any(n not in schema.names for n in names):
        return None
    arrays = []
    for field in schema:
        if field.name not in names:
            if not field.nullable and batch.num_rows:
                return None
            arrays.append(pa.nulls(batch.num_rows, field.type))
            continue
        column = batch.column(field.name)
        if not column.type.equals(field.type):
            if not upgradable(column.type, field.type):
                return None
            column = column.cast(field.type)
        if not field.nullable and column.null_count:
            return None
        arrays.append(column)
    return assembled(batch, schema, arrays, keep)
