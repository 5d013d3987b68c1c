"""Random sequences of append / seal / truncate / read / crash / gc against a model of per-vnode queues."""

from __future__ import annotations

import shutil
import tempfile
import uuid
from pathlib import Path

import pytest
from helpers import flatten, make_rows
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from logstore import EpochOrderError, EpochSealedError, LogStore, TruncatedRangeError, append_segment
from logstore.home import is_home_record

VNODES = 6


class LogStoreMachine(RuleBasedStateMachine):
    """The model: per vnode, a queue of (epoch, segment name, ids) above a truncate point."""

    def __init__(self, url: str = "", options: dict | None = None):
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="logstore-model-"))
        self.log_url = url.format(run=uuid.uuid4().hex) if url else str(self.dir / "log")
        self.options = options or {}
        self.store = self._open()
        self.next_id = 0
        self.epoch = 0  # the epoch being appended
        self.pending = []  # (descriptor, ids by vnode) appended to self.epoch, not sealed yet
        self.sealed = {}  # epoch -> [(segment name, {vnode: [ids]})]
        self.truncated = dict.fromkeys(range(VNODES), -1)

    def _open(self):
        return LogStore.open(self.dir / "state", self.log_url, vnodes=VNODES, storage_options=self.options)

    def teardown(self):
        self.store.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    @property
    def last_sealed(self):
        return max(self.sealed, default=-1)

    def model_rows(self, vnodes, after, up_to):
        out = []
        for v in vnodes:
            for epoch in sorted(e for e in self.sealed if after < e <= up_to):
                for _name, by_vnode in sorted(self.sealed[epoch], key=lambda s: s[0]):
                    out += [(v, epoch, i) for i in by_vnode.get(v, [])]
        return out

    @initialize()
    def start(self):
        assert self.store.last_sealed_epoch == -1

    @rule(vnodes=st.lists(st.integers(0, VNODES - 1), min_size=0, max_size=30), writer=st.sampled_from("abc"))
    def append(self, vnodes, writer):
        ids = list(range(self.next_id, self.next_id + len(vnodes)))
        self.next_id += len(vnodes)
        desc = append_segment(self.store.target, self.epoch, make_rows(ids, vnodes), writer_id=writer)
        if not vnodes:
            assert desc is None
            return
        by_vnode = {}
        for i, v in zip(ids, vnodes, strict=True):
            by_vnode.setdefault(v, []).append(i)
        assert {r.vnode: r.rows for r in desc.runs} == {v: len(x) for v, x in by_vnode.items()}
        self.pending.append((desc, by_vnode))

    @rule(gap=st.integers(0, 2))
    def seal(self, gap):
        self.store.seal(self.epoch, [d for d, _ in self.pending])
        self.sealed[self.epoch] = [(d.name, by_vnode) for d, by_vnode in self.pending]
        self.pending = []
        self.epoch += 1 + gap  # Spark batch ids are contiguous, but the log store must not rely on it

    @precondition(lambda self: self.sealed)
    @rule(data=st.data())
    def seal_old_epoch_is_refused(self, data):
        epoch = data.draw(st.integers(0, self.last_sealed))
        error = EpochSealedError if epoch == self.last_sealed else EpochOrderError
        with pytest.raises(error):
            self.store.seal(epoch, [])

    @precondition(lambda self: self.sealed)
    @rule(data=st.data())
    def truncate(self, data):
        vnodes = data.draw(st.lists(st.integers(0, VNODES - 1), min_size=1, max_size=VNODES, unique=True))
        points = {v: data.draw(st.integers(self.truncated[v], self.last_sealed)) for v in vnodes}
        self.store.truncate(points)
        self.truncated.update(points)

    @precondition(lambda self: self.sealed)
    @rule(data=st.data())
    def read(self, data):
        lo = data.draw(st.integers(0, VNODES - 1))
        hi = data.draw(st.integers(lo + 1, VNODES))
        floor = max(self.truncated[v] for v in range(lo, hi))
        after = data.draw(st.integers(-1, self.last_sealed))
        up_to = data.draw(st.integers(after, self.last_sealed))
        if after < floor:
            with pytest.raises(TruncatedRangeError):
                self.store.read(range(lo, hi), after, up_to)
            return
        got = [(v, e, i) for v, e, i, _ in flatten(self.store.read(range(lo, hi), after, up_to))]
        assert got == self.model_rows(range(lo, hi), after, up_to)

    @rule()
    def crash(self):
        """Drop every object and reopen from storage: what was not sealed is lost, the epoch is replayed."""
        self.store.close()
        self.store = self._open()
        self.pending = []

    @rule(sweep=st.booleans())
    def collect_garbage(self, sweep):
        self.store.collect_garbage(sweep=sweep)

    @precondition(lambda self: not self.pending)
    @rule()
    def collect_garbage_at_startup(self):
        self.store.collect_garbage(unsealed=True)
        files = {name for name, _ in self.store.storage.list_files() if not is_home_record(name)}
        assert files == set(self.store.segments()), "only sealed segments survive a start-up collection"

    @invariant()
    def matches_model(self):
        assert self.store.last_sealed_epoch == self.last_sealed
        assert self.store.truncate_points() == self.truncated
        backlog = {b.vnode: b.rows for b in self.store.backlog()}
        model = {v: len(self.model_rows([v], self.truncated[v], self.last_sealed)) for v in range(VNODES)}
        assert backlog == model

    @invariant()
    def held_segments_are_needed_or_awaiting_collection(self):
        for name, _ in self.store.storage.list_files():
            assert name.endswith(".seg") or is_home_record(name), f"no temp file may outlive an append: {name}"


def _settings(examples, steps):
    return settings(
        max_examples=examples, stateful_step_count=steps, deadline=None, suppress_health_check=list(HealthCheck)
    )


def test_log_store_matches_model_on_local_disk():
    run_state_machine_as_test(LogStoreMachine, settings=_settings(60, 40))


def test_log_store_matches_model_on_s3(s3_server):
    url, options = s3_server.url("stateful-{run}", "log"), s3_server.storage_options()
    run_state_machine_as_test(lambda: LogStoreMachine(url, options), settings=_settings(12, 25))
