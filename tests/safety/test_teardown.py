"""Teardown reaches every descendant, also those Flower starts in a session of their own."""

import os
import subprocess
import sys
import time

import pytest

from server_app.engine import descendants, stop_group

LEAF = "import time; time.sleep(120)"
MIDDLE = ("import subprocess, sys, time; "
          f"subprocess.Popen([sys.executable, '-c', {LEAF!r}]); time.sleep(120)")
TOP = ("import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', "
       f"{MIDDLE!r}], start_new_session=True); time.sleep(120)")


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="needs /proc")
def test_stop_group_kills_descendants_in_other_sessions():
    top = subprocess.Popen([sys.executable, "-c", TOP], start_new_session=True)
    deadline = time.monotonic() + 60          # three Python start-ups, on a busy machine
    while len(descendants(top.pid)) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    family = descendants(top.pid)
    assert len(family) == 2          # the new-session child and its child
    stop_group(top, grace=2)
    # a signalled process needs a moment to exit, longer on a busy machine: wait for it
    # (up to 30 s) rather than a fixed pause
    deadline = time.monotonic() + 30
    while [pid for pid in family if _running(pid)] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [pid for pid in family if _running(pid)]
