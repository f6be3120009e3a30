"""The centralized baselines are scikit-learn estimators: check_estimator, Pipeline, clone,
GridSearchCV, and the same results as the numpy core they wrap."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from sklearn.base import clone
from sklearn.datasets import make_blobs
from sklearn.metrics import adjusted_rand_score
from sklearn.model_selection import GridSearchCV
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler
from threadpoolctl import threadpool_limits

from fedclust import fcm
from fedclust.fcm import FuzzyCMeans

ROOT = Path(__file__).resolve().parents[2]

# Small networks keep each check_estimator run to seconds (the checks fit 1-60 samples). On
# check_clustering's blobs, which need an adjusted Rand index above 0.4, DEC with them reaches
# 0.66-1.0 and CentralizedDEC 0.57-0.94 over random_state 0-9: passing does not rest on one seed.
DEC_SMALL = {"hidden": (16, 4), "pretrain_epochs": 10, "batch_size": 32, "maxiter": 20,
             "update_interval": 5}
ESTIMATORS = {
    "FuzzyCMeans": "from fedclust.fcm import FuzzyCMeans; est = FuzzyCMeans()",
    "DEC": f"from fedclust.fedcref.dec import DEC; est = DEC(n_clusters=3, **{DEC_SMALL!r})",
    "CentralizedDEC": ("from fedclust.fedcref.dec import CentralizedDEC; "
                       f"est = CentralizedDEC(k_range=(2, 3), tsne_samples=60, "
                       f"dec_options={DEC_SMALL!r})"),
}
# How many checks check_estimator runs on each estimator (scikit-learn 1.9, SCIPY_ARRAY_API=1),
# exactly: a check that silently stops running (no longer yielded, or an import that turns a
# whole family off) fails the test instead of shrinking the list unseen. A scikit-learn version
# that adds or drops checks must recount (the failure lists the checks that ran).
CHECK_COUNTS = {"FuzzyCMeans": 51, "DEC": 46, "CentralizedDEC": 46}
# SCIPY_ARRAY_API must be set before scipy is imported, or the array-API check is skipped;
# hence a fresh interpreter per estimator.
RUN_CHECKS = """
import json, warnings
import torch
torch.set_num_threads(1)
from sklearn.utils.estimator_checks import check_estimator
{make}
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    results = check_estimator(est, on_fail=None)
print(json.dumps([[r["check_name"], r["status"], repr(r["exception"])[:500]] for r in results]))
"""


@pytest.mark.parametrize("name", sorted(ESTIMATORS))
def test_passes_every_check_of_check_estimator(name: str) -> None:
    # one OpenMP thread: t-SNE's and k-means' thread teams spin-wait on a busy machine
    env = {**os.environ, "SCIPY_ARRAY_API": "1", "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", RUN_CHECKS.format(make=ESTIMATORS[name])],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    results = json.loads(out.stdout.strip().splitlines()[-1])
    not_passed = [r for r in results if r[1] != "passed"]
    import sklearn

    assert len(results) == CHECK_COUNTS[name], (
        f"{name}: {len(results)} checks ran with scikit-learn {sklearn.__version__}, expected "
        f"{CHECK_COUNTS[name]}: {sorted(r[0] for r in results)}")
    assert not not_passed, f"{name}: {len(not_passed)} of {len(results)} checks: {not_passed}"


def _blobs(n: int = 300, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    return make_blobs(n, centers=3, n_features=4, cluster_std=0.6, random_state=seed)


def _old_fit(x: np.ndarray, n_clusters: int, m: float, tol: float, max_iter: int,
             init: object, random_state: object) -> fcm.FCMResult:
    """What ``FuzzyCMeans.fit`` did before it became a scikit-learn estimator, from the core."""
    if isinstance(init, str) and init == "uniform":
        start = fcm.random_centers(x.min(0), x.max(0), n_clusters, random_state)
    elif isinstance(init, str):
        start = fcm.kmeans_plusplus_centers(x, n_clusters, random_state)
    else:
        start = np.asarray(init, dtype=np.float64)
    return fcm.fcm_from_centers(x, start, m, tol, max_iter)


@pytest.mark.parametrize("params", [
    {"n_clusters": 4, "random_state": 0},
    {"n_clusters": 3, "m": 1.7, "tol": 1e-6, "max_iter": 200, "init": "k-means++",
     "random_state": 5},
    {"n_clusters": 4, "m": 3.0, "max_iter": 5, "random_state": 123},
    {"n_clusters": 2, "m": 1.0000001, "random_state": 0},
])
def test_fuzzy_c_means_gives_the_same_results_as_before(params: dict) -> None:
    x = np.random.default_rng(1).normal(size=(250, 3)) + np.repeat(np.eye(3) * 4, 84, 0)[:250]
    full = {"m": 2.0, "tol": 0.005, "max_iter": 30, "init": "uniform", **params}
    old = _old_fit(x, **full)
    est = FuzzyCMeans(**params).fit(x.tolist())          # any array-like, as before
    assert np.array_equal(est.cluster_centers_, old.centers)            # bitwise
    assert (est.n_iter_, est.converged_, est.shifts_) == (old.n_iter, old.converged, old.shifts)
    assert np.array_equal(est.labels_, fcm.squared_distances(x, old.centers).argmin(1))
    assert np.array_equal(est.predict(x), est.labels_)
    assert np.array_equal(FuzzyCMeans(**params).fit_predict(x), est.labels_)
    u = fcm.memberships(x, old.centers, full["m"])
    assert np.array_equal(est.memberships_, u) and np.array_equal(est.predict_proba(x), u)
    assert est.score(x) == -fcm.objective(x, old.centers, full["m"]) == -est.objective_
    np.testing.assert_allclose(est.transform(x) ** 2, fcm.squared_distances(x, old.centers),
                               rtol=1e-9, atol=1e-9)
    assert est.n_features_in_ == 3


def test_fuzzy_c_means_with_given_initial_centers_matches_the_core() -> None:
    x, _ = _blobs()
    init = x[:3] + 0.1
    est = FuzzyCMeans(3, init=init, tol=1e-7, max_iter=40).fit(x)
    ref = fcm.fcm_from_centers(x, init, 2.0, 1e-7, 40)
    assert np.array_equal(est.cluster_centers_, ref.centers) and est.n_iter_ == ref.n_iter


def test_the_estimator_is_importable_from_fedclust_fcm_without_loading_sklearn_there() -> None:
    from fedclust.fcm.estimator import FuzzyCMeans as defined

    assert FuzzyCMeans is defined
    code = "import sys, fedclust.fcm; print('sklearn' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, check=True)
    assert out.stdout.strip() == "False"


def test_fuzzy_c_means_in_a_pipeline() -> None:
    x, y = _blobs()
    x = x * [1.0, 10.0, 100.0, 1000.0]
    pipe = make_pipeline(StandardScaler(), FuzzyCMeans(3, init="k-means++", random_state=0))
    labels = pipe.fit_predict(x)
    alone = FuzzyCMeans(3, init="k-means++", random_state=0).fit(StandardScaler().fit_transform(x))
    assert np.array_equal(labels, alone.labels_)
    assert adjusted_rand_score(y, labels) > 0.95
    assert pipe.transform(x).shape == (len(x), 3)
    assert pipe.predict_proba(x).shape == (len(x), 3)
    assert list(pipe.get_feature_names_out()) == ["fuzzycmeans0", "fuzzycmeans1", "fuzzycmeans2"]


def test_clone_gives_an_unfitted_copy_with_the_same_parameters() -> None:
    x, _ = _blobs()
    est = FuzzyCMeans(4, m=1.7, tol=1e-4, init="k-means++", random_state=3).fit(x)
    twin = clone(est)
    assert twin is not est and twin.get_params() == est.get_params()
    assert not hasattr(twin, "cluster_centers_")
    assert np.array_equal(twin.fit(x).cluster_centers_, est.cluster_centers_)


def test_grid_search_with_the_objective_and_with_a_scorer() -> None:
    x, y = _blobs()
    # default score: minus the FCM objective, comparable at fixed n_clusters and m
    grid = GridSearchCV(FuzzyCMeans(3, random_state=0), {"init": ["uniform", "k-means++"]},
                        cv=3).fit(x)
    assert grid.best_params_["init"] in ("uniform", "k-means++")
    assert np.all(np.asarray(grid.cv_results_["mean_test_score"]) < 0)
    # across n_clusters: a scorer that uses the labels
    grid = GridSearchCV(FuzzyCMeans(random_state=0), {"n_clusters": [2, 3, 4, 5]},
                        scoring="adjusted_rand_score", cv=3).fit(x, y)
    assert grid.best_params_ == {"n_clusters": 3}
    assert grid.best_estimator_.cluster_centers_.shape == (3, 4)


def test_choosing_k_without_labels_with_the_fuzzy_validity_scorers() -> None:
    """The default score always prefers the largest K; the scorers of fedclust.fcm choose the
    planted 4 from the data alone, alone or all three at once, in a Pipeline too."""
    from sklearn.model_selection import KFold

    from fedclust.fcm import SCORERS, fuzzy_db_scorer, partition_coefficient_scorer

    x, _ = make_blobs(600, centers=[[0, 0], [6, 0], [0, 6], [6, 6]], cluster_std=0.7,
                      random_state=1)
    est = FuzzyCMeans(init="k-means++", random_state=0, max_iter=100, tol=1e-5)
    ks = {"n_clusters": list(range(2, 8))}
    cv = KFold(3, shuffle=True, random_state=0)
    assert GridSearchCV(est, ks, cv=cv).fit(x).best_params_ == {"n_clusters": 7}
    for scorer in (fuzzy_db_scorer, partition_coefficient_scorer):
        assert GridSearchCV(est, ks, scoring=scorer, cv=cv).fit(x).best_params_ == {
            "n_clusters": 4}
    grid = GridSearchCV(make_pipeline(StandardScaler(), est),
                        {"fuzzycmeans__n_clusters": list(range(2, 8))}, scoring=SCORERS,
                        refit="fuzzy_db", cv=cv).fit(x * [1.0, 100.0])
    assert grid.best_params_ == {"fuzzycmeans__n_clusters": 4}
    for name in SCORERS:
        scores = grid.cv_results_[f"mean_test_{name}"]
        assert int(np.argmax(scores)) == 2, (name, scores)


def test_the_scorers_are_the_indices_of_the_fitted_centers() -> None:
    from fedclust.fcm import fuzzy_db_scorer, partition_coefficient, xie_beni, xie_beni_scorer
    from fedclust.fcm.validity import fuzzy_db

    x, _ = _blobs()
    est = FuzzyCMeans(3, m=1.8, random_state=0).fit(x)
    u = est.memberships_
    assert est.fpc_ == pytest.approx(np.mean(np.sum(u**2, axis=1)))
    assert 1 / 3 <= est.fpc_ <= 1 and partition_coefficient(np.eye(3)) == 1.0
    assert fuzzy_db_scorer(est, x) == pytest.approx(-fuzzy_db(x, est.cluster_centers_, 1.8))
    v = est.cluster_centers_
    gap = min(np.sum((v[i] - v[j]) ** 2) for i in range(3) for j in range(3) if i != j)
    direct = np.sum(u**1.8 * ((x[:, None, :] - v[None]) ** 2).sum(-1)) / (len(x) * gap)
    assert xie_beni(x, v, 1.8) == pytest.approx(direct)
    assert xie_beni_scorer(est, x) == pytest.approx(-direct)
    one = FuzzyCMeans(1, random_state=0).fit(x)
    assert fuzzy_db_scorer(one, x) == -np.inf and xie_beni_scorer(one, x) == -np.inf


def test_bad_parameters_are_refused_before_any_work() -> None:
    x, _ = _blobs(30)
    with pytest.raises(ValueError, match="'n_clusters' parameter of FuzzyCMeans must be an int"):
        FuzzyCMeans(0).fit(x)
    with pytest.raises(ValueError, match="n_samples=30 should be >= n_clusters=31"):
        FuzzyCMeans(31).fit(x)
    with pytest.raises(ValueError, match="init has shape"):
        FuzzyCMeans(3, init=np.zeros((2, 4))).fit(x)
    with pytest.raises(TypeError, match="[Ss]parse"):
        from scipy import sparse

        FuzzyCMeans(3).fit(sparse.csr_matrix(x))


def test_dec_in_pipeline_clone_and_grid_search() -> None:
    import torch

    from fedclust.fedcref.dec import DEC

    torch.set_num_threads(1)
    x, y = _blobs(120)
    dec = DEC(n_clusters=3, hidden=(16, 4), pretrain_epochs=10, batch_size=32, maxiter=40,
              update_interval=10, random_state=0)
    pipe = make_pipeline(StandardScaler(), dec)
    labels = pipe.fit_predict(x)
    assert adjusted_rand_score(y, labels) > 0.9
    twin = clone(dec)
    assert twin.get_params() == dec.get_params() and not hasattr(twin, "encoder_")
    grid = GridSearchCV(twin, {"n_clusters": [2, 3]}, scoring="adjusted_rand_score",
                        cv=2).fit(StandardScaler().fit_transform(x), y)
    assert grid.best_params_ == {"n_clusters": 3}


def test_dec_fit_is_repeatable_and_an_explicit_pretrain_is_used_once() -> None:
    import torch

    from fedclust.fedcref.dec import DEC

    torch.set_num_threads(1)
    x, _ = _blobs(90)
    params = {"n_clusters": 3, "hidden": (8, 2), "pretrain_epochs": 3, "batch_size": 16,
              "maxiter": 20, "update_interval": 5, "random_state": 4}
    dec = DEC(**params)
    first = dec.fit(x).labels_.copy()
    assert np.array_equal(dec.fit(x).labels_, first)             # fit starts afresh
    # pretrain, then fit: the same autoencoder as fit's own pretraining, used once
    pre = DEC(**params).pretrain(x)
    assert np.array_equal(pre.fit(x).labels_, first)
    assert np.array_equal(pre.fit(x).labels_, first)


def test_centralized_dec_runs_dec_per_candidate_k_from_one_pretraining() -> None:
    import torch

    from fedclust.fedcref.dec import DEC, CentralizedDEC

    torch.set_num_threads(1)
    x, _ = _blobs(90)
    opts = {"hidden": (8, 2), "pretrain_epochs": 3, "batch_size": 16, "maxiter": 20,
            "update_interval": 5}
    est = CentralizedDEC(k_range=(2, 3), tsne_samples=60, dec_options=opts, random_state=2)
    with threadpool_limits(1):       # t-SNE's OpenMP team spin-waits on a busy machine
        est.fit(x)
        alone = {k: DEC(n_clusters=k, random_state=2, **opts).fit(x) for k in (2, 3)}
    for k in (2, 3):
        assert np.array_equal(est.labels_by_k_[k], alone[k].labels_)
    assert np.array_equal(est.labels_, est.labels_by_k_[est.n_clusters_])
