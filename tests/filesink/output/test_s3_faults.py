"""The sink on S3 through a fault-injecting proxy (``tests/faultproxy.py``): 5xx answers, timeouts, dropped
connections and, above all, requests the server applied whose answers were lost.

Retries are botocore's (the configuration the sink gives its S3 clients). The focused tests show each case
the sink has to get right; the campaign runs many epochs with a few hundred injected faults, restarts the
sink whenever a call fails after the retries, and checks that every row is in the output exactly once.
"""

from __future__ import annotations

import re
import time
import traceback
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from faultproxy import FaultRule
from sink_helpers import append_epoch, batch_rows, parquet_files, read_duckdb, read_pyarrow
from table_checker import TableTarget, TableWatch

from filesink import ExactlyOnceParquetSink, Rollover
from filesink.errors import FencedError
from filesink.output import OutputLocation, is_file_name
from filesink.output.location import filesystem as output_filesystem
from filesink.output.multipart import MIN_PART_SIZE, MultipartObject, abort_upload
from logstore.storage import S3_RETRIES, FsspecStorage, s3_client_options

RULES = Rollover(target_file_size=None, max_epochs=1000, max_age_seconds=None)
PARTITION_BY = ("event_date",)


def with_retries(options: dict[str, Any], retries: int) -> dict[str, Any]:
    config = {**options.get("config_kwargs", {}), "retries": {"mode": "standard", "max_attempts": retries}}
    return {**options, "config_kwargs": config}


def open_sink(
    prefix: str, state_dir, options: dict[str, Any], table: dict[str, Any] | None = None
) -> ExactlyOnceParquetSink:
    """``table``: the table options (``table_format``, and for Iceberg ``catalog`` and ``table``); none: a
    directory."""
    return ExactlyOnceParquetSink(
        f"{prefix}/table",
        state_dir,
        log_store=f"{prefix}/log",
        vnodes=8,
        parallelism=2,
        partition_by=list(PARTITION_BY),
        rollover=RULES,
        storage_options=options,
        **(table or {}),
    )


def crash(sink: ExactlyOnceParquetSink) -> None:
    """What the OS does when the driver dies: its lock and database are released, nothing is cleaned up."""
    sink._state_lock.release()
    sink.log_store.close()


def uploads_in_progress(s3_server, prefix: str) -> list[str]:
    fs = s3_server.filesystem()
    key = prefix.removeprefix(f"s3://{s3_server.bucket}/") + "/"
    found = fs.call_s3("list_multipart_uploads", Bucket=s3_server.bucket, Prefix=key).get("Uploads") or []
    return [u["Key"] for u in found]


# -- the retry configuration ---------------------------------------------------------------------------------


def test_s3_clients_get_botocore_retries_unless_set(s3_prefix, s3_options):
    checksums = {"request_checksum_calculation": "when_required", "response_checksum_validation": "when_required"}
    config = s3_client_options("s3://bucket/x", {})["config_kwargs"]
    assert config == {"retries": dict(S3_RETRIES), "connect_timeout": 10.0, "read_timeout": 15.0, **checksums}
    mine = {"key": "k", "config_kwargs": {"retries": {"mode": "adaptive", "max_attempts": 2}, "read_timeout": 5}}
    merged = s3_client_options("s3a://bucket/x", mine)
    assert merged["config_kwargs"] == {
        "retries": {"mode": "adaptive", "max_attempts": 2},
        "read_timeout": 5,
        "connect_timeout": 10.0,
        **checksums,
    }
    assert mine["config_kwargs"] == {"retries": {"mode": "adaptive", "max_attempts": 2}, "read_timeout": 5}
    assert s3_client_options("memory://x", {"a": 1}) == {"a": 1}

    # The clients the sink makes: the output's and the log store's.
    output_fs, _ = output_filesystem(OutputLocation(s3_prefix + "/table", s3_options))
    log_fs = FsspecStorage(s3_prefix + "/log", s3_options).fs
    for fs in (output_fs, log_fs):
        config = fs.s3.meta.config
        assert config.retries == {"mode": "standard", "total_max_attempts": 4}  # botocore's own spelling
        assert (config.connect_timeout, config.read_timeout) == (10.0, 15.0)
        assert fs.retries == 1, "s3fs's own retry loop makes one attempt: botocore's retries are the only ones"


def test_errors_after_retries_name_what_failed(s3_prefix, fault_proxy, proxy_options):
    options = with_retries(proxy_options, 0)
    storage = FsspecStorage(s3_prefix + "/log", options)
    fs, root = output_filesystem(OutputLocation(s3_prefix + "/table", options))
    upload = MultipartObject(fs, f"{root}/a.parquet")
    upload.write(b"x")
    upload.close()
    storage.write("seg", [b"x"])
    calls = [
        ("PutObject", lambda: storage.write("seg", [b"x"]), f"cannot write {s3_prefix}/log/seg: "),
        ("GetObject", lambda: storage.read_all("seg"), f"cannot read {s3_prefix}/log/seg: "),
        ("DeleteObject", lambda: storage.delete("seg"), f"cannot delete {s3_prefix}/log/seg: "),
        (
            "AbortMultipartUpload",
            lambda: abort_upload(fs, upload.bucket, upload.key, upload.upload_id),
            f"cannot abort the multipart upload {upload.upload_id} of {s3_prefix}/table/a.parquet: ",
        ),
    ]
    for operation, call, message in calls:
        fault_proxy.inject("5xx", operation, count=10)  # more than botocore's and s3fs's attempts together
        with pytest.raises(OSError) as caught:
            call()
        assert message in str(caught.value)
        fault_proxy.clear_injected()


# -- one case at a time --------------------------------------------------------------------------------------


def _closed_upload(fs, path: str, body: bytes, **kwargs: Any) -> MultipartObject:
    upload = MultipartObject(fs, path, part_size=MIN_PART_SIZE, **kwargs)
    upload.write(body)
    upload.close()
    return upload


@pytest.mark.parametrize("forget_completed", [True, False])
def test_lost_complete_answer_is_success(s3_server, s3_prefix, fault_proxy, proxy_options, forget_completed):
    """The retried Complete meets NoSuchUpload (stricter servers) or 200 (SeaweedFS): success either way."""
    fault_proxy.forget_completed = forget_completed
    fs, root = output_filesystem(OutputLocation(s3_prefix, proxy_options))
    upload = _closed_upload(fs, f"{root}/a.parquet", b"x" * 1000, on_gone=lambda: FencedError("gone"))
    fault_proxy.inject("lost_response", "CompleteMultipartUpload")
    assert upload.complete() is not forget_completed  # False: found completed already
    assert fault_proxy.emulated["NoSuchUpload"] == int(forget_completed)
    assert s3_server.filesystem().cat_file(f"{root}/a.parquet") == b"x" * 1000


@pytest.mark.parametrize("visible", [None, 999, 1000])
def test_aborted_upload_is_gone_unless_the_same_object_is_there(s3_server, s3_prefix, s3_options, visible):
    """NoSuchUpload at Complete with no object, or one of another size, still means the upload was aborted."""
    fs, root = output_filesystem(OutputLocation(s3_prefix, s3_options))
    upload = _closed_upload(fs, f"{root}/a.parquet", b"x" * 1000, on_gone=lambda: FencedError("gone"))
    fs.call_s3("abort_multipart_upload", Bucket=upload.bucket, Key=upload.key, UploadId=upload.upload_id)
    if visible is not None:
        s3_server.filesystem().pipe_file(f"{root}/a.parquet", b"y" * visible)
    if visible == 1000:
        assert upload.complete() is False  # an identical writer's object (same name, same size)
    else:
        with pytest.raises(FencedError):
            upload.complete()


def test_lost_abort_answer_is_quiet(s3_server, s3_prefix, fault_proxy, proxy_options):
    fs, root = output_filesystem(OutputLocation(s3_prefix, proxy_options))
    upload = _closed_upload(fs, f"{root}/a.parquet", b"x")
    fault_proxy.inject("lost_response", "AbortMultipartUpload")
    upload.abort()
    assert fault_proxy.faults == {("lost_response", "AbortMultipartUpload"): 1}
    assert uploads_in_progress(s3_server, s3_prefix) == []


def test_sink_rides_out_lost_answers_and_recovery_aborts_orphan_uploads(
    s3_server, s3_prefix, tmp_path, fault_proxy, proxy_options
):
    """Lost answers to a segment PUT, a record PUT, an UploadPart and a Complete: the flush succeeds. A lost
    CreateMultipartUpload answer leaves an upload nobody knows; it is aborted once its object is committed."""
    fault_proxy.forget_completed = True
    sink = open_sink(s3_prefix, tmp_path / "state", proxy_options)
    expected: Counter = Counter()
    for epoch in range(2):
        rows = batch_rows(epoch, 300, seed=5)
        expected.update(rows)
        fault_proxy.inject("lost_response", "PutObject")  # the segment
        append_epoch(sink, epoch, rows)
    for operation in ("CreateMultipartUpload", "UploadPart", "CompleteMultipartUpload", "PutObject", "PutObject"):
        fault_proxy.inject("lost_response", operation)  # the PUTs: writer records
    sink.flush()
    assert fault_proxy.faults_by_operation("lost_response") == {
        "PutObject": 4,
        "CreateMultipartUpload": 1,
        "UploadPart": 1,
        "CompleteMultipartUpload": 1,
    }
    assert fault_proxy.emulated["NoSuchUpload"] == 1
    # The upload whose Create answer was lost is an upload of an object the flush committed: the sink's
    # clean-up after the commit aborts it (recovery's garbage step would at the next start otherwise).
    assert uploads_in_progress(s3_server, s3_prefix) == []
    sink.close()
    open_sink(s3_prefix, tmp_path / "state", proxy_options).close()  # recovery's garbage step
    assert uploads_in_progress(s3_server, s3_prefix) == []
    direct = s3_server.storage_options()
    assert read_pyarrow(f"{s3_prefix}/table", direct, PARTITION_BY) == expected


# -- the campaign --------------------------------------------------------------------------------------------

CAMPAIGN_RULES = [
    FaultRule("lost_response", 0.25, frozenset({"CompleteMultipartUpload"})),
    FaultRule("lost_response", 0.08, frozenset({"PutObject"})),
    FaultRule("lost_response", 0.02),
    FaultRule("drop", 0.02),
    FaultRule("5xx", 0.03),
    FaultRule("timeout", 0.003),
]
CAMPAIGN_SINKS = 2
"""Sinks run side by side (own output, log store and state each), so that retry backoffs overlap."""
CAMPAIGN_EPOCHS = 16
CAMPAIGN_ROWS = 300
CAMPAIGN_RETRIES = 1
"""botocore retries per request in the campaign: few, so that some calls fail and the sink restarts."""
MIN_FAULTS = 200
_NAME = re.compile(r"part-[0-9a-f]{8}-(\d{20})-(\d{20})-(\d{5})-(\d{5})-[0-9a-f]{8}(?:-[0-9a-f]{16})?\.parquet")


def _epoch(epoch: int, rows: list[tuple]):
    """What foreachBatch does with one batch, without Spark."""

    def action(sink: ExactlyOnceParquetSink) -> None:
        if epoch > sink.log_store.last_sealed_epoch:  # Spark replays a batch whose seal went through: skipped
            append_epoch(sink, epoch, rows)
        sink.flush()

    return action


class Campaign:
    """One sink, restarted (as a crashed job is) whenever a call fails after botocore's retries."""

    def __init__(
        self,
        s3_server,
        prefix: str,
        state_dir,
        options: dict[str, Any],
        seed: int,
        table: dict[str, Any] | None = None,
    ) -> None:
        self.s3_server, self.prefix, self.state_dir = s3_server, prefix, state_dir
        self.options, self.seed, self.table = options, seed, table
        self.expected: Counter = Counter()
        self.failures: list[BaseException] = []
        self.orphans = 0
        self.starts = 0
        """Starts that ran recovery to its end (the sink opened)."""
        self.restarts_at: Counter[int] = Counter()
        """Restarts per epoch: while its batch was being handed over."""

    def _open(self) -> ExactlyOnceParquetSink:
        for _ in range(20):
            try:
                sink = open_sink(self.prefix, self.state_dir, self.options, self.table)  # runs recovery
                self.starts += 1
                return sink
            except Exception as e:
                self.failures.append(e)
        raise AssertionError(f"{self.prefix}: the sink did not start in 20 attempts: {self.failures[-3:]}")

    def _call(self, action) -> None:
        for _ in range(20):
            try:
                action(self.sink)
                return
            except Exception as e:
                self.failures.append(e)
                self.restarts_at[self.epoch] += 1
                crash(self.sink)
                self.crashed(len(self.failures))
                self.sink = self._open()
        raise AssertionError(f"{self.prefix}: a call failed 20 times in a row: {self.failures[-3:]}")

    def crashed(self, failures: int) -> None:
        """After a sink that had started was dropped as a crashed job is (nothing running): checks, if any."""

    def run(self, epochs: int) -> None:
        self.sink = self._open()
        for epoch in range(epochs):
            self.epoch = epoch
            rows = batch_rows(epoch, CAMPAIGN_ROWS, seed=self.seed)
            self.expected.update(rows)
            self._call(_epoch(epoch, rows))
        self.orphans = len(uploads_in_progress(self.s3_server, self.prefix))
        self.sink.close()
        last = self._open()  # a last start: recovery aborts what lost Create answers left behind
        self.pending, self.points = last.ledger.pending(), last.log_store.truncate_points()
        self.sink_id = last.log_store.sink_id
        last.close()

    def check(self) -> tuple[int, int, int]:
        """Compare the output (read straight from the server) with the input; return (lost, duplicated,
        unexpected) rows after asserting what must hold whatever they are."""
        direct, table, points = self.s3_server.storage_options(), f"{self.prefix}/table", self.points
        got = read_pyarrow(table, direct, PARTITION_BY)
        assert read_duckdb(table, direct, PARTITION_BY) == got, "pyarrow and DuckDB read the same rows"
        assert self.pending == []
        for key in parquet_files(table, direct):  # only this sink's files, each committed (vnodes truncated past it)
            name = key.rsplit("/", 1)[-1]
            assert is_file_name(self.sink_id, name), key
            m = _NAME.fullmatch(name)
            assert m is not None
            end, first_vnode, last_vnode = int(m[2]), int(m[3]), int(m[4])
            assert all(points[v] >= end for v in range(first_vnode, last_vnode + 1)), f"{key} is not committed"
        assert uploads_in_progress(self.s3_server, self.prefix) == []
        expected = self.expected
        lost = sum((expected - got).values())
        duplicated = sum(n - expected[row] for row, n in got.items() if row in expected and n > expected[row])
        unexpected = sum(n for row, n in got.items() if row not in expected)
        return lost, duplicated, unexpected


def _origin(error: BaseException) -> str:
    """The innermost frame of the sink's own code that the error went through."""
    frames = traceback.extract_tb(error.__traceback__)
    ours = [f for f in frames if re.search(r"/(filesink|logstore|recovery)/", f.filename)]
    return f"{'/'.join(ours[-1].filename.rsplit('/', 2)[-2:])}:{ours[-1].lineno}" if ours else "?"


def _run_campaigns(campaigns: Sequence[Campaign], fault_proxy, began: float, title: str) -> list[BaseException]:
    """Run ``campaigns`` side by side under the campaign's rules, check each, print the summary and assert what
    every S3 fault campaign must show; return the failures (the restarts' causes)."""
    fault_proxy.forget_completed = True
    fault_proxy.set_rules(CAMPAIGN_RULES)
    with ThreadPoolExecutor(len(campaigns)) as pool:
        for done in [pool.submit(c.run, CAMPAIGN_EPOCHS) for c in campaigns]:
            done.result()
    fault_proxy.set_rules([])
    faults = fault_proxy.faults_by_kind()
    anomalies = [c.check() for c in campaigns]
    lost, duplicated, unexpected = (sum(a[i] for a in anomalies) for i in range(3))
    failures = [f for c in campaigns for f in c.failures]
    print(
        f"\n{title}: {sum(faults.values())} faults {dict(sorted(faults.items()))} in "
        f"{sum(fault_proxy.requests.values())} requests; {len(failures)} restarts; "
        f"{sum(sum(c.expected.values()) for c in campaigns)} rows checked: lost {lost}, duplicated {duplicated}, "
        f"unexpected {unexpected}; {time.monotonic() - began:.0f} s"
    )
    print(
        f"  lost answers per operation {dict(fault_proxy.faults_by_operation('lost_response'))}; NoSuchUpload "
        f"answers to repeated Completes {fault_proxy.emulated['NoSuchUpload']}; orphan uploads before the last "
        f"start {[c.orphans for c in campaigns]}"
    )
    for failure in failures:
        print(f"  restart after {type(failure).__name__} ({_origin(failure)}): {str(failure)[:300]}")

    assert (lost, duplicated, unexpected) == (0, 0, 0), anomalies
    assert sum(faults.values()) >= MIN_FAULTS
    assert fault_proxy.faults[("lost_response", "CompleteMultipartUpload")] >= 10
    assert fault_proxy.faults[("lost_response", "PutObject")] >= 10
    assert fault_proxy.emulated["NoSuchUpload"] >= 5, "retried Completes met NoSuchUpload"
    fenced = [f for f in failures if isinstance(f, FencedError) or isinstance(f.__cause__, FencedError)]
    assert fenced == [], "no writer of a live run is fenced: a lost Complete answer is a success"
    return failures


@pytest.mark.slow
# The chaos tier's: the default tier keeps each fault above alone (a lost Complete or Abort answer, errors after
# retries, orphan uploads) and the failpoint matrix's raise, hang and kill at each step of an upload to S3.
@pytest.mark.chaos
def test_campaign(s3_server, s3_prefix, tmp_path, fault_proxy, proxy_options):
    began = time.monotonic()
    options = with_retries(proxy_options, CAMPAIGN_RETRIES)
    campaigns = [
        Campaign(s3_server, f"{s3_prefix}/sink-{i}", tmp_path / f"state-{i}", options, seed=i)
        for i in range(CAMPAIGN_SINKS)
    ]
    _run_campaigns(campaigns, fault_proxy, began, "S3 fault campaign")


# -- the campaign into a table -------------------------------------------------------------------------------


def _end_epoch(name: str) -> int:
    m = _NAME.fullmatch(name + ".parquet")
    assert m is not None, name
    return int(m[2])


class TableCampaign(Campaign):
    """The campaign into a Delta or an Iceberg table on S3: the table is the truth, read with deltalake or pyiceberg
    straight from the server (:class:`table_checker.TableWatch`) after every restart and at the end."""

    def __init__(self, s3_server, prefix: str, state_dir, options: dict[str, Any], seed: int, target: TableTarget):
        table: dict[str, Any] = {"table_format": target.format}
        if target.format == "iceberg":
            table |= {"catalog": dict(target.catalog), "table": target.table}
        super().__init__(s3_server, prefix, state_dir, options, seed, table)
        self.watch = TableWatch(target, f"{prefix}/table", s3_server.storage_options(), self.expected, seed)

    def crashed(self, failures: int) -> None:
        # The dropped sink had started (recovered): what was outside the table before it started is in it now.
        self.watch.step(f"after restart {failures}", quiet=True, recovered=True)

    def check(self) -> tuple[int, int, int]:
        report = self.watch.final()
        view, points = self.watch.view, self.points
        what = f"{self.watch.target.describe()} at {self.prefix}"
        assert report.stray_objects == [], f"{what}: stray objects {report.stray_objects[:5]}"
        assert report.outside_table == [], f"{what}: files outside the table {report.outside_table[:5]}"
        assert self.pending == [], f"{what}: pending files after the last start {self.pending}"
        assert view.sink_id == self.sink_id, f"{what}: the table's commits name the sink {view.sink_id}"
        for key in view.files:  # each committed: every vnode it holds truncated past its end epoch
            m = _NAME.fullmatch(key.rsplit("/", 1)[-1])
            assert m is not None, f"{what}: {key}"
            end, first_vnode, last_vnode = int(m[2]), int(m[3]), int(m[4])
            assert all(points[v] >= end for v in range(first_vnode, last_vnode + 1)), f"{what}: {key} not committed"
        # The sink's uploads are all ended. The table's metadata files (Iceberg) are written by pyiceberg's file IO
        # (s3fs by default; pyarrow's, when chosen, leaves an upload behind when a request fails): counted, not checked.
        uploads = uploads_in_progress(self.s3_server, self.prefix)
        metadata = self.prefix.removeprefix(f"s3://{self.s3_server.bucket}/") + "/table/metadata/"
        self.metadata_uploads = sum(key.startswith(metadata) for key in uploads)
        assert [key for key in uploads if not key.startswith(metadata)] == [], f"{what}: uploads left: {uploads}"
        # A roll is one commit. Each epoch is flushed alone, so a roll's files end at its epoch. A restart can split
        # one: the next start commits the roll's whole files, and what it drops is rolled again. So the files ending
        # at an epoch are in at most 1 + (restarts during its batch) commits. A commit per file (or per vnode range)
        # would exceed it at every epoch of more than one file without a restart (counted: ``binding``).
        ends = [{_end_epoch(f) for f in commit} for commit in view.commits]
        per_epoch = Counter(e for c in ends for e in c)
        over = {e: n for e, n in sorted(per_epoch.items()) if n > 1 + self.restarts_at[e]}
        assert not over, f"{what}: commits per epoch beyond 1 + its restarts {dict(self.restarts_at)}: {over}"
        files_at = Counter(_end_epoch(f) for commit in view.commits for f in commit)
        self.binding = sum(files_at[e] > 1 and self.restarts_at[e] == 0 for e in per_epoch)
        """Epochs at which a commit per file would break the bound (more than one file, no restart)."""
        self.commits, self.files = len(view.commits), sum(len(c) for c in view.commits)
        self.split = sum(n > 1 for n in per_epoch.values())
        return report.lost, report.duplicated, report.unexpected


@pytest.mark.chaos
@pytest.mark.timeout(1500)
@pytest.mark.parametrize("table_format", ["delta", "iceberg"])
def test_chaos_table_s3_fault_campaign(s3_server, s3_prefix, tmp_path, fault_proxy, proxy_options, table_format):
    """The S3 fault campaign with the output a Delta or an Iceberg table on S3, the table and the log store behind
    the proxy. Iceberg's catalog is a SQLite file under the test's directory (it survives the restarts), not behind
    the proxy; the table's metadata files, written by pyiceberg, are."""
    began = time.monotonic()
    options = with_retries(proxy_options, CAMPAIGN_RETRIES)
    campaigns: list[TableCampaign] = []
    for i in range(CAMPAIGN_SINKS):
        prefix = f"{s3_prefix}/sink-{i}"
        if table_format == "iceberg":
            catalog = {"type": "sql", "uri": f"sqlite:///{tmp_path / f'catalog-{i}.db'}", "warehouse": prefix}
            target = TableTarget("iceberg", table="faults.events", catalog=tuple(sorted(catalog.items())))
        else:
            target = TableTarget("delta")
        campaigns.append(TableCampaign(s3_server, prefix, tmp_path / f"state-{i}", options, i, target))
    _run_campaigns(campaigns, fault_proxy, began, f"S3 fault campaign into {table_format} tables")
    print(
        f"  table commits {[c.commits for c in campaigns]} for {CAMPAIGN_EPOCHS} rolls each "
        f"({[c.split for c in campaigns]} split by a restart; {[c.binding for c in campaigns]} where a commit per file "
        f"would break the bound), files "
        f"{[c.files for c in campaigns]}, starts {[c.starts for c in campaigns]}, files outside the table at a "
        f"restart and committed by the next start {[c.watch.settled for c in campaigns]}; Delta: the creation "
        f"written again {[c.watch.view.recreated for c in campaigns]}; Iceberg: metadata uploads left by pyiceberg "
        f"{[c.metadata_uploads for c in campaigns]}"
    )
