"""The exactly-once checker of the fault and chaos tests: exact multisets of rows, and nothing visible but the
sink's committed Parquet files."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import pyarrow.parquet as pq
from sink_helpers import _fs, read_duckdb, read_pyarrow

from filesink.output import CLAIM_NAME, MARK_NAME, is_file_name


@dataclass
class Report:
    rows: int = 0
    """Rows expected (and checked)."""
    lost: int = 0
    duplicated: int = 0
    unexpected: int = 0
    stray_objects: list[str] = field(default_factory=list)
    """Objects under the output that are not whole Parquet files named like the sink's files."""
    table: str | None = None
    """A table output's format (``delta``, ``iceberg``): the rows are the table's (``table_checker.py``)."""
    outside_table: list[str] = field(default_factory=list)
    """A table output: files in its directory that the table does not hold (at the end of a campaign: none)."""
    figures: dict[str, object] = field(default_factory=dict)
    """What the campaign did (kills, faults by kind, ...), for the summary line."""

    @property
    def anomalies(self) -> int:
        return self.lost + self.duplicated + self.unexpected + len(self.stray_objects) + len(self.outside_table)

    def counts(self) -> dict[str, int]:
        """The row figures of :meth:`line`, as a dict (for totals over several campaigns)."""
        counts = {
            "rows checked": self.rows,
            "lost": self.lost,
            "duplicated": self.duplicated,
            "unexpected": self.unexpected,
            "stray objects": len(self.stray_objects),
        }
        if self.table:
            counts["files outside the table"] = len(self.outside_table)
        return counts

    def line(self, **figures: object) -> str:
        """One summary line: the given figures (kills, faults by kind, ...), then rows and anomalies."""
        head = ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in figures.items())
        tail = f"rows checked {self.rows}, lost {self.lost}, duplicated {self.duplicated}, unexpected {self.unexpected}"
        if self.stray_objects:
            tail += f", stray objects {len(self.stray_objects)}: {self.stray_objects[:5]}"
        if self.outside_table:
            tail += f", files outside the table {len(self.outside_table)}: {self.outside_table[:5]}"
        return f"{head}, {tail}" if head else tail


def compare(expected: Counter, got: Counter) -> tuple[int, int, int]:
    """(lost, duplicated, unexpected): expected rows missing, extra copies of expected rows, rows never input."""
    lost = sum((expected - got).values())
    duplicated = sum(max(0, n - expected[r]) for r, n in got.items() if r in expected)
    unexpected = sum(n for r, n in got.items() if r not in expected)
    return lost, duplicated, unexpected


def stray_objects(path: str, options: dict | None, sink_id: str | None = None) -> list[str]:
    """Objects under the output that are not whole, readable Parquet files of the sink (by name)."""
    fs, root = _fs(path, options)
    if not fs.exists(root):
        return []
    stray = []
    for full in sorted(fs.find(root)):
        key = full[len(root.rstrip("/")) + 1 :]
        base = key.rsplit("/", 1)[-1]
        if key in (CLAIM_NAME, MARK_NAME):
            continue  # the sink's claim on the output, and its commit mark
        named = is_file_name(sink_id, base) if sink_id else base.startswith("part-") and base.endswith(".parquet")
        if not named:
            stray.append(key)
            continue
        try:
            with fs.open(full, "rb") as f:
                pq.ParquetFile(f).metadata  # noqa: B018  (whole and readable)
        except Exception:
            stray.append(key)
    return stray


def check(
    path: str,
    options: dict | None,
    expected: Counter,
    partition_by: tuple[str, ...] = (),
    sink_id: str | None = None,
) -> Report:
    """Read the output with pyarrow and DuckDB; both must see the same rows."""
    got = read_pyarrow(path, options, partition_by)
    lost, duplicated, unexpected = compare(expected, got)
    report = Report(sum(expected.values()), lost, duplicated, unexpected, stray_objects(path, options, sink_id))
    if report.anomalies == 0:
        assert read_duckdb(path, options, partition_by) == got, "DuckDB and pyarrow read different rows"
    return report
