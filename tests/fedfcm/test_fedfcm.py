"""FedFCM with k-means averaging, FedFuzzDB and the choice of K (paper 003)."""

import json

import numpy as np
import pytest

from fedclust.fedfcm import kmeans_average, support_weighted_average
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


@pytest.mark.parametrize("averaging", ["kmeans", "fedavg"])
def test_the_flower_run_is_the_loop_over_in_memory_clients(tmp_path, averaging):
    """The ServerApp run and :func:`fedclust.fedfcm.loop.run` over in-memory clients holding
    the same partitions: one loop, so the same centers of every K, index, choice of K, rounds
    and history (only node ids, traffic and timings differ)."""
    from client_apps.data import simulated_partition
    from fedclust.config import validate
    from fedclust.fedfcm import inmemory, loop
    from fedclust.fedfcm.keys import FedFCMSettings
    from fedclust.results import MemoryRecord, to_jsonable

    cfg = {**MOTIVATIONAL, "fedfcm.averaging": averaging, "fedfcm.k-max": 6,
           "output-dir": str(tmp_path)}
    summary, _ = run_server(cfg)
    full = validate(cfg)
    parts = [simulated_partition(full, i, 3) for i in range(3)]
    s = FedFCMSettings.from_config(full)
    record = MemoryRecord()
    metrics = loop.run(inmemory.InMemoryClients([p.x for p in parts], s,
                                                [p.y_eval for p in parts]), s, record)
    mine, fed = to_jsonable(metrics), summary["metrics"]
    for key in ("ks", "index", "best_k", "elbow_k", "fedfuzzdb", "rounds", "unconverged_k",
                "objective_best_k", "eval_ari", "eval_ari_best_k"):
        assert mine[key] == fed[key], key
    for key in ("local_index", "local_best_k"):   # by client: node ids differ
        assert list(mine[key].values()) == list(fed[key].values()), key
    for name, arr in record.arrays.items():
        np.testing.assert_array_equal(arr, np.load(tmp_path / f"{name}.npy"), err_msg=name)
    history = [json.loads(line) for line in (tmp_path / "history.jsonl").read_text()
               .splitlines()]
    for mine, theirs in zip(record.history, history, strict=True):
        assert {k: v for k, v in mine.items() if k not in ("seconds", "elapsed_s")} == \
            {k: v for k, v in theirs.items() if k not in ("seconds", "elapsed_s")}


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
