"""Waiting for a run's status: every ``flwr ls`` is a fresh Python process (about 2 s of CPU),
so the wait between polls grows up to a cap, and the run's log is read once at the end."""

from __future__ import annotations

import json
import subprocess
from typing import Any

import pytest

from server_app import engine


def test_the_wait_between_status_polls_grows_to_its_cap_and_the_log_is_read_once(monkeypatch):
    calls: list[list[str]] = []
    sleeps: list[float] = []
    statuses = iter(["pending"] + ["running"] * 9 + ["finished:completed"])

    def fake_run(cmd: list[str], **_: Any) -> subprocess.CompletedProcess[str]:
        calls.append(cmd)
        if cmd[1] == "ls":
            out = json.dumps({"runs": [{"run-id": 7, "status": next(statuses)}]})
        else:
            out = "the run's log"
        return subprocess.CompletedProcess(cmd, 0, out, "")

    monkeypatch.setattr(engine.subprocess, "run", fake_run)
    monkeypatch.setattr(engine.time, "sleep", sleeps.append)
    res = engine.wait_for_run(7, {}, "sim", timeout=1e6, poll=1.0, max_poll=10.0)
    assert res.status == "finished:completed" and res.log == "the run's log"
    assert [c[1] for c in calls] == ["ls"] * 11 + ["log"]
    assert sleeps == pytest.approx([1.0, 1.5, 2.25, 3.375, 5.0625, 7.59375, 10.0, 10.0, 10.0,
                                    10.0])


def test_a_run_that_never_finishes_is_given_up_at_the_timeout(monkeypatch):
    clock = [0.0]
    sleeps: list[float] = []

    def fake_run(cmd: list[str], **_: Any) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess(cmd, 0, '{"runs": [{"status": "running"}]}', "")

    def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        clock[0] += seconds

    monkeypatch.setattr(engine.subprocess, "run", fake_run)
    monkeypatch.setattr(engine.time, "sleep", sleep)
    monkeypatch.setattr(engine.time, "monotonic", lambda: clock[0])
    res = engine.wait_for_run(7, {}, "sim", timeout=30.0, poll=2.0, max_poll=10.0)
    assert res.status == "running"
    assert sum(sleeps) == pytest.approx(30.0) and max(sleeps) <= 10.0
