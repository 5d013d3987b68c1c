"""The durable home's records on a local disk: a temp file that a full disk or a crash left beside them is not a
record, a failed record write leaves no temp file behind, and a run's epoch record never replaces another run's."""

from __future__ import annotations

import errno
import json

import pytest

from logstore.home import EPOCHS, DurableHome, epoch_path, term_path
from logstore.storage import LocalStorage


def test_a_leftover_temp_record_is_not_read_as_a_record(tmp_path):
    home = DurableHome(LocalStorage(tmp_path))
    home.write("home/files/a.json", {"file": "a"})
    # what a write cut short by a full disk, or a crash before the rename, leaves: an empty temp file
    (tmp_path / "home/files/.b.json.tmp-0123abcd").write_bytes(b"")
    (tmp_path / "home/files/.c.json.tmp-4567ef01").write_bytes(b'{"file": "c"')
    assert home.records("home/files") == {"home/files/a.json": {"file": "a"}}


def test_a_record_a_full_disk_refuses_leaves_no_temp_file(tmp_path, monkeypatch):
    home = DurableHome(LocalStorage(tmp_path))
    home.write("home/files/a.json", {"file": "a"})
    real_fsync = __import__("os").fsync

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr("logstore.storage.os.fsync", full)
    with pytest.raises(OSError, match=r"cannot record .*b\.json.*No space left on device"):
        home.write("home/files/b.json", {"file": "b"})
    with pytest.raises(OSError, match="No space left on device"):
        home.create("home/terms/c.json", {"term": 1})
    monkeypatch.setattr("logstore.storage.os.fsync", real_fsync)
    left = sorted(p.name for p in tmp_path.rglob("*") if p.is_file())
    assert left == ["a.json"], left
    assert json.loads((tmp_path / "home/files/a.json").read_text()) == {"file": "a"}


def _owners(home: DurableHome, *terms: tuple[int, int]) -> None:
    for term, base in terms:
        assert home.create(term_path(term), {"term": term, "base": base})


def test_a_fenced_runs_late_seal_does_not_replace_the_newer_runs_record(tmp_path):
    """Finding G of the simulation: term 3 found an older record of epoch 3, read it, and replaced it while term 4
    deleted it and sealed epoch 3 itself; term 3's put then replaced term 4's record, and a rebuild dropped the
    epoch (a silent loss). Each term now writes its own record, so term 4's stays the epoch's."""
    home = DurableHome(LocalStorage(tmp_path))
    _owners(home, (3, 2), (4, 2))
    home.write_epoch(3, 2, {"segments": ["t2.seg"]})  # a run fenced earlier: does not count (3 > base 2)
    home.write_epoch(3, 4, {"segments": ["t4.seg"]})  # the owner's seal
    home.write_epoch(3, 3, {"segments": ["t3.seg"]})  # the fenced run's seal, after the owner's
    assert home.read(epoch_path(3, 4)) == {"epoch": 3, "term": 4, "segments": ["t4.seg"]}
    view = home.view()
    assert [(r["epoch"], r["term"], r["segments"]) for r in view.epochs] == [(3, 4, ["t4.seg"])]
    assert sorted(view.stale_records) == [epoch_path(3, 2), epoch_path(3, 3)] and view.stale_epochs == []
    home.delete_records(view.stale_records)
    assert [p for _, p in home.epoch_records()] == [epoch_path(3, 4)]


def test_of_several_epoch_records_that_count_the_newest_terms_is_the_epochs(tmp_path):
    """Both records count (the epoch is within the newest term's base): the newest term's is taken, whichever
    was written last."""
    home = DurableHome(LocalStorage(tmp_path))
    _owners(home, (5, 7))
    home.write_epoch(6, 4, {"segments": ["t4.seg"]})
    home.write_epoch(6, 2, {"segments": ["t2.seg"]})
    view = home.view()
    assert [(r["epoch"], r["term"]) for r in view.epochs] == [(6, 4)]
    assert view.stale_records == [epoch_path(6, 2)] and view.last_epoch == 7


def test_an_earlier_versions_epoch_record_is_read_by_the_term_it_names(tmp_path):
    """``epochs/<E>.json`` (no term in the name) is what earlier versions wrote: it counts by the term inside,
    and a newer term's own record of the same epoch wins over it."""
    home = DurableHome(LocalStorage(tmp_path))
    _owners(home, (2, 1))
    home.write(f"{EPOCHS}/{1:020d}.json", {"epoch": 1, "term": 1, "segments": ["old.seg"]})
    home.write(f"{EPOCHS}/{2:020d}.json", {"epoch": 2, "term": 1, "segments": ["late.seg"]})  # after 2 read it
    home.write(f"{EPOCHS}/not-an-epoch.json", {"epoch": 9})
    view = home.view()
    assert [(r["epoch"], r["segments"]) for r in view.epochs] == [(1, ["old.seg"])]
    assert view.stale_epochs == [2] and view.stale_records == [f"{EPOCHS}/{2:020d}.json"]
    home.write_epoch(1, 2, {"segments": ["new.seg"]})
    assert [r["segments"] for r in home.view().epochs] == [["new.seg"]]
    assert home.epoch_numbers() == [1, 2]
