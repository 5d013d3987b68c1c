"""The settings of the local session that ``filesink run``, the demo, the tests and the benchmarks start."""

from __future__ import annotations

from filesink.cli.localspark import UNIX_SOCKETS, session_conf


def test_the_local_session_keeps_sparks_python_workers_on_tcp() -> None:
    """Unix sockets are faster, but Spark's daemon then prints a traceback for each worker of a failed task
    (docs/benchmarks.md): the default stays Spark's."""
    conf = session_conf(3)
    assert UNIX_SOCKETS not in conf
    assert conf["spark.master"] == "local[3]"
    assert conf["spark.sql.shuffle.partitions"] == "3"
    assert conf["spark.sql.session.timeZone"] == "UTC"


def test_the_callers_settings_win() -> None:
    conf = session_conf(2, {UNIX_SOCKETS: "true", "spark.sql.session.timeZone": "Europe/Paris"})
    assert conf[UNIX_SOCKETS] == "true"
    assert conf["spark.sql.session.timeZone"] == "Europe/Paris"
    assert conf["spark.master"] == "local[2]"
