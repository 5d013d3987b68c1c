"""The durable home's records on a local disk: a temp file that a full disk or a crash left beside them is not a
record, and a failed record write leaves no temp file behind."""

from __future__ import annotations

import errno
import json

import pytest

from logstore.home import DurableHome
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
