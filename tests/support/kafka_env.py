"""A Kafka broker for the tests: Apache Kafka's own jars (``org.apache.kafka:kafka_2.13`` and ``kafka-tools``,
:data:`KAFKA`) fetched with Maven into the tests' cache (a directory of their own beside the engines' environment of
``engines_env.py``, built once under the same kind of lock and ``ready.json``), run as one KRaft node (broker and
controller in one JVM, no ZooKeeper) on loopback with free ports, its storage formatted first. The tests' producer
and topic tool are the broker's own Java tools (``ConsoleProducer``, ``TopicCommand``, ``GetOffsetShell``).
Every wait has a deadline; :meth:`KafkaBroker.stop` kills the broker's process group.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from engines_env import _run, built_once, cache_root

KAFKA = "4.1.1"
ARTIFACTS = (f"org.apache.kafka:kafka_2.13:{KAFKA}", f"org.apache.kafka:kafka-tools:{KAFKA}")
MAVEN_DEADLINE = 600.0
LOCK_DEADLINE = MAVEN_DEADLINE + 30.0
READY = "ready.json"
START_DEADLINE = 120.0
"""Seconds for the broker's JVM to start and answer (about 5-10 s; the machine may be shared)."""
TOOL_DEADLINE = 120.0
"""Seconds for one run of a Kafka tool (a JVM start and a request)."""

POM = """<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>filesink.tests</groupId><artifactId>kafka</artifactId><version>1</version>
  <dependencies>
{dependencies}
  </dependencies>
</project>
"""


def kafka_home(root: Path | None = None) -> tuple[Path | None, str]:
    """The directory of Kafka's jars (``<home>/jars``), fetched first if need be: ``(home, "")``, or
    ``(None, reason)`` naming the command that failed and its answer."""
    home = (root or cache_root()) / f"kafka-{KAFKA}"
    return built_once(home, lambda: home if (home / READY).exists() else None, lambda: _build(home), LOCK_DEADLINE)


def _build(home: Path) -> str:
    shutil.rmtree(home, ignore_errors=True)
    home.mkdir(parents=True)
    mvn = shutil.which("mvn")
    java = shutil.which("java")
    if mvn is None or java is None:
        return "Maven ('mvn') and Java ('java') are needed to fetch and run Kafka's broker"
    dependencies = "\n".join(
        f"    <dependency><groupId>{g}</groupId><artifactId>{a}</artifactId><version>{v}</version></dependency>"
        for g, a, v in (artifact.split(":") for artifact in ARTIFACTS)
    )
    (home / "pom.xml").write_text(POM.format(dependencies=dependencies))
    started = time.monotonic()
    try:
        _run(
            "Maven fetching Kafka's jars",
            [
                mvn,
                "-B",
                "-q",
                "dependency:copy-dependencies",
                f"-DoutputDirectory={home / 'jars'}",
                "-DincludeScope=runtime",
            ],
            MAVEN_DEADLINE,
            cwd=home,
        )
    except RuntimeError as e:
        return str(e)
    ready = home / f"{READY}.tmp"
    ready.write_text(json.dumps({"artifacts": list(ARTIFACTS), "seconds": round(time.monotonic() - started, 1)}))
    ready.replace(home / READY)
    return ""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


SERVER = """process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:{controller}
listeners=PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller}
advertised.listeners=PLAINTEXT://127.0.0.1:{port}
controller.listener.names=CONTROLLER
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
inter.broker.listener.name=PLAINTEXT
log.dirs={data}
offsets.topic.replication.factor=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
auto.create.topics.enable=false
group.initial.rebalance.delay.ms=0
log.retention.check.interval.ms=1000
log.segment.delete.delay.ms=0
"""
"""One KRaft node; retention is checked every second (the data-loss test deletes records by retention)."""


@dataclass
class KafkaBroker:
    """A running broker (see :func:`start_broker`)."""

    home: Path
    directory: Path
    port: int
    process: subprocess.Popen[bytes]

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def tool(self, main: str, *args: str, stdin: str | None = None, deadline: float = TOOL_DEADLINE) -> str:
        """Run one of Kafka's tools (its main class) against this broker: its output; raises with its answer."""
        command = ["java", "-cp", str(self.home / "jars" / "*"), main, "--bootstrap-server", self.bootstrap, *args]
        try:
            done = subprocess.run(command, input=stdin, capture_output=True, text=True, timeout=deadline, check=False)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"{main} {' '.join(args)} did not finish within {deadline:g} s") from None
        if done.returncode != 0:
            raise AssertionError(f"{main} {' '.join(args)} failed (exit {done.returncode}): {done.stderr[-2000:]}")
        return done.stdout

    def create_topic(self, topic: str, partitions: int, *config: str) -> None:
        extra = [a for c in config for a in ("--config", c)]
        self.tool(
            "org.apache.kafka.tools.TopicCommand",
            *("--create", "--topic", topic, "--partitions", str(partitions), *extra),
        )

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
        out = self.tool("org.apache.kafka.tools.GetOffsetShell", "--topic", topic)
        ends = {}
        for line in out.split():
            _, partition, offset = line.rsplit(":", 2)
            ends[int(partition)] = int(offset)
        return ends

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, 9)
        self.process.wait(30)


def start_broker(home: Path, directory: Path) -> KafkaBroker:
    """Format a KRaft node's storage in ``directory`` and start it on free loopback ports; returns once it
    answers (a topic listing), within :data:`START_DEADLINE`."""
    directory.mkdir(parents=True, exist_ok=True)
    port, controller = free_port(), free_port()
    config = directory / "server.properties"
    config.write_text(SERVER.format(port=port, controller=controller, data=directory / "data"))
    classpath = str(home / "jars" / "*")
    _run(
        "formatting the broker's storage",
        [
            "java",
            "-cp",
            classpath,
            "kafka.tools.StorageTool",
            "format",
            "-t",
            "ZmlsZXNpbmt0ZXN0czAwMA",
            "-c",
            str(config),
        ],
        TOOL_DEADLINE,
    )
    log = (directory / "broker.log").open("wb")
    process = subprocess.Popen(
        ["java", "-Xmx512m", "-cp", classpath, "kafka.Kafka", str(config)],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    broker = KafkaBroker(home, directory, port, process)
    deadline = time.monotonic() + START_DEADLINE
    while True:
        if process.poll() is not None:
            raise AssertionError(f"the broker ended (exit {process.returncode}): {_tail(directory / 'broker.log')}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                break
        except OSError:
            if time.monotonic() > deadline:
                broker.stop()
                raise AssertionError(
                    f"the broker did not listen on {port} within {START_DEADLINE:g} s: "
                    f"{_tail(directory / 'broker.log')}"
                ) from None
            time.sleep(0.2)
    return broker


def _tail(path: Path) -> str:
    try:
        return path.read_text(errors="replace")[-2000:]
    except OSError as e:
        return f"(no log: {e})"
