"""Every engine honours ``timeout``, and a client-count mismatch is refused at once.

The in-process engine (``fedclust.simulate``, ``fedclust sweep``, the tests) called each
handler and waited for it however long it took, and waited ``timeout`` (600 s by default) for
nodes that could never connect when ``num-clients`` exceeded its nodes.
"""

from __future__ import annotations

import json
import threading

import numpy as np
import pytest

import fedclust
from client_apps.app import app as client_app
from fedclust.config import ConfigError
from server_app.app import run_method
from server_app.inprocess import InProcessGrid

BAD = 1000


def _clients(n: int = 3) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [rng.normal(size=(30, 2)) + i for i in range(n)]


def test_simulate_refuses_more_clients_in_the_run_config_than_it_was_given(tmp_path):
    """Probe: simulate() with three clients and num-clients=5 ran past 240 s (it waited for
    two nodes that could never connect); with timeout=3 it waited, then ran on 3 clients."""
    with pytest.raises(ConfigError, match="num-clients = 5 but 3 client"):
        fedclust.simulate("exact-fcm", _clients(), n_clusters=2, output_dir=tmp_path / "o",
                          run_config={"num-clients": 5, "timeout": 3, "plots": False})
    assert not (tmp_path / "o").exists()


def test_the_in_process_engine_does_not_wait_for_nodes_it_does_not_have(tmp_path):
    """Nodes with their own data (dataset="local"): nothing asks the engine its count, and the
    run waited ``timeout`` for the missing nodes, then ran on those it had."""
    nodes = []
    for i, x in enumerate(_clients()):
        np.savez(tmp_path / f"c{i}.npz", x=x)
        nodes.append({"data-path": str(tmp_path / f"c{i}.npz")})
    cfg = {"method": "exact-fcm", "dataset": "local", "num-clients": 5, "timeout": 3,
           "plots": False, "fcm.n-clusters": 2, "output-dir": str(tmp_path / "run")}
    with pytest.raises(ConfigError, match="all there from the start"):
        run_method(InProcessGrid(client_app, 3, cfg, node_configs=nodes), cfg)


def test_the_in_process_engine_honours_timeout(tmp_path):
    """Node BAD hangs in round 2: the phase ends at the deadline without it, it is named with
    'no reply within', and the run goes on with the others (it stays busy, so it answers
    nothing until its handler returns). The deadline leaves the honest nodes' first round,
    imports included, room on a loaded 2-core CI machine."""
    release = threading.Event()

    def app(msg, context):
        if context.node_id == BAD and msg.metadata.group_id == "round-2":
            release.wait(60)
        return client_app(msg, context)

    cfg = {"method": "exact-fcm", "dataset": "iris", "num-clients": 3, "plots": False,
           "fcm.n-clusters": 3, "fcm.max-rounds": 3, "fcm.epsilon": 0.0, "timeout": 20,
           "output-dir": str(tmp_path / "run")}
    try:
        summary = run_method(InProcessGrid(app, 3, cfg), cfg)
    finally:
        release.set()
    history = [json.loads(x) for x in (tmp_path / "run" / "history.jsonl").read_text()
               .splitlines()]
    assert "1000" not in history[0]["dropped_nodes"]
    assert history[1]["dropped_nodes"]["1000"] == "no reply within 20s"
    assert history[1]["contributed"] == 2
    assert BAD in summary["metrics"]["dropped_nodes"]
