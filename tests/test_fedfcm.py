"""FedFCM with k-means averaging, FedFuzzDB and the choice of K (paper 003)."""

import json

import numpy as np
import pytest

from fedclust.fedfcm import fedfcm_simulate, kmeans_average, support_weighted_average
from fedclust.fedfcm.validity import choose_k, elbow
from tests.fake_grid import run_server

MOTIVATIONAL = {"method": "fedfcm", "dataset": "motivational", "partition.kind": "recipe",
                "num-clients": 3, "fedfcm.k-min": 2, "fedfcm.k-max": 8,
                "fedfcm.local-k-max": 5, "scaling": "none", "plots": False}


def test_motivational_example_federated_finds_five_clients_alone_find_two(tmp_path):
    """Paper 003 Table 1: FedFuzzDB lowest at K = 5; every client's local index at K = 2."""
    summary, _ = run_server({**MOTIVATIONAL, "output-dir": str(tmp_path)})
    m = summary["metrics"]
    assert m["best_k"] == 5
    assert set(m["local_best_k"].values()) == {2}
    assert m["eval_ari_best_k"] > 0.85
    assert abs(m["fedfuzzdb"]["5"] - 0.4289) < 0.05        # paper: 0.4289


def test_federated_averaging_variant_does_worse_on_non_iid_data(tmp_path):
    """Paper 003 Table 2: with federated averaging the index is higher and K = 5 is missed."""
    fed = run_server({**MOTIVATIONAL, "fedfcm.averaging": "fedavg",
                      "output-dir": str(tmp_path / "a")})[0]["metrics"]
    km = run_server({**MOTIVATIONAL, "output-dir": str(tmp_path / "b")})[0]["metrics"]
    assert fed["best_k"] != 5
    assert fed["fedfuzzdb"]["5"] > km["fedfuzzdb"]["5"]
    assert fed["eval_ari"]["5"] < km["eval_ari"]["5"]


def test_server_loop_matches_the_reference_simulation(tmp_path):
    cfg = {"method": "fedfcm", "num-clients": 4, "fedfcm.k-min": 3, "fedfcm.k-max": 3,
           "scaling": "none", "output-dir": str(tmp_path), "plots": False, "seed": 2,
           "fedfcm.tol": 1e-6, "fedfcm.max-rounds": 5}
    run_server(cfg)
    from client_apps.data import simulated_partition
    from fedclust.config import validate

    full = validate(cfg)
    xs = [simulated_partition(full, i, 4).x for i in range(4)]
    rng = np.random.default_rng(2)
    lo, hi = np.min([x.min(0) for x in xs], 0), np.max([x.max(0) for x in xs], 0)
    init = lo + rng.random((3, 2)) * (hi - lo)
    ref, _ = fedfcm_simulate(xs, 3, init=init, tol=1e-6, max_rounds=5, random_state=2003)
    np.testing.assert_allclose(np.load(tmp_path / "centers_k3.npy"), ref, atol=1e-9)


def test_kmeans_averaging_groups_permuted_local_centers():
    truth = np.array([[0.0, 0.0], [5.0, 5.0], [10.0, 0.0]])
    rng = np.random.default_rng(0)
    locals_ = [truth[rng.permutation(3)] + rng.normal(scale=0.01, size=(3, 2)) for _ in range(4)]
    got = kmeans_average(locals_, 3, previous=None, random_state=0)
    assert np.abs(np.sort(got, axis=0) - np.sort(truth, axis=0)).max() < 0.05
    # federated averaging by index cannot undo the permutation
    naive = support_weighted_average(locals_, [np.ones(3)] * 4, truth)
    assert np.abs(np.sort(naive, axis=0) - np.sort(truth, axis=0)).max() > 1.0


def test_choice_of_k_reports_every_index_argmin_and_elbow():
    ch = choose_k([2, 3, 4, 5], [0.9, 0.5, 0.45, 0.6])
    assert ch.best_k == 4 and ch.index == [0.9, 0.5, 0.45, 0.6]
    assert elbow([1, 2, 3, 4, 5, 6], [10, 5, 2, 1.8, 1.6, 1.5]) == 3


def test_dropped_client_is_recorded_and_the_run_completes(tmp_path):
    def drop(node_id, msg):          # node 1002 dies after the scaling phase
        return node_id == 1002 and msg.metadata.message_type != "query.fcm_stats"

    summary, _ = run_server({"method": "fedfcm", "num-clients": 4, "output-dir": str(tmp_path),
                             "plots": False}, drop=drop)
    history = [json.loads(line) for line in (tmp_path / "history.jsonl").read_text().splitlines()]
    assert "1002" in history[0]["dropped_nodes"]
    assert 1002 in summary["metrics"]["dropped_nodes"]
    assert summary["metrics"]["best_k"] == 4


@pytest.mark.parametrize("averaging, sends_support", [("kmeans", False), ("fedavg", True)])
def test_local_replies_carry_supports_only_for_federated_averaging(tmp_path, averaging,
                                                                   sends_support):
    """Paper 003: k-means averaging shares the local centers and nothing else."""
    keys = []

    def inspect(msg, rep):
        if msg.metadata.message_type == "train.fedfcm_local" and rep.has_content():
            keys.extend(rep.content.array_records["local"].keys())

    summary, _ = run_server({"method": "fedfcm", "dataset": "motivational",
                             "partition.kind": "recipe", "num-clients": 3, "fedfcm.k-max": 3,
                             "fedfcm.averaging": averaging, "plots": False,
                             "output-dir": str(tmp_path)}, inspect=inspect)
    assert keys and any(k.endswith(".support") for k in keys) == sends_support
    assert summary["metrics"]["best_k"] in (2, 3)


def test_kmeans_averaging_after_round_one_starts_from_the_previous_centers():
    """Rounds > 1 initialise k-means with the previous global centers: center k stays center k."""
    truth = np.array([[0.0, 0.0], [5.0, 5.0], [10.0, 0.0]])
    rng = np.random.default_rng(1)
    locals_ = [truth[rng.permutation(3)] + rng.normal(scale=0.01, size=(3, 2)) for _ in range(4)]
    for order in ([2, 0, 1], [1, 2, 0], [0, 1, 2]):
        previous = truth[order] + 0.3
        got = kmeans_average(locals_, 3, previous=previous, random_state=0)
        assert np.abs(got - truth[order]).max() < 0.05
