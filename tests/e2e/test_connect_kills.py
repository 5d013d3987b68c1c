"""Random kill campaigns through Spark Connect: the sink opens on a Connect server (pyspark's own, on loopback),
in the query's foreachBatch process; the client (``tests/support/connect_job.py``) runs in a process of its own.

At random moments either the server is SIGKILLed (its JVM, its foreachBatch process and its Python workers; the
client, which then fails or hangs, is killed too), or only the client. A killed client leaves its query running
on the server (a Connect session outlives its client): the restart, on the same server with the same checkpoint,
stops that old run (Spark stops an active run of a query restarted from its checkpoint,
``spark.sql.streaming.stopActiveRunOnRestart``, on by default) and waits for the sink's lock until the old
foreachBatch process is gone. Every restart runs at another sink parallelism, a restarted server at another
``local[N]``. After every kill nothing but whole Parquet files of the sink is under the output; at the end the
output equals the input exactly (lost, duplicated and unexpected rows counted separately). Seeded: a failure names
its seed, and the same seed draws the same campaign (the moments depend on the machine's speed).
"""

from __future__ import annotations

import contextlib
import random
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from checker import Report, check, stray_objects
from connect_server import ConnectServer, connect_client_env
from helpers import SUPPORT, communicate, readline_with_deadline
from helpers import kill as kill_process
from sink_helpers import input_file

JOB = SUPPORT / "connect_job.py"
LINE_TIMEOUT = 240.0
"""Seconds to wait for the client's next line: a Connect session, the sink's recovery on the server, or a batch
(each starts Spark jobs on a busy 2-core server)."""
LAST_RUN_TIMEOUT = 420.0
STOPPED_OLD_RUN = "Stopping existing streaming query"
"""What the server logs when a restart from the checkpoint stops the run a killed client left behind."""
SPARK_WORKER_START = "Python worker failed to connect back"
"""Spark waits a fixed 10 s for a new Python worker to connect back (no setting changes it); on a busy machine a
client may fail of that alone. Such a round is run again; it is not a kill and proves nothing either way."""


@dataclass
class Servers:
    """The campaign's Connect servers (one at a time); every one is killed at the end, whatever happened."""

    root: Path
    started: list[ConnectServer] = field(default_factory=list)
    current: ConnectServer | None = None

    def url(self, rng: random.Random) -> str:
        """The running server's URL; a new server at a random ``local[N]`` (N in 1..3) if none runs."""
        if self.current is None:
            n = rng.randint(1, 3)
            server = ConnectServer(self.root / f"server-{len(self.started)}", master=f"local[{n}]")
            self.started.append(server)
            server.start()
            self.current = server
        return self.current.url

    def kill(self) -> None:
        if self.current is not None:
            self.current.kill()
            self.current = None

    def close(self) -> None:
        for server in self.started:
            server.kill()

    def count(self, text: str) -> int:
        """Lines of the servers' logs that hold ``text``."""
        return sum(line.count(text) for s in self.started for line in s.log().splitlines())

    def logs(self) -> str:
        """The ends of the servers' logs, for a failure message."""
        return "".join(f"\n--- {s.log_path} (end):\n{s.log()[-4000:]}" for s in self.started)


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[Servers]:
    s = Servers(tmp_path / "servers")
    try:
        yield s
    finally:
        s.close()


class Clients:
    """The campaign's client processes; every one is killed at the end."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.started: list[subprocess.Popen[str]] = []

    def start(self, url: str, parallelism: int) -> subprocess.Popen[str]:
        t = self.tmp_path
        args = [sys.executable, str(JOB), url, str(t / "input"), str(t / "out"), str(t / "state")]
        args += [str(t / "checkpoint"), str(parallelism)]
        proc = subprocess.Popen(
            args,
            env=connect_client_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        self.started.append(proc)
        return proc

    def close(self) -> None:
        for proc in self.started:
            _kill(proc)


@pytest.fixture
def clients(tmp_path: Path) -> Iterator[Clients]:
    c = Clients(tmp_path)
    try:
        yield c
    finally:
        c.close()


def _kill(proc: subprocess.Popen[str]) -> str:
    """SIGKILL the client's process group (unless it ended and was reaped: its id may be another's by now); what
    is left of its stderr."""
    if proc.poll() is None:
        kill_process(proc, group=True, timeout=60)
    err = ""
    assert proc.stdout is not None and proc.stderr is not None
    if not proc.stderr.closed:
        with contextlib.suppress(OSError, ValueError):
            err = proc.stderr.read()
    proc.stdout.close()
    proc.stderr.close()
    return err


def _write_input(tmp_path: Path, seed: int, inputs: int) -> Counter:
    expected: Counter = Counter()
    for b in range(inputs):
        expected += input_file(tmp_path / "input", b, 200, seed=seed)
    return expected


def campaign(
    tmp_path: Path, servers: Servers, clients: Clients, seed: int, kills: int, inputs: int
) -> tuple[Report, dict[str, object]]:
    """``kills`` kills at random moments, each of the server (and its client) or of the client alone, restarting
    each time at another parallelism; then a last run to the end, ``flush()``, and the check."""
    rng = random.Random(seed)
    expected = _write_input(tmp_path, seed, inputs)
    out = str(tmp_path / "out")
    figures: dict[str, object] = {"seed": seed, "server kills": 0, "client kills": 0}
    parallelism = rng.choice([1, 2, 3, 4])
    landed = rounds = 0
    while landed < kills:
        rounds += 1
        assert rounds <= 2 * kills, f"seed {seed}: only {landed} of {kills} kills landed in {rounds - 1} rounds"
        parallelism = rng.choice([p for p in (1, 2, 3, 4) if p != parallelism])
        target = rng.choice(["server", "client"])
        batches = rng.randrange(0, 3) + 1  # lines to wait for: "started", then batches
        pause = rng.uniform(0.0, 1.5)
        proc = clients.start(servers.url(rng), parallelism)
        for _ in range(batches):
            if not readline_with_deadline(proc, LINE_TIMEOUT, f"seed {seed}: the client's next line"):
                break
        time.sleep(pause)
        alive = proc.poll() is None
        if target == "server":
            servers.kill()  # the JVM, the foreachBatch process and the file writers at once
        err = _kill(proc)  # with its server gone the client fails or hangs; alone, its query runs on
        if not alive:
            # It ended before the kill: the input ran out, or it failed (a failure is a finding, but Spark's
            # Python worker start on a busy machine, which is only run again).
            if SPARK_WORKER_START in err:
                figures["rounds run again"] = int(str(figures.get("rounds run again", 0))) + 1
                continue
            pytest.fail(f"seed {seed}: the client ended before kill {landed + 1}:\n{err[-5000:]}{servers.logs()}")
        landed += 1
        figures[f"{target} kills"] = int(str(figures[f"{target} kills"])) + 1
        assert stray_objects(out, None) == [], f"seed {seed}: after kill {landed} ({target})"
    for attempt in (1, 2):
        parallelism = rng.choice([p for p in (1, 2, 3, 4) if p != parallelism])
        proc = clients.start(servers.url(rng), parallelism)
        out_text, err = communicate(proc, LAST_RUN_TIMEOUT, f"seed {seed}: the last run to finish")
        if proc.returncode == 0 or SPARK_WORKER_START not in err or attempt == 2:
            break
    assert proc.returncode == 0 and out_text.endswith("done\n"), f"seed {seed}: {err[-5000:]}{servers.logs()}"
    figures["servers started"] = len(servers.started)
    figures["old runs stopped by a restart"] = servers.count(STOPPED_OLD_RUN)
    return check(out, None, expected), figures


def _report(report: Report, figures: dict[str, object], capsys: pytest.CaptureFixture[str], request) -> None:
    with capsys.disabled():
        print("\n" + report.line(**figures))
    request.node.user_properties.append(("campaign", {**figures, **report.counts()}))
    assert report.anomalies == 0, report.line(**figures)


@pytest.mark.slow
# The chaos tier's: the default tier keeps a restart through Connect (tests/e2e/test_connect.py) and the classic
# kill campaigns of the same sink (tests/e2e/test_sink_kills.py).
@pytest.mark.chaos
@pytest.mark.timeout(600)  # 132-199 s measured on a busy 2-core machine
def test_connect_server_and_client_kills_at_random_moments(tmp_path, servers, clients, capsys, request):
    """Seed 47 kills the client twice (each restart on the same server stops the run the killed client left), then
    the server; the last run is on a new server."""
    report, figures = campaign(tmp_path, servers, clients, seed=47, kills=3, inputs=16)
    _report(report, figures, capsys, request)


CHAOS_SEEDS = range(300, 306)


@pytest.mark.chaos
@pytest.mark.timeout(1800)  # 391 s measured for seed 300 (8 server and 2 client kills), 2-core machine
@pytest.mark.parametrize("seed", CHAOS_SEEDS)
def test_chaos_connect_campaign(tmp_path, servers, clients, capsys, request, seed):
    """The on-demand Connect campaign: 6 seeds x 10 kills of the server or the client."""
    report, figures = campaign(tmp_path, servers, clients, seed=seed, kills=10, inputs=40)
    _report(report, figures, capsys, request)
