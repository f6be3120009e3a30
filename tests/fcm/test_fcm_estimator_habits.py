"""scikit-learn's habits on ``FuzzyCMeans``: a ``ConvergenceWarning`` when ``max_iter`` stops a
fit before it converges, and ``n_init`` starts of which the lowest objective is kept."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from sklearn.exceptions import ConvergenceWarning

from fedclust.fcm import FuzzyCMeans, random_centers


def blobs(seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    centers = np.array([[0.0, 0.0], [3.0, 0.0], [0.0, 3.0], [3.0, 3.0], [1.5, 1.5]])
    return centers[rng.integers(0, 5, 400)] + rng.normal(0, 0.7, (400, 2))


def test_stopping_at_max_iter_warns():
    with pytest.warns(ConvergenceWarning, match="max_iter=2 before converging"):
        est = FuzzyCMeans(4, tol=1e-9, max_iter=2, random_state=0).fit(blobs())
    assert not est.converged_ and est.n_iter_ == 2
    with warnings.catch_warnings():
        warnings.simplefilter("error")            # a converged fit says nothing
        assert FuzzyCMeans(4, tol=1e-3, max_iter=500, random_state=0).fit(blobs()).converged_


def test_n_init_keeps_the_lowest_objective_of_its_starts():
    x = np.random.default_rng(1).random((300, 2))     # no clear clusters: local optima
    est = FuzzyCMeans(8, n_init=6, tol=1e-6, max_iter=300, random_state=3).fit(x)
    rng = np.random.default_rng(3)          # the starts' initial centers, in order
    singles = [FuzzyCMeans(8, init=random_centers(x.min(0), x.max(0), 8, rng), tol=1e-6,
                           max_iter=300).fit(x).objective_ for _ in range(6)]
    assert est.objective_ == min(singles)
    assert len(set(np.round(singles, 6))) > 1      # the starts differ: the choice matters
    one = FuzzyCMeans(8, tol=1e-6, max_iter=300, random_state=3).fit(x)
    same = FuzzyCMeans(8, n_init=1, tol=1e-6, max_iter=300, random_state=3).fit(x)
    np.testing.assert_array_equal(one.cluster_centers_, same.cluster_centers_)


def test_explicit_centers_make_one_start():
    x = blobs(2)
    init = x[:3]
    with pytest.warns(RuntimeWarning, match="one start instead of n_init=4"):
        est = FuzzyCMeans(3, init=init, n_init=4, max_iter=200).fit(x)
    np.testing.assert_array_equal(
        est.cluster_centers_, FuzzyCMeans(3, init=init, max_iter=200).fit(x).cluster_centers_)
    with pytest.raises(ValueError, match="n_init"):
        FuzzyCMeans(3, n_init=0).fit(x)
