"""The local session's settings: Python workers over Unix sockets unless the caller says otherwise."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from filesink.localspark import UNIX_SOCKETS, session_conf


def test_the_local_session_talks_to_python_workers_over_unix_sockets() -> None:
    conf = session_conf(3)
    assert conf[UNIX_SOCKETS] == "true"
    assert conf["spark.master"] == "local[3]"
    assert conf["spark.sql.shuffle.partitions"] == "3"


def test_the_callers_settings_win() -> None:
    conf = session_conf(2, {UNIX_SOCKETS: "false", "spark.sql.session.timeZone": "Europe/Paris"})
    assert conf[UNIX_SOCKETS] == "false"
    assert conf["spark.sql.session.timeZone"] == "Europe/Paris"
    assert conf["spark.master"] == "local[2]"


def test_a_python_task_of_the_local_session_runs_over_them(spark: Any) -> None:
    """The setting reaches Spark, and Python tasks run with it: every row crosses to the workers and back."""
    assert spark.sparkContext.getConf().get(UNIX_SOCKETS) == "true"

    def double(batches: Any) -> Any:
        for batch in batches:
            yield pa.record_batch([pc.multiply(batch.column(0), 2)], names=["id"])

    rows = spark.range(0, 1000, 1, 4).mapInArrow(double, "id long").collect()
    assert sorted(r.id for r in rows) == [2 * i for i in range(1000)]
