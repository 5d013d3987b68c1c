"""The way docs/kafka.md gives from a fresh clone to a Kafka run, as a user takes it: ``bash scripts/kafka.sh`` in
a clone of this checkout (its own ``.venv-kafka``: pyspark 4.1.1 from PyPI), ``filesink kafka-broker`` with
generated events, ``filesink run --format kafka`` with nothing but the brokers and the topic, SIGKILLed once and
run again with ``--available-now``; every event once in the output. In the chaos tier: the set-up installs pyspark
(minutes, pip's cache helps), and the default tier runs the same commands in the tests' own pyspark 4.1.1.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
from collections import Counter
from pathlib import Path

import pytest
from helpers import communicate, kill, wait_for_line, wait_until
from kafka_env import output_rows

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(1800)]

ROOT = Path(__file__).resolve().parents[2]
SETUP_DEADLINE = 1200.0
RUN_DEADLINE = 400.0
SCHEMA = "user_id bigint, event string, amount double, seq bigint"


def _env() -> dict[str, str]:
    return {
        k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYSPARK_PYTHON", "SPARK_HOME", "PYTHONPATH")
    }


def _broker(filesink: str, clone: Path, *args: str) -> subprocess.Popen[str]:
    """``filesink kafka-broker ARGS`` in the clone, its output on a pipe, in a process group of its own."""
    return subprocess.Popen(
        [filesink, "kafka-broker", *args],
        cwd=clone,
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def test_from_a_fresh_clone_to_every_event_once(tmp_path: Path) -> None:
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True, timeout=120)
    setup = subprocess.run(
        ["bash", "scripts/kafka.sh"], cwd=clone, env=_env(), capture_output=True, text=True, timeout=SETUP_DEADLINE
    )
    assert setup.returncode == 0, (setup.stdout + setup.stderr)[-4000:]
    assert "==> ready: .venv-kafka (pyspark 4.1.1)" in setup.stdout, setup.stdout[-3000:]
    filesink = str(clone / ".venv-kafka" / "bin" / "filesink")

    broker = _broker(filesink, clone, "--port", "0", "--produce", "300")
    try:
        line = wait_for_line(broker, lambda x: x.startswith("kafka broker: listening on"), 300, "the broker", skip=True)
        bootstrap = re.search(r"listening on (\S+)", line).group(1)  # type: ignore[union-attr]
        wait_for_line(broker, lambda x: x.startswith("producing 300"), 60, "the producer", skip=True)
        run = [filesink, "run", "--format", "kafka", "--kafka-bootstrap", bootstrap, "--topics", "events"]
        run += ["--kafka-value", "json", "--schema", SCHEMA, "--key", "user_id", "--output", "./kafka-out"]
        run += ["--state-dir", "./kafka-state", "--max-file-age", "5s"]
        log = (tmp_path / "run.log").open("w")
        first = subprocess.Popen(
            [*run, "--trigger", "2s"],
            cwd=clone,
            env=_env(),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        commits = clone / "kafka-state" / "checkpoint" / "commits"
        wait_until(
            lambda: commits.is_dir() and len([p for p in commits.iterdir() if p.name.isdigit()]) >= 3,
            RUN_DEADLINE,
            "three committed batches",
            proc=first,
        )
        kill(first, group=True)
        os.killpg(broker.pid, signal.SIGTERM)  # the producer flushes; the broker stops
        said, _ = communicate(broker, 120, "the broker to stop")
        written = int(re.search(r"([\d,]+) events written", said).group(1).replace(",", ""))  # type: ignore[union-attr]
        broker = _broker(filesink, clone, "--port", bootstrap.rsplit(":", 1)[1], "--produce", "0")
        wait_for_line(broker, lambda x: x.startswith("topic events: there already"), 300, "the broker", skip=True)
        last = subprocess.run(
            [*run, "--available-now"], cwd=clone, env=_env(), capture_output=True, text=True, timeout=RUN_DEADLINE
        )
        assert last.returncode == 0, (last.stdout + last.stderr)[-4000:]
    finally:
        if broker.poll() is None:
            os.killpg(broker.pid, signal.SIGTERM)
            communicate(broker, 120, "the broker to stop")
    rows = output_rows(clone / "kafka-out")
    assert Counter(r["seq"] for r in rows) == Counter(range(written))
    assert len({(r["partition"], r["offset"]) for r in rows}) == len(rows) == written
