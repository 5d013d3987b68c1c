"""The start-up probe of conditional create (``logstore/conditional.py``), asked of each real store: local disk,
SeaweedFS, moto's server and rclone's ``serve s3`` (docs/protocol.md#conditional-create-and-ownership); and the
bulk delete (S3 DeleteObjects) on each."""

from __future__ import annotations

import logging
import uuid

import pytest
from s3servers import S3_SERVERS

from filesink.demo.s3server import S3Settings
from logstore.conditional import (
    PROBE_DIR,
    ConditionalCreate,
    probe_conditional_create,
    require_conditional_create,
)
from logstore.errors import ConditionalCreateError
from logstore.home import HOME
from logstore.storage import ConditionalPut, FsspecStorage, LocalStorage, LogLocation, PutAnswer, Storage

EXPECTED = {
    "local": ConditionalCreate.HONOURED,
    "seaweedfs": ConditionalCreate.HONOURED,
    "moto": ConditionalCreate.HONOURED,
    "rclone": ConditionalCreate.IGNORED,
}
"""What each store did when measured (SeaweedFS 4.48, moto 5.2.5, rclone 1.75.2): a server that changes its
answer fails the test, and then docs/protocol.md and docs/testing.md's table change with it."""


@pytest.fixture(params=list(EXPECTED))
def store(request: pytest.FixtureRequest, tmp_path) -> tuple[str, Storage]:
    """(name, storage) of an empty log store location on each store."""
    if request.param == "local":
        return "local", LogLocation(str(tmp_path / "log")).open()
    server: S3Settings = request.getfixturevalue(S3_SERVERS[request.param])
    return request.param, LogLocation(server.url(f"test-{uuid.uuid4().hex}", "log"), server.storage_options()).open()


@pytest.mark.timeout(120)
def test_the_probe_sees_what_each_store_does_and_leaves_nothing(store):
    name, storage = store
    probe = probe_conditional_create(storage)
    assert probe.outcome is EXPECTED[name], probe
    assert probe.where.startswith(storage.display(PROBE_DIR) + "/") and probe.where.endswith(".json")
    if isinstance(storage, FsspecStorage):
        assert probe.server and probe.server.startswith("http://127.0.0.1:")
        expected_seen = "HTTP 412 PreconditionFailed" if probe.honoured else "HTTP 200"
        assert probe.seen == expected_seen, probe
    assert list(storage.list_files()) == []  # the probe object is deleted, nothing else was written


@pytest.mark.timeout(120)
def test_delete_many_deletes_exactly_the_files_named(store, monkeypatch):
    """One request for many keys on S3 (DeleteObjects); a key already gone is no error; nothing else is touched."""
    _, storage = store
    names = [f"00000000000000000001/seg-{i}.seg" for i in range(5)] + ["home/files/a.json", "home/files/b.json"]
    for name in names:
        storage.put(name, name.encode())
    calls: list[str] = []
    if isinstance(storage, FsspecStorage):
        real = storage.fs._call_s3

        async def counted(method, *args, **kwargs):
            calls.append(method)
            return await real(method, *args, **kwargs)

        monkeypatch.setattr(storage.fs, "_call_s3", counted)
    storage.delete_many([*names[:4], "00000000000000000001/never-written.seg", names[5]])
    left = sorted(name for name, _ in storage.list_files())
    assert left == sorted([names[4], names[6]]), left
    if isinstance(storage, FsspecStorage):
        assert calls.count("delete_objects") == 1 and "delete_object" not in calls, calls
    storage.delete_many([])
    storage.delete_many([names[4]])
    assert [name for name, _ in storage.list_files()] == [names[6]]


def test_a_store_that_ignores_the_condition_stops_the_start_unless_single_driver(rclone_server, caplog):
    storage = LogLocation(rclone_server.url(f"test-{uuid.uuid4().hex}", "log"), rclone_server.storage_options()).open()
    with pytest.raises(ConditionalCreateError) as raised:
        require_conditional_create(storage, single_driver=False)
    message = str(raised.value)
    for part in (
        storage.display(HOME),
        rclone_server.endpoint,
        "conditional create: PUT with If-None-Match: *",
        "replaced the object",
        "HTTP 200",
        "both own the sink",
        "twice to the output or lost",
        "single_driver=True",
        "filesink run --single-driver",
        "filesink recover apply --single-driver",
        "at most one driver or recover command runs on this sink at a time: nothing fences a second one",
    ):
        assert part in message, (part, message)

    with caplog.at_level(logging.WARNING, logger="logstore.conditional"):
        assert require_conditional_create(storage, single_driver=True) is None
        require_conditional_create(storage, single_driver=True)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings  # once per location and process
    assert storage.display(HOME) in warnings[0] and "single-driver operation" in warnings[0]
    assert list(storage.list_files()) == []


def test_a_server_that_refuses_the_condition_is_refused_with_its_code(s3_server, fault_proxy, proxy_options):
    storage = LogLocation(s3_server.url(f"test-{uuid.uuid4().hex}", "log"), proxy_options).open()
    fault_proxy.inject("unsupported", "PutObject")  # 501 NotImplemented, as from a server without the condition
    probe = probe_conditional_create(storage)
    assert probe.outcome is ConditionalCreate.REFUSED and probe.seen == "HTTP 501 NotImplemented", probe
    assert fault_proxy.requests.get("PutObject") == 1 and not fault_proxy.requests.get("DeleteObject")
    fault_proxy.inject("unsupported", "PutObject")
    with pytest.raises(ConditionalCreateError, match=r"refused as unsupported \(HTTP 501 NotImplemented\)"):
        require_conditional_create(storage, single_driver=False)
    assert list(storage.list_files()) == []
    # Storage.create on such a server: the HEAD, the refused conditional PUT, then a plain write.
    fault_proxy.inject("unsupported", "PutObject")
    assert storage.create("home/terms/0000000001.json", b"first") is True
    assert storage.create("home/terms/0000000001.json", b"second") is False  # the HEAD finds it
    assert storage.read_all("home/terms/0000000001.json") == b"first"


def test_local_disk_honours_it_without_a_word(tmp_path, caplog):
    storage = LocalStorage(tmp_path / "log")
    with caplog.at_level(logging.WARNING):
        require_conditional_create(storage, single_driver=False)
    assert caplog.records == []
    assert list(storage.list_files()) == []


class _AlwaysExists(LocalStorage):
    """A store that answers every conditional create as if the object existed (after writing it)."""

    def conditional_put(self, relpath: str, data: bytes) -> ConditionalPut:
        self.put(relpath, data)
        return ConditionalPut(PutAnswer.EXISTS, "HTTP 412 PreconditionFailed")


def test_a_store_that_says_a_new_object_exists_is_an_error_and_the_probe_cleans_up(tmp_path):
    storage = _AlwaysExists(tmp_path / "log")
    with pytest.raises(ConditionalCreateError, match="as if the object existed"):
        probe_conditional_create(storage)
    assert list(storage.list_files()) == []


@pytest.mark.timeout(120)
def test_a_sink_refused_by_the_probe_leaves_nothing_and_the_runbooks_way_out_works(rclone_server, tmp_path):
    """The refusal comes before the sink writes anything (no claim in the output, no state, nothing in the log store),
    so the runbook's first way out, the same state directory and output with a log store that honours the condition,
    starts at once."""
    from filesink import ExactlyOnceParquetSink

    log = rclone_server.url(f"test-{uuid.uuid4().hex}", "log")
    state, output = tmp_path / "state", tmp_path / "out"
    with pytest.raises(ConditionalCreateError, match="Nothing of the sink was changed"):
        ExactlyOnceParquetSink(
            str(output), state_dir=str(state), log_store=log, storage_options=rclone_server.storage_options()
        )
    assert not output.exists() or not any(output.iterdir()), sorted(output.rglob("*"))
    assert not state.exists() or not any(state.iterdir()), sorted(state.rglob("*"))
    assert list(LogLocation(log, rclone_server.storage_options()).open().list_files()) == []
    sink = ExactlyOnceParquetSink(str(output), state_dir=str(state), log_store=str(tmp_path / "log"))
    sink.close()


class _FirstAnswerLost(LocalStorage):
    """A store that honours the condition, whose first create's answer is lost: the client's retry meets the object
    the create had just made and answers as if it existed."""

    def __init__(self, root) -> None:
        super().__init__(root)
        self.lost = 1

    def conditional_put(self, relpath: str, data: bytes) -> ConditionalPut:
        answer = super().conditional_put(relpath, data)
        if self.lost and answer.answer is PutAnswer.CREATED:
            self.lost -= 1
            return ConditionalPut(PutAnswer.EXISTS, "HTTP 412 PreconditionFailed")
        return answer


def test_a_lost_answer_to_the_probes_create_is_not_taken_for_a_broken_server(tmp_path):
    storage = _FirstAnswerLost(tmp_path / "log")
    probe = probe_conditional_create(storage)
    assert probe.outcome is ConditionalCreate.HONOURED and storage.lost == 0
    assert list(storage.list_files()) == []
