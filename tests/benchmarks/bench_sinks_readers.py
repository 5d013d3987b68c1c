"""What readers gain from fewer, larger files: DuckDB and Polars queries over two partitioned outputs of the same
input (Spark's Parquet sink's and ours), timed, with the Parquet files each query opens counted.

Not a test. ``bench_sinks.py`` calls ``measure``; each query runs in a fresh process started as
``python bench_sinks_readers.py READER QUERY ROOT``, which prints one JSON line: the query's seconds (the query
alone, not the interpreter's start or the imports) and its answer. See ``docs/benchmarks.md``.
"""

from __future__ import annotations

import json
import math
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

READERS = ("duckdb", "polars")
QUERIES = ("full scan", "selective")
PARTITION = "country"
"""The partition column of both outputs (``country=XX/`` directories, as Spark's writer names them)."""
SELECT_COUNTRY = "DE"
SELECT_AMOUNT = 100.0
ROUNDS = 3
CHILD_TIMEOUT = 900.0
QUERY_TEXT = {
    "full scan": "count(*), sum(amount) over every row",
    "selective": f"count(*), sum(amount) where {PARTITION} = '{SELECT_COUNTRY}' and amount > {SELECT_AMOUNT:g}",
}


def pattern(root: Path) -> str:
    """The files a reader reads: the partition directories' Parquet files (not ``_spark_metadata``)."""
    return f"{root}/{PARTITION}=*/*.parquet"


def run_query(reader: str, query: str, root: Path) -> tuple[int, float]:
    """``(rows, sum of amount)`` of ``query`` over the output at ``root``, read by ``reader``."""
    if reader == "duckdb":
        import duckdb

        where = f" WHERE {PARTITION} = '{SELECT_COUNTRY}' AND amount > {SELECT_AMOUNT}" if query == "selective" else ""
        sql = f"SELECT count(*), sum(amount) FROM read_parquet('{pattern(root)}', hive_partitioning = true){where}"
        (row,) = duckdb.connect().sql(sql).fetchall()
        return int(row[0]), float(row[1] or 0.0)
    if reader == "polars":
        import polars as pl

        frame = pl.scan_parquet(pattern(root), hive_partitioning=True)
        if query == "selective":
            frame = frame.filter((pl.col(PARTITION) == SELECT_COUNTRY) & (pl.col("amount") > SELECT_AMOUNT))
        rows, amount = frame.select(pl.len(), pl.col("amount").sum()).collect().row(0)
        return int(rows), float(amount or 0.0)
    raise SystemExit(f"unknown reader {reader!r}: use one of {', '.join(READERS)}")


def child_main(argv: list[str]) -> int:
    reader, query, root = argv
    if reader == "duckdb":
        import duckdb  # noqa: F401  (imported before the clock starts)
    else:
        import polars  # noqa: F401
    start = time.perf_counter()
    rows, amount = run_query(reader, query, Path(root))
    seconds = time.perf_counter() - start
    print(json.dumps({"seconds": seconds, "rows": rows, "amount": amount}), flush=True)
    return 0


# -- counting the files a query opens --------------------------------------------------------------------

_CALL = re.compile(r'^(?P<pid>\d+)\s+(?:open|openat)\((?:[^,"]*,\s*)?"(?P<path>(?:[^"\\]|\\.)*)"')
_RESUMED = re.compile(r"^(?P<pid>\d+)\s+<\.\.\. (?:open|openat) resumed>")
_RESULT = re.compile(r"\)\s+=\s+(?P<ret>-?\d+)")


def opened_parquet_files(log: Path, root: Path) -> set[str]:
    """The distinct ``.parquet`` paths under ``root`` that a ``strace -f -e trace=openat,open`` log shows opened
    successfully (a call split by another thread's, ``<unfinished ...>`` then ``<... resumed>``, is joined)."""
    prefix = f"{root}/"
    pending: dict[str, str] = {}
    opened: set[str] = set()
    for line in log.read_text(errors="replace").splitlines():
        call, resumed = _CALL.match(line), _RESUMED.match(line)
        if call is not None:
            path = call["path"]
            if line.rstrip().endswith("<unfinished ...>"):
                pending[call["pid"]] = path
                continue
        elif resumed is not None:
            if resumed["pid"] not in pending:
                continue
            path = pending.pop(resumed["pid"])
        else:
            continue
        result = _RESULT.search(line)
        if result is not None and int(result["ret"]) >= 0 and path.endswith(".parquet") and path.startswith(prefix):
            opened.add(path)
    return opened


# -- measuring -------------------------------------------------------------------------------------------


@dataclass
class ReaderFigure:
    reader: str
    query: str
    output: str
    seconds: list[float] = field(default_factory=list)
    files_opened: int | None = None
    """Distinct Parquet files opened, under strace; None when strace is missing or could not trace."""
    answer: tuple[int, float] = (0, 0.0)

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)


def _child(reader: str, query: str, root: Path, trace: Path | None) -> dict[str, Any] | None:
    """One query in a fresh process (under strace when ``trace`` names a log); its JSON line, or None if strace
    could not trace it."""
    command = [sys.executable, __file__, reader, query, str(root)]
    strace = shutil.which("strace")
    if trace is not None:
        assert strace is not None
        command = [strace, "-f", "-qq", "-s", "4096", "-e", "trace=openat,open", "-o", str(trace), *command]
    done = subprocess.run(command, capture_output=True, text=True, timeout=CHILD_TIMEOUT)
    if done.returncode != 0:
        if trace is not None:
            return None
        raise SystemExit(f"the {reader} {query} query over {root} failed:\n{done.stderr[-4000:]}")
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if not lines:
        if trace is not None:
            return None
        raise SystemExit(f"the {reader} {query} query over {root} printed no result:\n{done.stdout[-2000:]}")
    value: dict[str, Any] = json.loads(lines[-1])
    return value


def measure(outputs: dict[str, Path], rounds: int = ROUNDS) -> list[ReaderFigure]:
    """Every reader's every query over every output: first once under strace (which also warms the page cache
    for the timed runs), then ``rounds`` timed runs, the outputs in turn, each in a fresh process."""
    traced = shutil.which("strace") is not None
    figures: list[ReaderFigure] = []
    with tempfile.TemporaryDirectory(prefix="bench_readers-") as tmp:
        for reader in READERS:
            for query in QUERIES:
                mine = {name: ReaderFigure(reader, query, name) for name in outputs}
                for name, root in outputs.items():
                    figure = mine[name]
                    log = Path(tmp) / f"{reader}-{query.replace(' ', '-')}-{len(figures)}-{name[:8]}.strace"
                    result = _child(reader, query, root, log) if traced else None
                    if result is not None:
                        figure.files_opened = len(opened_parquet_files(log, root))
                    log.unlink(missing_ok=True)
                for _ in range(rounds):
                    for name, root in outputs.items():
                        result = _child(reader, query, root, None)
                        assert result is not None
                        mine[name].seconds.append(float(result["seconds"]))
                        mine[name].answer = (int(result["rows"]), float(result["amount"]))
                for figure in mine.values():
                    opened = "n/a" if figure.files_opened is None else f"{figure.files_opened:,}"
                    print(
                        f"  {reader}, {query}, {figure.output}: {figure.median:.3f} s (median of {rounds}), "
                        f"{opened} files opened; {figure.answer[0]:,} rows",
                        flush=True,
                    )
                figures.extend(mine.values())
    return figures


def disagreements(figures: list[ReaderFigure], full_rows: int | None = None) -> list[str]:
    """Warnings where readers or outputs answer a query differently (exact counts; sums to within rounding), or a
    full scan does not count ``full_rows``."""
    warnings = []
    for query in QUERIES:
        answers = [f for f in figures if f.query == query]
        if not answers:
            continue
        first = answers[0]
        for f in answers[1:]:
            if f.answer[0] != first.answer[0] or not math.isclose(f.answer[1], first.answer[1], rel_tol=1e-9):
                warnings.append(
                    f"WARNING: {query}: {f.reader} over {f.output} answers {f.answer[0]:,} rows, "
                    f"sum {f.answer[1]:,.2f}; "
                    f"{first.reader} over {first.output} {first.answer[0]:,} rows, sum {first.answer[1]:,.2f}"
                )
        if query == "full scan" and full_rows is not None:
            warnings += [
                f"WARNING: full scan: {f.reader} over {f.output} counts {f.answer[0]:,} rows, "
                f"the input has {full_rows:,}"
                for f in answers
                if f.answer[0] != full_rows
            ]
    return warnings


def table(figures: list[ReaderFigure], spark: str, ours: str) -> list[str]:
    """The report's table: a row per reader, query and output; on the row of Spark's sink's output, its seconds
    and files opened divided by ours."""
    lines = [
        f"| reader | query | output | seconds (median of {ROUNDS}) | files opened "
        "| Spark's output / ours: seconds, files |",
        "|---|---|---|---:|---:|---:|",
    ]
    by_key = {(f.reader, f.query, f.output): f for f in figures}
    for reader in READERS:
        for query in QUERIES:
            base = by_key.get((reader, query, ours))
            for name in (spark, ours):
                f = by_key.get((reader, query, name))
                if f is None:
                    continue
                opened = "n/a" if f.files_opened is None else f"{f.files_opened:,}"
                ratio = ""
                if name == spark and base is not None:
                    files = (
                        "n/a"
                        if f.files_opened is None or not base.files_opened
                        else f"{f.files_opened / base.files_opened:.1f}x"
                    )
                    ratio = f"{f.median / base.median:.2f}x, {files}"
                lines.append(f"| {reader} | {query} | {name} | {f.median:.3f} | {opened} | {ratio} |")
    return lines


if __name__ == "__main__":
    sys.exit(child_main(sys.argv[1:]))
