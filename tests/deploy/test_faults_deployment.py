"""A SuperNode killed mid-run (SIGTERM and SIGKILL) on the real Deployment Engine.

The run must finish with the remaining clients, name the dropped node (by its SuperNode ID)
with the reason in ``history.jsonl``, in the run's log and in ``summary.json``; no phase may
wait longer than the configured reply ``timeout`` (plus scheduling slack), and the *whole run*
(submission to final status) may not take longer than ``phases × timeout`` plus a fixed
start-up allowance — so a hang anywhere, not only inside a round, fails the test.

What Flower does (flwr 1.41/1.42, notes §4.4): after SIGTERM the SuperNode deregisters and the
next message to it comes back at once as an error reply ("Node Unavailable"); after SIGKILL the
SuperLink only notices after the heartbeat expires (~30-60 s), so the next phases get *no*
reply and wait the full ``timeout`` — ``send_and_collect`` records both as dropouts. A node
killed while it uploads a reply leaves a reply whose objects never arrive: the ServerApp's grid
retries pulling them until the SuperLink's object-push session expires
(``OBJECT_PUSH_SESSION_TTL_SECONDS``, 180 s), then gives an error reply ("Reply message objects
are unavailable"); that phase may take that much longer than ``timeout``, no other.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import signal
import time
from pathlib import Path

import pytest
from flwr.supercore.constant import OBJECT_PUSH_SESSION_TTL_SECONDS

from server_app.deploy import LoopbackDeployment, write_partitions

pytestmark = pytest.mark.slow

# Reply timeout per phase: must exceed one healthy round trip (~6-10 s idle; each message starts
# a fresh ClientApp process, and the first one also installs the app: over 45 s on CI's loaded
# 2 cores), and bounds the wait after SIGKILL.
TIMEOUT = float(os.environ.get("FEDCLUST_TEST_REPLY_TIMEOUT", "60"))
SLACK = 20.0     # 3-s polling + process start-up beyond the timeout
ROUNDS = 4
PHASES = 1 + ROUNDS + 1          # scaling, the FCM rounds, the final (objective) phase
# Submission (FAB build + install), ServerApp process start and the final status poll, on top
# of the phases themselves; measured 10-40 s on this 2-core box depending on load.
RUN_SLACK = 120.0
# Flower's error reply for a reply whose upload never completed, and how long its grid keeps
# trying to pull it (flwr.superlink.grid.http_grid, flwr.supercore.constant)
UPLOAD_CUT = "Reply message objects are unavailable"
UPLOAD_TTL = float(OBJECT_PUSH_SESSION_TTL_SECONDS)
# What send_and_collect records for a node that is gone (strategies/common.py).
REASON = re.compile(r"^(error reply: .+|no usable reply; SuperLink reported: .+|"
                    r"no reply within \d+s)$", re.S)


def _history(out: Path) -> list[dict]:
    path = out / "history.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def kill_mid_run(tmp_path: Path, sig: int) -> list[dict]:
    cfg = {"method": "exact-fcm", "num-clients": 3, "seed": 2, "fcm.max-rounds": ROUNDS,
           "fcm.epsilon": 0.0, "timeout": TIMEOUT, "plots": False}
    data = write_partitions(cfg, tmp_path / "data")
    out = tmp_path / "out"
    with LoopbackDeployment([{"data-path": str(p), "allow-evaluation": True} for p in data],
                            workdir=tmp_path / "flwr") as dep:
        t0 = time.perf_counter()
        run_id = dep.submit({**cfg, "dataset": "local", "min-clients": 3,
                             "output-dir": str(out)})
        deadline = time.monotonic() + 600
        # round 1's record is looked for every second, the run's status (a `flwr ls`, about
        # 2 s of CPU) every tenth
        for tick in itertools.count():
            if _history(out) or time.monotonic() > deadline:
                break
            if tick % 10 == 9:
                early = dep.status(run_id)
                assert not early.startswith("finished"), (f"run {run_id} ended before round "
                                                          f"1: {early}\n"
                                                          f"{dep.wait(run_id, 5).log[-3000:]}")
            time.sleep(1.0)
        assert _history(out), f"round 1 never finished\n{dep.logs()}"
        victim = dep.kill_node(2, sig)
        assert victim is not None and not dep.nodes[2].alive
        res = dep.wait(run_id, timeout=900, t0=t0)
        assert res.ok, f"run {run_id}: {res.status}\n{res.log[-3000:]}\n{dep.logs()}"
    history = _history(out)
    summary = json.loads((out / "summary.json").read_text())
    assert len(history) == ROUNDS, history
    assert history[0]["contributed"] == 3 and history[0]["dropped_nodes"] == {}
    # The killed node is named (with a reason) from the first round after the kill on …
    named = [h for h in history[1:] if str(victim) in h["dropped_nodes"]]
    assert named, history
    assert all(h["contributed"] == 2 for h in named)
    # … the run finished with the other two …
    assert history[-1]["contributed"] == 2 and str(victim) in history[-1]["dropped_nodes"]
    assert victim in summary["metrics"]["dropped_nodes"]
    assert summary["metrics"]["rounds"] == ROUNDS
    # … the reason is a dropout reason, and the run's log names the node with that reason …
    for h in named:
        why = h["dropped_nodes"][str(victim)]
        assert REASON.match(why), why
        assert f"node {victim} dropped: {why}" in res.log, (why, res.log[-3000:])
    # … no phase waited past the reply timeout (or, for a reply cut off mid-upload, Flower's
    # object-push session), and neither did the run as a whole.
    cut = [h for h in named if UPLOAD_CUT in h["dropped_nodes"][str(victim)]]
    assert len(cut) <= 1, history
    for h in history:
        assert h["seconds"] <= TIMEOUT + SLACK + (UPLOAD_TTL if h in cut else 0), history
    assert res.seconds <= PHASES * TIMEOUT + RUN_SLACK + UPLOAD_TTL * len(cut), (res.seconds,
                                                                              history)
    return history


def test_supernode_sigterm_mid_run(tmp_path):
    """SIGTERM: the SuperNode deregisters; the SuperLink then answers for it (an error reply, or
    a reply it could not match to the node, depending on how far the goodbye got under load)
    instead of leaving every later phase to its timeout as after SIGKILL."""
    history = kill_mid_run(tmp_path, signal.SIGTERM)
    reasons = [r for h in history[1:] for r in h["dropped_nodes"].values()]
    assert any(r.startswith(("error reply: ", "no usable reply; SuperLink reported: "))
               for r in reasons), reasons


def test_supernode_sigkill_mid_run(tmp_path):
    """SIGKILL: no goodbye; phases wait up to the timeout until the heartbeat expires."""
    kill_mid_run(tmp_path, signal.SIGKILL)
