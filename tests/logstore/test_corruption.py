"""Damaged segment files are always detected, with an error naming the file, epoch and vnodes."""

from __future__ import annotations

import pytest
from helpers import flatten, make_rows

from logstore import SegmentCorruptError, SegmentMissingError, append_segment


@pytest.fixture
def sealed(open_store):
    """A store with epoch 0 of two segments; the victim holds vnodes 1 and 2."""
    store = open_store(vnodes=4)
    victim = append_segment(store.target, 0, make_rows(range(100), [1 + i % 2 for i in range(100)]), writer_id="v")
    healthy = append_segment(store.target, 0, make_rows(range(100, 110), [0] * 10), writer_id="h")
    store.seal(0, [victim, healthy])
    return store, victim


def _rewrite(store, name, change):
    data = bytearray(store.storage.read_all(name))
    store.storage.write(name, [bytes(change(data))])


def _flip(offset):
    def change(data):
        data[offset] ^= 0x40
        return data

    return change


def _read_all(store):
    return flatten(store.read(range(0, 4), -1, 0))


def test_flipped_byte_in_a_block(sealed):
    store, victim = sealed
    block = victim.runs[1].blocks[0]  # vnode 2
    _rewrite(store, victim.name, _flip(block.offset + block.length // 2))
    with pytest.raises(SegmentCorruptError, match=rf"{victim.name} \(epoch 0, vnodes 1, 2\).*checksum mismatch"):
        _read_all(store)
    # vnodes the damage does not touch still read
    assert [r[2] for r in flatten(store.read(range(0, 2), -1, 0))] == list(range(100, 110)) + list(range(0, 100, 2))
    [problem] = store.verify()
    assert victim.name in str(problem) and "epoch 0" in str(problem)


def test_flipped_byte_in_the_footer_is_found_by_verify(sealed):
    store, victim = sealed
    _rewrite(store, victim.name, _flip(victim.size - 20))
    [problem] = store.verify()
    assert isinstance(problem, SegmentCorruptError)
    assert "footer checksum mismatch" in str(problem) and victim.name in str(problem)


def test_truncated_file(sealed):
    store, victim = sealed
    _rewrite(store, victim.name, lambda data: data[: victim.runs[1].blocks[0].offset + 10])
    with pytest.raises(SegmentCorruptError, match=rf"{victim.name} \(epoch 0, vnodes 1, 2\).*short read"):
        _read_all(store)
    [problem] = store.verify()
    assert "bytes, sealed with" in str(problem)


def test_missing_file(sealed):
    store, victim = sealed
    store.storage.delete(victim.name)
    with pytest.raises(SegmentMissingError, match=rf"{victim.name} \(epoch 0, vnodes 1, 2\).*missing"):
        _read_all(store)
    [problem] = store.verify()
    assert isinstance(problem, SegmentMissingError)


def test_healthy_store_verifies_clean(sealed):
    store, _ = sealed
    assert store.verify() == []
    assert len(_read_all(store)) == 110


def test_recover_status_reports_the_damaged_vnodes(tmp_path, capsys):
    import json

    from filesink import ExactlyOnceParquetSink, Rollover
    from filesink.cli.main import main

    sink = ExactlyOnceParquetSink(
        str(tmp_path / "out"), tmp_path / "state", vnodes=4, rollover=Rollover(max_epochs=100, max_age_seconds=None)
    )
    store = sink.log_store
    victim = store.append(0, make_rows(range(100), [1 + i % 2 for i in range(100)]), writer_id="v")
    healthy = store.append(0, make_rows(range(100, 110), [0] * 10), writer_id="h")
    store.seal(0, [victim, healthy])
    sink.close()
    clean = ["recover", "status", "--state-dir", str(tmp_path / "state"), "--json"]
    assert main(clean) == 0
    assert json.loads(capsys.readouterr().out)["damaged_vnodes"] == []

    block = victim.runs[0].blocks[0]
    _rewrite(store, victim.name, _flip(block.offset + block.length // 2))
    assert main(clean) == 0
    status = json.loads(capsys.readouterr().out)
    assert status["damaged_vnodes"] == [1, 2]
    [damaged] = status["damaged_segments"]
    assert damaged["segment"] == victim.name and damaged["epoch"] == 0 and "vnodes 1, 2" in damaged["problem"]

    assert main(clean[:-1]) == 0
    out, err = capsys.readouterr()
    assert "DAMAGED log segments: 1; vnodes whose data cannot be read: 1-2" in out and "verified 2/2" in err
    assert main([*clean, "--no-verify"]) == 0
    assert "damaged_vnodes" not in json.loads(capsys.readouterr().out)
