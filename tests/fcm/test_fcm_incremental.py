"""Incremental exact federated FCM (``fcm.incremental``): with γ < 1 on a label-skewed split
the server loop reaches centralized FCM's fixed point; paper 004's rule does not."""

from __future__ import annotations

import json

import numpy as np
import pytest

from fedclust import fcm
from fedclust.config import ConfigError, validate
from fedclust.data import partition
from fedclust.data.tabular import load_dataset
from fedclust.fcm.incremental import LatestSums, converged
from tests.fake_grid import run_server

# 8 label-skewed clients (Dirichlet α = 0.3), two of them per round
SKEWED = {"method": "exact-fcm", "dataset": "blobs", "num-clients": 8,
          "partition.kind": "dirichlet", "partition.alpha": 0.3, "fcm.fraction": 0.25,
          "fcm.epsilon": 1e-9, "fcm.max-rounds": 300, "plots": False, "seed": 1}


def _pooled(cfg):
    """The pooled rows, scaled as the federated MinMax phase does, and the partition."""
    full = validate(cfg)
    ds = load_dataset(full)
    lo, hi = ds.x.min(0), ds.x.max(0)
    x = (ds.x - lo) / np.where(hi > lo, hi - lo, 1.0)
    parts = partition.make_partition(full["partition.kind"], ds, full["num-clients"],
                                     full["seed"], full["partition.alpha"])
    return x, parts


def _history(path):
    return [json.loads(line) for line in (path / "history.jsonl").read_text().splitlines()]


def _run(tmp_path, name, **overrides):
    cfg = {**SKEWED, **overrides, "output-dir": str(tmp_path / name)}
    # one message at a time: the benchmark's in-memory loop adds each client's sums as these
    # do, so their histories are compared bit for bit (batched sums: tests/fcm/test_fcm_batched.py)
    summary, _ = run_server(cfg, batch=False)
    out = tmp_path / name
    return summary, np.load(out / "initial_centers.npy"), np.load(out / "centers.npy"), \
        _history(out)


def test_incremental_rule_reaches_centralized_fcm_with_partial_participation(tmp_path):
    summary, init, fed, history = _run(tmp_path, "inc", **{"fcm.incremental": True})
    x, _ = _pooled(SKEWED)
    central = fcm.fcm_from_centers(x, init, 2.0, tol=1e-12, max_iter=5000)
    assert central.converged
    assert all(h["sampled"] == 2 for h in history)                 # γ < 1 in every round
    assert summary["metrics"]["converged"] and summary["metrics"]["incremental"] is True
    assert summary["config"]["fcm.incremental"] is True
    assert summary["metrics"]["clients_with_sums"] == 8            # every client answered
    assert [h["clients_with_sums"] for h in history] == sorted(h["clients_with_sums"]
                                                                for h in history)
    assert history[-1]["drift"] < 1e-9 and history[-1]["oldest_sums_age"] >= 1
    np.testing.assert_allclose(fed, central.centers, atol=1e-6, rtol=0)


def test_paper_rule_on_the_same_setting_does_not_reach_it(tmp_path):
    summary, init, fed, _ = _run(tmp_path, "paper")
    x, _ = _pooled(SKEWED)
    central = fcm.fcm_from_centers(x, init, 2.0, tol=1e-12, max_iter=5000)
    from fedclust.metrics import matched_center_distance

    assert summary["metrics"]["incremental"] is False
    assert not summary["metrics"]["converged"]                     # the centers keep wandering
    assert matched_center_distance(fed, central.centers) > 1e-2


def test_with_every_client_every_round_both_rules_are_the_same_run(tmp_path):
    base = {"fcm.fraction": 1.0, "fcm.epsilon": 1e-6}
    s_inc, _, v_inc, h_inc = _run(tmp_path, "inc", **base, **{"fcm.incremental": True})
    s_pap, _, v_pap, h_pap = _run(tmp_path, "pap", **base)
    assert s_inc["metrics"]["rounds"] == s_pap["metrics"]["rounds"]
    np.testing.assert_allclose(v_inc, v_pap, atol=1e-12, rtol=0)
    np.testing.assert_allclose([h["drift"] for h in h_inc], [h["shift"] for h in h_pap],
                               atol=1e-12)


@pytest.mark.parametrize("incremental", [True, False])
def test_the_benchmarks_in_memory_loop_replays_the_server_run(tmp_path, incremental):
    """The loop over in-memory clients on the raw partitions (what
    ``bench/fcm_incremental_table.py`` runs) equals the ServerApp run: same initial centers,
    participants, centers and number of rounds."""
    from fedclust.fcm import inmemory, loop
    from fedclust.fcm.keys import FCMSettings
    from fedclust.results import MemoryRecord

    cfg = {**SKEWED, "fcm.epsilon": 1e-6, "fcm.max-rounds": 60,
           "fcm.incremental": incremental}
    summary, init, fed, history = _run(tmp_path, "run", **cfg)
    full = validate(cfg)
    ds = load_dataset(full)
    parts = partition.make_partition(full["partition.kind"], ds, full["num-clients"],
                                     full["seed"], full["partition.alpha"])
    s = FCMSettings.from_config(full)
    record = MemoryRecord()
    sim = loop.run(inmemory.InMemoryClients([ds.x[p] for p in parts], s), s, record)
    np.testing.assert_array_equal(record.arrays["initial_centers"], init)
    assert sim["rounds"] == summary["metrics"]["rounds"]
    assert sim["converged"] == summary["metrics"]["converged"]
    assert [h["shift"] for h in record.history] == [h["shift"] for h in history]
    np.testing.assert_array_equal(record.arrays["centers"], fed)


def test_secure_aggregation_with_the_incremental_rule_is_refused_before_any_message(tmp_path):
    sent = []
    cfg = {**SKEWED, "fcm.incremental": True, "fcm.secure-aggregation": True,
           "output-dir": str(tmp_path)}
    with pytest.raises(ConfigError) as err:
        run_server(cfg, inspect=lambda msg, rep: sent.append(msg))
    text = str(err.value)
    assert "fcm.incremental" in text                                         # what
    assert "SecAgg+ reveals only the round's sum over the sampled clients" in text  # why
    assert "Fix: set fcm.incremental=false" in text and "fcm.fraction=1" in text   # how
    assert not sent
    with pytest.raises(ConfigError, match="SecAgg"):
        validate({"method": "exact-fcm", "fcm.incremental": True,
                  "fcm.secure-aggregation": True})


def test_latest_sums_replaces_only_the_clients_that_answered():
    store = LatestSums(2, 3)
    v1, v2 = np.zeros((2, 3)), np.ones((2, 3))
    a = (np.array([1.0, 2.0]), np.full((2, 3), 1.0))
    b = (np.array([3.0, 4.0]), np.full((2, 3), 2.0))
    a2 = (np.array([5.0, 6.0]), np.full((2, 3), 7.0))
    u, ws = store.totals()
    assert not u.any() and not ws.any() and len(store) == 0     # nobody answered: nothing
    assert store.drift(v1) == np.inf and store.oldest_age(1) is None
    store.replace(1, v1, {10: a, 11: b})
    store.replace(2, v2, {10: a2})                                # 11 did not answer round 2
    u, ws = store.totals()
    np.testing.assert_array_equal(u, a2[0] + b[0])                # a replaced, b kept
    np.testing.assert_array_equal(ws, a2[1] + b[1])
    assert store.clients() == [10, 11]
    assert store.round_of(10) == 2 and store.round_of(11) == 1 and store.round_of(12) is None
    assert store.oldest_age(3) == 2
    # drift: distance from the centers each kept sum was computed from
    assert store.drift(v2) == pytest.approx(np.linalg.norm(v2 - v1))
    assert store.drift(v2, [10]) == 0.0
    assert not converged(store, [10, 11], v2, 1e-3)               # 11's sums are stale
    assert converged(store, [10], v2, 1e-3)                       # 11 down: not waited for
    assert not converged(store, [10, 11, 12], v2, 10.0)           # 12 has never answered
    store.replace(3, v2, {})                                      # a round nobody answered
    np.testing.assert_array_equal(store.totals()[0], u)
    sums_of_10 = np.array(a2[0])
    a2[0][:] = -1.0                                               # the store keeps copies
    np.testing.assert_array_equal(store.arrays()["U/10"], sums_of_10)
    with pytest.raises(ValueError, match="expected"):
        store.replace(4, v2, {10: (np.ones(3), np.ones((2, 3)))})
    with pytest.raises(ValueError, match="non-finite"):
        store.replace(4, v2, {10: (np.array([np.nan, 1.0]), np.ones((2, 3)))})
    with pytest.raises(ValueError, match="older"):
        store.replace(1, v1, {12: a})


def test_a_dropped_client_keeps_its_latest_sums(tmp_path):
    """Node 1003 stops answering after round 10: its sums stay in the total, the run still
    converges (the drift is taken over the clients that can answer)."""
    def drop(nid, msg):
        group = msg.metadata.group_id
        return nid == 1003 and group.startswith("round-") and int(group.split("-")[1]) > 10

    cfg = {**SKEWED, "fcm.incremental": True, "fcm.fraction": 0.5, "fcm.epsilon": 1e-6,
           "output-dir": str(tmp_path)}
    summary, _ = run_server(cfg, drop=drop)
    history = _history(tmp_path)
    dropped_in = [h["round"] for h in history if "1003" in h["dropped_nodes"]]
    assert dropped_in, "node 1003 was never sampled after round 10"
    assert all(h["clients_with_sums"] == 8 for h in history if h["round"] >= dropped_in[0])
    assert summary["metrics"]["converged"]
    assert 1003 in summary["metrics"]["dropped_nodes"]
