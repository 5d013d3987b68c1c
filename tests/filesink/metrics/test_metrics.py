"""A sink's figures (``sink.metrics()``) and their Prometheus exposition (``metrics_port``), checked against what the
output holds; the port-in-use refusal; the JSON event records; prometheus_client left unimported without the
option."""

from __future__ import annotations

import json
import socket
import sys
import urllib.request
from collections import Counter

import pyarrow.parquet as pq
import pytest
from helpers import run, support_env
from prometheus_client.parser import text_string_to_metric_families
from sink_helpers import _fs, batch_df, batch_rows, parquet_files, read_pyarrow

from filesink import ExactlyOnceParquetSink, MetricsPortError, Rollover, SchemaMismatchError, StateBehindError
from filesink.metrics.figures import MetricsBook, event_record, query_restarted
from logstore.errors import FencedError

COUNTERS = (
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
    "filesink_append_seconds_count",
    "filesink_roll_seconds_count",
    "filesink_table_commit_seconds_count",
)


def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample at ``url``, keyed by (name, sorted labels)."""
    with urllib.request.urlopen(url, timeout=10) as answer:
        text = answer.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(samples, name: str, **labels: str) -> float:
    """The sample ``name`` with exactly ``labels`` (besides ``sink``)."""
    found = [v for (n, ls), v in samples.items() if n == name and {k: x for k, x in ls if k != "sink"} == labels]
    assert len(found) == 1, (name, labels, sorted(k for k in samples if k[0] == name))
    return found[0]


def counters(samples) -> dict:
    return {k: v for k, v in samples.items() if k[0] in COUNTERS or k[0].endswith("_bucket")}


@pytest.mark.slow
def test_metrics_over_http_match_the_output(spark, tmp_path, s3_prefix, s3_options):
    """A sink on S3 (log store and output) serving on a free port: scraped after each batch (counters never go
    back) and after the flush (the counters are the committed files' exact rows, count and bytes)."""
    path, log = f"{s3_prefix}/table", f"{s3_prefix}/log"
    sink = ExactlyOnceParquetSink(
        path,
        tmp_path / "state",
        log_store=log,
        vnodes=8,
        parallelism=2,
        rollover=Rollover(target_file_size=None, max_epochs=2, max_age_seconds=None),
        storage_options=s3_options,
        metrics_port=0,
    )
    try:
        url = sink.metrics_url
        assert url is not None and url.startswith("http://127.0.0.1:") and not url.endswith(":0/metrics"), url
        start = scrape(url)
        assert value(start, "filesink_rows_appended_total") == 0
        assert value(start, "filesink_writer_term") == sink.term
        assert {dict(labels).get("sink") for _, labels in start} == {sink.log_store.sink_id}
        expected: Counter = Counter()
        before = start
        for b in range(5):
            rows = batch_rows(b, 150, seed=3)
            sink(batch_df(spark, rows), b)
            expected.update(rows)
            now = scrape(url)
            for key, v in counters(before).items():
                assert now.get(key, 0) >= v, (b, key, v, now.get(key))
            assert value(now, "filesink_rows_appended_total") == sum(expected.values())
            assert value(now, "filesink_append_seconds_count") == b + 1
            held = sink.log_store.held_totals()
            assert value(now, "filesink_rows_held") == held.rows
            assert value(now, "filesink_log_bytes_held") == held.bytes
            assert value(now, "filesink_epochs_held") == held.epochs
            assert (value(now, "filesink_oldest_held_epoch_age_seconds") > 0) == (held.rows > 0)
            before = now
        assert value(before, "filesink_files_committed_total") > 0, "max_epochs=2: files rolled during the run"
        changed = spark.createDataFrame([(1, "x", 2.0)], "id long, user_id string, extra double")
        with pytest.raises(SchemaMismatchError):
            sink(changed, 5)
        refused = scrape(url)
        assert value(refused, "filesink_refusals_total", reason="schema_mismatch") == 1
        assert value(refused, "filesink_rows_appended_total") == sum(expected.values())
        sink.flush()
        after = scrape(url)
        snapshot = sink.metrics()
    finally:
        sink.close()

    assert read_pyarrow(path, s3_options) == expected
    fs, root = _fs(path, s3_options)
    files = [f for f in parquet_files(path, s3_options) if f.endswith(".parquet")]
    sizes = [fs.size(f"{root}/{f}") for f in files]
    rows = sum(pq.ParquetFile(fs.open(f"{root}/{f}")).metadata.num_rows for f in files)
    assert rows == sum(expected.values())
    assert value(after, "filesink_rows_committed_total") == rows == snapshot.rows_committed
    assert value(after, "filesink_files_committed_total") == len(files) == snapshot.files_committed
    assert value(after, "filesink_bytes_committed_total") == sum(sizes) == snapshot.bytes_committed
    for key, v in counters(before).items():
        assert after.get(key, 0) >= v, key
    assert value(after, "filesink_rows_held") == 0
    assert value(after, "filesink_epochs_held") == 0
    assert value(after, "filesink_oldest_held_epoch_age_seconds") == 0
    assert value(after, "filesink_pending_files") == 0
    # The append tasks' segment PUTs and the file-writing tasks' uploads came back in their result rows.
    assert value(after, "filesink_storage_requests_total", store="log", kind="put") >= 5
    assert value(after, "filesink_storage_requests_total", store="output", kind="put") >= 3 * len(files)
    assert value(after, "filesink_storage_requests_total", store="home", kind="put") > 0
    assert value(after, "filesink_roll_seconds_count") == 6  # one per batch and the flush's
    assert value(after, "filesink_table_commit_seconds_count") > 0
    assert value(after, "filesink_fenced_total") == 0
    assert snapshot.rows_appended == sum(expected.values()) and snapshot.batches == 5


def test_a_port_in_use_is_refused_before_the_state_is_made(tmp_path):
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    try:
        with pytest.raises(
            MetricsPortError, match=rf"127\.0\.0\.1:{port}/metrics: port {port} on 127\.0\.0\.1 is in use"
        ):
            ExactlyOnceParquetSink(str(tmp_path / "out"), tmp_path / "state", metrics_port=port)
    finally:
        taken.close()
    assert sorted(tmp_path.iterdir()) == [], "nothing created: no state directory, no output"


def test_a_port_in_use_leaves_an_existing_state_unchanged(tmp_path):
    sink = ExactlyOnceParquetSink(str(tmp_path / "out"), tmp_path / "state")
    sink.close()
    before = {p: p.stat().st_mtime_ns for p in sorted((tmp_path / "state").rglob("*"))}
    holder = ExactlyOnceParquetSink(str(tmp_path / "out2"), tmp_path / "state2", metrics_port=0)
    try:
        port = int(holder.metrics_url.rsplit(":", 1)[1].split("/")[0])
        with pytest.raises(MetricsPortError, match="choose another port"):
            ExactlyOnceParquetSink(str(tmp_path / "out"), tmp_path / "state", metrics_port=port)
    finally:
        holder.close()
    assert {p: p.stat().st_mtime_ns for p in sorted((tmp_path / "state").rglob("*"))} == before
    reopened = ExactlyOnceParquetSink(str(tmp_path / "out"), tmp_path / "state")
    assert reopened.term == 2, "the refused start took no writer term"
    reopened.close()


def test_without_metrics_port_prometheus_client_is_not_imported(tmp_path):
    code = (
        "import sys\n"
        "from filesink import ExactlyOnceParquetSink\n"
        f"sink = ExactlyOnceParquetSink({str(tmp_path / 'out')!r}, {str(tmp_path / 'state')!r})\n"
        "m = sink.metrics()\n"
        "sink.close()\n"
        "assert m.writer_term == 1 and m.rows_held == 0, m\n"
        "print(sorted(name for name in sys.modules if name.split('.')[0] == 'prometheus_client'))\n"
    )
    done = run([sys.executable, "-c", code], 120, capture_output=True, text=True, env=support_env())
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_event_records_are_one_json_line_each(capsys):
    from filesink.cli import jsonlog

    book = MetricsBook()
    book.started("sink-x", 3, 7)
    book.listener = jsonlog.write
    book.committed([(10, 1000), (5, 600)])
    book.rolled(0.25)
    book.batch_done(8, False, 1.5)
    book.rolled(0.01)  # committed nothing: no event
    jsonlog.notice('a notice with "quotes"\nand a newline')
    lines = capsys.readouterr().out.splitlines()
    records = [json.loads(line) for line in lines]
    assert [r["event"] for r in records] == ["roll", "batch", "notice"]
    roll, batch, notice = records
    assert (roll["files"], roll["rows"], roll["bytes"]) == (2, 15, 1600)
    assert roll["rows_committed_total"] == 15 and roll["writer_term"] == 3 and roll["sink"] == "sink-x"
    assert batch["batch_id"] == 8 and batch["epoch"] == 7 and batch["duration_seconds"] == 1.5
    assert notice["message"] == 'a notice with "quotes"\nand a newline'
    assert event_record("batch", book.snapshot(), 0.0, {}).keys() >= {"rows_held", "storage_requests_total"}


def test_counters_of_a_book_never_go_back_and_buckets_are_cumulative():
    book = MetricsBook()
    for seconds in (0.005, 0.3, 0.3, 700.0):
        book.rolled(seconds)
    t = book.snapshot().roll
    assert t.count == 4 and t.total_seconds == pytest.approx(700.605)
    assert list(t.buckets) == sorted(t.buckets) and t.buckets[0] == 1 and t.buckets[-1] == 3


def test_refusals_by_reason_and_a_fencing_counted_once():
    book = MetricsBook()
    for error in (StateBehindError("behind"), SchemaMismatchError("gone"), SchemaMismatchError("again")):
        with pytest.raises(type(error)), book.watching():
            raise error
    fenced = FencedError("a newer run owns the sink")
    book.fenced_at(fenced)  # the idle timer's roll
    with pytest.raises(FencedError), book.watching():  # the next batch raises the timer's error again
        raise fenced
    with pytest.raises(RuntimeError), book.watching():
        raise RuntimeError("not a refusal")
    m = book.snapshot()
    assert m.refusals == {"state_behind": 1, "schema_mismatch": 2}
    assert m.fenced == 1


def test_query_restarts_count_from_the_sinks_start_in_the_figures_events_and_exposition():
    """``filesink run``'s restarts of its query (past SPARK-55271) are counted by the sinks open in the process, each
    from its start: in ``sink.metrics()``, the JSON event records and the Prometheus exposition."""
    from prometheus_client import CollectorRegistry, generate_latest

    from filesink.metrics.prometheus import SinkCollector

    query_restarted()  # before the sink started: not its own
    book = MetricsBook()
    book.started("sink-r", 1, -1)
    assert book.snapshot().query_restarts == 0
    query_restarted()
    query_restarted()
    assert book.snapshot().query_restarts == 2
    assert event_record("batch", book.snapshot(), 0.0, {})["query_restarts_total"] == 2
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SinkCollector(book.snapshot))
    families = {f.name: f for f in text_string_to_metric_families(generate_latest(registry).decode())}
    assert families["filesink_query_restarts"].type == "counter"
    [sample] = [s for s in families["filesink_query_restarts"].samples if s.name.endswith("_total")]
    assert (sample.name, sample.labels, sample.value) == ("filesink_query_restarts_total", {"sink": "sink-r"}, 2)
