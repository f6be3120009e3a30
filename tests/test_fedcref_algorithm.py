"""FedCRef's Flower-free loop (fedclust.fedcref.algorithm): the same trajectory as before it was
taken out of the strategy, the same trajectory over Flower messages and over direct calls, and
tests that fail on a wrong algorithm (one-way edges, unweighted FedAvg, a member's model in
place of the aggregate, a plain argmin in place of Algorithm 2, evaluation steering the run)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from fedclust.config import validate
from fedclust.fedcref import algorithm
from fedclust.fedcref import client as core
from fedclust.fedcref.inmemory import InMemoryClients
from tests.fake_grid import run_server
from tests.test_fedcref_e2e import FAST, planted

# A small fixed run: the planted system of test_fedcref_e2e, 3 iterations at most.
FIXED = {"method": "fedcref", "dataset": "mnist", "num-clients": 5, "seed": 1,
         "fedcref.dirtiness": 0.2, **FAST, "fedcref.max-iterations": 3}

# Recorded with the strategy before the loop moved to fedclust/fedcref/algorithm.py (the
# one-function server loop), same config.
BEFORE = {
    "summary": {"iterations": 2, "stop_reason": "no active clients", "communities": 0,
                "isolated_start": 13, "isolated_first": 6, "isolated_end": 13,
                "active_clients": 0, "eval_acc_start": 0.792222222222222, "eval_acc_end": 1.0,
                "eval_wrong_associations_pct": 0.0},
    "hist": [{"communities": 3, "isolated": 6, "edges": 5, "clusters": 13, "sizes": [3, 2, 2],
              "active_after": 2, "mean_agreement": 0.7888888888888888,
              "eval_acc": 0.9966666666666667},
             {"communities": 0, "isolated": 13, "edges": 0, "clusters": 13, "sizes": [],
              "active_after": 0, "mean_agreement": 0.9916666666666667, "eval_acc": 1.0}],
}


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return planted(tmp_path_factory.mktemp("planted"))


@pytest.fixture(scope="module")
def flower_run(root: Path, tmp_path_factory: pytest.TempPathFactory):
    out = tmp_path_factory.mktemp("fixed")
    summary, _ = run_server({**FIXED, "data-dir": str(root), "output-dir": str(out)})
    hist = [json.loads(line) for line in (out / "history.jsonl").read_text().splitlines()]
    return summary["metrics"], hist


def _compare(metrics: dict, hist: list[dict], ref: dict) -> None:
    for k, v in ref["summary"].items():
        assert metrics[k] == (pytest.approx(v) if isinstance(v, float) else v), k
    assert len(hist) == len(ref["hist"])
    for h, r in zip(hist, ref["hist"], strict=True):
        for k, v in r.items():
            assert h[k] == (pytest.approx(v) if isinstance(v, float) else v), (h["iteration"], k)


def test_same_trajectory_as_the_former_server_loop(flower_run) -> None:
    _compare(*flower_run, BEFORE)


def _inmemory(root: Path, **extra: object) -> tuple[InMemoryClients, dict]:
    """The fixed system's clients and their dirty start, as the ClientApp builds them."""
    from fedclust.fedcref.initial import initial_clustering

    cfg = validate({**FIXED, "data-dir": str(root), "output-dir": "unused", **extra})
    xs, ys, starts = [], [], []
    for i in range(cfg["num-clients"]):
        x, y = core.client_data(cfg, i)
        k = int(np.unique(y).size)
        starts.append(initial_clustering("dirty", x, k, y_true=y,
                                         dirtiness=cfg["fedcref.dirtiness"],
                                         random_state=core.derive_seed(cfg["seed"],
                                                                       core.client_key(x), 0)))
        xs.append(x)
        ys.append(y)
    return InMemoryClients(xs, starts, cfg, ys=ys), cfg


def test_direct_calls_follow_the_flower_trajectory(root: Path, flower_run) -> None:
    clients, cfg = _inmemory(root)
    out = algorithm.run(clients, algorithm.Settings.from_config(cfg))
    metrics, hist = flower_run
    _compare(out.summary, out.history, {
        "summary": {k: metrics[k] for k in BEFORE["summary"]},
        "hist": [{k: h[k] for k in BEFORE["hist"][0]} for h in hist]})


def test_trajectory_is_the_same_with_evaluation_on_and_off(root: Path) -> None:
    on_clients, cfg = _inmemory(root, evaluate=True)
    on = algorithm.run(on_clients, algorithm.Settings.from_config(cfg))
    off_clients, cfg_off = _inmemory(root, evaluate=False)
    off = algorithm.run(off_clients, algorithm.Settings.from_config(cfg_off))
    assert "eval_acc_end" in on.summary and "eval_acc_end" not in off.summary
    keys = ("communities", "isolated", "edges", "clusters", "sizes", "active_after",
            "mean_agreement")
    assert [{k: h[k] for k in keys} for h in on.history] == \
        [{k: h[k] for k in keys} for h in off.history]
    for a, b in zip(on_clients.states, off_clients.states, strict=True):
        np.testing.assert_array_equal(a.labels, b.labels)
