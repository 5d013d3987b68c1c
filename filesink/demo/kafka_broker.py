"""``filesink kafka-broker``: a Kafka broker on loopback to try ``filesink run --format kafka`` with, as ``filesink
demo --s3`` starts an S3 server. Apache Kafka's own jars (:data:`KAFKA`, fetched once into the user's cache by
:mod:`filesink.mavenjars`) run as one KRaft node, broker and controller in one JVM, its storage in a directory of
its own (formatted at the first start, kept across restarts). Topics are created with the partitions asked for, and
generated JSON events can be written into the first one at a steady rate (Kafka's own console producer), until
Ctrl-C or SIGTERM; then the broker stops, and its data stays for the next start.

Not a production broker: one node, no replication, no authentication, listening on 127.0.0.1 only.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from .. import mavenjars
from ..errors import KafkaBrokerError

KAFKA = "4.1.1"
ARTIFACTS = (f"org.apache.kafka:kafka_2.13:{KAFKA}", f"org.apache.kafka:kafka-tools:{KAFKA}")
START_DEADLINE = 120.0
"""Seconds for the broker's JVM to start and listen (about 5-10 s)."""
TOOL_DEADLINE = 120.0
"""Seconds for one of Kafka's tools (a JVM start and a request)."""
STOP_DEADLINE = 30.0
PRODUCER_STOP_DEADLINE = 300.0
"""Seconds for the producer to send the events it holds when it is stopped (its JVM may still be starting)."""
CLUSTER_ID = "ZmlsZXNpbmtrYWZrYTAwMA"
"""The KRaft cluster id the storage is formatted with (any 22 base64 characters)."""

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
"""One KRaft node on loopback; retention is checked every second (so that records deleted by retention go soon)."""


def kafka_jars(say: Callable[[str], None] = lambda line: None) -> list[Path]:
    """Kafka's broker and tools jars, fetched the first time."""
    return mavenjars.fetch(ARTIFACTS, what=f"Apache Kafka {KAFKA}'s broker", say=say)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _port_free(port: int) -> bool:
    """Whether nothing listens on ``port`` (connections of a broker just stopped, in TIME_WAIT, do not count)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _java() -> str:
    home = os.environ.get("JAVA_HOME")
    return str(Path(home) / "bin" / "java") if home else "java"


@dataclass
class KafkaBroker:
    """A running broker (:func:`start_broker`): its jars, its directory, its port and its process."""

    jars: tuple[Path, ...]
    directory: Path
    port: int
    process: subprocess.Popen[bytes]

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def classpath(self) -> str:
        return os.pathsep.join(str(j) for j in self.jars)

    def tool_command(self, main: str, *args: str) -> list[str]:
        """The command line of one of Kafka's tools (its main class) against this broker."""
        return [_java(), "-cp", self.classpath, main, "--bootstrap-server", self.bootstrap, *args]

    def tool(self, main: str, *args: str, stdin: str | None = None, deadline: float = TOOL_DEADLINE) -> str:
        """Run one of Kafka's tools against this broker: its output; raises :class:`KafkaBrokerError` with its
        answer."""
        command = self.tool_command(main, *args)
        try:
            done = subprocess.run(command, input=stdin, capture_output=True, text=True, timeout=deadline, check=False)
        except subprocess.TimeoutExpired:
            raise KafkaBrokerError(f"{main} {' '.join(args)} did not finish within {deadline:g} s") from None
        if done.returncode != 0:
            raise KafkaBrokerError(f"{main} {' '.join(args)} failed (exit {done.returncode}): {done.stderr[-2000:]}")
        return done.stdout

    def topics(self) -> list[str]:
        return self.tool("org.apache.kafka.tools.TopicCommand", "--list").split()

    def create_topic(self, topic: str, partitions: int, *config: str) -> None:
        extra = [a for c in config for a in ("--config", c)]
        self.tool(
            "org.apache.kafka.tools.TopicCommand",
            *("--create", "--topic", topic, "--partitions", str(partitions), *extra),
        )

    def producer(self, topic: str, *properties: str) -> subprocess.Popen[str]:
        """Kafka's console producer into ``topic``, reading ``key<TAB>value`` lines from its stdin, each
        acknowledged by the broker (``acks=all``); what it says goes to ``producer.log`` in the broker's directory
        (a pipe nobody reads would fill, and stop it). It runs in a session of its own, so that a Ctrl-C or SIGTERM
        to the command's process group does not end it before it sent what it was handed."""
        command = self.tool_command(
            "org.apache.kafka.tools.ConsoleProducer",
            *("--topic", topic, "--property", "parse.key=true", "--property", "key.separator=\t"),
            *("--producer-property", "acks=all", "--producer-property", "linger.ms=5"),
            *(a for p in properties for a in ("--producer-property", p)),
        )
        with (self.directory / "producer.log").open("ab") as log:
            return (
                subprocess.Popen(  # a session of its own: a Ctrl-C to the terminal's group is the command's to act on
                    command,
                    stdin=subprocess.PIPE,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    text=True,
                    start_new_session=True,
                )
            )

    def stop(self) -> None:
        """Stop the broker: SIGTERM (it closes its logs cleanly), then SIGKILL after :data:`STOP_DEADLINE`."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(STOP_DEADLINE)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(STOP_DEADLINE)


def start_broker(
    directory: Path, port: int = 0, jars: Sequence[Path] | None = None, say: Callable[[str], None] = lambda _: None
) -> KafkaBroker:
    """Start a KRaft node whose storage is in ``directory`` (formatted first if it is new) on ``port`` of 127.0.0.1
    (0: a free one); returns once it listens, within :data:`START_DEADLINE`, or raises :class:`KafkaBrokerError`
    with the end of its log."""
    jars = tuple(jars or kafka_jars(say))
    directory.mkdir(parents=True, exist_ok=True)
    if port and not _port_free(port):
        raise KafkaBrokerError(
            f"port {port} of 127.0.0.1 is in use (another broker?): stop what listens there, or give --port with "
            "another port (0 picks a free one)"
        )
    port = port or free_port()
    config = directory / "server.properties"
    config.write_text(SERVER.format(port=port, controller=free_port(), data=directory / "data"))
    classpath = os.pathsep.join(str(j) for j in jars)
    if not (directory / "data" / "meta.properties").exists():
        shutil.rmtree(directory / "data", ignore_errors=True)
        _format(classpath, config)
    log_path = directory / "broker.log"
    with log_path.open("ab") as log:
        process = subprocess.Popen(
            [_java(), "-Xmx512m", "-cp", classpath, "kafka.Kafka", str(config)],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    broker = KafkaBroker(jars, directory, port, process)
    deadline = time.monotonic() + START_DEADLINE
    while True:
        if process.poll() is not None:
            raise KafkaBrokerError(
                f"the Kafka broker ended at its start (exit {process.returncode}); the end of {log_path}:\n"
                f"{_tail(log_path)}"
            )
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return broker
        except OSError:
            if time.monotonic() > deadline:
                broker.stop()
                raise KafkaBrokerError(
                    f"the Kafka broker did not listen on 127.0.0.1:{port} within {START_DEADLINE:g} s; the end of "
                    f"{log_path}:\n{_tail(log_path)}"
                ) from None
            time.sleep(0.2)


def _format(classpath: str, config: Path) -> None:
    command = [_java(), "-cp", classpath, "kafka.tools.StorageTool", "format", "-t", CLUSTER_ID, "-c", str(config)]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=TOOL_DEADLINE, check=False)
    except FileNotFoundError:
        raise KafkaBrokerError("Java ('java') was not found: install a JDK 17 or set JAVA_HOME") from None
    except subprocess.TimeoutExpired:
        raise KafkaBrokerError(f"formatting the broker's storage did not finish within {TOOL_DEADLINE:g} s") from None
    if done.returncode != 0:
        raise KafkaBrokerError(f"formatting the broker's storage failed: {(done.stdout + done.stderr)[-2000:]}")


def _tail(path: Path) -> str:
    try:
        return path.read_text(errors="replace")[-2000:]
    except OSError as e:
        return f"(no log: {e})"


SCHEMA = "user_id bigint, event string, amount double, seq bigint"
"""The generated events' JSON, as ``filesink run --kafka-value json --schema`` reads it."""
EVENTS = ("view", "click", "cart", "buy")


def events(first: int, count: int, rng: random.Random) -> list[tuple[str, str]]:
    """``count`` generated events from sequence number ``first``: (key, JSON value), keyed by user."""
    out = []
    for seq in range(first, first + count):
        user = rng.randrange(1, 1000)
        value = {"user_id": user, "event": rng.choice(EVENTS), "amount": round(rng.uniform(1, 500), 2), "seq": seq}
        out.append((str(user), json.dumps(value, separators=(",", ":"))))
    return out


class Producing:
    """Generated events handed to Kafka's console producer for ``topic`` at ``rate`` a second, from a thread, until
    :meth:`stop`; ``handed`` counts them (the broker's end offsets say how many it holds)."""

    def __init__(self, broker: KafkaBroker, topic: str, rate: int, first: int = 0) -> None:
        self.process = broker.producer(topic)
        self.rate, self.handed, self.first = rate, 0, first
        self.error: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._produce, name="kafka-broker-producer", daemon=True)
        self._thread.start()

    def _produce(self) -> None:
        rng = random.Random(self.first)
        stdin: IO[str] | None = self.process.stdin
        assert stdin is not None
        tick = 0.1
        started = time.monotonic()
        while not self._stop.is_set():
            due = int((time.monotonic() - started) * self.rate) - self.handed
            if due > 0:
                lines = "".join(f"{k}\t{v}\n" for k, v in events(self.first + self.handed, due, rng))
                try:
                    stdin.write(lines)
                    stdin.flush()
                except (BrokenPipeError, OSError) as e:
                    self.error = f"the producer ended ({e})"
                    return
                self.handed += due
            self._stop.wait(tick)

    def stop(self) -> int | None:
        """Stop handing events; the producer sends what it holds and ends: its exit code, or None when it was
        killed after :data:`PRODUCER_STOP_DEADLINE`."""
        self._stop.set()
        self._thread.join(STOP_DEADLINE)
        if self.process.stdin is not None:
            with contextlib.suppress(OSError):
                self.process.stdin.close()
        try:
            return self.process.wait(PRODUCER_STOP_DEADLINE)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(STOP_DEADLINE)
            return None


def end_offsets(broker: KafkaBroker, topic: str) -> dict[int, int]:
    """Partition -> the offset after its last record."""
    ends = {}
    for line in broker.tool("org.apache.kafka.tools.GetOffsetShell", "--topic", topic).split():
        _, partition, offset = line.rsplit(":", 2)
        ends[int(partition)] = int(offset)
    return ends


def serve(
    directory: Path,
    *,
    port: int,
    topics: Sequence[str],
    partitions: int,
    rate: int,
    out: Callable[[str], None] = print,
) -> int:
    """``filesink kafka-broker``: start the broker, create ``topics``, write ``rate`` generated events a second
    into the first, and say how to stream them, until Ctrl-C or SIGTERM (then stop; exit 0), or until the broker
    ends by itself (exit 1, with the end of its log)."""
    stop = threading.Event()
    previous = {s: signal.signal(s, lambda *_: stop.set()) for s in (signal.SIGINT, signal.SIGTERM)}
    broker: KafkaBroker | None = None
    producing: Producing | None = None
    try:
        broker = start_broker(directory, port, say=out)
        out(
            f"kafka broker: listening on {broker.bootstrap} (one KRaft node; data in {directory}, log "
            f"{directory / 'broker.log'})"
        )
        have = set(broker.topics())
        held = 0  # the events the first topic holds: the generated ones are numbered on from there
        for topic in topics:
            if topic in have:
                ends = end_offsets(broker, topic)
                held = sum(ends.values()) if topic == topics[0] else held
                out(f"topic {topic}: there already ({len(ends)} partitions)")
            else:
                broker.create_topic(topic, partitions)
                out(f"topic {topic}: created with {partitions} partitions")
        if rate and topics:
            producing = Producing(broker, topics[0], rate, first=held)
            out(f"producing {rate:,} generated events a second into {topics[0]} (JSON: {SCHEMA}; keyed by user_id)")
        out(
            "stream them, in another terminal:\n"
            f"  filesink run --format kafka --kafka-bootstrap {broker.bootstrap} --topics {','.join(topics)} "
            f"--kafka-value json --schema '{SCHEMA}' --key user_id --output ./kafka-out --state-dir ./kafka-state "
            "--trigger 5s\n"
            f"Ctrl-C stops the broker; its data stays in {directory} for the next start."
        )
        while not stop.wait(0.5):
            if broker.process.poll() is not None:
                log = _tail(directory / "broker.log")
                out(f"error: the Kafka broker ended (exit {broker.process.returncode}); the end of its log:\n{log}")
                return 1
            if producing is not None and producing.error:
                out(f"error: {producing.error}; the end of its log:\n{_tail(directory / 'producer.log')}")
                return 1
        return 0
    finally:
        extra = ""
        if producing is not None and broker is not None:
            extra = _stop_producing(producing, broker, topics[0], out)
        if broker is not None:
            broker.stop()
            out(f"stopped: the Kafka broker on {broker.bootstrap}{extra}; its data stays in {directory}")
        for s, handler in previous.items():
            signal.signal(s, handler)


def _stop_producing(producing: Producing, broker: KafkaBroker, topic: str, out: Callable[[str], None]) -> str:
    """Stop the producer and count, from the broker's end offsets, the events this start wrote: the words the
    ``stopped:`` line says them with; a warning when the broker holds fewer than were handed to the producer."""
    out(
        f"stopping: the producer sends the {producing.handed:,} events it was handed "
        f"(up to {PRODUCER_STOP_DEADLINE:.0f} s)"
    )
    code = producing.stop()
    if broker.process.poll() is not None:
        return f"; {producing.handed:,} events handed to the producer, not counted (the broker had ended)"
    try:
        held = sum(end_offsets(broker, topic).values())
    except KafkaBrokerError as e:
        return f"; {producing.handed:,} events handed to the producer, not counted ({e})"
    written = held - producing.first
    if written < producing.handed:
        how = "was killed" if code is None else f"ended with exit {code}"
        out(
            f"warning: {producing.handed - written:,} of the {producing.handed:,} events handed to the producer are "
            f"not in {topic} (the producer {how}; its log: {broker.directory / 'producer.log'})"
        )
    return f"; {written:,} events written into {topic} ({held:,} in it)"
