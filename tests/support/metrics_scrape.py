"""Reading a sink's Prometheus endpoint in tests (``metrics_port``, ``filesink run --metrics-port``)."""

from __future__ import annotations

import urllib.request

from prometheus_client.parser import text_string_to_metric_families


def sink_samples(url: str) -> dict[str, float]:
    """The samples at ``url`` labelled by ``sink`` only, by name (without the ``filesink_`` prefix)."""
    with urllib.request.urlopen(url, timeout=10) as answer:
        text = answer.read().decode()
    return {
        s.name.removeprefix("filesink_"): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if set(s.labels) == {"sink"}
    }
