"""``filesink run --format kafka`` against a real broker (``kafka_env.py``: Apache Kafka's KRaft node from Maven
Central's jars) and a real Spark: the pinned second environment of ``engines_env.py`` (pyspark 4.1.1 with Spark's
Kafka source of the same version, given to the run with ``--conf spark.jars``), where the sink runs from this
checkout (``PYTHONPATH``). The test environment's own pyspark has no Kafka source on Maven Central yet
(``docs/kafka.md``). Where Maven, Java or the network are missing, the tests are skipped with the command that
failed and its answer.

Exactly-once is checked the way a reader would: every (topic, partition, offset) the broker holds is in the output
exactly once, with the value and key it was written with (exact multisets), after the job was SIGKILLed mid-stream
and restarted with another parallelism.
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from helpers import kill, wait_until
from kafka_env import KafkaBroker, kafka_home, start_broker
from spark_engines import engines_or_skip

from filesink.cli import main

pytestmark = pytest.mark.timeout(1500)  # a cold build of the environments waits for their locks

ROOT = Path(__file__).resolve().parents[2]
RUN_DEADLINE = 300.0
"""Seconds for one ``--available-now`` run (Spark's start and a few batches; the machine may be shared)."""
BATCHES_DEADLINE = 240.0
"""Seconds for a run to commit its first batches before it is killed."""
KAFKA_JARS = ("spark-sql-kafka", "spark-token-provider-kafka", "kafka-clients", "commons-pool2")


@pytest.fixture
def broker(tmp_path: Path) -> Any:
    home, reason = kafka_home()
    if home is None:
        pytest.skip(f"no Kafka broker: {reason}")
    broker = start_broker(home, tmp_path / "kafka")
    try:
        yield broker
    finally:
        broker.stop()


def _records(first: int, count: int) -> list[tuple[str, str]]:
    return [(f"k{i % 23}", f"v{i}") for i in range(first, first + count)]


def _start(
    tmp_path: Path, broker: KafkaBroker, topics: str, parallelism: int, *extra: str, env: dict[str, str] | None = None
) -> subprocess.Popen[Any]:
    engines = engines_or_skip()
    jars = ",".join(str(j) for j in engines.jars if j.name.startswith(KAFKA_JARS))
    args = [
        str(engines.python),
        *("-m", "filesink", "run", "--format", "kafka", "--kafka-bootstrap", broker.bootstrap, "--topics", topics),
        *("--output", str(tmp_path / "out"), "--state-dir", str(tmp_path / "state")),
        *("--parallelism", str(parallelism), "--trigger", "1s", "--max-file-age", "1s"),
        *("--kafka-option", "maxOffsetsPerTrigger=150", "--conf", f"spark.jars={jars}", *extra),
    ]
    environ = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYSPARK_PYTHON", "SPARK_HOME")}
    environ.update(env or {}, PYTHONPATH=str(ROOT))
    log = (tmp_path / "run.log").open("ab")
    return subprocess.Popen(args, env=environ, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def _finish(proc: subprocess.Popen[Any], tmp_path: Path, code: int | None = 0) -> str:
    """Wait for the run (killed after :data:`RUN_DEADLINE`); its exit code must be ``code``: the run's output
    (the log is emptied for the next run)."""
    try:
        proc.wait(RUN_DEADLINE)
    except subprocess.TimeoutExpired:
        kill(proc, group=True)
    log = tmp_path / "run.log"
    text = log.read_text(errors="replace")
    log.unlink()
    assert code is None or proc.returncode == code, text[-4000:]
    return text


def _drain(
    tmp_path: Path, broker: KafkaBroker, topics: str, parallelism: int, *extra: str, env: dict[str, str] | None = None
) -> str:
    """Run ``--available-now`` to the end of the topics: the last run's output. Spark 4.1's Kafka source fails a
    restarted query once, after the batch it replayed was committed (SPARK-55271): the run says so and exits 1, and
    the same command again goes on. Any other failure fails the test."""
    for _ in range(3):
        proc = _start(tmp_path, broker, topics, parallelism, "--available-now", *extra, env=env)
        text = _finish(proc, tmp_path, code=None)
        if proc.returncode == 0:
            return text
        assert proc.returncode == 1, text[-4000:]
        assert "known bug of Spark 4.1's Kafka source (SPARK-55271)" in text, text[-4000:]
        assert "Nothing of the failed batch was committed" not in text, text[-4000:]
    raise AssertionError("the run still failed after 3 attempts")


def _commits(checkpoint: Path) -> int:
    """Batches Spark's checkpoint ``checkpoint`` has committed."""
    commits = checkpoint / "commits"
    return len([p for p in commits.iterdir() if p.name.isdigit()]) if commits.is_dir() else 0


def _output(tmp_path: Path) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for path in sorted((tmp_path / "out").rglob("*.parquet")):
        if not any(part.startswith((".", "_")) for part in path.relative_to(tmp_path / "out").parts):
            rows += pq.read_table(path).to_pylist()
    return rows


def _check_exactly_once(rows: list[dict[str, Any]], broker: KafkaBroker, topic: str, written: list[tuple[str, str]]):
    ends = broker.end_offsets(topic)
    held = Counter((r["topic"], r["partition"], r["offset"]) for r in rows)
    assert held == Counter({(topic, p, o): 1 for p, end in ends.items() for o in range(end)})
    assert Counter((r["key"], r["value"]) for r in rows) == Counter(written)
    partitions_of_key: dict[str, set[int]] = {}
    for r in rows:
        partitions_of_key.setdefault(r["key"], set()).add(r["partition"])
    assert {len(p) for p in partitions_of_key.values()} == {1}  # keyed: one key, one partition
    assert len({r["partition"] for r in rows}) == len(ends) > 1


@pytest.mark.slow
def test_kafka_exactly_once_through_a_kill(tmp_path: Path, broker: KafkaBroker) -> None:
    """Records on three partitions; the job is SIGKILLed once it committed two batches, more records are written,
    and a restart at another parallelism drains the topic (``--available-now``): each record once."""
    broker.create_topic("events", 3)
    written = _records(0, 400)
    broker.produce("events", written)
    proc = _start(tmp_path, broker, "events", 2)
    checkpoint = tmp_path / "state" / "checkpoint"
    wait_until(lambda: _commits(checkpoint) >= 2, BATCHES_DEADLINE, "two committed batches", proc=proc)
    kill(proc, group=True)
    more = _records(400, 300)
    broker.produce("events", more)
    text = _drain(tmp_path, broker, "events", 3)
    rows = _output(tmp_path)
    _check_exactly_once(rows, broker, "events", written + more)
    assert set(rows[0]) == {"key", "value", "topic", "partition", "offset", "timestamp"}
    assert "done:" in text


def _positions(rows: list[dict[str, Any]]) -> Counter[tuple[str, int, int]]:
    return Counter((r["topic"], r["partition"], r["offset"]) for r in rows)


@pytest.mark.chaos
def test_kafka_records_deleted_before_they_were_read(tmp_path: Path, broker: KafkaBroker) -> None:
    """Records of partition 0 deleted (as retention does) before the query read them: with failOnDataLoss true
    (Spark's default) the run fails with Spark's reason and writes nothing more; with failOnDataLoss=false it says
    at its start that gaps are skipped (not checked yet: see below)."""
    broker.create_topic("lossy", 2)
    broker.produce("lossy", _records(0, 200))
    _finish(_start(tmp_path, broker, "lossy", 2, "--available-now"), tmp_path)
    first = _positions(_output(tmp_path))
    read = broker.end_offsets("lossy")
    assert first == Counter({("lossy", p, o): 1 for p, end in read.items() for o in range(end)})
    broker.produce("lossy", _records(200, 200))
    ends = broker.end_offsets("lossy")
    broker.delete_records("lossy", {0: ends[0]})
    failed = _finish(_start(tmp_path, broker, "lossy", 2, "--available-now"), tmp_path, code=1)
    assert "Some data may have been lost" in failed, failed[-3000:]
    assert "--kafka-option failOnDataLoss=false" in failed and "replace" not in failed, failed[-3000:]
    assert _positions(_output(tmp_path)) == first
    # failOnDataLoss=false is not checked here: with --available-now, Spark 4.1.1 wrote the first batch and then
    # failed the query with an internal error (STREAM_FAILED, a null Option.get()); see docs/kafka.md.


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--topics", "a"], "--format kafka needs --kafka-bootstrap"),
        (["--kafka-bootstrap", "h:1"], "one of --topics T1,T2 and --topic-pattern"),
        (["--kafka-bootstrap", "h:1", "--topics", "a", "--topic-pattern", "a.*"], "not both"),
        (["--kafka-bootstrap", "h:1", "--topics", "a", "--input", "in"], "--input: options of a landing directory"),
        (["--kafka-bootstrap", "h:1", "--topics", "a", "--kafka-value", "json"], "--kafka-value json needs --schema"),
        (["--kafka-bootstrap", "h:1", "--topics", "a", "--schema", "id int"], "give it with --kafka-value json"),
        (["--kafka-bootstrap", "h:1", "--topics", "a", "--starting-offsets", "first"], "is not earliest, latest"),
        (["--kafka-bootstrap", "h:1", "--topics", "a", "--kafka-option", "subscribe=b"], "set it with its own option"),
        (["--kafka-bootstrap", "h:1", "--topics", "a", "--kafka-option", "failOnDataLoss=no"], "take true or false"),
        (
            ["--kafka-bootstrap", "h:1", "--topics", "a", "--kafka-value", "json", "--schema", "offset bigint"],
            "--schema names offset",
        ),
    ],
)
def test_kafka_options_refused_at_parse_time(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], words: str
) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["run", "--format", "kafka", "--output", str(tmp_path / "o"), "--state-dir", str(tmp_path / "s"), *args])
    assert exit_.value.code == 2
    assert words in capsys.readouterr().err
    assert not (tmp_path / "s").exists()


def test_kafka_options_refused_without_format_kafka(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["run", "--input", str(tmp_path), "--output", "o", "--state-dir", "s", "--topics", "a"])
    assert exit_.value.code == 2
    assert "--topics: options of --format kafka, not of --format parquet" in capsys.readouterr().err


@pytest.mark.chaos
def test_kafka_campaign_kills_new_partitions_and_a_lost_state(
    tmp_path: Path, broker: KafkaBroker, s3_server: Any, s3_prefix: str
) -> None:
    """A producer writes while the job is SIGKILLed again and again; restarts alternate the parallelism; the topic
    gains partitions mid-stream; once the state directory is deleted and the sink rebuilds it from its durable home
    on S3 (the log store there, Spark's checkpoint kept apart). At the end every (topic, partition, offset) the
    broker holds is in the output once, with its key and value."""
    rng = random.Random(48)
    broker.create_topic("stream", 2)
    written: list[tuple[str, str]] = []
    checkpoint = tmp_path / "checkpoint"
    creds = {"AWS_ACCESS_KEY_ID": s3_server.access_key, "AWS_SECRET_ACCESS_KEY": s3_server.secret_key}
    s3 = ("--s3-endpoint", s3_server.endpoint, "--log-store", s3_prefix + "/log", "--checkpoint", str(checkpoint))

    def produce(count: int) -> None:
        records = _records(len(written), count)
        broker.produce("stream", records)
        written.extend(records)

    produce(300)
    for round_ in range(5):
        if round_ == 2:
            broker.add_partitions("stream", 4)  # new partitions, read from their first offset
        if round_ == 3:
            shutil.rmtree(tmp_path / "state")  # the driver's machine is gone; the home on S3 is not
        before = _commits(checkpoint)
        proc = _start(tmp_path, broker, "stream", 2 + round_ % 2, *s3, env=creds)
        wait_until(
            lambda b=before: _commits(checkpoint) > b,
            BATCHES_DEADLINE,
            f"a committed batch in round {round_}",
            proc=proc,
        )
        produce(rng.randint(100, 250))  # while the job runs
        time.sleep(rng.uniform(0.5, 4.0))
        kill(proc, group=True)
        produce(rng.randint(50, 150))  # while it is down
    text = _drain(tmp_path, broker, "stream", 3, *s3, env=creds)
    rows = _output(tmp_path)
    ends = broker.end_offsets("stream")
    assert len(ends) == 4 and all(ends.values()), ends
    assert _positions(rows) == Counter({("stream", p, o): 1 for p, end in ends.items() for o in range(end)})
    assert Counter((r["key"], r["value"]) for r in rows) == Counter(written)
    assert "done:" in text
