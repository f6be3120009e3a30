"""EMD-CFL core (paper 001): distances, threshold rule, neighbourhood clusters, privacy, data."""

import numpy as np
import pytest

from fedclust.emdcfl.baselines import cfl_bipartition, cfl_should_split
from fedclust.emdcfl.cluster import (
    Participation,
    cluster_fedavg,
    neighbourhood_clusters,
    recluster_models,
    threshold_adjacency,
    weighted_average,
)
from fedclust.emdcfl.data import client_split, ground_truth, rotate
from fedclust.emdcfl.distance import EMDError, pairwise_wasserstein, wasserstein
from fedclust.emdcfl.privacy import (
    PairContext,
    generate_keypair,
    pair_seed,
    projection_matrix,
    shared_secret,
)


def test_wasserstein_is_zero_on_identical_clouds_and_the_shift_length_under_translation():
    rng = np.random.default_rng(0)
    p = rng.normal(size=(80, 5))
    assert wasserstein(p, p, metric="euclidean") == pytest.approx(0.0, abs=1e-12)
    assert wasserstein(p, p, metric="cosine") == pytest.approx(0.0, abs=1e-9)
    shift = np.array([3.0, 0, 0, 0, 0])
    # W1 between a cloud and its translate is exactly the translation length.
    assert wasserstein(p, p + shift, metric="euclidean") == pytest.approx(3.0, rel=1e-9)
    far = wasserstein(p, p + 10 * shift, metric="euclidean")
    assert far == pytest.approx(30.0, rel=1e-9)
    q = p + np.array([20.0, 0, 0, 0, 0])                   # all near direction +e1
    assert wasserstein(q, -q, metric="cosine") > 1.9       # opposite directions: cos dist ~2


def test_a_distance_is_never_negative_by_roundoff():
    # 1 - cos rounds to about -1e-16 on parallel points: on identical clouds most seeds gave a
    # negative W, which the server refuses as a reply (a client was dropped for -2.2e-16)
    for seed in range(40):
        p = np.random.default_rng(seed).normal(size=(50, 8))
        for metric in ("cosine", "euclidean", "sqeuclidean"):
            assert wasserstein(p, p, metric=metric) >= 0.0, (seed, metric)
        assert wasserstein(p, p[::-1].copy(), metric="cosine", solver="emd") >= 0.0


def test_sinkhorn_is_close_to_exact_and_exact_non_convergence_is_an_error():
    rng = np.random.default_rng(1)
    p, q = rng.normal(size=(60, 4)), rng.normal(size=(50, 4)) + 1.0
    exact = wasserstein(p, q, metric="euclidean")
    approx = wasserstein(p, q, metric="euclidean", solver="sinkhorn", reg=0.01)
    assert approx == pytest.approx(exact, rel=0.1)
    big = rng.normal(size=(300, 4))
    with pytest.raises(EMDError, match="exact EMD did not converge.*num-itermax"):
        wasserstein(big, big[:299] + 0.1, metric="euclidean", num_itermax=5)   # network simplex


def test_sinkhorn_non_convergence_and_underflow_are_errors():
    rng = np.random.default_rng(3)
    p, q = rng.normal(size=(60, 4)), rng.normal(size=(50, 4)) + 1.0
    with pytest.raises(EMDError, match="Sinkhorn did not converge in 3 iterations"):
        wasserstein(p, q, metric="euclidean", solver="sinkhorn", reg=0.01, num_itermax=3)
    # the same pair converges with POT's iteration budget: the limit, not the data, failed
    assert np.isfinite(wasserstein(p, q, metric="euclidean", solver="sinkhorn", reg=0.01))
    with pytest.raises(EMDError, match="numerical errors.*sinkhorn-reg"):
        wasserstein(p, q + 30.0, metric="euclidean", solver="sinkhorn", reg=1e-4)


def test_sinkhorn_passes_other_warnings_on(monkeypatch):
    """A warning that is not POT's convergence warning (here numpy's divide-by-zero text) is
    re-emitted, not reported as non-convergence."""
    import warnings

    import ot

    rng = np.random.default_rng(4)
    p, q = rng.normal(size=(40, 3)), rng.normal(size=(30, 3))
    quiet = wasserstein(p, q, metric="euclidean", solver="sinkhorn", reg=0.05)
    real = ot.sinkhorn

    def noisy(*args, **kwargs):
        warnings.warn("divide by zero encountered in divide", RuntimeWarning, stacklevel=2)
        return real(*args, **kwargs)

    monkeypatch.setattr(ot, "sinkhorn", noisy)
    with pytest.warns(RuntimeWarning, match="divide by zero"):
        value = wasserstein(p, q, metric="euclidean", solver="sinkhorn", reg=0.05)
    assert value == quiet


def test_pairwise_parallel_equals_serial():
    rng = np.random.default_rng(2)
    pairs = [(rng.normal(size=(30, 3)), rng.normal(size=(20, 3)) + i) for i in range(6)]
    serial = pairwise_wasserstein(pairs, "euclidean", workers=1)
    parallel = pairwise_wasserstein(pairs, "euclidean", workers=2)
    np.testing.assert_allclose(parallel, serial, rtol=1e-12)
    assert np.all(np.diff(serial) > 0)


def test_threshold_rule_needs_both_directions():
    # excess[c, o] = W(train_c, val_o) - W(train_c, val_c)
    e = np.array([[0.0, 0.05, 0.50],
                  [0.02, 0.0, 0.01],
                  [0.01, 0.30, 0.0]])
    adj = threshold_adjacency(e, 0.1)
    assert adj[0, 1] and adj[1, 0]                  # both directions under eps
    assert not adj[0, 2] and not adj[2, 0]          # 0 refuses 2 (0.50), although 2 accepts 0
    assert not adj[1, 2] and not adj[2, 1]          # 1 accepts 2 but 2 refuses 1 (0.30)
    assert adj.diagonal().all()
    assert threshold_adjacency(e, 1.0).all()
    assert not threshold_adjacency(e, 0.0)[0, 1]    # strict inequality
    with pytest.raises(ValueError, match="epsilon"):
        threshold_adjacency(e, -0.1)


def test_neighbourhood_clusters_are_identical_neighbourhoods_not_components():
    # two cliques {0,1,2} and {3,4}: two clusters
    adj = np.zeros((5, 5), bool)
    adj[np.ix_([0, 1, 2], [0, 1, 2])] = True
    adj[np.ix_([3, 4], [3, 4])] = True
    assert neighbourhood_clusters(adj).tolist() == [0, 0, 0, 1, 1]
    # path 0-1-2: one connected component, three different neighbourhoods
    path = np.eye(3, dtype=bool)
    path[0, 1] = path[1, 0] = path[1, 2] = path[2, 1] = True
    assert neighbourhood_clusters(path).tolist() == [0, 1, 2]
    # a missing diagonal is treated as a self-loop
    assert neighbourhood_clusters(np.array([[0, 1], [1, 0]], bool)).tolist() == [0, 0]


def test_cluster_fedavg_is_weighted_by_sample_counts():
    models = {1: [np.zeros(2, np.float32)], 2: [np.ones(2, np.float32)],
              3: [np.full(2, 5, np.float32)]}
    out = cluster_fedavg({1: 0, 2: 0, 3: 1}, models, {1: 1, 2: 3, 3: 7})
    np.testing.assert_allclose(out[0][0], [0.75, 0.75])
    np.testing.assert_allclose(out[1][0], [5, 5])
    with pytest.raises(ValueError):
        weighted_average([], [])


def test_recluster_keeps_unchanged_clusters_and_restarts_changed_ones_from_latest_models():
    def w(v):
        return [np.full(2, v, np.float32)]

    old_labels = {1: 0, 2: 0, 3: 1, 4: 1, 5: 2}
    old_models = {0: w(10), 1: w(20), 2: w(30)}          # after this round's FedAvg
    latest = {1: w(1), 2: w(2), 3: w(3), 4: w(4)}        # 5 has not trained yet
    counts = {1: 1, 2: 1, 3: 1, 4: 3}
    new_labels = {1: 7, 2: 7, 3: 8, 4: 9, 5: 4}          # {1,2} and {5} unchanged, {3,4} split
    models, kept = recluster_models(old_labels, old_models, new_labels, latest, counts, w(-1))
    assert kept == 2 and set(models) == {7, 8, 9, 4}
    np.testing.assert_array_equal(models[7][0], [10, 10])    # kept, not the mean of 1 and 2
    np.testing.assert_array_equal(models[4][0], [30, 30])    # unseen singleton keeps its model
    np.testing.assert_array_equal(models[8][0], [3, 3])      # changed: own latest model
    np.testing.assert_array_equal(models[9][0], [4, 4])
    merged, kept = recluster_models(old_labels, old_models, {c: 0 for c in old_labels}, latest,
                                    counts, w(-1))
    assert kept == 0
    np.testing.assert_allclose(merged[0][0], [(1 + 2 + 3 + 12) / 6] * 2)   # 5: no model yet
    fresh, _ = recluster_models({}, {}, {5: 0}, latest, counts, w(-1))
    np.testing.assert_array_equal(fresh[0][0], [-1, -1])     # nobody trained: the default


def test_backdoor_palettes_authors_and_wide():
    from fedclust.emdcfl.data import backdoor_colours

    y = np.arange(10)
    authors = backdoor_colours(1, y, "authors")
    # the notebook: cm.get_cmap('summer', 40)(i) for digit i = (i/39, 0.5 + i/78, 0.4)
    np.testing.assert_allclose(authors[:, 0], y / 39, rtol=1e-6)
    np.testing.assert_allclose(authors[:, 1], 0.5 + y / 78, rtol=1e-6)
    np.testing.assert_allclose(backdoor_colours(0, y[:2], "authors"), [[0.26, 0.63, 0.4]] * 2,
                               rtol=1e-6)
    np.testing.assert_allclose(backdoor_colours(2, y[:1], "authors"),
                               [[149 / 255, 52 / 255, 235 / 255]], rtol=1e-6)
    wide = backdoor_colours(1, y)
    np.testing.assert_allclose(wide[:, 0], y / 9, rtol=1e-6)              # red 0 ... 1
    np.testing.assert_allclose(backdoor_colours(2, y[:1]), [[0.5, 0.0, 0.5]])
    with pytest.raises(ValueError, match="palette"):
        backdoor_colours(0, y, "bright")


def test_partial_participation_bookkeeping():
    part = Participation([10, 11, 12, 13], 2, seed=0)
    seen = set()
    for _ in range(6):
        picked, grew = part.sample()
        assert len(picked) == 2 and grew == bool(set(picked) - seen)
        seen |= set(picked)
        assert part.seen == sorted(seen)
    labels = Participation([1, 2, 3], 1, 0).labels({1: 0})
    assert labels[1] == 0 and len(set(labels.values())) == 3        # unseen: singletons
    with pytest.raises(ValueError, match="clients per round"):
        Participation([1, 2], 3, 0)


def test_pair_members_derive_the_same_projection_and_the_seed_needs_a_private_key():
    a_priv, a_pub = generate_keypair()
    b_priv, b_pub = generate_keypair()
    assert shared_secret(a_priv, b_pub) == shared_secret(b_priv, a_pub)
    ra = PairContext(a_priv, 5, 9, b_pub, 128, 0.9).R
    rb = PairContext(b_priv, 9, 5, a_pub, 128, 0.9).R
    np.testing.assert_array_equal(ra, rb)
    assert ra.shape == (128, 115)                       # int(0.9 * 128), as the authors
    np.testing.assert_allclose(np.linalg.norm(ra, axis=1), 1.0, rtol=1e-5)
    c_priv, c_pub = generate_keypair()
    rc = PairContext(a_priv, 5, 7, c_pub, 128, 0.9).R
    assert not np.allclose(ra, rc)
    secret = shared_secret(a_priv, b_pub)
    assert pair_seed(secret, 5, 9) == pair_seed(secret, 9, 5) != pair_seed(secret, 5, 9, "x")
    for bad in (0.0, 1.5, -0.2):
        with pytest.raises(ValueError, match="projection ratio"):
            projection_matrix(np.random.default_rng(0), 10, bad)


def test_orthogonal_projection_is_an_isometry_onto_the_gaussian_draws_span():
    a_priv, a_pub = generate_keypair()
    b_priv, b_pub = generate_keypair()
    qa = PairContext(a_priv, 5, 9, b_pub, 64, 0.5, "orthogonal").R
    qb = PairContext(b_priv, 9, 5, a_pub, 64, 0.5, "orthogonal").R
    np.testing.assert_array_equal(qa, qb)                   # both members draw the same
    np.testing.assert_allclose(qa.T @ qa, np.eye(32), atol=1e-5)
    g = projection_matrix(np.random.default_rng(3), 64, 0.5)
    q = projection_matrix(np.random.default_rng(3), 64, 0.5, "orthogonal")
    raw = np.random.default_rng(3).standard_normal((64, 32))
    np.testing.assert_allclose(q @ (q.T @ raw), raw, atol=1e-4)   # same span as the draw
    assert not np.allclose(np.abs(g), np.abs(q), atol=1e-3)
    x = np.random.default_rng(4).standard_normal((5, 64)).astype(np.float32)
    inside = x @ q @ q.T                                    # points in the subspace
    np.testing.assert_allclose(np.linalg.norm(inside @ q, axis=1),
                               np.linalg.norm(inside, axis=1), rtol=1e-4)
    with pytest.raises(ValueError, match="projection must be one of"):
        projection_matrix(np.random.default_rng(0), 10, 0.5, "sparse")


def test_rotations_are_exact_for_quarter_turns_and_nearest_neighbour_otherwise():
    img = np.zeros((1, 28, 28), np.uint8)
    img[0, 2, 5] = 255
    np.testing.assert_array_equal(rotate(img, 90), np.rot90(img, 1, axes=(1, 2)))
    np.testing.assert_array_equal(rotate(img, 270), np.rot90(img, 3, axes=(1, 2)))
    np.testing.assert_array_equal(rotate(rotate(img, 180), 180), img)
    np.testing.assert_array_equal(rotate(img, 0), img)
    rng = np.random.default_rng(0)
    blob = np.zeros((2, 28, 28), np.uint8)
    blob[:, 3:11, 20:24] = rng.integers(100, 255, size=(2, 8, 4))     # off-centre: moves
    small = rotate(blob, 3)
    assert small.shape == blob.shape and small.dtype == np.uint8
    assert not np.array_equal(small, blob)
    assert set(np.unique(small)) <= set(np.unique(blob))   # nearest: no new intensities
    assert abs(int(small.astype(int).sum()) - int(blob.astype(int).sum())) < 0.05 * blob.sum()
    # a +3 degree turn moves mass counter-clockwise: same direction as np.rot90 for 90
    line = np.zeros((1, 29, 29), np.uint8)
    line[0, 14, 14:] = 255                              # ray to the right of the centre
    assert rotate(line, 90)[0, :14, 14].sum() > 0       # rot90 sends it up
    assert rotate(line, 10)[0, :14, 20:].sum() > 0      # small positive angle: upwards too


def test_rotated_clients_and_ground_truth(data_dir):
    n = 8
    a = client_split("rotmnist", "max", 1, n, 50, 20, 0.1, 0, str(data_dir))
    b = client_split("rotmnist", "max", 5, n, 50, 20, 0.1, 0, str(data_dir))
    assert a.set_id == b.set_id == 1 and a.cluster == b.cluster == 1
    assert len(a.y_train) == 45 and len(a.y_val) == 5 and len(a.y_test) == 20
    assert ground_truth("rotmnist", "two", 8).tolist() == [0, 0, 1, 1, 0, 0, 1, 1]
    assert set(ground_truth("rotmnist", "min", 8)) == {0}
    bd = client_split("backdoor-mnist", "max", 0, 6, 40, 10, 0.1, 0, str(data_dir))
    # validation split first (4 = 10 % of 40 for every set), then the train set halved
    assert bd.x_train.shape[-1] == 3 and len(bd.y_val) == 4 and len(bd.y_train) == 18
    assert bd.x_test_bd is not None and bd.x_test_bd.shape == bd.x_test.shape
    shaded = client_split("backdoor-mnist", "max", 1, 6, 40, 10, 0.1, 0, str(data_dir),
                          "authors")
    wide = client_split("backdoor-mnist", "max", 1, 6, 40, 10, 0.1, 0, str(data_dir))
    np.testing.assert_array_equal(shaded.y_train, wide.y_train)      # same images, new colours
    assert len(wide.y_val) == 4 and len(wide.y_train) == 36
    assert shaded.x_train[..., 0].max() <= 0.24 * 255 < wide.x_train[..., 0].max()


def test_cfl_split_rule_and_ifca_choice():
    rng = np.random.default_rng(0)
    d = rng.normal(size=50)
    updates = np.vstack([d + 0.1 * rng.normal(size=(4, 50)), -d + 0.1 * rng.normal(size=(4, 50))])
    assert cfl_should_split(updates, eps1=0.4 * np.linalg.norm(d), eps2=0.5, round_idx=1)
    assert not cfl_should_split(updates, 0.4 * np.linalg.norm(d), 0.5, round_idx=0)
    assert not cfl_should_split(updates[:2], 100, 0.0, round_idx=3)      # size <= 2
    halves = cfl_bipartition(updates)
    assert len(set(halves[:4])) == 1 and len(set(halves[4:])) == 1 and halves[0] != halves[4]
    # both conditions are needed (AND): each one alone must not split
    mean_norm = np.linalg.norm(updates.mean(axis=0))
    max_norm = np.linalg.norm(updates, axis=1).max()
    assert not cfl_should_split(updates, eps1=0.5 * mean_norm, eps2=0.5 * max_norm, round_idx=1)
    assert not cfl_should_split(updates, eps1=2 * mean_norm, eps2=2 * max_norm, round_idx=1)


def test_participation_keeps_flower_node_ids_exact():
    ids = [7240939148616878081, 18000000000000000001, 3]      # > int64 and > float precision
    part = Participation(ids, 2, seed=1)
    for _ in range(3):
        picked, _ = part.sample()
        assert set(picked) <= set(ids)


def test_fast_embedding_evaluation_and_pooling_equal_the_module_path():
    import torch
    from torch import nn
    from torch.nn import functional as F

    from fedclust.emdcfl.model import (
        CNN,
        ModelSpec,
        _pool2,
        build,
        embed,
        embed_many,
        embed_reference,
        evaluate,
        init_weights,
        to_tensor,
    )

    h = torch.randn(5, 3, 8, 6)
    assert torch.equal(_pool2(h), F.max_pool2d(h, 2))
    rng = np.random.default_rng(0)
    for spec in (ModelSpec(1, 28, 4, 6, 16, 10), ModelSpec(3, 28, 3, 5, 8, 10)):
        shape = (300, 28, 28) if spec.in_channels == 1 else (300, 28, 28, 3)
        x = rng.integers(0, 256, shape, dtype=np.uint8)
        y = rng.integers(0, 10, 300)
        models = [init_weights(spec, s) for s in range(3)]
        fast = embed_many(spec, iter(models), x)              # any iterable, consumed once
        for w, e in zip(models, fast):
            assert e.shape == (300, spec.embed_dim)
            np.testing.assert_allclose(e, embed_reference(spec, w, x), atol=1e-5)
            np.testing.assert_allclose(embed(spec, w, x), e, atol=1e-6)
            # the authors' layer order (ReLU → MaxPool) computes the same function
            old = CNN(spec)
            f = old.features
            old.features = nn.Sequential(f[0], f[1], f[2], f[4], f[3], f[5], f[6], f[7])
            old.load_state_dict(build(spec, w).state_dict())
            with torch.no_grad():
                logits = old.eval()(to_tensor(x))
            loss, acc = evaluate(spec, w, x, y)
            assert acc == pytest.approx(float((logits.argmax(1).numpy() == y).mean()))
            assert loss == pytest.approx(float(F.cross_entropy(logits, torch.from_numpy(y))),
                                         rel=1e-5)


def test_channels_last_training_returns_c_ordered_weights_that_learn():
    from fedclust.emdcfl.model import ModelSpec, evaluate, init_weights, train_local

    spec = ModelSpec(1, 8, 4, 6, 16, 2)
    rng = np.random.default_rng(1)
    y = rng.integers(0, 2, 256)
    x = np.where(y[:, None, None] == 1, 200, 20).astype(np.uint8) * np.ones((1, 8, 8), np.uint8)
    x = np.clip(x + rng.integers(0, 40, x.shape), 0, 255).astype(np.uint8)
    w0 = init_weights(spec, 0)
    w1, loss = train_local(spec, w0, x, y, 2, 0.05, 32, 0)
    assert all(a.flags["C_CONTIGUOUS"] and a.dtype == np.float32 for a in w1)
    assert [a.shape for a in w1] == [a.shape for a in w0]
    assert evaluate(spec, w1, x, y)[1] > 0.95
    w2, _ = train_local(spec, w0, x, y, 2, 0.05, 32, 0)
    for a, b in zip(w1, w2):                     # seeded: the same run gives the same weights
        np.testing.assert_array_equal(a, b)


def test_experiment_table_keeps_runs_with_other_epochs_or_clients_apart(tmp_path):
    import json

    from server_app.emdcfl_experiments import CPU, PAPER, PRESETS, SMALL, table

    assert CPU["emdcfl.samples"] == PAPER["emdcfl.samples"] == 5420     # the paper's client size
    # ε read from each run's excesses; the earlier small preset keeps the paper's 0.1
    assert CPU["emdcfl.epsilon"] == PAPER["emdcfl.epsilon"] == "auto"
    assert SMALL["emdcfl.samples"] == 500 and SMALL["emdcfl.epsilon"] == 0.1
    # Backdoor MNIST: the cpu sizes with 30 clients, the authors' lr (0.05 diverged on RGB) and
    # PACFL's threshold chosen on the held-out seed 100
    assert PRESETS["cpu-backdoor"] == {**CPU, "num-clients": 30, "emdcfl.lr": 0.01,
                                       "emdcfl.pacfl-threshold": 3.0}
    metrics = {"eval_acc_mean": 0.9, "eval_acc_worst": 0.8, "eval_ari": 1.0, "num_clusters": 3,
               "emd_s": 1.0, "emd_share_of_run": 0.1}
    rows = []
    for seed, epochs, clients in [(0, 2, 30), (1, 2, 30), (0, "5", 30), (0, 2, "12")]:
        cfg = {"dataset": "backdoor-mnist", "emdcfl.algorithm": "emdcfl", "seed": seed,
               "emdcfl.epsilon": 0.1, "emdcfl.local-epochs": epochs, "num-clients": clients}
        rows.append(json.dumps({"config": cfg, "seconds": 10.0, "metrics": metrics}))
    (tmp_path / "results.jsonl").write_text("\n".join(rows) + "\n")
    lines = table(tmp_path).splitlines()[2:]
    assert len(lines) == 3
    assert any("| 30 | 2 | 0.01 | emdcfl | 0.1 | 0,1 | 90.00 ± 0.00 |" in line for line in lines)
    assert any("| 30 | 5 |" in line and "| 90.00 |" in line for line in lines)   # one seed
    assert any("| 12 | 2 |" in line for line in lines)
    # ε auto: the column names the ε each seed's run chose
    auto = [json.dumps({"config": {"dataset": "rotmnist", "emdcfl.algorithm": "emdcfl",
                                   "seed": seed, "emdcfl.epsilon": "auto",
                                   "emdcfl.local-epochs": 2, "num-clients": 40},
                        "seconds": 10.0, "metrics": {**metrics, "epsilon": eps}})
            for seed, eps in ((0, 0.0612), (1, None))]
    (tmp_path / "auto").mkdir()
    (tmp_path / "auto" / "results.jsonl").write_text("\n".join(auto) + "\n")
    assert "| emdcfl | auto (0.0612 / none) | 0,1 |" in table(tmp_path / "auto")
    # 95 % CI: Student t with n - 1 degrees of freedom; several folders in one table
    m2 = {**metrics, "eval_acc_mean": 0.8}
    (tmp_path / "b").mkdir()
    cfg = {"dataset": "backdoor-mnist", "emdcfl.algorithm": "emdcfl", "seed": 2,
           "emdcfl.epsilon": 0.1, "emdcfl.local-epochs": 2, "num-clients": 30}
    (tmp_path / "b" / "results.jsonl").write_text(
        json.dumps({"config": cfg, "seconds": 10.0, "metrics": m2}) + "\n")
    lines = table([tmp_path, tmp_path / "b"]).splitlines()[2:]
    half = 4.303 * np.std([90, 90, 80], ddof=1) / np.sqrt(3)           # t(0.975, 2) = 4.303
    assert any(f"| 0,1,2 | 86.67 ± {half:.2f} |" in line for line in lines)


def test_experiment_table_reports_wall_time_overhead_over_the_oracle_of_the_same_seeds(
        tmp_path):
    """The paper's ~9 % is EMD-CFL's wall time over the Oracle's (App. D.1), paired by seed."""
    import json

    from server_app.emdcfl_experiments import table

    rows = []
    for alg, seed, seconds in [("emdcfl", 0, 420.0), ("emdcfl", 1, 300.0), ("oracle", 0, 280.0),
                               ("oracle", 5, 1.0)]:
        cfg = {"dataset": "rotmnist", "emdcfl.rotation": "max", "emdcfl.algorithm": alg,
               "seed": seed, "emdcfl.epsilon": 0.1, "emdcfl.local-epochs": 2,
               "num-clients": 40, "emdcfl.lr": 0.05}
        metrics = {"eval_acc_mean": 0.9, "eval_acc_worst": 0.8, "eval_ari": 1.0,
                   "num_clusters": 4, "emd_s": 60.0, "emd_share_of_run": 0.15,
                   "clustering_s": 140.0, "clustering_share_of_run": 0.35}
        rows.append(json.dumps({"config": cfg, "seconds": seconds, "metrics": metrics}))
    (tmp_path / "results.jsonl").write_text("\n".join(rows) + "\n")
    emd = next(line for line in table(tmp_path).splitlines() if "| emdcfl |" in line)
    # only seed 0 has both runs: 420 / 280 - 1 = +50 %
    assert emd.endswith("| 60.0 (15.0 %) | 140.0 (35.0 %) | +50 % (420 s vs 280 s; seeds 0) |")
    oracle = next(line for line in table(tmp_path).splitlines() if "| oracle |" in line)
    assert oracle.endswith("|  |  |  |")


def test_experiment_table_labels_cfl_rows_that_never_split(tmp_path):
    import json

    from server_app.emdcfl_experiments import table

    rows = []
    for rotation, clusters in (("max", [1, 1]), ("two", [1, 2])):
        for seed, k in enumerate(clusters):
            cfg = {"dataset": "rotmnist", "emdcfl.rotation": rotation, "emdcfl.algorithm": "cfl",
                   "seed": seed, "emdcfl.local-epochs": 2, "num-clients": 40}
            metrics = {"eval_acc_mean": 0.9, "eval_acc_worst": 0.8, "eval_ari": 0.0,
                       "num_clusters": k}
            rows.append(json.dumps({"config": cfg, "seconds": 1.0, "metrics": metrics}))
    (tmp_path / "results.jsonl").write_text("\n".join(rows) + "\n")
    lines = table(tmp_path).splitlines()[2:]
    assert "| cfl (no split in the budget → FedAvg) |" in lines[0] and "| max |" in lines[0]
    assert "| cfl |" in lines[1] and "| two |" in lines[1]       # split on one seed: plain


def test_to_tensor_uses_the_authors_normalisation_per_image_type():
    """Grey: MNIST mean/std; RGB: per-channel ImageNet mean/std (authors' CMNIST transform)."""
    import torch

    from fedclust.emdcfl.model import RGB_MEAN, RGB_STD, to_tensor

    grey = np.array([[[0, 255]]], dtype=np.uint8)                     # (1, 1, 2)
    t = to_tensor(grey)
    assert t.shape == (1, 1, 1, 2)
    np.testing.assert_allclose(t.numpy().ravel(), [-0.1307 / 0.3081, (1 - 0.1307) / 0.3081],
                               rtol=1e-6)
    rgb = np.zeros((2, 1, 1, 3), dtype=np.uint8)
    rgb[1] = [255, 128, 0]
    t = to_tensor(rgb)
    assert t.shape == (2, 3, 1, 1) and t.dtype == torch.float32
    np.testing.assert_allclose(t[0].ravel().numpy(), -np.array(RGB_MEAN) / np.array(RGB_STD),
                               rtol=1e-6)
    np.testing.assert_allclose(t[1].ravel().numpy(),
                               (np.array([1.0, 128 / 255, 0.0]) - RGB_MEAN) / np.array(RGB_STD),
                               rtol=1e-6)
    with pytest.raises(ValueError, match="RGB"):
        to_tensor(np.zeros((1, 2, 2, 4), dtype=np.uint8))


def test_device_cpu_path_equals_the_default_and_cuda_is_validated(monkeypatch):
    """emdcfl.device: the CPU path is bit-identical to the default; ``cuda`` without a GPU is a
    ConfigError before any work; ``auto`` picks cuda only when torch sees one. (No GPU here:
    the CUDA path itself is not exercised.)"""
    import torch

    from fedclust.config import ConfigError, validate
    from fedclust.emdcfl.client import device_for
    from fedclust.emdcfl.keys import resolve_device
    from fedclust.emdcfl.model import ModelSpec, embed_many, evaluate, init_weights, train_local

    spec = ModelSpec(1, 8, 4, 8, 16, 10)
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, size=(40, 8, 8), dtype=np.uint8)
    y = rng.integers(0, 10, size=40)
    w0 = init_weights(spec, 0)
    (wa, la), (wb, lb) = (train_local(spec, w0, x, y, 1, 0.05, 16, 3),
                          train_local(spec, w0, x, y, 1, 0.05, 16, 3, device="cpu"))
    assert la == lb and all(np.array_equal(a, b) for a, b in zip(wa, wb, strict=True))
    assert evaluate(spec, wa, x, y) == evaluate(spec, wa, x, y, device="cpu")
    np.testing.assert_array_equal(embed_many(spec, [wa], x)[0],
                                  embed_many(spec, [wa], x, device="cpu")[0])

    base = {"method": "emdcfl", "dataset": "rotdigits", "num-clients": 4}
    assert validate(base)["emdcfl.device"] == "cpu" and resolve_device("cpu") == "cpu"
    threads: list[int] = []
    monkeypatch.setattr(torch, "set_num_threads", threads.append)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == "cpu"
    # a CPU-only server with GPU SuperNodes is valid: only the nodes check for CUDA
    assert validate({**base, "emdcfl.device": "cuda"})["emdcfl.device"] == "cuda"
    with pytest.raises(ConfigError, match=r"'emdcfl.device' = 'cuda'.*Allowed.*Fix"):
        resolve_device("cuda")
    assert device_for("auto", False) == "cpu" and threads == [1]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert validate({**base, "emdcfl.device": "cuda"})["emdcfl.device"] == "cuda"
    assert resolve_device("auto") == "cuda"
    assert device_for("auto", False) == "cuda" and threads == [1]   # no 1-thread cap
