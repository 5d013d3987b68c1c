"""How ``filesink run --format kafka`` gets Spark's Kafka source, on the Spark that has one (pyspark 4.1.1, the tests'
second environment of ``engines_env.py``, as ``scripts/kafka.sh`` sets it up for a user), with nothing given but
the brokers and topics, as docs/kafka.md says.

What a user met: a local Maven repository (``~/.m2``) holding a dependency's pom without its jar. Spark's own
resolver (``spark.jars.packages``) reads that repository first and stops on it; the run's own fetch reads Maven
Central only, into a cache of its own, and goes on. The JVMs' home is pointed at a directory holding such a pom
(``JAVA_TOOL_OPTIONS=-Duser.home=...``), and the run's cache is empty, so that the fetch really resolves.

In the chaos tier (about 90 s, a resolution from Maven Central each time): the default tier's Kafka runs fetch the
source the same way (``test_kafka.py``), and ``tests/filesink/cli/test_kafka_jars.py`` checks in seconds, against a
repository served on loopback, that the fetch reads no local Maven repository.
"""

from __future__ import annotations

import os
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from engines_env import cache_root
from kafka_env import KafkaBroker, kafka_home, output_rows, start_broker
from spark_engines import engines_or_skip

pytestmark = pytest.mark.timeout(1200)

ROOT = Path(__file__).resolve().parents[2]
RUN_DEADLINE = 400.0
"""Seconds for one ``--available-now`` run, with a resolution from Maven Central (the machine may be shared)."""
SOURCE = "org.apache.spark:spark-sql-kafka-0-10_2.13:4.1.1"


@pytest.fixture
def broker(tmp_path: Path) -> Any:
    jars, reason = kafka_home()
    if jars is None:
        pytest.skip(f"no Kafka broker: {reason}")
    broker = start_broker(jars, tmp_path / "kafka")
    try:
        yield broker
    finally:
        broker.stop()


def _run(tmp_path: Path, broker: KafkaBroker, *extra: str, env: dict[str, str]) -> tuple[int, str]:
    engines = engines_or_skip()
    args = [
        str(engines.python),
        *("-m", "filesink", "run", "--format", "kafka", "--kafka-bootstrap", broker.bootstrap, "--topics", "events"),
        *("--output", str(tmp_path / "out"), "--state-dir", str(tmp_path / "state"), "--available-now", *extra),
    ]
    environ = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYSPARK_PYTHON", "SPARK_HOME")}
    environ.update(env, PYTHONPATH=str(ROOT))
    try:
        done = subprocess.run(
            args, env=environ, capture_output=True, text=True, timeout=RUN_DEADLINE, check=False, start_new_session=True
        )
    except subprocess.TimeoutExpired as e:
        raise AssertionError(f"the run did not end within {RUN_DEADLINE:g} s: {str(e.stdout)[-3000:]}") from None
    return done.returncode, done.stdout + done.stderr


@pytest.mark.chaos
def test_the_kafka_source_is_fetched_past_a_broken_local_maven_repository(tmp_path: Path, broker: KafkaBroker) -> None:
    broker.create_topic("events", 2)
    written = [(f"k{i % 7}", f"v{i}") for i in range(300)]
    broker.produce("events", written)
    home = tmp_path / "home"
    pom = home / ".m2" / "repository" / "org" / "slf4j" / "slf4j-api" / "2.0.17" / "slf4j-api-2.0.17.pom"
    pom.parent.mkdir(parents=True)
    pom.write_text(
        '<project xmlns="http://maven.apache.org/POM/4.0.0"><modelVersion>4.0.0</modelVersion>'
        "<groupId>org.slf4j</groupId><artifactId>slf4j-api</artifactId><version>2.0.17</version></project>"
    )
    env = {"JAVA_TOOL_OPTIONS": f"-Duser.home={home}", "FILESINK_CACHE": str(tmp_path / "cache")}

    # Spark's own resolver, as the run used it before: stopped by the pom without its jar, and said so
    ivy = cache_root() / "spark-ivy-for-kafka-tests"  # Spark's downloads of the others, kept between test runs
    code, said = _run(
        tmp_path, broker, "--conf", f"spark.jars.packages={SOURCE}", "--conf", f"spark.jars.ivy={ivy}", env=env
    )
    assert code == 1, said[-4000:]
    assert "download failed: org.slf4j#slf4j-api;2.0.17!slf4j-api.jar" in said, said[-4000:]
    assert "did not start with the packages given by --conf spark.jars.packages" in said, said[-4000:]
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").rglob("*.parquet"))

    # the run's own fetch: Maven Central only, into its cache; every record once
    code, said = _run(tmp_path, broker, env=env)
    assert code == 0, said[-4000:]
    assert f"fetching Spark 4.1.1's Kafka source ({SOURCE}) from Maven Central" in said, said[-4000:]
    fetched = sorted(p.name for p in (tmp_path / "cache" / "jars").glob("spark-sql-kafka-*/jars/*.jar"))
    assert [n.rsplit("-", 1)[0] for n in fetched] == [
        "commons-pool2",
        "kafka-clients",
        "spark-sql-kafka-0-10_2.13",
        "spark-token-provider-kafka-0-10_2.13",
    ]  # what pyspark ships (slf4j-api among them) is not fetched again
    rows = output_rows(tmp_path / "out")
    assert Counter((r["key"], r["value"]) for r in rows) == Counter(written)
    assert Counter((r["partition"], r["offset"]) for r in rows) == Counter(
        (p, o) for p, end in broker.end_offsets("events").items() for o in range(end)
    )
