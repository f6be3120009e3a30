"""FedCRef on nodes that read their own data file (deployment layout), in-process.

A node's ``.npz`` may or may not carry true classes ``y`` and a node-config ``num-clusters``;
an explicit ``fedcref.init=dirty`` (the default ``auto`` is label-free k-means on such nodes,
tests/fedcref/test_fedcref_label_free.py) must take K_i from the node's classes, and refuse
clearly when it cannot or may not use them.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from flwr.app import Context, RecordDict

from client_apps.fedcref_handlers import _data, _init_state, dirty_k
from fedclust.config import validate
from tests.fake_grid import run_server

CFG = {"method": "fedcref", "dataset": "digits", "num-clients": 3, "seed": 0,
       "fedcref.split": "all", "fedcref.fl-rounds": 2, "fedcref.fl-local-epochs": 1,
       "fedcref.batch-size": 16, "fedcref.ae-epochs": 3, "fedcref.ae-patience": 0,
       "fedcref.max-iterations": 1, "fedcref.k-max": 3, "fedcref.samples-per-cluster": 30,
       "fedcref.dirtiness": 0.2, "plots": False}


def _ctx(node_config: dict, cfg: dict) -> Context:
    return Context(run_id=1, node_id=1, node_config=node_config, state=RecordDict(),
                   run_config=cfg)


def _write_nodes(directory: Path, with_y: bool = True, allow: bool = True) -> list[dict]:
    full = validate(CFG)
    nodes = []
    for i in range(CFG["num-clients"]):
        ctx = _ctx({"partition-id": i, "num-partitions": CFG["num-clients"]}, CFG)
        x, y, _ = _data(ctx, {**full, "evaluate": True})
        path = directory / f"c{i}.npz"
        np.savez(path, **({"x": x, "y": y} if with_y else {"x": x}))
        # no num-clusters key; the dirty start may use the labels only where evaluation is allowed
        nodes.append({"data-path": str(path), **({"allow-evaluation": True} if allow else {})})
    return nodes


def test_dirty_start_without_num_clusters_takes_k_from_the_node_classes(tmp_path: Path) -> None:
    nodes = _write_nodes(tmp_path)
    got, _ = run_server({**CFG, "dataset": "local", "fedcref.init": "dirty",
                         "output-dir": str(tmp_path / "a")}, node_configs=nodes)
    # the default start (auto) of simulated nodes is the same dirty start
    ref, _ = run_server({**CFG, "output-dir": str(tmp_path / "b")})
    assert got["metrics"]["dropped_nodes"] == []
    assert got["metrics"]["isolated_start"] == ref["metrics"]["isolated_start"] > 0
    for key in ("eval_acc_start", "eval_acc_end", "communities"):
        assert got["metrics"][key] == pytest.approx(ref["metrics"][key], rel=1e-9), key


def test_dirty_start_refuses_a_node_without_classes(tmp_path: Path) -> None:
    nodes = _write_nodes(tmp_path, with_y=False)
    cfg = validate({**CFG, "dataset": "local", "fedcref.init": "dirty"})
    ctx = _ctx(nodes[0], cfg)
    x, y, k = _data(ctx, cfg)
    with pytest.raises(ValueError, match=r"fedcref.init='dirty'.*no 'y' array.*kmeans"):
        _init_state(ctx, cfg, x, y, k, seed=0)


@pytest.mark.parametrize(("allow", "evaluate", "why"), [
    (False, True, "allow-evaluation is not true"), (True, False, "evaluate=false")])
def test_dirty_start_refuses_a_deployed_node_that_may_not_use_its_labels(
        tmp_path: Path, allow: bool, evaluate: bool, why: str) -> None:
    nodes = _write_nodes(tmp_path, allow=allow)
    cfg = validate({**CFG, "dataset": "local", "fedcref.init": "dirty", "evaluate": evaluate})
    ctx = _ctx(nodes[0], cfg)
    x, y, k = _data(ctx, cfg)
    assert y is None
    with pytest.raises(ValueError, match=rf"simulation protocol.*{why}.*fedcref.init='auto'"):
        _init_state(ctx, cfg, x, y, k, seed=0)


def test_dirty_k_checks_num_clusters() -> None:
    y = np.array([3, 3, 7, 7, 9])
    assert dirty_k(y, 0) == 3 and dirty_k(y, 3) == 3
    with pytest.raises(ValueError, match="num-clusters=2 .* 3 classes"):
        dirty_k(y, 2)
