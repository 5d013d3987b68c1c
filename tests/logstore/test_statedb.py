"""The state database: durability settings and versioned schema migrations, against real SQLite files."""

from __future__ import annotations

import pytest
from sqlite_utils.migrations import Migrations

from logstore import LogStore, StateMismatchError, connect
from logstore.statedb import apply_migrations, migrations


def test_connection_is_wal_with_full_sync(tmp_path):
    db = connect(tmp_path / "nested" / "state.sqlite")
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert db.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
    assert db.execute("PRAGMA foreign_keys").fetchone()[0] == 1
    db.close()


def test_migrations_apply_once_and_record_themselves(tmp_path):
    store = LogStore.open(tmp_path, vnodes=4)
    applied = [m.name for m in migrations.applied(store.db)]
    assert applied == ["0001_log_tables", "0002_given_up"]
    assert {"log_store", "log_epochs", "log_segments", "log_segment_vnodes", "log_vnodes", "log_given_up"} <= set(
        store.db.table_names()
    )
    store.close()
    again = LogStore.open(tmp_path)
    assert [m.name for m in migrations.applied(again.db)] == applied
    assert again.vnodes == 4
    again.close()


def test_other_packages_add_their_own_migration_set(tmp_path):
    """The file sink keeps its tables in the same database through its own migration set."""
    store = LogStore.open(tmp_path, vnodes=4)
    extra = Migrations("filesink-test")

    @extra()
    def create_files(db):
        db.execute("CREATE TABLE sink_files (name TEXT PRIMARY KEY)")

    apply_migrations(store.db, extra, where="test")
    assert "sink_files" in store.db.table_names()
    assert [m.name for m in migrations.applied(store.db)] == ["0001_log_tables", "0002_given_up"]
    store.close()


def test_database_from_a_newer_version_is_refused(tmp_path):
    store = LogStore.open(tmp_path, vnodes=4)
    store.db["_sqlite_migrations"].insert(
        {"migration_set": "logstore", "name": "0099_from_the_future", "applied_at": "2030-01-01"}
    )
    store.close()
    with pytest.raises(StateMismatchError, match=r"0099_from_the_future.*newer version"):
        LogStore.open(tmp_path)


def test_bad_vnode_count_is_refused(tmp_path):
    with pytest.raises(ValueError, match="vnodes must be an integer from 1 to 32768, not 0"):
        LogStore.open(tmp_path, vnodes=0)
