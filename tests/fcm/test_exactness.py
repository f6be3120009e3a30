"""Paper 004 §4.1: with all clients, federated FCM equals centralized FCM (to 1e-9)."""

import json

import numpy as np
import pytest

from fedclust import fcm
from fedclust.data import partition
from fedclust.data.tabular import load_dataset
from fedclust.fcm.validity import db_statistics, federated_fuzzy_db, fuzzy_db
from tests.fake_grid import run_server


def _scaled_pool(cfg):
    ds = load_dataset(cfg)
    x = ds.x
    lo, hi = x.min(0), x.max(0)
    return (x - lo) / np.where(hi > lo, hi - lo, 1.0), ds


@pytest.mark.parametrize("kind", ["iid", "stratified", "dirichlet"])
def test_sum_of_local_sums_equals_the_pooled_update(kind):
    rng = np.random.default_rng(0)
    from sklearn.datasets import make_blobs

    x, y = make_blobs(1200, centers=5, n_features=4, random_state=1)
    parts = {"iid": lambda: partition.iid(len(y), 7, 0),
             "stratified": lambda: partition.stratified(y, 7, 0),
             "dirichlet": lambda: partition.dirichlet(y, 7, 0.3, 0)}[kind]()
    v = rng.normal(size=(5, 4))
    for _ in range(10):
        sums = [fcm.local_sums(x[p], v) for p in parts]
        fed = fcm.update_centers(sum(s[0] for s in sums), sum(s[1] for s in sums), v)
        central = fcm.update_centers(*fcm.local_sums(x, v), v)
        np.testing.assert_allclose(fed, central, atol=1e-12)
        v = fed


@pytest.mark.parametrize("kind, n_clients", [("iid", 6), ("stratified", 10), ("dirichlet", 5)])
def test_server_loop_with_gamma_one_equals_centralized_fcm(tmp_path, kind, n_clients):
    cfg = {"method": "exact-fcm", "dataset": "blobs", "blobs.n-features": 3,
           "num-clients": n_clients, "partition.kind": kind, "partition.alpha": 0.3,
           "fcm.n-clusters": 4, "fcm.max-rounds": 40, "fcm.epsilon": 1e-7,
           "output-dir": str(tmp_path), "plots": False, "seed": 3}
    summary, _ = run_server(cfg)
    init = np.load(tmp_path / "initial_centers.npy")
    fed = np.load(tmp_path / "centers.npy")
    from fedclust.config import validate

    x, _ = _scaled_pool(validate(cfg))
    central = fcm.FuzzyCMeans(4, init=init, tol=1e-7, max_iter=40).fit(x)
    np.testing.assert_allclose(fed, central.cluster_centers_, atol=1e-9, rtol=0)
    assert summary["metrics"]["rounds"] == central.n_iter_
    history = [json.loads(line) for line in (tmp_path / "history.jsonl").read_text().splitlines()]
    np.testing.assert_allclose([h["shift"] for h in history], central.shifts_, atol=1e-9)


def test_partial_participation_still_converges_near_the_central_solution(tmp_path):
    cfg = {"method": "exact-fcm", "num-clients": 20, "fcm.fraction": 0.5, "output-dir":
           str(tmp_path), "plots": False, "partition.kind": "stratified", "seed": 1}
    summary, _ = run_server(cfg)
    history = [json.loads(line) for line in (tmp_path / "history.jsonl").read_text().splitlines()]
    assert all(h["sampled"] == 10 for h in history)
    assert summary["metrics"]["eval_ari"] > 0.9


def test_privacy_guard_withholds_tiny_clients(tmp_path):
    # 15 points over 12 clients: clients hold 1-2 points; C(F+1)/F = 4*3/2 = 6 > N_m.
    cfg = {"method": "exact-fcm", "num-clients": 12, "blobs.n-samples": 15, "fcm.max-rounds": 2,
           "output-dir": str(tmp_path), "plots": False}
    with pytest.raises(RuntimeError, match="scaling phase.*fcm.privacy-guard=false"):
        run_server(cfg)
    assert (tmp_path / "history.jsonl").read_text() == ""   # stopped before any round
    cfg.update({"fcm.privacy-guard": False, "output-dir": str(tmp_path / "off")})
    run_server(cfg)
    history = [json.loads(line) for line in
               (tmp_path / "off" / "history.jsonl").read_text().splitlines()]
    assert history[0]["withheld"] == 0 and history[0]["contributed"] == 12


def central_fuzzy_db_by_definition(x, centers, m, p, q):
    """Paper 003 eqs. 7-13 on pooled data, written out independently of fedclust.fcm.validity."""
    n, k = x.shape[0], centers.shape[0]
    dist = np.linalg.norm(x[:, None, :] - centers[None, :, :], axis=2)          # (n, K)
    u = 1.0 / ((dist[:, :, None] / dist[:, None, :]) ** (2 / (m - 1))).sum(axis=2)
    s = u.sum(0) / n * ((dist**q).sum(0) / n) ** (1 / q)                         # eq. 12-13
    r = np.zeros(k)
    for i in range(k):
        r[i] = max((s[i] + s[j]) / (np.abs(centers[i] - centers[j]) ** p).sum() ** (1 / p)
                   for j in range(k) if j != i)
    return r.mean()


@pytest.mark.parametrize("p, q, m", [(2.0, 1.0, 2.0), (2.0, 2.0, 2.0), (1.0, 1.0, 1.5)])
def test_fedfuzzdb_equals_central_index_on_pooled_data(p, q, m):
    from sklearn.datasets import make_blobs

    x, y = make_blobs(900, centers=4, n_features=3, random_state=5)
    centers = fcm.FuzzyCMeans(4, random_state=0, max_iter=50).fit(x).cluster_centers_
    central = central_fuzzy_db_by_definition(x, centers, m, p, q)
    assert abs(fuzzy_db(x, centers, m, p, q) - central) < 1e-9
    for parts in (partition.iid(900, 9, 1), partition.dirichlet(y, 6, 0.2, 2)):
        stats = [db_statistics(x[i], centers, m, q) for i in parts]
        assert abs(federated_fuzzy_db(stats, centers, p, q) - central) < 1e-9


def test_fuzzy_db_matches_its_definition():
    rng = np.random.default_rng(0)
    x, c = rng.normal(size=(50, 2)), rng.normal(size=(3, 2))
    u = fcm.memberships(x, c)
    dist = np.linalg.norm(x[:, None] - c[None], axis=2)
    s = u.mean(0) * dist.mean(0)                          # eq. 12-13 with q = 1
    r = [max((s[i] + s[j]) / np.linalg.norm(c[i] - c[j]) for j in range(3) if j != i)
         for i in range(3)]
    assert abs(fuzzy_db(x, c) - np.mean(r)) < 1e-12


def test_participants_are_resampled_every_round_and_init_lies_in_the_federated_bounds(tmp_path):
    picked: dict[str, set[int]] = {}

    def inspect(msg, rep):
        if msg.metadata.message_type == "query.fcm_sums":
            picked.setdefault(msg.metadata.group_id, set()).add(msg.metadata.dst_node_id)

    cfg = {"method": "exact-fcm", "num-clients": 8, "fcm.fraction": 0.25, "fcm.epsilon": 0.0,
           "fcm.max-rounds": 6, "scaling": "none", "output-dir": str(tmp_path), "plots": False}
    run_server(cfg, inspect=inspect)
    assert len(picked) == 6 and all(len(s) == 2 for s in picked.values())
    assert len({frozenset(s) for s in picked.values()}) > 1          # γ resampled each round
    from fedclust.config import validate

    x = load_dataset(validate(cfg)).x
    init = np.load(tmp_path / "initial_centers.npy")
    assert np.all(init >= x.min(0)) and np.all(init <= x.max(0))


@pytest.mark.parametrize("extra", [
    {"fcm.fraction": 0.5},
    {"fcm.fraction": 0.25, "fcm.incremental": True, "partition.kind": "dirichlet",
     "partition.alpha": 0.3, "fcm.max-rounds": 60},
    {"blobs.n-samples": 150, "partition.kind": "dirichlet", "partition.alpha": 0.5},
], ids=["paper-rule", "incremental", "guard-withholds-some"])
def test_the_flower_run_is_the_loop_over_in_memory_clients(tmp_path, extra):
    """The ServerApp run and :func:`fedclust.fcm.loop.run` over in-memory clients holding the
    same partitions: one loop, so the same participants, centers, history and metrics (only
    node ids, traffic and timings differ)."""
    from client_apps.data import simulated_partition
    from fedclust.config import validate
    from fedclust.fcm import inmemory, loop
    from fedclust.fcm.keys import FCMSettings
    from fedclust.results import MemoryRecord, to_jsonable

    cfg = {"method": "exact-fcm", "dataset": "blobs", "num-clients": 10, "seed": 2,
           "plots": False, "output-dir": str(tmp_path), **extra}
    # one message at a time, as every engine but the in-process one serves them: the same
    # additions in the same order as the in-memory clients, so the same bits (the in-process
    # engine's batched sums equal these up to rounding: tests/fcm/test_fcm_batched.py)
    summary, _ = run_server(cfg, batch=False)
    full = validate(cfg)
    parts = [simulated_partition(full, i, 10) for i in range(10)]
    s = FCMSettings.from_config(full)
    record = MemoryRecord()
    metrics = to_jsonable(loop.run(inmemory.InMemoryClients([p.x for p in parts], s,
                                                            [p.y_eval for p in parts]),
                                   s, record))
    traffic = {"bytes_sent", "bytes_received", "dropped_nodes"}

    def same(m: dict) -> dict:      # node ids differ: coverage compared by its counts
        return {k: ({**v, "missing": len(v["missing"])} if k.endswith("_coverage")
                    and "missing" in v else v) for k, v in m.items() if k not in traffic}

    assert same(metrics) == same(summary["metrics"])
    for name, arr in record.arrays.items():
        np.testing.assert_array_equal(arr, np.load(tmp_path / f"{name}.npy"), err_msg=name)
    history = [json.loads(line) for line in (tmp_path / "history.jsonl").read_text()
               .splitlines()]
    timing = {"seconds", "elapsed_s"}
    assert [{k: v for k, v in h.items() if k not in timing} for h in record.history] == \
        [{k: v for k, v in h.items() if k not in timing} for h in history]
