"""docs/observability.md, docs/grafana-dashboard.json and tests/benchmarks/render_dashboard.py agree on the metrics:
every metric is documented, the dashboard, the alert rules and the picture's panels name only documented metrics,
and the picture's panels are the dashboard's. The picture's evaluation of the expressions (rate with a reset,
histogram_quantile) is checked against values worked out by hand."""

from __future__ import annotations

import importlib.util
import json
import math
import re
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).parents[1]
DOC = ROOT / "docs" / "observability.md"
DASHBOARD = ROOT / "docs" / "grafana-dashboard.json"

COUNTERS = {
    "filesink_rows_appended_total",
    "filesink_rows_committed_total",
    "filesink_files_committed_total",
    "filesink_bytes_committed_total",
    "filesink_storage_requests_total",
    "filesink_storage_errors_total",
    "filesink_retries_total",
    "filesink_refusals_total",
    "filesink_fenced_total",
    "filesink_query_restarts_total",
}
GAUGES = {
    "filesink_rows_held",
    "filesink_log_bytes_held",
    "filesink_epochs_held",
    "filesink_oldest_held_epoch_age_seconds",
    "filesink_pending_files",
    "filesink_writer_term",
}
HISTOGRAMS = {"filesink_append_seconds", "filesink_roll_seconds", "filesink_table_commit_seconds"}
METRICS = COUNTERS | GAUGES | HISTOGRAMS
LABELS = {"filesink_storage_requests_total": "store, kind", "filesink_storage_errors_total": "store, kind"}


def _metric(name: str) -> str:
    """The metric a series name belongs to (a histogram's ``_bucket``, ``_sum`` and ``_count``: the histogram)."""
    for suffix in ("_bucket", "_sum", "_count"):
        if name.endswith(suffix) and name.removesuffix(suffix) in HISTOGRAMS:
            return name.removesuffix(suffix)
    return name


def _names(text: str) -> set[str]:
    return {_metric(n) for n in re.findall(r"\bfilesink_[a-z_]+", text)}


def _render():
    path = ROOT / "tests" / "benchmarks" / "render_dashboard.py"
    spec = importlib.util.spec_from_file_location("render_dashboard", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_every_metric_is_documented_with_its_type_and_labels():
    doc = DOC.read_text()
    rows = {m.group(1): m.group(0) for m in re.finditer(r"^\| `(filesink_[a-z_]+)` \|.*$", doc, re.M)}
    assert set(rows) == METRICS, set(rows) ^ METRICS
    for name, row in rows.items():
        kind = "counter" if name in COUNTERS else "gauge" if name in GAUGES else "histogram"
        assert f"| {kind} |" in row, row
        labels = LABELS.get(name, "sink").split(", ")
        shown = "`sink`" + "".join(f", `{label}`" for label in labels if label != "sink")
        if name == "filesink_refusals_total":
            shown = "`sink`, `reason`"
        assert f"| {shown} |" in row, row
    assert _names(doc) <= METRICS, _names(doc) - METRICS
    index, readme = (ROOT / "docs" / "index.md").read_text(), (ROOT / "README.md").read_text()
    assert "(observability.md)" in index and "(docs/observability.md)" in readme


def test_the_alert_rules_are_prometheus_rules_over_documented_metrics():
    blocks = re.findall(r"```yaml\n(.*?)```", DOC.read_text(), re.S)
    rules = [r for b in blocks for g in (yaml.safe_load(b) or {}).get("groups", []) for r in g["rules"]]
    assert {r["alert"] for r in rules} >= {
        "FilesinkVisibilityLag",
        "FilesinkRollStalled",
        "FilesinkStorageErrors",
        "FilesinkRetriesHigh",
        "FilesinkFenced",
        "FilesinkBatchRefused",
    }
    used = set().union(*(_names(r["expr"]) for r in rules))
    assert used <= METRICS and "filesink_oldest_held_epoch_age_seconds" in used, used
    stalled = next(r["expr"] for r in rules if r["alert"] == "FilesinkRollStalled")
    assert "filesink_roll_seconds_count" in stalled and "filesink_rows_held" in stalled, stalled


def test_the_dashboard_shows_every_metric_per_sink_from_a_chosen_prometheus():
    dashboard = json.loads(DASHBOARD.read_text())
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    sink = variables["sink"]
    assert sink["type"] == "query" and "label_values(filesink_writer_term, sink)" in json.dumps(sink["query"])
    exprs = []
    for panel in dashboard["panels"]:
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${datasource}", panel["title"]
            exprs.append(target["expr"])
            for selector in re.findall(r"\bfilesink_[a-z_]+(\{[^}]*\})?", target["expr"]):
                assert selector == '{sink=~"$sink"}', (panel["title"], target["expr"])
    used = set().union(*(_names(e) for e in exprs))
    assert used == METRICS, used ^ METRICS
    quantiles = [e for e in exprs if e.startswith("histogram_quantile(")]
    assert {n for e in quantiles for n in _names(e)} == HISTOGRAMS
    assert all("_bucket{" in e and "le)" in e for e in quantiles), quantiles
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids)), ids


def test_the_picture_draws_the_dashboard_panels():
    render = _render()
    dashboard = json.loads(DASHBOARD.read_text())
    drawn = [(title, {s.metric for s in series}) for title, _, series in render.PANELS]
    shown = [(p["title"], set().union(*(_names(t["expr"]) for t in p["targets"]))) for p in dashboard["panels"]]
    assert drawn == shown


def test_the_picture_evaluates_expressions_as_prometheus_does():
    render = _render()
    sink = {"sink": "s"}
    # A counter at 10/s that resets (a restart) at t=5 and goes on at 10/s from 0.
    values = [0, 10, 20, 30, 40, 5, 15, 25, 35, 45, 55, 65]
    scrapes = [(float(t), [("filesink_rows_appended_total", sink, float(v))]) for t, v in enumerate(values)]
    rate = render.evaluate(scrapes, render.Series("rate", "filesink_rows_appended_total"))[("s",)]
    assert [t for t, _ in rate] == [float(t) for t in range(1, 12)]
    assert rate[-1] == (11.0, pytest.approx((30 + 5 + 60) / 10)), rate  # t=1..11: 10 to 40, reset to 5, 5 to 65
    assert rate[0] == (1.0, 10.0)

    # histogram_quantile: 10 observations, 4 at most 0.1 s, 9 at most 1 s, 1 above 5 s.
    buckets = {0.1: 4.0, 1.0: 9.0, 5.0: 9.0, math.inf: 10.0}
    assert render.histogram_quantile(0.5, buckets) == pytest.approx(0.1 + 0.9 * (5 - 4) / 5)
    assert render.histogram_quantile(0.2, buckets) == pytest.approx(0.05)
    assert render.histogram_quantile(0.99, buckets) == 5.0  # in +Inf: the highest finite bound
    assert math.isnan(render.histogram_quantile(0.5, {0.1: 0.0, math.inf: 0.0}))

    # The roll histogram over time: its quantile from the window's increase of each bucket.
    def roll(t: float, fast: int, slow: int) -> list:
        series = [
            ("filesink_roll_seconds_bucket", {**sink, "le": le}, float(n))
            for le, n in (("0.1", fast), ("1.0", fast + slow), ("+Inf", fast + slow))
        ]
        return [(t, series)]

    history = roll(0, 100, 0) + roll(5, 100, 10) + roll(20, 100, 10)
    p50 = render.evaluate(history, render.Series("p50", "filesink_roll_seconds"))[("s",)]
    assert p50 == [(5.0, pytest.approx(0.55))], p50  # 10 rolls in (0.1, 1]; none in the window ending at 20
