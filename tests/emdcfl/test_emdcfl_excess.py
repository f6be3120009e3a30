"""EMD-CFL's clustering step (fedclust.emdcfl.excess), its solver and the baselines' server steps.

- the excess subtracts client c's own reference, never the peer's;
- the lazy AND and the dual lower bound give the same clusters as the full matrix with fewer
  solves; the bound never exceeds the exact cost;
- the assignment solver equals ``ot.emd2`` on equal-size uniform clouds; workers read one
  memory-mapped store instead of pickled clouds;
- same-distribution excess is unbiased at the cloud sizes every dataset produces (and biased
  with the old Backdoor split, which the test detects);
- references computed on the client give the numbers of the former server-side references;
- IFCA and CFL server steps: right assignment, right split rule;
- the ε sweep re-clusters a finished run's excess matrix at the values asked for.
"""

import json

import numpy as np
import pytest

from fedclust.emdcfl.excess import PairClouds, Solver, cluster_clients, excess_matrix


def _groups(rng, sizes=(3, 3, 2), n=40, dim=6, shift=3.0):
    """Clients in groups; every ordered pair's clouds drawn from the two groups' Gaussians."""
    group = [g for g, size in enumerate(sizes) for _ in range(size)]
    means = [shift * rng.normal(size=dim) for _ in sizes]
    members = list(range(100, 100 + len(group)))
    pairs = {}
    for i, c in enumerate(members):
        for j, o in enumerate(members):
            if i != j:
                src = means[group[i]] + rng.normal(size=(n, dim))
                tgt = means[group[j]] + rng.normal(size=(n, dim))
                own = means[group[i]] + rng.normal(size=(n, dim))
                ref = Solver(metric="euclidean").many([(src, own)])[0]
                pairs[(c, o)] = PairClouds(src, tgt, float(ref))
    return members, pairs, np.array(group)


def test_excess_subtracts_the_source_clients_own_reference():
    rng = np.random.default_rng(0)
    members = [7, 9]
    a, b = rng.normal(size=(20, 3)), rng.normal(size=(20, 3)) + 0.5
    # client 7's reference is large (its own val is far from its train), client 9's is small
    pairs = {(7, 9): PairClouds(a, b, 1.0), (9, 7): PairClouds(b, a, 0.0)}
    solver = Solver(metric="euclidean")
    w, excess, solves = excess_matrix(members, pairs, epsilon=0.1, solver=solver, lazy=False)
    w79 = solver.many([(a, b)])[0]
    assert solves == 2 and w[0, 1] == pytest.approx(w79)
    assert excess[0, 1] == pytest.approx(w79 - 1.0)        # 7's reference, not 9's (0.0)
    assert excess[1, 0] == pytest.approx(w[1, 0] - 0.0)
    assert w[0, 0] == 1.0 and w[1, 1] == 0.0               # diagonal: own mean reference
    # the wrong reference would decide differently: 7 accepts 9 only with its own reference
    eps = w79 - 0.5
    assert excess[0, 1] < eps < w79 - 0.0
    found = cluster_clients(members, pairs, eps, solver, lazy=False)
    assert found.adjacency[0, 1] == (w[1, 0] < eps)


def test_lazy_and_gives_the_same_clusters_with_fewer_solves():
    rng = np.random.default_rng(1)
    members, pairs, truth = _groups(rng)
    solver = Solver(metric="euclidean")
    full = cluster_clients(members, pairs, 1.0, solver, lazy=False)
    lazy = cluster_clients(members, pairs, 1.0, solver, lazy=True)
    assert full.solves == len(pairs) and full.skipped == 0
    assert lazy.skipped > 0 and lazy.solves + lazy.skipped == len(pairs)
    np.testing.assert_array_equal(lazy.labels, full.labels)
    np.testing.assert_array_equal(lazy.adjacency, full.adjacency)
    from fedclust.metrics import adjusted_rand

    assert adjusted_rand(truth, full.labels) == 1.0
    solved = np.isfinite(lazy.distance)
    np.testing.assert_allclose(lazy.distance[solved], full.distance[solved], rtol=0, atol=0)


@pytest.mark.parametrize("metric", ["cosine", "euclidean", "sqeuclidean"])
def test_the_dual_bound_never_exceeds_the_exact_cost(metric):
    import ot

    from fedclust.emdcfl.distance import dual_lower_bound

    rng = np.random.default_rng(4)
    for n, k in [(30, 30), (25, 40), (60, 60)]:
        for shift in (0.0, 0.3, 2.0):
            p = np.abs(rng.normal(size=(n, 8)))
            q = np.abs(rng.normal(size=(k, 8))) + shift
            m = ot.dist(p, q, metric=metric)
            exact = ot.emd2(np.full(n, 1 / n), np.full(k, 1 / k), m)
            bound = dual_lower_bound(m)
            assert bound <= exact + 1e-12
            assert bound >= max(m.min(1).mean(), m.min(0).mean()) - 1e-15   # the simple one


def test_the_bound_skips_solves_but_not_a_single_decision():
    # three far-apart groups: every cross-group direction is decided by its bound alone
    rng = np.random.default_rng(5)
    members, pairs, truth = _groups(rng, shift=6.0)
    solver = Solver(metric="euclidean")
    eps = 1.0
    full = cluster_clients(members, pairs, eps, solver, lazy=False)
    lazy = cluster_clients(members, pairs, eps, solver, lazy=True)
    np.testing.assert_array_equal(lazy.adjacency, full.adjacency)
    np.testing.assert_array_equal(lazy.labels, full.labels)
    same = sum(truth[members.index(c)] == truth[members.index(o)] for c, o in pairs)
    assert full.solves == len(pairs) and lazy.solves == same      # only same-group directions
    # an ε so large that every pair passes: the bound may skip nothing, all are solved
    wide = cluster_clients(members, pairs, 1e6, solver, lazy=True)
    assert wide.solves == len(pairs) and wide.labels.tolist() == [0] * len(members)


def test_a_missing_pair_is_no_edge_and_a_lone_client_a_singleton():
    rng = np.random.default_rng(2)
    members, pairs, _ = _groups(rng, sizes=(4,))
    pairs = {k: v for k, v in pairs.items() if 103 not in k}      # 103 never answered
    found = cluster_clients(members, pairs, 10.0, Solver(metric="euclidean"))
    assert found.labels[:3].tolist() == [0, 0, 0] and found.labels[3] == 1
    assert not found.adjacency[3, :3].any()


@pytest.mark.parametrize("metric", ["cosine", "euclidean", "sqeuclidean"])
def test_assignment_solver_equals_network_simplex(metric):
    import ot

    from fedclust.emdcfl.distance import wasserstein

    rng = np.random.default_rng(3)
    for n in (1, 7, 64, 300):
        p, q = rng.normal(size=(n, 10)), rng.normal(size=(n, 10)) + 0.3
        m = np.nan_to_num(ot.dist(p, q, metric=metric), nan=1.0)
        ref = ot.emd2(np.full(n, 1 / n), np.full(n, 1 / n), m, numItermax=10**6)
        assert abs(wasserstein(p, q, metric) - ref) < 1e-10
    # unequal sizes: the network simplex (ot.emd2)
    p, q = rng.normal(size=(50, 4)), rng.normal(size=(40, 4))
    m = ot.dist(p, q, metric=metric)
    assert wasserstein(p, q, metric) == pytest.approx(
        ot.emd2(np.full(50, 1 / 50), np.full(40, 1 / 40), m), abs=1e-12)


def test_workers_read_one_memory_mapped_store_not_pickled_clouds(monkeypatch):
    import joblib

    from fedclust.emdcfl import distance

    rng = np.random.default_rng(4)
    clouds = [rng.normal(size=(30, 5)).astype(np.float32) for _ in range(6)]
    pairs = [(clouds[i], clouds[j]) for i in range(6) for j in range(6) if i != j]
    serial = distance.pairwise_wasserstein(pairs, "euclidean", workers=1)
    seen = []
    real = joblib.delayed

    def spy(fn):
        wrapped = real(fn)

        def call(*args, **kwargs):
            seen.append(args[0])
            return wrapped(*args, **kwargs)
        return call

    monkeypatch.setattr(joblib, "delayed", spy)
    parallel = distance.pairwise_wasserstein(pairs, "euclidean", workers=2)
    if len(seen) == 0:
        pytest.skip("one CPU: no worker processes")
    np.testing.assert_allclose(parallel, serial, rtol=0, atol=1e-12)
    assert all(isinstance(store, str) and store.endswith(".npy") for store in seen)


def _excess_samples(rng, train_c, val_c, val_o, reps, cap=512, dim=16):
    """Excess W(train_c, val_o) − W(train_c, val_c) for one distribution, as the pipeline
    computes it: clouds capped at ``cap``, every comparison on equal sizes."""
    from fedclust.emdcfl.excess import reference_distance

    solver = Solver(metric="cosine", seed=0)
    out = []
    for r in range(reps):
        draw = lambda n: rng.normal(size=(min(n, cap), dim)) + 1.0       # noqa: E731
        src, own, tgt = draw(train_c), draw(val_c), draw(val_o)
        pair = Solver(metric="cosine", seed=r).many([(src, tgt)])[0]
        out.append(pair - reference_distance(src, own, solver))
    return np.array(out)


def test_same_distribution_excess_is_unbiased_at_every_datasets_cloud_sizes():
    from fedclust.emdcfl.data import num_sets, split_sizes
    from server_app.emdcfl_experiments import CPU

    rng = np.random.default_rng(5)
    samples, frac = CPU["emdcfl.samples"], CPU["emdcfl.val-fraction"]
    sizes = {}
    for dataset in ("rotmnist", "backdoor-mnist"):
        for a in range(num_sets(dataset)):
            for b in range(num_sets(dataset)):
                (tr_a, va_a), (_, va_b) = (split_sizes(dataset, s, samples, frac) for s in (a, b))
                sizes[(min(tr_a, 512), min(va_a, 512), min(va_b, 512))] = dataset
    assert len(sizes) == 1            # every client sends 512 / 512 / 512 points
    for shape in sizes:
        e = _excess_samples(rng, *shape, reps=40)
        assert abs(e.mean()) < 3 * e.std(ddof=1) / np.sqrt(len(e)), (shape, e.mean())
    # the former Backdoor split (validation after halving: 271 vs 542 capped at 512) is biased
    old = _excess_samples(rng, 2439, 512, 271, reps=40)
    assert old.mean() > 3 * old.std(ddof=1) / np.sqrt(len(old)), old.mean()


# The excess matrix of a 4-client rotdigits run (quarter turns, seed 3, 1 round) computed by the
# former code, where the server solved W(train_c, val_c) from c's own-model validation clouds;
# the clients now compute it. Every cloud has 40 points, so equal-size cuts change nothing.
FORMER_EXCESS = [
    [0.0, 0.32119067083068287, 0.01805390486173676, 0.2353686315919199],
    [0.3259047122263523, 0.0, 0.3091370861215499, 0.023949489689103168],
    [0.027990496629257122, 0.2336835809275873, 0.0, 0.2864952619415781],
    [0.4109421183535453, 0.030750042488585233, 0.2563500185999763, 0.0]]
FORMER_CFG = {"method": "emdcfl", "dataset": "rotdigits", "num-clients": 4,
              "emdcfl.rotation": "max", "emdcfl.rounds": 1, "emdcfl.local-epochs": 3,
              "emdcfl.conv1": 8, "emdcfl.conv2": 16, "emdcfl.embed-dim": 32, "emdcfl.lr": 0.02,
              "emdcfl.batch-size": 16, "emdcfl.samples": 400, "emdcfl.max-samples": 40,
              "emdcfl.workers": 1, "seed": 3, "emdcfl.epsilon": 0.03}


def test_client_side_references_give_the_former_numbers(tmp_path):
    from server_app.inprocess import run_server

    runs = {}
    for full in (True, False):
        out = tmp_path / str(full)
        summary, _ = run_server({**FORMER_CFG, "emdcfl.full-matrix": full,
                                 "output-dir": str(out)}, num_nodes=4)
        runs[full] = summary["metrics"]["clusters"], np.load(out / "emd_excess.npy")
    # float32 training differs in the 7th digit between CPUs and thread counts; a different
    # reference (another subsample, another cloud) moves the excess by more than 1e-3
    np.testing.assert_allclose(runs[True][1], FORMER_EXCESS, rtol=0, atol=1e-5)
    assert runs[True][0] == runs[False][0]                 # lazy AND: same clusters
    assert np.isnan(runs[False][1]).any()                  # ... without some second directions


def test_ifca_server_step_averages_exactly_the_clients_that_chose_each_model():
    from fedclust.emdcfl.baselines import ifca_models

    old = {0: [np.zeros(2)], 1: [np.ones(2)], 2: [np.full(2, 7.0)]}
    trained = {10: [np.array([2.0, 2.0])], 11: [np.array([4.0, 4.0])],
               12: [np.array([-1.0, -1.0])]}
    counts = {10: 1, 11: 3, 12: 5}
    new = ifca_models(old, {10: 1, 11: 1, 12: 0}, trained, counts)
    np.testing.assert_allclose(new[1][0], [3.5, 3.5])      # (1·2 + 3·4) / 4
    np.testing.assert_allclose(new[0][0], [-1, -1])
    np.testing.assert_allclose(new[2][0], [7, 7])          # nobody chose 2: kept


def test_cfl_server_step_splits_by_the_and_rule_into_the_right_halves():
    from fedclust.emdcfl.baselines import CFLState, cfl_step

    rng = np.random.default_rng(6)
    d = rng.normal(size=20)
    base = [np.zeros(20)]
    upd = {n: [(1 if n < 4 else -1) * d + 0.05 * rng.normal(size=20)] for n in range(8)}
    counts = dict.fromkeys(upd, 1)
    state = CFLState([list(range(8)) + [99]], [base])      # 99 did not train this round
    norm = np.linalg.norm(d)
    split, _ = cfl_step(state, upd, counts, eps1=0.4 * norm, eps2=0.5 * norm, round_idx=1)
    assert sorted(map(sorted, split.clusters)) == [[0, 1, 2, 3, 99], [4, 5, 6, 7]] or \
        sorted(map(sorted, split.clusters)) == [[0, 1, 2, 3], [4, 5, 6, 7, 99]]
    for members, model in zip(split.clusters, split.models):
        trained = [n for n in members if n != 99]
        np.testing.assert_allclose(model[0], np.mean([upd[n][0] for n in trained], axis=0))
    # only one of the two conditions holds: no split (an OR rule would split here)
    for eps1, eps2 in ((0.4 * norm, 2 * norm), (1e-6, 0.5 * norm)):
        same, _ = cfl_step(state, upd, counts, eps1, eps2, round_idx=1)
        assert same.clusters == state.clusters
    late, _ = cfl_step(state, upd, counts, 0.4 * norm, 0.5 * norm, round_idx=0)
    assert late.clusters == state.clusters                 # never in round 0


# ----------------------------------------------------------------------------------------------
# PACFL baseline

def _authors_hierarchical(a: np.ndarray, thresh: float) -> list[set[int]]:
    """The PACFL code's merge loop (average of the two rows), written out as a reference."""
    a = a.copy()
    groups = [{i} for i in range(len(a))]
    while len(a) > 1:
        np.fill_diagonal(a, np.inf)
        i, j = np.unravel_index(np.argmin(a), a.shape)
        if a[i, j] > thresh:
            break
        np.fill_diagonal(a, 0)
        z = (a[:, i] + a[:, j]) / 2
        a[:, i], a[i, :] = z, z
        a = np.delete(np.delete(a, j, axis=0), j, axis=1)
        groups[i] |= groups.pop(j)
    return groups


def test_pacfl_clustering_follows_the_pacfl_merge_rule():
    from fedclust.emdcfl.pacfl import pacfl_clusters

    rng = np.random.default_rng(7)
    for _ in range(20):
        pts = rng.normal(size=(12, 2)) * 10
        a = np.linalg.norm(pts[:, None] - pts[None], axis=-1)
        for t in (2.0, 5.0, 9.0):
            labels = pacfl_clusters(a, t)
            ours = {frozenset(np.flatnonzero(labels == k).tolist()) for k in set(labels)}
            assert ours == {frozenset(g) for g in _authors_hierarchical(a, t)}


def test_pacfl_subspaces_separate_rotated_data_and_keep_labels_home():
    from fedclust.emdcfl.pacfl import angle_matrix, class_subspaces, pacfl_clusters

    rng = np.random.default_rng(8)
    base = rng.normal(size=(3, 6, 6))                    # 3 class prototypes
    clients = []
    for c in range(6):
        y = rng.integers(0, 3, size=60)
        x = base[y] + 0.05 * rng.normal(size=(60, 6, 6))
        if c % 2:
            x = np.rot90(x, 1, axes=(1, 2))
        clients.append(class_subspaces(x, y, basis=2))
    assert clients[0].shape == (36, 6) and clients[0].dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(clients[0], axis=0), 1, atol=1e-5)
    a = angle_matrix(clients)
    assert np.allclose(a, a.T) and np.all(np.diag(a) == 0)
    labels = pacfl_clusters(a, threshold=0.5 * (a[0, 2] + a[0, 1]))
    assert labels.tolist() == [0, 1, 0, 1, 0, 1]
    with pytest.raises(ValueError, match="basis"):
        class_subspaces(base, np.arange(3), basis=0)


def test_pacfl_baseline_runs_end_to_end_and_sends_only_subspaces(tmp_path):
    from server_app.inprocess import run_server
    from tests.emdcfl.test_emdcfl_server import TINY, planted_nodes

    sent = {}

    def inspect(instruction, reply):
        if instruction.metadata.message_type == "query.emdcfl_pacfl" and reply.has_content():
            sent[instruction.metadata.dst_node_id] = {
                name: sorted(rec) for name, rec in reply.content.items()}

    cfg = {**TINY, "emdcfl.algorithm": "pacfl", "emdcfl.pacfl-threshold": 30.0,
           "emdcfl.rounds": 1, "output-dir": str(tmp_path / "out")}
    m = run_server(cfg, inspect=inspect, node_configs=planted_nodes(tmp_path))[0]["metrics"]
    angles = np.load(tmp_path / "out" / "pacfl_angles.npy")
    assert angles.shape == (4, 4)
    assert m["eval_ari"] == 1.0 and m["num_clusters"] == 2, (m, angles)
    assert len(sent) == 4 and all(v == {"subspace": ["u"], "metrics": []} for v in sent.values())


def test_epsilon_sweep_reclusters_a_runs_excess_at_the_given_values(tmp_path, capsys):
    from server_app.emdcfl_experiments import main

    truth = [0, 0, 1, 1]
    excess = np.array([[0.0, 0.4, 1.6, 1.7], [0.5, 0.0, 1.8, 1.5],
                       [1.9, 1.6, 0.0, 0.3], [1.5, 2.0, 0.6, 0.0]])
    np.save(tmp_path / "emd_excess.npy", excess)
    (tmp_path / "summary.json").write_text(json.dumps(
        {"metrics": {"eval_truth": truth}, "config": {"emdcfl.epsilon": 1.0}}))
    assert main(["eps-sweep", "--run-dir", str(tmp_path), "--eps", "0.2", "1.0", "2.5",
                 "--out", str(tmp_path / "out")]) == 0
    rows = [r for r in capsys.readouterr().out.splitlines() if r.startswith("| ")][1:]
    assert rows == ["| 0.2 | 4 | 0.000 |", "| 1 | 2 | 1.000 |", "| 2.5 | 1 | 0.000 |"]
