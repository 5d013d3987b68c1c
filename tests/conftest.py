"""Shared pytest fixtures."""

from __future__ import annotations

import dataclasses
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cluster import SparkCluster
from faultproxy import PROXY_READ_TIMEOUT, FaultProxy
from s3servers import S3_SERVERS, MotoServer, RcloneServer
from session import XDIST_WORKER, session_root

from filesink.demo.s3server import S3Settings, SeaweedServer, ensure_bucket, settings_from_env
from logstore import LogStore

# ---------------------------------------------------------------------------------------------------------
# S3 test server (see docs/testing.md)
#
# One server per test session: an external S3 server when FILESINK_TEST_S3_ENDPOINT is set, otherwise a
# SeaweedFS `weed mini` on 127.0.0.1 with random credentials. A server that does not come up is a test
# error carrying the server's log, never a skip.
# ---------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Settings]:
    """Settings of the session's S3 server, with its bucket created."""
    external = settings_from_env()
    if external is not None:
        ensure_bucket(external)
        yield external
        return
    server = SeaweedServer(tmp_path_factory.mktemp("seaweedfs"))
    settings = server.start()
    try:
        yield settings
    finally:
        server.stop()


@pytest.fixture
def s3_prefix(s3_server: S3Settings) -> str:
    """A fresh ``s3://<bucket>/test-<uuid hex>`` URL (no trailing slash) for one test."""
    return s3_server.url(f"test-{uuid.uuid4().hex}")


@pytest.fixture
def s3_options(s3_server: S3Settings) -> dict[str, Any]:
    """fsspec / s3fs storage options for ``s3_server``."""
    return s3_server.storage_options()


# Two more S3 servers for the contract and end-to-end tests that run on every server (docs/testing.md has the
# matrix of what each supports): moto's server and rclone's `serve s3`, each started once per session on
# 127.0.0.1 with random credentials and a bucket. Tests that take `any_s3_server` run once per server.


@pytest.fixture(scope="session")
def moto_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Settings]:
    """Settings of a moto S3 server (``moto_server``) on 127.0.0.1, with its bucket created."""
    with MotoServer(tmp_path_factory.mktemp("moto")) as settings:
        yield settings


@pytest.fixture(scope="session")
def rclone_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Settings]:
    """Settings of ``rclone serve s3`` over a local directory on 127.0.0.1, with its bucket."""
    with RcloneServer(tmp_path_factory.mktemp("rclone")) as settings:
        yield settings


@pytest.fixture(params=list(S3_SERVERS))
def any_s3_server(request: pytest.FixtureRequest) -> S3Settings:
    """Each S3 server in turn (the test runs once per server; its id names the server)."""
    settings: S3Settings = request.getfixturevalue(S3_SERVERS[request.param])
    return settings


@pytest.fixture
def any_s3_prefix(any_s3_server: S3Settings) -> str:
    """A fresh ``s3://<bucket>/test-<uuid hex>`` URL on ``any_s3_server``."""
    return any_s3_server.url(f"test-{uuid.uuid4().hex}")


# --------------------------------------------- end of S3 test servers -------------------------------------


# ---------------------------------------------------------------------------------------------------------
# Log stores: the same contract tests run on local disk and on the S3 test server
# ---------------------------------------------------------------------------------------------------------


@pytest.fixture(params=["local", "s3", "moto", "rclone"])
def log_url(request, tmp_path):
    """(URL, storage options) of an empty log store location: local, or on each S3 server ("s3": SeaweedFS)."""
    if request.param == "local":
        return str(tmp_path / "log"), {}
    if request.param == "s3":
        return request.getfixturevalue("s3_prefix") + "/log", request.getfixturevalue("s3_options")
    server: S3Settings = request.getfixturevalue(S3_SERVERS[request.param])
    return server.url(f"test-{uuid.uuid4().hex}", "log"), server.storage_options()


@pytest.fixture
def open_store(tmp_path, log_url):
    """Open the log store at ``log_url`` with its state database in ``tmp_path / "state"``."""
    url, options = log_url
    stores = []

    def factory(vnodes=16):
        store = LogStore.open(tmp_path / "state", url, vnodes=vnodes, storage_options=options)
        stores.append(store)
        return store

    yield factory
    for store in stores:
        store.close()


# ---------------------------------------------------------------------------------------------------------
# Spark: one local session per test run (local[2], no UI)
# ---------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def spark():
    from filesink.cli.localspark import local_spark

    session = local_spark("filesink-tests")
    yield session
    session.stop()


# ---------------------------------------------------------------------------------------------------------
# Failpoint coverage: every process of the session logs the failpoints that fire (FILESINK_FAILPOINT_DIR);
# test_failpoint_coverage.py runs last and checks that each failpoint in the source fired somewhere (with
# pytest-xdist, after the other workers have finished: each marks its end in the run's root directory).
# ---------------------------------------------------------------------------------------------------------

COVERAGE_TEST = "test_failpoint_coverage.py"
LONGEST = ("test_sink_kills.py",)
"""Files of the longest tests (minutes each): they start first."""


_session_root: list[Path] = []


def pytest_sessionfinish(session: pytest.Session) -> None:
    if XDIST_WORKER and _session_root:
        (_session_root[0] / f"finished-{XDIST_WORKER}").touch()


@pytest.fixture(scope="session", autouse=True)
def failpoint_log(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    from logstore.failpoints import DIR_VAR

    _session_root.append(session_root(tmp_path_factory))
    shared = tmp_path_factory.mktemp("failpoints")
    before = os.environ.get(DIR_VAR)
    os.environ[DIR_VAR] = str(shared)
    yield
    if before is None:
        os.environ.pop(DIR_VAR, None)
    else:
        os.environ[DIR_VAR] = before


@pytest.fixture(scope="session", autouse=True)
def segment_cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The segment cache of every process of the session (logstore.segment_cache) in the session's temp directory,
    not the machine's: the tests leave no copies behind, and sessions running side by side do not evict each
    other's. On for every S3 log store of the tests, so their reads go through it."""
    from logstore.segment_cache import DIR_VAR

    before = os.environ.get(DIR_VAR)
    os.environ[DIR_VAR] = str(tmp_path_factory.mktemp("segment-cache"))
    yield
    if before is None:
        os.environ.pop(DIR_VAR, None)
    else:
        os.environ[DIR_VAR] = before


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests marked ``slow`` first (so that with pytest-xdist the long ones run side by side, and the short ones
    fill the gaps), the failpoint coverage test last."""
    last = [i for i in items if i.path.name == COVERAGE_TEST]
    rest = [i for i in items if i.path.name != COVERAGE_TEST]
    slow = sorted((i for i in rest if i.get_closest_marker("slow")), key=lambda i: i.path.name not in LONGEST)
    items[:] = slow + [i for i in rest if not i.get_closest_marker("slow")] + last


# ---------------------------------------------------------------------------------------------------------
# S3 through a fault-injecting proxy (tests/faultproxy.py)
# ---------------------------------------------------------------------------------------------------------

"""Read timeout of the clients ``proxy_options`` makes: a ``timeout`` fault costs about this long."""


@pytest.fixture
def fault_proxy(s3_server: S3Settings) -> Iterator[FaultProxy]:
    """A :class:`FaultProxy` on 127.0.0.1 in front of ``s3_server``; it injects nothing until given rules."""
    with FaultProxy(s3_server.endpoint, hold_seconds=10 * PROXY_READ_TIMEOUT) as proxy:
        yield proxy


@pytest.fixture
def proxy_options(s3_server: S3Settings, fault_proxy: FaultProxy) -> dict[str, Any]:
    """fsspec / s3fs storage options for ``s3_server`` through ``fault_proxy``, with short timeouts."""
    options = dataclasses.replace(s3_server, endpoint=fault_proxy.endpoint).storage_options()
    options["config_kwargs"] = {"read_timeout": PROXY_READ_TIMEOUT, "connect_timeout": PROXY_READ_TIMEOUT}
    return options


# ---------------------------------------------------------------------------------------------------------
# A Spark standalone cluster: a master and two workers (1 core, 1 GiB each) on 127.0.0.1 (tests/cluster.py)
# ---------------------------------------------------------------------------------------------------------


@pytest.fixture
def spark_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkCluster]:
    """A started cluster (``master_url``, ``state()``, ``executor_pids()``, ...), stopped with its executors after
    the test. One that does not come up is a test error carrying the daemons' logs."""
    cluster = SparkCluster(tmp_path_factory.mktemp("spark-cluster"), workers=2, cores=1, memory="1g")
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


# ---------------------------------------------------------------------------------------------------------
# Campaign totals: kill campaigns record their figures in user_properties (which pytest-xdist carries back
# from its workers); the session ends with one line per campaign and one line of totals.
# ---------------------------------------------------------------------------------------------------------


def pytest_terminal_summary(terminalreporter) -> None:
    campaigns = [
        value
        for outcome in ("passed", "failed")
        for report in terminalreporter.stats.get(outcome, [])
        if getattr(report, "when", None) == "call"
        for name, value in getattr(report, "user_properties", [])
        if name == "campaign"
    ]
    if not campaigns:
        return
    terminalreporter.section("kill campaigns")
    totals: dict[str, int] = {}
    for figures in sorted(campaigns, key=lambda f: f.get("seed", 0)):
        terminalreporter.write_line(", ".join(f"{k} {v}" for k, v in figures.items()))
        for key, value in figures.items():
            if key != "seed" and isinstance(value, int):
                totals[key] = totals.get(key, 0) + value
    head = f"campaigns {len(campaigns)}, " + ", ".join(f"{k} {v}" for k, v in totals.items())
    terminalreporter.write_line(f"total: {head}")


# ---------------------------------------------------------------------------------------------------------
# PostgreSQL: one throwaway server per test session, for SQL catalogs (tests/support/postgres.py). One that cannot
# start here (no binaries, no unprivileged user to run it as root, ...) skips the tests that use it, with the reason.
# ---------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def postgres_uri() -> Iterator[str]:
    """The SQLAlchemy URI (``postgresql+psycopg2://...``) of the session's PostgreSQL server."""
    from postgres import PostgresServer, PostgresUnavailable

    server = PostgresServer()
    try:
        uri = server.start()
    except PostgresUnavailable as e:
        pytest.skip(f"no PostgreSQL server could be started: {e}")
    try:
        yield uri
    finally:
        server.stop()
