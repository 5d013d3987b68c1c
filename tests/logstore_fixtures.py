"""Fixtures for log store tests: the same tests run on local disk and on the S3 test server."""

from __future__ import annotations

import pytest

from logstore import LogStore


@pytest.fixture(params=["local", "s3"])
def log_url(request, tmp_path):
    """(URL, storage options) of an empty log store location."""
    if request.param == "local":
        return str(tmp_path / "log"), {}
    return request.getfixturevalue("s3_prefix") + "/log", request.getfixturevalue("s3_options")


@pytest.fixture
def open_store(tmp_path, log_url):
    """Open the log store at ``log_url`` with its state database in ``tmp_path / "state"``."""
    url, options = log_url
    stores = []

    def factory(vnodes=16):
        store = LogStore.open(tmp_path / "state", url, vnodes=vnodes, storage_options=options)
        stores.append(store)
        return store

    yield factory
    for store in stores:
        store.close()
