"""Input of the sink benchmark: Parquet files of an event stream, generated from fixed seeds.

Columns: ``id`` (unique, ascending), ``user_id`` (the key, 1M distinct values), ``ts`` (timestamps in order,
with jitter), ``amount`` (two decimals), ``event`` (8 short strings), ``country`` (20 two-letter codes) and
``sku`` (50,000 values such as ``SKU-004711``). See ``docs/benchmarks.md``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

SPARK_SCHEMA = "id long, user_id long, ts timestamp, amount double, event string, country string, sku string"
KEY_COLUMNS = ["user_id"]
EVENTS = ["click", "view", "search", "add_to_cart", "purchase", "refund", "signup", "logout"]
COUNTRIES = ["US", "DE", "FR", "GB", "JP", "BR", "IN", "CN", "CA", "AU", "ES", "IT", "NL", "SE", "PL", "MX", "KR"]
COUNTRIES += ["ZA", "AR", "CH"]
SKUS = 50_000
START_MICROS = 1_767_225_600_000_000  # 2026-01-01 00:00 UTC


def file_rows(rows: int) -> list[int]:
    """Rows per input file: 100,000 (fewer files for small runs, but at least 20)."""
    files = max(20, rows // 100_000)
    base, extra = divmod(rows, files)
    return [base + (1 if i < extra else 0) for i in range(files)]


def make_batch(first_id: int, rows: int, seed: int) -> pa.Table:
    rng = np.random.default_rng(seed)
    ids = np.arange(first_id, first_id + rows, dtype=np.int64)
    micros = START_MICROS + ids * 1_000 + rng.integers(0, 1_000, rows)  # one event per ms, with jitter
    sku_numbers = rng.integers(0, SKUS, rows)
    return pa.table(
        {
            "id": ids,
            "user_id": rng.integers(0, 1_000_000, rows, dtype=np.int64),
            "ts": pa.array(micros, pa.timestamp("us", tz="UTC")),
            "amount": np.round(rng.exponential(40.0, rows), 2),
            "event": pa.array(EVENTS).take(pa.array(rng.integers(0, len(EVENTS), rows))),
            "country": pa.array(COUNTRIES).take(pa.array(rng.integers(0, len(COUNTRIES), rows))),
            "sku": pa.array(np.char.add("SKU-", np.char.zfill(sku_numbers.astype(str), 6)).tolist(), pa.string()),
        }
    )


def generate(directory: Path, rows: int) -> list[Path]:
    """Write the input files (``part-00000.parquet`` ...) into ``directory``; returns their paths."""
    directory.mkdir(parents=True, exist_ok=True)
    paths: list[Path] = []
    first = 0
    for i, n in enumerate(file_rows(rows)):
        path = directory / f"part-{i:05d}.parquet"
        pq.write_table(make_batch(first, n, seed=i), path, compression="snappy")
        paths.append(path)
        first += n
    return paths


def read_tables(paths: list[Path]) -> list[pa.Table]:
    return [pq.read_table(p) for p in paths]
