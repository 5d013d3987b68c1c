"""The tests' side of ``spark_sql_job.py``: one Spark with the Delta and Iceberg connectors (``engines_env.py``),
started once, asked many requests, each answer awaited with a deadline."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import pytest
from engines_env import Engines, pinned_engines
from helpers import SUPPORT, kill, wait_for_line

START_DEADLINE = 180.0
"""Seconds for the JVM, Spark and the connectors to start (about 10-20 s; the machine may be shared)."""
ANSWER_DEADLINE = 180.0
"""Seconds for one request's statements (a rewrite of a table's files is a Spark job)."""
EXIT_DEADLINE = 60.0
ANSWER = "answer: "
"""``spark_sql_job.ANSWER`` (not imported: that module needs pyspark 4.1's environment)."""


def engines_or_skip() -> Engines:
    """The pinned environment, built if need be; the test is skipped with the reason when it cannot be."""
    engines, reason = pinned_engines()
    if engines is None:
        pytest.skip(f"no Spark with the Delta and Iceberg connectors: {reason}")
    return engines


def s3_setup(settings: Any) -> dict[str, str]:
    """What the job needs of a test S3 server (``S3Settings``)."""
    return {
        "endpoint": settings.endpoint,
        "access_key": settings.access_key,
        "secret_key": settings.secret_key,
        "region": getattr(settings, "region", None) or "us-east-1",
    }


def embedded_catalog(table: Path) -> dict[str, str]:
    """Iceberg's JdbcCatalog on the sink's embedded SQLite catalog beside a local table."""
    from table_checker import EMBEDDED_CATALOG

    return {"uri": f"jdbc:sqlite:{table / EMBEDDED_CATALOG}", "warehouse": f"file://{table}"}


def jdbc_catalog(sqlalchemy_uri: str, warehouse: str, name: str = "filesink") -> dict[str, str]:
    """Iceberg's JdbcCatalog named ``name`` on the database of a SQLAlchemy URI
    (``postgresql+psycopg2://user:pw@host:port/db`` or ``sqlite:////path``), as pyiceberg's SqlCatalog names it."""
    if sqlalchemy_uri.startswith("sqlite:///"):
        return {"uri": "jdbc:sqlite:" + sqlalchemy_uri.removeprefix("sqlite:///"), "warehouse": warehouse, "name": name}
    parts = urlsplit(sqlalchemy_uri)
    assert parts.scheme.startswith("postgresql"), sqlalchemy_uri
    host = f"{parts.hostname}:{parts.port}" if parts.port else str(parts.hostname)
    catalog = {"uri": f"jdbc:postgresql://{host}{parts.path}", "warehouse": warehouse, "name": name}
    if parts.username:
        catalog["jdbc.user"] = unquote(parts.username)
    if parts.password:
        catalog["jdbc.password"] = unquote(parts.password)
    return catalog


class SparkSQL:
    """A running ``spark_sql_job.py``: :meth:`ask` sends statements, :meth:`close` ends it."""

    def __init__(self, engines: Engines, log: Path, s3: dict[str, str] | None = None):
        setup = {"jars": [str(j) for j in engines.jars], "s3": s3}
        self._sent: list[list[str]] = []
        self.log = log
        self._log = log.open("w")
        self.proc = subprocess.Popen(
            [str(engines.python), str(SUPPORT / "spark_sql_job.py"), json.dumps(setup)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
            start_new_session=True,
            env=_java_env(),
        )
        wait_for_line(self.proc, "ready\n", START_DEADLINE, f"Spark with the connectors to start (log: {log})")

    def ask(
        self, statements: list[str], catalog: dict[str, str] | None = None, timeout: float = ANSWER_DEADLINE
    ) -> list[dict[str, Any]]:
        """Each statement's answer (``{"columns", "rows"}`` or ``{"error"}``), run in a session whose Iceberg
        catalog has ``catalog``'s properties."""
        self.send(statements, catalog)
        return self.receive(timeout)

    def send(self, statements: list[str], catalog: dict[str, str] | None = None) -> None:
        """Send a request without waiting for its answer (:meth:`receive`): Spark runs it while the test goes on."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"catalog": catalog, "statements": statements}) + "\n")
        self.proc.stdin.flush()
        self._sent.append(statements)

    def receive(self, timeout: float = ANSWER_DEADLINE) -> list[dict[str, Any]]:
        """The answer to the oldest request sent and not yet answered."""
        statements = self._sent.pop(0)
        line = wait_for_line(
            self.proc,
            lambda text: text.startswith(ANSWER),
            timeout,
            f"Spark's answer to {statements} (log: {self.log})",
            skip=True,
        )
        answers: list[dict[str, Any]] = json.loads(line.removeprefix(ANSWER))
        return answers

    def rows(self, statement: str, catalog: dict[str, str] | None = None) -> list[list[Any]]:
        """The rows of one statement, which must succeed."""
        [answer] = self.ask([statement], catalog)
        assert "error" not in answer, f"Spark refused {statement}: {answer['error']}"
        rows: list[list[Any]] = answer["rows"]
        return rows

    def close(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            try:
                self.proc.wait(EXIT_DEADLINE)
            except subprocess.TimeoutExpired:
                kill(self.proc)
        self._log.close()

    def __enter__(self) -> SparkSQL:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _java_env() -> dict[str, str]:
    """This process's environment without what would point the job at the test environment's Spark or Python."""
    import os

    dropped = ("SPARK_HOME", "PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "SPARK_CONF_DIR")
    return {k: v for k, v in os.environ.items() if k not in dropped and not k.startswith("PYSPARK_")}
