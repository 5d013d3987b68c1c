"""The key columns bound how far rows spread (docs/kafka.md, "Keys and the files of a roll"): rows of one key value
are in one vnode, each writer writes one file a roll for its vnode range, so a roll's files are at most the number
of distinct key values, and fewer when two values fall in one writer's range. The Kafka columns as a user keys
them (``--key topic --key partition``, four partitions, three writers), through Spark in local mode."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from pyspark.sql import functions as F
from sink_helpers import parquet_files

from filesink import ExactlyOnceParquetSink, Rollover
from filesink.rolling.planner import writer_ranges

ROOT = Path(__file__).resolve().parents[3]
ONE_ROLL = Rollover(target_file_size=None, max_age_seconds=None, max_epochs=1000)
ROWS = [("events", p, o, f"v{p}-{o}") for p in range(4) for o in range(250)]


def _files_of_one_roll(spark, tmp_path: Path, keys: list[str]) -> tuple[int, set[int]]:
    """Write :data:`ROWS` in one batch and one roll: the roll's files, and the writers whose vnodes hold rows."""
    out = str(tmp_path / "out")
    sink = ExactlyOnceParquetSink(out, tmp_path / "state", key_columns=keys, parallelism=3, rollover=ONE_ROLL)
    df = spark.createDataFrame(ROWS, "topic string, partition int, offset long, value string")
    sink(df, 0)
    sink.flush()
    sink.close()
    rows = Counter(tuple(r) for r in spark.read.parquet(out).select("topic", "partition", "offset", "value").collect())
    assert rows == Counter(ROWS)
    vnodes = {
        r[0] for r in df.select(F.pmod(F.hash(*keys), F.lit(sink.vnodes)).alias("v")).distinct().collect()
    }  # as the sink assigns them
    writers = {i for i, r in enumerate(writer_ranges(sink.vnodes, 3)) if any(v in r for v in vnodes)}
    return len([f for f in parquet_files(out) if f.endswith(".parquet")]), writers


def test_the_key_columns_bound_the_files_of_a_roll(spark, tmp_path: Path) -> None:
    files, writers = _files_of_one_roll(spark, tmp_path / "a", ["topic", "partition"])
    assert files == len(writers) <= 3  # one file per writer whose range holds one of the 4 keys' vnodes
    files, writers = _files_of_one_roll(spark, tmp_path / "b", ["topic", "partition", "offset"])
    assert files == len(writers) == 3  # 1,000 key values: every writer has rows
    text = (ROOT / "docs" / "kafka.md").read_text()
    assert "## Keys and the files of a roll" in text
    assert "at most the number of distinct values of the key columns" in text
