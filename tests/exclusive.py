"""One test at a time per resource, across the xdist workers of a test session.

Each Simulation Engine run starts its own Ray cluster, and Ray gives its raylet a fixed 30 s to
register (``ray/_private/node.py``): two or three clusters starting side by side on a 2-core
machine miss it and the run fails. A test marked ``pytest.mark.exclusive("ray")`` holds the
``"ray"`` lock for its whole call (``conftest.py``); a helper that starts a cluster inside a
longer test holds it for that part only: ``with exclusive("ray"): ...``.
"""

from __future__ import annotations

import fcntl
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def exclusive(resource: str) -> Iterator[None]:
    """Wait until no other worker of this session holds ``resource``, then hold it."""
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    if run is None:              # one process: its tests run one after the other anyway
        yield
        return
    folder = Path(tempfile.gettempdir()) / f"fedclust-tests-{run}"
    folder.mkdir(exist_ok=True)
    with open(folder / f"{resource}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
