"""Inputs of the sink benchmarks: Parquet files generated from fixed seeds, one workload each.

Workloads (``WORKLOADS``, by name):

- ``events`` (the default, the project's workload): ``id`` (unique, ascending), ``user_id`` (the key, 1M
  distinct values), ``ts`` (timestamps in order, with jitter), ``amount`` (two decimals), ``event`` (8 short
  strings), ``country`` (20 two-letter codes) and ``sku`` (50,000 values such as ``SKU-004711``).
- ``strings``: an event stream heavy in strings: ``id``, ``user_id`` (the key), ``ts`` and five string columns
  of 20 to 40 characters: ``session`` (200,000 values), ``url`` (100,000), ``user_agent`` (200),
  ``referrer`` (5,000) and ``message`` (1,000,000).
- ``wide``: 50 columns: ``id``, ``user_id`` (the key), ``ts``, then ``i00``..``i14`` bigint, ``d00``..``d15``
  double and ``s00``..``s15`` strings of 5 to 15 characters (1,000 values each).

See ``docs/benchmarks.md``.
"""

from __future__ import annotations

import tempfile
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

EVENTS = ["click", "view", "search", "add_to_cart", "purchase", "refund", "signup", "logout"]
COUNTRIES = ["US", "DE", "FR", "GB", "JP", "BR", "IN", "CN", "CA", "AU", "ES", "IT", "NL", "SE", "PL", "MX", "KR"]
COUNTRIES += ["ZA", "AR", "CH"]
SKUS = 50_000
START_MICROS = 1_767_225_600_000_000  # 2026-01-01 00:00 UTC
_ALPHABET = np.frombuffer(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789/-_.", dtype=np.uint8)


def file_rows(rows: int) -> list[int]:
    """Rows per input file: 100,000 (fewer files for small runs, but at least 20)."""
    files = max(20, rows // 100_000)
    base, extra = divmod(rows, files)
    return [base + (1 if i < extra else 0) for i in range(files)]


def _common(first_id: int, rows: int, rng: np.random.Generator) -> dict[str, pa.Array]:
    ids = np.arange(first_id, first_id + rows, dtype=np.int64)
    micros = START_MICROS + ids * 1_000 + rng.integers(0, 1_000, rows)  # one event per ms, with jitter
    return {
        "id": pa.array(ids),
        "user_id": pa.array(rng.integers(0, 1_000_000, rows, dtype=np.int64)),
        "ts": pa.array(micros, pa.timestamp("us", tz="UTC")),
    }


def _pool(values: int, shortest: int, longest: int, prefix: str, seed: int) -> pa.Array:
    """``values`` distinct strings of ``shortest`` to ``longest`` characters, the same for every seed of a run."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(shortest, longest + 1, values)
    chars = _ALPHABET[rng.integers(0, len(_ALPHABET), int(lengths.sum()))].tobytes().decode()
    out, at = [], 0
    for i, n in enumerate(lengths.tolist()):
        body = f"{prefix}{i:x}-{chars[at : at + n]}"
        out.append(body[:n])
        at += n
    return pa.array(out, pa.string())


_POOLS: dict[tuple[int, int, int, str], pa.Array] = {}


def _pick(rng: np.random.Generator, rows: int, values: int, shortest: int, longest: int, prefix: str) -> pa.Array:
    """``rows`` strings drawn from the pool of ``(values, shortest, longest, prefix)``, made once per process."""
    key = (values, shortest, longest, prefix)
    if key not in _POOLS:
        _POOLS[key] = _pool(values, shortest, longest, prefix, seed=zlib.crc32(repr(key).encode()))
    return _POOLS[key].take(pa.array(rng.integers(0, values, rows)))


def events_batch(first_id: int, rows: int, seed: int) -> pa.Table:
    rng = np.random.default_rng(seed)
    common = _common(first_id, rows, rng)
    sku_numbers = rng.integers(0, SKUS, rows)
    return pa.table(
        {
            **common,
            "amount": np.round(rng.exponential(40.0, rows), 2),
            "event": pa.array(EVENTS).take(pa.array(rng.integers(0, len(EVENTS), rows))),
            "country": pa.array(COUNTRIES).take(pa.array(rng.integers(0, len(COUNTRIES), rows))),
            "sku": pa.array(np.char.add("SKU-", np.char.zfill(sku_numbers.astype(str), 6)).tolist(), pa.string()),
        }
    )


def strings_batch(first_id: int, rows: int, seed: int) -> pa.Table:
    rng = np.random.default_rng(seed)
    return pa.table(
        {
            **_common(first_id, rows, rng),
            "session": _pick(rng, rows, 200_000, 32, 36, "s"),
            "url": _pick(rng, rows, 100_000, 20, 40, "/p/"),
            "user_agent": _pick(rng, rows, 200, 30, 40, "Mozilla/5.0 "),
            "referrer": _pick(rng, rows, 5_000, 20, 40, "https://"),
            "message": _pick(rng, rows, 1_000_000, 20, 40, "m"),
        }
    )


def wide_batch(first_id: int, rows: int, seed: int) -> pa.Table:
    rng = np.random.default_rng(seed)
    columns: dict[str, pa.Array] = _common(first_id, rows, rng)
    for i in range(15):
        columns[f"i{i:02d}"] = pa.array(rng.integers(0, 10 ** (i % 9 + 1), rows, dtype=np.int64))
    for i in range(16):
        columns[f"d{i:02d}"] = pa.array(np.round(rng.normal(100.0, 30.0, rows), i % 6))
    for i in range(16):
        columns[f"s{i:02d}"] = _pick(rng, rows, 1_000, 5, 15, f"c{i}")
    return pa.table(columns)


def spark_schema(directory: Path) -> str:
    """The Spark schema (DDL) of the input files in ``directory``, from one file's footer: a streaming source
    needs it, and making a workload's rows to learn it would build its string pools in every job process."""
    schema = pq.read_schema(min(directory.glob("*.parquet")))
    names = {pa.int64(): "long", pa.float64(): "double", pa.string(): "string"}
    return ", ".join(f"{f.name} {'timestamp' if pa.types.is_timestamp(f.type) else names[f.type]}" for f in schema)


@dataclass(frozen=True)
class Workload:
    """One benchmark input: how to make its rows, and the sink's key columns."""

    name: str
    make_batch: Callable[[int, int, int], pa.Table]
    key_columns: tuple[str, ...] = ("user_id",)
    description: str = ""
    target_mib: float = 16
    """Our sink's target file size in the side-by-side runs (at 100,000 rows per input file): a writer's file
    holds several batches. A row of ``strings`` or ``wide`` is 6 to 8 times the Parquet bytes of one of
    ``events``; 64 MiB is the target of the issue's own string-heavy benchmark."""

    def generate(self, directory: Path, rows: int) -> list[Path]:
        return generate(directory, rows, self)


WORKLOADS = {
    "events": Workload(
        "events", events_batch, description="7 columns: 3 numbers, a timestamp, 3 short strings (the project's)"
    ),
    "strings": Workload(
        "strings",
        strings_batch,
        description="8 columns: 2 numbers, a timestamp, 5 strings of 20 to 40 characters",
        target_mib=64,
    ),
    "wide": Workload(
        "wide",
        wide_batch,
        description="50 columns: 17 bigint, 16 double, a timestamp, 16 strings of 5 to 15 chars",
        target_mib=64,
    ),
}
DEFAULT = WORKLOADS["events"]

make_batch = events_batch
"""The default workload's rows (the benchmarks that drive the sink without Spark use these)."""


def generate(directory: Path, rows: int, workload: Workload = DEFAULT) -> list[Path]:
    """Write the input files (``part-00000.parquet`` ...) into ``directory``; returns their paths."""
    directory.mkdir(parents=True, exist_ok=True)
    paths: list[Path] = []
    first = 0
    for i, n in enumerate(file_rows(rows)):
        path = directory / f"part-{i:05d}.parquet"
        pq.write_table(workload.make_batch(first, n, i), path, compression="snappy")
        paths.append(path)
        first += n
    return paths


def read_tables(paths: list[Path]) -> list[pa.Table]:
    return [pq.read_table(p) for p in paths]


def work_directory(parent: Path | None, prefix: str) -> Path:
    """A new temp directory for a benchmark's files, in ``parent`` (made if it does not exist yet) or the cwd."""
    base = (parent or Path.cwd()).resolve()
    base.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=prefix, dir=base))
