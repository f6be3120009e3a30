"""FedCRef core (paper 000): association test, communities, Algorithm 2, ACC, generator, AEs."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedclust.fedcref import autoencoder as ae
from fedclust.fedcref import client as core
from fedclust.fedcref.association import (
    accept_matrix,
    accept_score,
    accepts,
    communities,
    log_ratio_quantile,
    mutual_edges,
    normalized_gap,
    perfect_edges,
)
from fedclust.fedcref.evaluation import wrong_associations
from fedclust.fedcref.refine import cluster_refine, label_agreement, table_accuracy
from fedclust.fedcref.rules import Calibrated, Eq2, Ratio
from fedclust.fedcref.system import SystemSizeError, dirty_clustering, generate_system
from fedclust.metrics import mean_ci

# --- association (eq. 2) -----------------------------------------------------------------------


def test_normalized_gap_is_minmax_of_abs_difference() -> None:
    d = normalized_gap(np.array([1.0, 2.0, 3.0]), np.array([1.0, 3.0, 6.0]))
    np.testing.assert_allclose(d, [0.0, 1 / 3, 1.0])
    assert np.all(normalized_gap(np.ones(4), np.ones(4) * 2) == 0)   # constant gap


def test_accepts_threshold_and_percentile() -> None:
    own = np.zeros(100)
    close = np.r_[np.full(80, 0.1), np.full(20, 1.0)]   # 80% of gaps normalise to 0
    far = np.linspace(0, 1, 100)                        # gaps spread uniformly
    assert accepts(own, close, theta=0.2, alpha=0.75)
    assert not accepts(own, far, theta=0.2, alpha=0.75)
    assert accepts(own, far, theta=0.8, alpha=0.75)      # 81% ≤ 0.8
    assert not accepts(own, close, theta=0.2, alpha=0.85)
    both = accepts(own, np.stack([close, far]), 0.2, 0.75)
    assert both.tolist() == [True, False]


def test_edges_need_both_directions() -> None:
    a, b, c = (0, 0), (1, 0), (2, 0)
    accept = {a: {b, c}, b: {a}, c: set()}          # a→c is not reciprocated
    assert mutual_edges(accept) == [(a, b)]
    accept[c] = {a}
    assert sorted(mutual_edges(accept)) == [(a, b), (a, c)]


def test_edge_needs_both_clients_error_vectors_to_accept() -> None:
    """Client 0's model reconstructs client 1's cluster as well as client 1's own model does
    (D1 passes), but not vice versa (D2 fails): no edge; once both pass, an edge."""
    rng = np.random.default_rng(5)
    labels = np.zeros(100, int)
    own0, own1 = rng.random((1, 100)), rng.random((1, 100))
    good_on_1 = own1 + 1e-3 * rng.random(100)
    good_on_1[0, :3] += 10                             # gaps normalise to ≈ 0 except outliers
    bad_on_0 = rng.random((1, 100)) * 5                # client 1's model on client 0's samples
    acc1 = accept_matrix(labels, own1, good_on_1, Eq2(0.2, 0.75))         # D1
    acc0 = accept_matrix(labels, own0, bad_on_0, Eq2(0.2, 0.75))           # D2
    assert acc1[0, 0] and not acc0[0, 0]
    accept = {(0, 0): {(1, 0)} if acc0[0, 0] else set(),
              (1, 0): {(0, 0)} if acc1[0, 0] else set()}
    assert mutual_edges(accept) == []
    good_on_0 = own0 + 1e-3 * rng.random(100)
    good_on_0[0, :3] += 10
    assert accept_matrix(labels, own0, good_on_0, Eq2(0.2, 0.75))[0, 0]
    accept[(0, 0)] = {(1, 0)}
    assert mutual_edges(accept) == [((0, 0), (1, 0))]


def test_stopping_rule_window_and_no_active() -> None:
    from fedclust.fedcref.stopping import NO_ACTIVE, STABLE, StabilityStop

    stop = StabilityStop(window=3, change=0.1)
    # 10 → 10 → 11 (10%: calm) → 10 → stop at the 4th iteration (3 calm comparisons)
    seq = [(10, 20), (10, 20), (11, 21), (10, 22)]
    reasons = [stop.update(c, i, active=5) for c, i in seq]
    assert reasons == [None, None, None, STABLE]
    stop = StabilityStop(window=3, change=0.1)
    # a jump of more than 10% resets the count
    seq = [(10, 20), (10, 20), (13, 20), (13, 20), (13, 20)]
    assert [stop.update(c, i, 5) for c, i in seq] == [None] * 5
    assert stop.update(13, 20, 5) == STABLE
    # zero counts compare with max(p, 1): 0 → 0 is calm
    stop = StabilityStop(window=1, change=0.1)
    assert stop.update(0, 0, 3) is None and stop.update(0, 0, 3) == STABLE
    assert StabilityStop().update(4, 4, active=0) == NO_ACTIVE


def test_accept_matrix_per_cluster() -> None:
    rng = np.random.default_rng(0)
    labels = np.r_[np.zeros(50, int), np.ones(50, int)]
    own = np.stack([rng.random(100), rng.random(100)])
    foreign = np.stack([own[0] + 0.001 * rng.random(100), rng.random(100) * 5])
    foreign[0, :3] += 10          # a few outliers: the rest of the gaps normalise to ~0
    acc = accept_matrix(labels, own, foreign, Eq2(0.2, 0.75))
    assert acc.shape == (2, 2)
    assert acc[0, 0] and not acc[0, 1]
    empty = accept_matrix(np.zeros(100, int), own, foreign, Eq2(0.2, 0.75))
    assert not empty[1].any()     # cluster 1 has no samples


def test_accept_matrix_best_per_client() -> None:
    rng = np.random.default_rng(1)
    labels = np.zeros(100, int)
    own = rng.random((1, 100))
    close, closer = own[0].copy(), own[0].copy()
    close[:3] += 10               # outliers stretch the range: the other gaps normalise small
    closer[:3] += 10
    close[3:20] += 5              # 17% of the gaps at 0.5 > θ: Pr = 0.80 ≥ α, 'closer' 0.97
    foreign = np.stack([close, closer, close])
    assert accept_matrix(labels, own, foreign, Eq2(0.2, 0.75)).tolist() == [[True, True, True]]
    # foreign models 0 and 1 belong to client 7, model 2 to client 9: one accept per client
    one = accept_matrix(labels, own, foreign, Eq2(0.2, 0.75), groups=np.array([7, 7, 9]))
    assert one.tolist() == [[False, True, True]]


def test_best_per_client_ties_are_broken_by_a_continuous_score() -> None:
    # two models of one foreign client pass eq. (2) with the same Pr (1.0): the one with the
    # lower median log error ratio wins, whatever the order of the models
    labels = np.zeros(50, int)
    own = (1.0 + np.arange(50) / 64)[None]        # dyadic: the gaps below are exact
    worse, better = own[0] + 0.25, own[0] + 0.125    # constant gaps: Pr{D ≤ θ} = 1 for both
    grp = np.array([4, 4])
    for foreign, want in ((np.stack([worse, better]), [False, True]),
                          (np.stack([better, worse]), [True, False])):
        assert accept_matrix(labels, own, foreign, Eq2(0.2, 0.75)).all()
        assert accept_matrix(labels, own, foreign, Eq2(0.2, 0.75), groups=grp)[0].tolist() == want


def test_eq2_is_scale_free_and_the_ratio_test_is_not() -> None:
    # a foreign model c x worse on every sample: eq. (2) cannot tell c = 1.05 from c = 10
    rng = np.random.default_rng(0)
    labels = np.zeros(200, int)
    own = rng.gamma(2.0, 0.01, 200)[None]
    held = np.zeros(200, bool)
    held[::5] = True
    for c in (1.05, 10.0):
        foreign = own * c
        assert accept_score(own[0], foreign, 0.2)[0] == accept_score(own[0], own * 1.05, 0.2)[0]
        ratio = accept_matrix(labels, own, foreign, Ratio(epsilon=0.2), held_out=held)
        assert ratio[0, 0] == (np.log(c) <= 0.2)
    np.testing.assert_allclose(log_ratio_quantile(own[0], own * 2.0, 0.5), [np.log(2.0)])


def test_ratio_test_uses_the_quantile_of_held_out_samples_only() -> None:
    labels = np.zeros(100, int)
    own = np.full((1, 100), 1.0)
    held = np.zeros(100, bool)
    held[:20] = True
    foreign = np.full((1, 100), 1.0)
    foreign[0, 20:] = 100.0          # terrible on the training samples: not looked at
    assert accept_matrix(labels, own, foreign, Ratio(), held_out=held).all()
    foreign = np.full((1, 100), 1.0)
    foreign[0, :8] = 5.0             # 40% of the held-out samples are 5x worse: median passes
    assert accept_matrix(labels, own, foreign, Ratio(), held_out=held).all()
    assert not accept_matrix(labels, own, foreign, Ratio(quantile=0.75), held_out=held).any()
    with pytest.raises(ValueError, match="held_out"):
        accept_matrix(labels, own, foreign, Ratio())


def test_calibrated_test_takes_its_scale_from_the_clients_other_cluster() -> None:
    # cluster 0's own model errs 1.0 on its held-out samples, the client's other model 4.0
    # (log ratio log 4): with λ = 0.5 a foreign model passes below e^{0.5 log 4} = 2x
    labels = np.r_[np.zeros(50, int), np.ones(50, int)]
    held = np.zeros(100, bool)
    held[::5] = True
    own = np.stack([np.ones(100), np.full(100, 4.0)])
    own[1, labels == 1] = 1.0                        # model 1 is good on its own cluster
    foreign = np.stack([np.full(100, 1.9), np.full(100, 2.1)])
    acc = accept_matrix(labels, own, foreign, Calibrated(lam=0.5), held_out=held)
    assert acc[0].tolist() == [True, False]
    # the same foreign errors against a closer "different" anchor (2x): only e^{0.5 log 2}
    own[1, labels == 0] = 2.0
    acc = accept_matrix(labels, own, foreign, Calibrated(lam=0.5), held_out=held)
    assert acc[0].tolist() == [False, False]
    # scale-free in the errors as a whole, unlike ε: multiplying everything changes nothing
    acc10 = accept_matrix(labels, 10 * own, 10 * foreign, Calibrated(lam=0.5),
                          held_out=held)
    np.testing.assert_array_equal(acc10, acc)
    # no other modelled cluster: no anchor, nothing accepted
    lone = accept_matrix(np.zeros(100, int), own[:1], foreign, Calibrated(lam=0.99),
                         held_out=held)
    assert not lone.any()
    with pytest.raises(ValueError, match="held_out"):
        accept_matrix(labels, own, foreign, Calibrated())


def test_hold_out_takes_a_share_of_every_cluster() -> None:
    labels = np.r_[np.zeros(100, int), np.ones(7, int), [2]]
    held = core.hold_out(labels, 0.15, seed=3)
    assert held[labels == 0].sum() == 15 and held[labels == 1].sum() == 1
    assert not held[labels == 2].any()     # a one-sample cluster keeps its sample


def test_components_and_isolated() -> None:
    nodes = [(0, 0), (0, 1), (1, 0), (1, 1), (2, 0), (3, 0)]
    edges = [((0, 0), (1, 0)), ((1, 0), (2, 0)), ((0, 1), (1, 1))]
    groups, isolated = communities(nodes, edges)
    assert groups == [[(0, 0), (1, 0), (2, 0)], [(0, 1), (1, 1)]]
    assert isolated == [(3, 0)]


def test_perfect_edges_link_same_majority_across_clients() -> None:
    major = {(0, 0): 3, (0, 1): 3, (1, 0): 3, (1, 1): 5, (2, 0): 5}
    e = perfect_edges(major)
    assert sorted(e) == [((0, 0), (1, 0)), ((0, 1), (1, 0)), ((1, 1), (2, 0))]


def test_wrong_associations_counts_minority_members() -> None:
    hist = {(0, 0): np.array([9, 1]), (1, 0): np.array([8, 2]), (2, 0): np.array([1, 9]),
            (3, 0): np.array([0, 5])}
    groups = [[(0, 0), (1, 0), (2, 0)]]
    wrong, total, pct = wrong_associations(groups, hist)
    assert (wrong, total) == (1, 3) and pct == pytest.approx(100 / 3)


# --- Algorithm 2 ---------------------------------------------------------------------------


def test_cluster_refine_hand_made() -> None:
    # models: A, B, C; 7 samples. A is best for 3, B for 2, C for 2.
    e = np.array([
        [0.1, 0.1, 0.1, 0.9, 0.9, 0.5, 0.9],   # A
        [0.5, 0.9, 0.9, 0.1, 0.1, 0.9, 0.3],   # B
        [0.9, 0.5, 0.9, 0.9, 0.9, 0.2, 0.2],   # C
    ])
    labels, sel = cluster_refine(e, 2)
    # pick 1: A takes samples 0-2; pick 2: among B, C on {3..6}: B wins 3,4; C wins 5,6 — tie
    # of 2 votes resolved to the lower index (B). Leftovers 5, 6 → best selected model:
    # sample 5: A 0.5 < B 0.9 → A; sample 6: B 0.3 < A 0.9 → B.
    assert sel.tolist() == [0, 1]
    assert labels.tolist() == [0, 0, 0, 1, 1, 0, 1]


def test_cluster_refine_fewer_clusters_when_samples_run_out() -> None:
    e = np.array([[0.1, 0.1, 0.1], [0.5, 0.5, 0.5], [0.9, 0.9, 0.9]])
    labels, sel = cluster_refine(e, 3)
    assert sel.tolist() == [0] and labels.tolist() == [0, 0, 0]


def test_cluster_refine_ignores_nan_models() -> None:
    e = np.array([[np.nan] * 4, [0.1, 0.9, 0.1, 0.9], [0.9, 0.1, 0.9, 0.1]])
    labels, sel = cluster_refine(e, 2)
    assert set(sel.tolist()) == {1, 2} and len(set(labels.tolist())) == 2


# --- ACC (eq. 4) ----------------------------------------------------------------------------


def test_acc_permuted_labels() -> None:
    rng = np.random.default_rng(1)
    y = rng.integers(0, 5, 300)
    perm = rng.permutation(5)
    assert label_agreement(y, perm[y]) == 1.0
    noisy = perm[y].copy()
    noisy[:30] = (noisy[:30] + 1) % 5
    assert label_agreement(y, noisy) == pytest.approx(0.9, abs=0.01)
    assert table_accuracy(np.array([[5, 0], [1, 4]])) == 0.9


# --- system generator and dirty clustering ------------------------------------------------


def test_dirty_clustering_rate() -> None:
    y = np.repeat([3, 7, 8], 4000)
    lab = dirty_clustering(y, 0.3, random_state=0)
    true = np.unique(y, return_inverse=True)[1]
    assert abs(np.mean(lab != true) - 0.3) < 0.015
    moved = lab[lab != true]
    assert set(np.unique(moved)) == {0, 1, 2}
    assert np.array_equal(dirty_clustering(y, 0.0), true)


def test_generator_invariants() -> None:
    y = np.repeat(np.arange(10), 1000)
    system = generate_system(y, 12, 50, random_state=3)
    assert len(system) == 12
    all_idx = np.concatenate([c.indices for c in system])
    assert len(np.unique(all_idx)) == len(all_idx)            # no sample on two clients
    for c in system:
        assert 2 <= c.k <= 5                                     # K_i ~ U{2..|U|/2}
        assert np.array_equal(np.unique(c.y), c.classes)
        assert np.all(np.bincount(c.y)[c.classes] == 50)        # S per class
        assert np.array_equal(y[c.indices], c.y)
    ks = [c.k for c in generate_system(y, 400, 2, random_state=0)]
    assert set(ks) == {2, 3, 4, 5}


def test_generator_overlap_fraction() -> None:
    y = np.repeat(np.arange(6), 1000)
    system = generate_system(y, 8, 40, overlap=0.25, random_state=1)
    for cls in range(6):
        parts = [set(c.indices[c.y == cls]) for c in system if cls in c.classes]
        for i in range(len(parts)):
            for j in range(i + 1, len(parts)):
                assert len(parts[i] & parts[j]) == 10            # 25% of 40 shared


def test_generator_refuses_to_duplicate() -> None:
    y = np.repeat(np.arange(4), 30)
    with pytest.raises(SystemSizeError, match=r"needs \d+, has 30") as err:
        generate_system(y, 10, 20, random_state=0)
    assert 'fedcref.split="all"' in str(err.value) and "another seed" in str(err.value)


# --- stacked autoencoders -------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["keras", "torch"])
def test_stacked_training_equals_separate_training(kind: str) -> None:
    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    data = [rng.random((37, 16)).astype(np.float32), rng.random((70, 16)).astype(np.float32)]
    sizes = ae.layer_sizes(16, [8, 4])
    p0 = ae.init_params(2, sizes, seed=5, kind=kind)
    together, info = ae.train(ae.TrainCall(p0, data, epochs=3, batch_size=16, seed=1))
    # model 1 alone, with the same permutations: replay the rng draws of the joint run
    alone, _ = ae.train(ae.TrainCall(ae.select(p0, [0]), data[:1], epochs=3, batch_size=16,
                                      seed=1))
    assert info.epochs.tolist() == [3, 3]
    for a, b in zip(ae.select(together, [0]), alone, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    e = ae.errors(together, np.concatenate(data))
    assert e.shape == (2, 107) and np.all(e >= 0)


def test_init_keras_is_glorot_uniform_with_zero_bias_and_torch_is_linear_default() -> None:
    sizes = ae.layer_sizes(784, [100, 64, 32])
    k = ae.init_params(3, sizes, seed=0, kind="keras")
    t = ae.init_params(3, sizes, seed=0, kind="torch")
    for layer, (fan_in, fan_out) in enumerate(zip(sizes[:-1], sizes[1:], strict=False)):
        w, b = k[2 * layer], k[2 * layer + 1]
        limit = np.sqrt(6.0 / (fan_in + fan_out))
        assert w.shape == (3, fan_in, fan_out) and float(w.abs().max()) <= limit
        assert float(w.abs().max()) > 0.9 * limit          # spans the glorot range
        assert float(w.std()) == pytest.approx(limit / np.sqrt(3), rel=0.1)
        assert torch.count_nonzero(b) == 0
        bound = 1 / np.sqrt(fan_in)
        assert float(t[2 * layer].abs().max()) <= bound and float(t[2 * layer + 1].abs().max()) > 0
    assert not torch.equal(k[0][0], k[0][1])               # independent models
    with pytest.raises(ValueError, match="keras"):
        ae.init_params(1, sizes, seed=0, kind="xavier")


def test_errors_match_forward_and_fedavg_weights() -> None:
    rng = np.random.default_rng(2)
    p = ae.init_params(3, ae.layer_sizes(10, [6, 3]), seed=0)
    x = rng.random((20, 10)).astype(np.float32)
    ref = ((ae.forward(p, torch.as_tensor(x).expand(3, -1, -1)) - torch.as_tensor(x)) ** 2
           ).mean(2).numpy()
    np.testing.assert_allclose(ae.errors(p, x, max_elems=50), ref, rtol=1e-5, atol=1e-6)
    a, b = ae.select(p, [0]), ae.select(p, [1])
    avg = ae.fedavg([a, b], [1.0, 3.0])
    torch.testing.assert_close(avg[0], 0.25 * a[0] + 0.75 * b[0])


def test_mean_ci() -> None:
    m, h = mean_ci([1.0, 2.0, 3.0])
    assert m == 2.0 and h == pytest.approx(2.4841, abs=1e-3)
    assert mean_ci([4.0]) == (4.0, 0.0)


# --- initial clustering (kmeans, DEC) and the centralized baseline ------------------------------


def _blobs(n: int = 240, d: int = 20, k: int = 3, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    centers = rng.random((k, d))
    y = np.repeat(np.arange(k), n // k)
    x = np.clip(centers[y] + rng.normal(0, 0.03, (len(y), d)), 0, 1).astype(np.float32)
    return x, y


def test_kmeans_init_with_silhouette_k() -> None:
    from fedclust.fedcref.initial import initial_clustering

    x, y = _blobs()
    lab = initial_clustering("kmeans", x, range(2, 6), random_state=0)
    assert len(np.unique(lab)) == 3 and label_agreement(y, lab) == 1.0


def test_kmeans_and_dec_init_accept_63_bit_client_seeds() -> None:
    # the ClientApp derives seeds from a 63-bit digest; sklearn's KMeans rejects >= 2**32
    torch.set_num_threads(1)
    from fedclust.fedcref.initial import DECStart, initial_clustering

    x, _ = _blobs()
    seed = 7126998361905123456
    for kind in ("kmeans", "dec"):
        start = DECStart({"hidden": (16, 8, 2), "pretrain_epochs": 2, "maxiter": 5}) \
            if kind == "dec" else kind
        lab = initial_clustering(start, x, 3, random_state=seed)
        assert lab.shape == (len(x),)


def test_dec_recovers_blobs() -> None:
    torch.set_num_threads(1)
    from fedclust.fedcref.dec import DEC

    x, y = _blobs()
    dec = DEC(n_clusters=3, hidden=(32, 16, 4), pretrain_epochs=10, batch_size=32, maxiter=40,
              update_interval=20, random_state=0)
    lab = dec.fit_predict(x)
    assert label_agreement(y, lab) >= 0.95
    assert dec.cluster_centers_.shape == (3, 4)


def test_centralized_dec_picks_k_by_tsne_silhouette() -> None:
    torch.set_num_threads(1)
    from fedclust.fedcref.dec import CentralizedDEC

    x, y = _blobs(n=150, k=3)
    est = CentralizedDEC(k_range=(2, 3, 4), tsne_samples=150,
                         dec_options={"hidden": (16, 8, 2), "pretrain_epochs": 15,
                                      "batch_size": 32, "maxiter": 20, "update_interval": 10})
    est.fit(x)
    assert set(est.scores_) == {2, 3, 4}
    # three well-separated blobs: the t-SNE silhouette must pick the planted K and the labels
    # must then match the blobs
    assert est.n_clusters_ == 3, est.scores_
    assert est.scores_[3] > max(est.scores_[2], est.scores_[4])
    assert len(est.labels_) == len(x) and label_agreement(y, est.labels_) >= 0.95


def test_dec_estimates_k_by_silhouette() -> None:
    torch.set_num_threads(1)
    from fedclust.fedcref.initial import DECStart, initial_clustering

    x, y = _blobs(n=150, k=3)
    lab = initial_clustering(DECStart({"hidden": (16, 8, 2), "pretrain_epochs": 15,
                                       "batch_size": 32, "maxiter": 20,
                                       "update_interval": 10}), x, range(2, 6), random_state=0)
    assert np.unique(lab).size == 3                 # given K = 2 is ignored, K = 3 found
    assert label_agreement(y, lab) >= 0.95


@pytest.mark.parametrize("warm", [True, False])
def test_warm_start_begins_a_cluster_model_at_its_previous_model(warm: bool) -> None:
    from fedclust.config import validate
    from fedclust.fedcref.keys import ClientSettings

    torch.set_num_threads(1)
    cfg = validate({"method": "fedcref", "dataset": "digits", "output-dir": "unused",
                    "fedcref.ae-hidden": "8,4", "fedcref.lr": 1e-12, "fedcref.ae-epochs": 2,
                    "fedcref.warm-epochs": 1, "fedcref.warm-start": warm,
                    "fedcref.assoc-rule": "eq2"})   # held-out rules start local models fresh
    rng = np.random.default_rng(0)
    x = rng.random((60, 16)).astype(np.float32)
    st = core.ClientState(labels=np.repeat([0, 1, 2], 20), k=3)
    s = ClientSettings.from_config(cfg)
    core.train_local(st, x, s, seed=1)                     # iteration 1: all fresh
    first = [p.clone() for p in st.models]
    st.models = [p[:2] for p in st.models]                 # cluster 2 lost its model
    st.model_clusters = np.array([0, 1])
    core.train_local(st, x, s, seed=2)                     # iteration 2, another init seed
    fresh = ae.init_params(3, ae.layer_sizes(16, [8, 4]), 2, "keras")
    for p, old, new in zip(st.models, first, fresh, strict=True):
        # lr ~ 0: every model stays where it started
        torch.testing.assert_close(p[2], new[2], rtol=0, atol=1e-6)         # no previous model
        start = old[:2] if warm else new[:2]
        torch.testing.assert_close(p[:2], start, rtol=0, atol=1e-6)
