"""Shared fixtures: where the real benchmark data live, a quiet logger, and one Ray cluster at a
time across the test workers."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from tests.exclusive import exclusive

ROOT = Path(__file__).resolve().parents[1]


def find_data_dir() -> Path | None:
    """``$FEDCLUST_DATA_DIR``, else ``../shared/data`` next to the repository."""
    candidates = [os.environ.get("FEDCLUST_DATA_DIR", ""), str(ROOT.parent / "shared" / "data")]
    for c in candidates:
        if c and (Path(c) / "README.md").exists():
            return Path(c)
    return None


@pytest.fixture(scope="session")
def data_dir() -> Path:
    path = find_data_dir()
    if path is None:
        pytest.skip("benchmark data not found: set FEDCLUST_DATA_DIR to the shared/data folder")
    return path


@pytest.fixture
def task_identity():
    """What a running ServerApp sets before it builds a ``Message``: without it Flower raises
    ``TaskIdentity.run_id is not set``, and a test would pass or fail by which test of its
    worker ran an in-process grid first."""
    from flwr.supercore.task_identity import TaskIdentity

    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@pytest.fixture
def fedclust_log():
    """Warnings of the ``fedclust`` logger (it does not propagate to the root logger)."""
    handler = _Collect()
    logger = logging.getLogger("fedclust")
    logger.addHandler(handler)
    yield handler.messages
    logger.removeHandler(handler)


@pytest.fixture(autouse=True)
def _exclusive(request):
    """A test marked ``pytest.mark.exclusive(resource)`` waits for ``resource`` before its call
    (tests/exclusive.py), so waiting counts against no timeout of the test."""
    marker = request.node.get_closest_marker("exclusive")
    if marker is None:
        yield
        return
    with exclusive(marker.args[0]):
        yield
