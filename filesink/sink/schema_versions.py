"""The sink's schema history at a batch: is the batch's schema the recorded one, a new version, or refused?

A sink records the schema of its first batch as version 1 (:meth:`filesink.committer.ledger.Ledger.record_schema`). A
later batch with another schema is compared with the newest version (:func:`filesink.schema.evolution.evolve`): a change
the sink takes becomes the next version, recorded (in the state database and the durable home) after the batch's rows
are in the log store and before its epoch is sealed (:meth:`~filesink.committer.ledger.Ledger.add_schema_version`); a
change it does not take refuses the batch before anything of it is written. A version recorded for an epoch that was
never sealed (a run stopped in between) is taken back when the batch comes again with the older schema.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from logstore import NOTHING

from ..errors import SchemaMismatchError
from ..schema.conform import arrow_schema_of, file_schema, schema_problems, spark_schema_json
from ..schema.evolution import Change, Evolution, evolve

if TYPE_CHECKING:
    from ..committer.ledger import Ledger, SchemaVersion
    from ..destination import Destination


@dataclass(frozen=True)
class NewVersion:
    """A schema change the sink takes, to be recorded before the batch's epoch is sealed."""

    spark_schema: str
    spark_type: str
    arrow_schema: bytes
    """The files' schema from this version on."""
    first_epoch: int
    changes: tuple[str, ...]
    taken: tuple[Change, ...] = ()
    """The changes, as :func:`filesink.schema.evolution.evolve` found them (``changes`` is their text, as recorded)."""


@dataclass(frozen=True)
class SchemaTaken:
    """A new schema version a sink took at a batch (:attr:`filesink.sink.core.SinkStats.schema_changes`)."""

    epoch: int
    version: int
    changes: tuple[Change, ...]

    def line(self) -> str:
        """``schema: the sink took new column `x` (bigint), `n` widened from int to bigint at batch 3 (version
        2)``: for progress displays."""
        said = []
        for c in self.changes:
            if c.kind == "added":
                said.append(f"new {'field' if '.' in c.column else 'column'} `{c.column}` ({c.new})")
            else:
                said.append(f"`{c.column}` widened from {c.old} to {c.new}")
        what = ", ".join(said) or "a new column order"
        return f"schema: the sink took {what} at batch {self.epoch} (schema version {self.version})"


TAKEN = (
    "The sink takes new nullable columns and struct fields, wider types (tinyint to smallint to int to bigint, float "
    "to double, a decimal's precision up at the same scale) and columns becoming nullable; anything else needs a new "
    "sink (new state directory, log store and output)."
)
"""What the sink takes, said after each refusal of a schema (of a batch, or of ``filesink run``'s input)."""


def check_batch_schema(
    ledger: Ledger,
    last_sealed: int,
    schema: Any,
    epoch: int | None,
    *,
    zone: str,
    fixed: tuple[str, ...],
    destination: Destination,
) -> NewVersion | None:
    """None when batches of the Spark ``schema`` are written under the recorded files' schema (a new sink records
    it here as version 1), the next version when the schema evolves, or :class:`SchemaMismatchError` naming each
    column that changed in a way the sink does not take. ``epoch``: the batch's (None: a check before a query)."""
    current = spark_schema_json(schema)
    history = ledger.schema_history()
    first = epoch if epoch is not None else last_sealed + 1
    if not history or last_sealed == NOTHING:
        if not history or history[-1].spark_schema != current or len(history) > 1:
            ledger.record_schema(
                current, spark_type=schema.json(), first_epoch=first
            )  # nothing sealed yet: the schema may still change
        return None
    established = [v for v in history if v.first_epoch <= last_sealed] or history[:1]
    if len(established) < len(history) and current != history[-1].spark_schema:
        ledger.drop_schema_versions_after(established[-1].version)  # no seal used them
        history = established
    if current == history[-1].spark_schema:
        return None
    recorded = ledger.arrow_schema()
    old = pa.ipc.read_schema(pa.py_buffer(recorded)) if recorded is not None else _converted(history[-1], zone)
    converted = arrow_schema_of(schema, timezone=zone)
    if converted is None or old is None:
        problems = schema_problems(history[-1].spark_schema, current)
        raise SchemaMismatchError(
            f"the batch's schema differs from the sink's: {'; '.join(problems)}. Nothing of this batch was written."
        )
    evolution = evolve(old, file_schema(converted), fixed=fixed)
    problems = list(evolution.problems)
    if not problems:
        problems += destination.evolution_problems(evolution.changes)
    if problems:
        raise SchemaMismatchError(
            f"batch {'' if epoch is None else f'{epoch} '}changes the sink's schema (version {history[-1].version}) "
            f"in a way the sink does not take: {'; '.join(problems)}. Nothing of this batch was written. {TAKEN}"
        )
    return NewVersion(
        current,
        schema.json(),
        bytes(evolution.schema.serialize().to_pybytes()),
        first,
        tuple(str(c) for c in evolution.changes),
        evolution.changes,
    )


@dataclass(frozen=True)
class Proposed:
    """How a schema compares with the sink's (:func:`propose`), before anything of it is read."""

    recorded: pa.Schema
    """The files' schema of the newest version a sealed epoch uses."""
    version: int
    evolution: Evolution
    """:func:`filesink.schema.evolution.evolve` of ``recorded`` and the schema, with the table format's refusals among
    its problems."""


def propose(
    ledger: Ledger,
    last_sealed: int,
    schema: pa.Schema,
    *,
    fixed: tuple[str, ...],
    fill_missing: bool,
    destination: Destination,
) -> Proposed | None:
    """Compare the files' Arrow ``schema`` of batches to come (as :func:`filesink.schema.conform.file_schema` makes it)
    with the sink's, as :func:`check_batch_schema` will compare their Spark schema: the sink's columns a batch lacks are
    filled when the sink fills them (never ``fixed`` ones). None while no epoch is sealed (any schema is taken)."""
    history = ledger.schema_history()
    if not history or last_sealed == NOTHING:
        return None
    established = [v for v in history if v.first_epoch <= last_sealed] or history[:1]
    latest = established[-1]
    stored = latest.arrow_schema
    if stored is None and latest is history[-1]:
        stored = ledger.arrow_schema()
    recorded = pa.ipc.read_schema(pa.py_buffer(stored)) if stored is not None else _converted(latest, "UTC")
    if recorded is None:
        return None
    if fill_missing:
        lacking = [f for f in recorded if f.name not in schema.names and f.name not in fixed]
        schema = pa.schema([*schema, *lacking], metadata=schema.metadata)
    evolution = evolve(recorded, schema, fixed=fixed)
    if not evolution.problems:
        more = tuple(destination.evolution_problems(evolution.changes))
        evolution = Evolution(evolution.schema, evolution.changes, more)
    return Proposed(recorded, latest.version, evolution)


def _converted(version: SchemaVersion, zone: str) -> pa.Schema | None:
    """The files' schema of a version no rows were held under yet, from its Spark schema (None if not recorded)."""
    if version.spark_type is None:
        return None
    from pyspark.sql import types as T

    converted = arrow_schema_of(T.StructType.fromJson(json.loads(version.spark_type)), timezone=zone)
    return None if converted is None else file_schema(converted)


def filled_schema(schema: Any, ledger: Ledger, keep: tuple[str, ...]) -> Any:
    """The Spark ``schema`` of a batch after :func:`fill_missing_columns`, for a check before the query starts."""
    from pyspark.sql import types as T

    history = ledger.schema_history()
    if not history or history[-1].spark_type is None:
        return schema
    recorded = T.StructType.fromJson(json.loads(history[-1].spark_type))
    names = schema.fieldNames()
    missing = [f.name for f in recorded.fields if f.name not in names and f.name not in keep]
    if not missing:
        return schema
    fields = [recorded[n] if n in missing else schema[n] for n in recorded.fieldNames() if n in missing or n in names]
    return T.StructType(fields + [f for f in schema.fields if f.name not in recorded.fieldNames()])


def fill_missing_columns(df: Any, ledger: Ledger, keep: tuple[str, ...]) -> Any:
    """``df`` with the sink's columns it lacks added as nulls of their recorded types (the sink's
    ``fill_missing_columns``), the sink's columns first in their order; ``keep`` (key and partition columns) are
    never filled: a batch without them is refused."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    history = ledger.schema_history()
    if not history:
        return df
    latest = history[-1]
    recorded = [name for name, _ in json.loads(latest.spark_schema)]
    missing = [n for n in recorded if n not in df.columns and n not in keep]
    if not missing:
        return df
    types = T.StructType.fromJson(json.loads(latest.spark_type)) if latest.spark_type else None
    kinds = dict(json.loads(latest.spark_schema))

    def quoted(name: str) -> str:
        return "`" + name.replace("`", "``") + "`"

    columns = []
    for name in recorded:
        if name in missing:
            kind = types[name].dataType if types is not None else kinds[name]
            columns.append(F.lit(None).cast(kind).alias(name))
        elif name in df.columns:
            columns.append(F.col(quoted(name)))
    columns += [F.col(quoted(n)) for n in df.columns if n not in recorded]
    return df.select(*columns)
