"""A Kafka broker for the tests: the product's own (``filesink kafka-broker``'s :mod:`filesink.demo.kafka_broker`:
Apache Kafka's jars fetched once into the user's cache, one KRaft node on loopback with free ports), with what the
tests do to its topics beside: keyed records written through Kafka's console producer, partitions added, records
deleted as retention does, the end offsets read. Every wait has a deadline; :meth:`KafkaBroker.stop` stops the
broker's process group.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

from filesink.demo import kafka_broker
from filesink.errors import FileSinkError

KAFKA = kafka_broker.KAFKA
TOOL_DEADLINE = kafka_broker.TOOL_DEADLINE


def kafka_home() -> tuple[tuple[Path, ...] | None, str]:
    """Kafka's jars, fetched first if need be: ``(jars, "")``, or ``(None, reason)`` naming what failed."""
    try:
        return tuple(kafka_broker.kafka_jars()), ""
    except FileSinkError as e:
        return None, str(e)


class KafkaBroker(kafka_broker.KafkaBroker):
    """The product's broker, with what the tests do to its topics."""

    def add_partitions(self, topic: str, partitions: int) -> None:
        self.tool("org.apache.kafka.tools.TopicCommand", "--alter", "--topic", topic, "--partitions", str(partitions))

    def produce(
        self,
        topic: str,
        records: list[tuple[str, str]],
        batch_bytes: int | None = None,
        deadline: float = TOOL_DEADLINE,
    ) -> None:
        """Write keyed records (``key``, ``value``; neither holds a tab or a newline), acknowledged by the broker
        (``acks=all``) when this returns; the default partitioner spreads the keys over the topic's partitions.
        ``batch_bytes``: the producer's ``batch.size`` (small: a few records per record batch, so that a consumer
        with a small fetch size does not hold a partition's records in its buffer at once)."""
        lines = "".join(f"{k}\t{v}\n" for k, v in records)
        size = ("--producer-property", f"batch.size={batch_bytes}") if batch_bytes else ()
        self.tool(
            "org.apache.kafka.tools.ConsoleProducer",
            *("--topic", topic, "--property", "parse.key=true", "--property", "key.separator=\t"),
            *("--producer-property", "acks=all", "--producer-property", "linger.ms=5", *size),
            stdin=lines,
            deadline=deadline,
        )

    def delete_records(self, topic: str, before: dict[int, int]) -> None:
        """Delete the records of each partition below its offset in ``before``, as retention does (the
        partition's log start offset moves up)."""
        spec = {"version": 1, "partitions": [{"topic": topic, "partition": p, "offset": o} for p, o in before.items()]}
        file = self.directory / f"delete-{topic}.json"
        file.write_text(json.dumps(spec))
        self.tool("org.apache.kafka.tools.DeleteRecordsCommand", "--offset-json-file", str(file))

    def end_offsets(self, topic: str) -> dict[int, int]:
        """Partition -> the offset after its last record."""
        return kafka_broker.end_offsets(self, topic)

    def stop(self) -> None:
        """Kill the broker at once (the tests do not keep its data)."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(30)


def start_broker(jars: tuple[Path, ...], directory: Path) -> KafkaBroker:
    """A broker whose storage is in ``directory``, on a free loopback port; returns once it listens."""
    started = kafka_broker.start_broker(directory, 0, jars)
    return KafkaBroker(started.jars, started.directory, started.port, started.process)


def output_rows(out: Path) -> list[dict[str, Any]]:
    """Every row of the Parquet files under ``out`` a reader of the directory sees (names starting with ``.`` or
    ``_`` are not the output's)."""
    import pyarrow.parquet as pq

    rows: list[dict[str, Any]] = []
    for path in sorted(out.rglob("*.parquet")):
        if not any(part.startswith((".", "_")) for part in path.relative_to(out).parts):
            rows += pq.read_table(path).to_pylist()
    return rows
