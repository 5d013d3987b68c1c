"""The test session across pytest-xdist workers: its root directory, and which workers have finished."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

XDIST_WORKER = os.environ.get("PYTEST_XDIST_WORKER")
"""This process's name (gw0, gw1, ...) when pytest-xdist runs the session in several processes (``-n 2``)."""


def session_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The directory holding every temp directory of this test run: with pytest-xdist, those of all workers."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if XDIST_WORKER else base


def finished_workers(root: Path) -> list[str]:
    """pytest-xdist workers of this run that have finished all their tests."""
    return sorted(p.name.removeprefix("finished-") for p in root.glob("finished-*"))
