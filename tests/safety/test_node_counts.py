"""What a node says about itself or the engine is decided by the majority.

A node's count of the engine's nodes (``query.fedclust_node``) and the digest of its feature
column names are words the server cannot check against anything but the other nodes: the
majority decides, an answer outside the possible range excludes its sender, and a missing
digest where the majority's files name their columns is a failed check.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from client_apps.app import app as client_app
from fedclust.config import ConfigError
from server_app.app import run_method
from server_app.inprocess import InProcessGrid

IRIS = {"method": "exact-fcm", "dataset": "iris", "num-clients": 3, "seed": 0, "plots": False,
        "fcm.n-clusters": 3, "fcm.max-rounds": 4}
BAD = 1000


def _says(value: int, nodes=frozenset({BAD})):
    def app(msg, context):
        rep = client_app(msg, context)
        if context.node_id in nodes and msg.metadata.message_type == "query.fedclust_node":
            rep.content.metric_records["metrics"]["num-partitions"] = value
        return rep
    return app


def _run(app, cfg, n, out: Path, **grid):
    cfg = {**cfg, "output-dir": str(out)}
    return run_method(InProcessGrid(app, n, cfg, **grid), cfg)


def test_a_node_saying_the_engine_has_no_nodes_is_outvoted(tmp_path):
    """Probe: one node answering num-partitions=0 was believed (0 is what a deployed node says),
    and the two honest simulated nodes were the ones excluded."""
    summary = _run(_says(0), {**IRIS, "num-clients": 0}, 3, tmp_path / "run")
    assert [(e["node"], e["phase"]) for e in summary["excluded_nodes"]] == [(BAD, "engine")]
    assert "majority" in summary["excluded_nodes"][0]["reason"]
    assert summary["metrics"]["n_clients"] == 3


def test_a_count_outside_the_possible_range_excludes_its_sender(tmp_path):
    summary = _run(_says(2), IRIS, 3, tmp_path / "run")
    assert [(e["node"], e["phase"]) for e in summary["excluded_nodes"]] == [(BAD, "engine")]
    assert "possible answers" in summary["excluded_nodes"][0]["reason"]


def test_a_tie_asks_every_node_then_stops(tmp_path):
    """Two nodes, one says 0 and one says 2: no majority, nobody else to ask."""
    with pytest.raises(ConfigError, match="no majority"):
        _run(_says(0), {**IRIS, "num-clients": 2}, 2, tmp_path / "run")
    # four nodes: the first three asked split 2-1 … a 2-2 split over four is asked of all
    summary = _run(_says(0, frozenset({1000})), {**IRIS, "num-clients": 4}, 4, tmp_path / "r4")
    assert [e["node"] for e in summary["excluded_nodes"]] == [1000]


def _sites(tmp_path: Path, reorder: int | None = None) -> list[dict]:
    rng = np.random.default_rng(0)
    nodes = []
    for i in range(3):
        x = rng.normal(size=(40, 3)) + 3 * (np.arange(40) % 2)[:, None]
        names = ["a", "b", "c"]
        if i == reorder:
            x, names = x[:, [1, 0, 2]], ["b", "a", "c"]
        path = tmp_path / f"site{i}.csv"
        np.savetxt(path, x, delimiter=",", header=",".join(names), comments="")
        nodes.append({"data-path": str(path)})
    return nodes


def test_a_node_without_a_column_digest_fails_the_check(tmp_path):
    """Probe: a node could omit its column-name digest and be summed position by position."""
    def app(msg, context):
        rep = client_app(msg, context)
        if context.node_id == BAD and msg.metadata.message_type == "query.fcm_stats":
            del rep.content.metric_records["metrics"]["columns"]
        return rep

    cfg = {"method": "exact-fcm", "dataset": "local", "num-clients": 3, "plots": False,
           "fcm.n-clusters": 2, "fcm.max-rounds": 3}
    summary = _run(app, cfg, 3, tmp_path / "run", node_configs=_sites(tmp_path))
    assert [(e["node"], e["phase"]) for e in summary["excluded_nodes"]] == [(BAD, "scaling")]
    assert "no digest" in summary["excluded_nodes"][0]["reason"]


def test_a_split_among_every_node_stops(tmp_path):
    """Two of four nodes say 0: the three asked first split 2-1 and the liars won; now every
    node is asked on any disagreement, and 2-2 has no majority."""
    with pytest.raises(ConfigError, match="no majority"):
        _run(_says(0, frozenset({1000, 1002})), {**IRIS, "num-clients": 0}, 4, tmp_path / "r")
