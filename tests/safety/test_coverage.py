"""Every figure says which nodes it covers, not only the ``eval_*`` ones.

Probe: when a node was lost in exact FCM's final phase, the objective of the other two nodes
(3.39 instead of 5.22) was reported with ``objective_withheld_clients: 0``, as if it were the
federation's. Each figure computed from one phase's replies now carries ``<figure>_coverage``
(``nodes``, ``of_nodes``, ``missing``) and a partial one is logged as a warning.
"""

from __future__ import annotations

import pytest

from client_apps.app import app as client_app
from server_app.app import run_method
from server_app.inprocess import InProcessGrid
from strategies.wire.fcm import is_final

BAD = 1000
IRIS = {"method": "exact-fcm", "dataset": "iris", "num-clients": 3, "seed": 0, "plots": False,
        "fcm.n-clusters": 3, "fcm.max-rounds": 4}
FED = {"method": "fedfcm", "dataset": "iris", "num-clients": 3, "seed": 0, "plots": False,
       "fedfcm.k-max": 3, "fedfcm.max-rounds": 3}


def _silent(message_type: str):
    return lambda nid, msg: nid == BAD and msg.metadata.message_type == message_type


def _secure_final_masked_vector(nid, msg) -> bool:
    """Node BAD drops when asked for its masked vector of the final phase (after it shared its
    keys: SecAgg+ recovers, and the final sum holds the others only)."""
    conf = msg.content.config_records.get("fitins.config")
    return nid == BAD and conf is not None and is_final(conf)


def _run(cfg, out, **grid):
    cfg = {**cfg, "output-dir": str(out)}
    return run_method(InProcessGrid(client_app, 3, cfg, **grid), cfg)["metrics"]


@pytest.mark.parametrize("secure", [False, True])
def test_the_objective_says_it_lacks_a_node_lost_in_the_final_phase(tmp_path, fedclust_log,
                                                                   secure):
    cfg = {**IRIS, "fcm.secure-aggregation": secure}
    whole = _run(cfg, tmp_path / "whole")
    assert whole["objective_coverage"] == {"nodes": 3, "of_nodes": 3, "missing": []}
    final = "train" if secure else "query.fcm_final"
    drop = _silent(final) if not secure else _secure_final_masked_vector
    part = _run(cfg, tmp_path / "part", drop=drop)
    assert part["objective"] < whole["objective"]
    assert part["objective_coverage"] == {"nodes": 2, "of_nodes": 3, "missing": [BAD]}
    assert any("objective covers 2 of 3 nodes" in m for m in fedclust_log)


def test_fedfcm_figures_say_which_nodes_they_cover(tmp_path):
    whole = _run(FED, tmp_path / "whole")
    assert whole["fedfuzzdb_coverage"]["missing"] == []
    part = _run(FED, tmp_path / "db", drop=_silent("query.fedfcm_db"))
    assert part["fedfuzzdb_coverage"] == {"nodes": 2, "of_nodes": 3, "missing": [BAD]}
    assert part["objective_best_k_coverage"]["missing"] == []
    fin = _run(FED, tmp_path / "final", drop=_silent("query.fcm_final"))
    assert fin["objective_best_k_coverage"] == {"nodes": 2, "of_nodes": 3, "missing": [BAD]}


def test_an_objective_no_node_covers_is_null(tmp_path):
    """Probe: every node lost in the final phase gave ``objective: 0.0``."""
    m = _run(IRIS, tmp_path / "none",
             drop=lambda nid, msg: msg.metadata.message_type == "query.fcm_final")
    assert m["objective"] is None
    assert m["objective_coverage"] == {"nodes": 0, "of_nodes": 3, "missing": [1000, 1001, 1002]}
