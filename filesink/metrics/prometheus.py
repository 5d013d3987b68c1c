"""Prometheus exposition of a sink's figures (:mod:`filesink.metrics.figures`) from the driver, at ``http://A:N/metrics``.

Imported only when a sink is given ``metrics_port`` (``filesink run --metrics-port``): it needs the ``metrics``
extra (``prometheus_client``). A collector of its own reads the sink's in-memory figures at each scrape; the server
is ``prometheus_client``'s own (``start_http_server``: a daemon thread), on a registry of its own (not the process's
default one).
"""

from __future__ import annotations

import errno
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from ..errors import MetricsPortError, SinkOptionError
from .figures import BUCKETS, SinkMetrics, Timing

COUNTERS = (
    ("filesink_rows_appended", "Rows this run appended to the log store.", "rows_appended"),
    (
        "filesink_rows_committed",
        "Rows of the files this run committed (recovery's at start included).",
        "rows_committed",
    ),
    ("filesink_files_committed", "Files this run committed (recovery's at start included).", "files_committed"),
    ("filesink_bytes_committed", "Bytes of the files this run committed.", "bytes_committed"),
    (
        "filesink_query_restarts",
        "Times filesink run restarted the streaming query past SPARK-55271 (Spark 4.1's Kafka source).",
        "query_restarts",
    ),
)
GAUGES = (
    ("filesink_rows_held", "Rows the log store holds that no committed file holds yet.", "rows_held"),
    ("filesink_log_bytes_held", "The log store's bytes of the rows held.", "log_bytes_held"),
    ("filesink_epochs_held", "Epochs of which some rows are held.", "epochs_held"),
    (
        "filesink_oldest_held_epoch_age_seconds",
        "Seconds since the oldest held epoch was sealed (visibility lag; 0 when nothing is held).",
        "oldest_held_epoch_age_seconds",
    ),
    ("filesink_pending_files", "Files pre-committed and not yet committed.", "pending_files"),
    ("filesink_writer_term", "The writer term this run took.", "writer_term"),
)
HISTOGRAMS = (
    ("filesink_append_seconds", "Duration of a batch's append (Spark job and seal).", "append"),
    ("filesink_roll_seconds", "Duration of a roll (plan, pre-commit, write, commit, clean-up).", "roll"),
    ("filesink_table_commit_seconds", "Duration of a roll's commit (table and ledger).", "table_commit"),
)


class SinkCollector:
    """Reads a sink's figures at scrape time (``snapshot``: the sink's ``metrics``)."""

    def __init__(self, snapshot: Callable[[], SinkMetrics]) -> None:
        self._snapshot = snapshot

    def describe(self) -> list[Any]:
        return []  # nothing to check at registration: the figures are read at each scrape

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import (
            CounterMetricFamily,
            GaugeMetricFamily,
            HistogramMetricFamily,
        )

        m = self._snapshot()
        sink = [m.sink]
        for name, text, attr in COUNTERS:
            counter = CounterMetricFamily(name, text, labels=["sink"])
            counter.add_metric(sink, getattr(m, attr))
            yield counter
        for name, text, attr in GAUGES:
            gauge = GaugeMetricFamily(name, text, labels=["sink"])
            gauge.add_metric(sink, getattr(m, attr))
            yield gauge
        for name, text, attr in HISTOGRAMS:
            timing: Timing = getattr(m, attr)
            histogram = HistogramMetricFamily(name, text, labels=["sink"])
            buckets = [(f"{bound:g}", n) for bound, n in zip(BUCKETS, timing.buckets, strict=True)]
            histogram.add_metric(sink, [*buckets, ("+Inf", timing.count)], timing.total_seconds)
            yield histogram
        labels = ["sink", "store", "kind"]
        requests = CounterMetricFamily("filesink_storage_requests", "Requests to object stores.", labels=labels)
        for (store, kind), n in sorted(m.storage_requests.items()):
            requests.add_metric([m.sink, store, kind], n)
        yield requests
        errors = CounterMetricFamily(
            "filesink_storage_errors", "Requests to object stores that failed after retries.", labels=labels
        )
        for (store, kind), n in sorted(m.storage_errors.items()):
            errors.add_metric([m.sink, store, kind], n)
        yield errors
        retries = CounterMetricFamily(
            "filesink_retries", "Storage request retries and Spark task re-attempts.", labels=["sink"]
        )
        retries.add_metric(sink, m.retries)
        yield retries
        refusals = CounterMetricFamily(
            "filesink_refusals", "Batches refused before anything was written.", labels=["sink", "reason"]
        )
        for reason, n in sorted(m.refusals.items()):
            refusals.add_metric([m.sink, reason], n)
        yield refusals
        fenced = CounterMetricFamily(
            "filesink_fenced", "Times this run found a newer run owns the sink.", labels=["sink"]
        )
        fenced.add_metric(sink, m.fenced)
        yield fenced


@dataclass(frozen=True)
class MetricsServer:
    """``prometheus_client``'s HTTP server of one sink's collector."""

    address: str
    port: int
    """The port it listens on (the one the OS chose, when asked for port 0)."""
    _server: Any

    @property
    def url(self) -> str:
        host = f"[{self.address}]" if ":" in self.address else self.address
        return f"http://{host}:{self.port}/metrics"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def serve(snapshot: Callable[[], SinkMetrics], address: str, port: int, where: str) -> MetricsServer:
    """Serve ``snapshot``'s figures at ``http://address:port/metrics`` (``where``: whose, for messages). A port in
    use, or an address this machine does not have, is :class:`MetricsPortError`; without ``prometheus_client``,
    :class:`SinkOptionError`."""
    if not isinstance(port, int) or isinstance(port, bool) or not 0 <= port <= 65535:
        raise SinkOptionError(f"metrics_port must be a port number from 0 to 65535 (0: any free port), not {port!r}")
    try:
        from prometheus_client import CollectorRegistry, start_http_server
    except ImportError:
        raise SinkOptionError(
            f"metrics_port={port} for {where}: serving metrics needs prometheus_client, which is not installed. "
            "Install the package's metrics extra (pip install 'exactly-once-parquet-sink[metrics]'), or leave "
            "metrics_port unset (filesink run: without --metrics-port)."
        ) from None
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SinkCollector(snapshot))
    try:
        server, _thread = start_http_server(port, addr=address, registry=registry)
    except OSError as e:
        if e.errno == errno.EADDRINUSE:
            problem = f"port {port} on {address} is in use by another process"
            fix = (
                "Stop the process that listens there (a previous run still running?), or choose another port "
                "(metrics_port, filesink run --metrics-port; 0 picks a free one)"
            )
        else:
            problem = f"cannot listen on {address} port {port} ({e.strerror or e})"
            fix = (
                "Give an address of this machine (metrics_address, filesink run --metrics-address; 127.0.0.1 by "
                "default, 0.0.0.0 for every interface) and a port this user may open (1024 and above)"
            )
        raise MetricsPortError(
            f"cannot serve the metrics of {where} at http://{address}:{port}/metrics: {problem}. Nothing was "
            f"started: the sink did not open its state, seal or claim anything. {fix}."
        ) from None
    return MetricsServer(address, int(server.server_address[1]), server)
