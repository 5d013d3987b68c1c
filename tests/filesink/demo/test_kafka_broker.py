"""``filesink kafka-broker``: a real KRaft broker (Apache Kafka's jars, fetched by the command into the cache) started
by the command as a user starts it, its generated events read back with Kafka's own console consumer. A stop by
SIGTERM ends it cleanly (exit 0) and keeps its data; a second start finds the topic and goes on with the events'
sequence numbers, so every number is in the topic once. A port in use is refused with what to do.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from helpers import communicate, wait_for_line

from filesink.demo import kafka_broker
from filesink.errors import FileSinkError

pytestmark = pytest.mark.timeout(600)

START = 240.0
"""Seconds for the command to start its broker and say how to stream (a JVM start; the jars fetched the first
time)."""


def _command(directory: Path, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "filesink", "kafka-broker", "--dir", str(directory), "--port", "0", *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def _stop(proc: subprocess.Popen[str]) -> str:
    os.killpg(proc.pid, signal.SIGTERM)
    out, _ = communicate(proc, 120, "the broker command to stop")
    assert proc.returncode == 0, out
    return out


@pytest.fixture(scope="module")
def jars() -> tuple[Path, ...]:
    try:
        return tuple(kafka_broker.kafka_jars())
    except FileSinkError as e:
        pytest.skip(f"no Kafka broker: {e}")


def test_events_are_generated_kept_and_go_on_after_a_restart(tmp_path: Path, jars: tuple[Path, ...]) -> None:
    directory = tmp_path / "broker"
    proc = _command(directory, "--topic", "clicks", "--partitions", "3", "--produce", "400")
    line = wait_for_line(proc, lambda x: x.startswith("kafka broker: listening on"), START, "the broker", skip=True)
    bootstrap = re.search(r"listening on (\S+)", line).group(1)  # type: ignore[union-attr]
    wait_for_line(proc, "topic clicks: created with 3 partitions\n", 60, "the topic")
    wait_for_line(proc, lambda x: x.startswith("producing 400 generated events"), 60, "the producer")
    wait_for_line(proc, lambda x: f"--kafka-bootstrap {bootstrap} --topics clicks" in x, 60, "the run", skip=True)
    time.sleep(2)  # about 800 events
    said = _stop(proc)
    assert "warning" not in said, said  # the broker holds every event handed to the producer
    first = int(re.search(r"([\d,]+) events written into clicks", said).group(1).replace(",", ""))  # type: ignore[union-attr]
    assert first >= 1

    again = _command(directory, "--topic", "clicks", "--produce", "300")
    line = wait_for_line(again, lambda x: x.startswith("kafka broker: listening on"), START, "the broker", skip=True)
    wait_for_line(again, "topic clicks: there already (3 partitions)\n", 60, "the topic found")
    wait_for_line(again, lambda x: x.startswith("producing 300 generated events"), 60, "the producer")
    time.sleep(2)
    said = _stop(again)
    second = re.search(r"stopped: the Kafka broker on \S+; ([\d,]+) events written into clicks", said)
    assert second is not None and "warning" not in said, said
    # every event handed to the producer is in the topic once (the stop flushed them), numbered on
    broker = kafka_broker.start_broker(directory, 0, jars)
    try:
        total = sum(kafka_broker.end_offsets(broker, "clicks").values())
        assert total == first + int(second.group(1).replace(",", ""))
        values = broker.tool(
            "org.apache.kafka.tools.consumer.ConsoleConsumer",
            *("--topic", "clicks", "--from-beginning", "--max-messages", str(total), "--timeout-ms", "60000"),
        ).split()
    finally:
        broker.stop()
    assert Counter(json.loads(v)["seq"] for v in values) == Counter(range(total))


def test_a_port_in_use_is_refused(tmp_path: Path, jars: tuple[Path, ...]) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen(1)
        port = held.getsockname()[1]
        proc = subprocess.run(
            [sys.executable, "-m", "filesink", "kafka-broker", "--dir", str(tmp_path / "b"), "--port", str(port)],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert f"error: port {port} of 127.0.0.1 is in use (another broker?)" in proc.stderr, proc.stderr
    assert not (tmp_path / "b" / "data").exists()  # nothing formatted
