"""Centralized fuzzy c-means as a scikit-learn estimator.

The numpy core is the top level of :mod:`fedclust.fcm`; it is what clients run, and importing
it does not import scikit-learn (which would add about a second to each ClientApp start, see
``tests/test_architecture.py``). This module builds the estimator on that core in the style of
:class:`sklearn.cluster.KMeans`; ``from fedclust.fcm import FuzzyCMeans`` imports it on first
access to the name.

Deep Embedded Clustering, the other centralized baseline offered as an estimator, is
:class:`fedclust.fedcref.dec.DEC`.
"""

from __future__ import annotations

from numbers import Integral, Real

import numpy as np
from numpy.typing import ArrayLike, NDArray
from sklearn.base import (
    BaseEstimator,
    ClassNamePrefixFeaturesOutMixin,
    ClusterMixin,
    TransformerMixin,
    _fit_context,
)
from sklearn.metrics.pairwise import euclidean_distances
from sklearn.utils._param_validation import Interval, StrOptions
from sklearn.utils.validation import check_is_fitted, validate_data

from fedclust.fcm import (
    Float,
    _as_2d,
    fcm_from_centers,
    fuzzifier_problem,
    kmeans_plusplus_centers,
    memberships,
    objective,
    random_centers,
    squared_distances,
)
from fedclust.fcm.kernel import fcm_pass

__all__ = ["FuzzyCMeans"]


class FuzzyCMeans(ClassNamePrefixFeaturesOutMixin, TransformerMixin, ClusterMixin, BaseEstimator):
    r"""Centralized fuzzy c-means (Bezdek), the pooled-data reference of paper 004.

    Alternates the membership update :math:`\mu_{c,j}` and the center update
    :math:`v_c = \sum_j \mu_{c,j}^m x_j / \sum_j \mu_{c,j}^m` from the initial centers until the
    centers move less than ``tol`` (:func:`fedclust.fcm.fcm_from_centers`). With the same initial
    centers it gives the same centers as federated exact FCM over all clients.

    Parameters
    ----------
    n_clusters : int, default=3
        Number of clusters :math:`C`.
    m : float, default=2.0
        Fuzzifier, ``m > 1`` (the paper's :math:`\lambda`); ``m -> 1`` is hard k-means. Its upper
        limit depends on ``n_clusters`` (:func:`fedclust.fcm.fuzzifier_problem`).
    tol : float, default=0.005
        Stop when the Frobenius norm of the center change is below ``tol`` (paper 004).
    max_iter : int, default=30
        Maximum number of center updates.
    init : {"uniform", "k-means++"} or array-like of shape (n_clusters, n_features), \
default="uniform"
        ``"uniform"`` draws centers uniformly in the data's bounding box, as the federated
        server does from the federated bounds; ``"k-means++"`` uses scikit-learn's seeding.
    random_state : int, numpy.random.Generator or None, default=None
        Seed of the initial centers.

    Attributes
    ----------
    cluster_centers_ : ndarray of shape (n_clusters, n_features)
        Final centers :math:`v_c`.
    labels_ : ndarray of shape (n_samples,)
        Cluster of highest membership (= nearest center) of each training sample.
    memberships_ : ndarray of shape (n_samples, n_clusters)
        Fuzzy memberships :math:`\mu_{c,j}` of the training samples w.r.t. the final centers;
        rows sum to 1.
    objective_ : float
        :math:`J_m = \sum_j \sum_c \mu_{c,j}^m \|x_j - v_c\|^2` at the final centers.
    n_iter_ : int
        Number of center updates run.
    converged_ : bool
        Whether the last center change was below ``tol``.
    shifts_ : list of float
        Frobenius norm of the center change at each update.
    n_features_in_ : int
        Number of features seen during :meth:`fit`.
    feature_names_in_ : ndarray of shape (n_features_in_,)
        Names of features seen during :meth:`fit`, when ``X`` has string column names.

    See Also
    --------
    sklearn.cluster.KMeans : hard k-means, the ``m -> 1`` limit.
    fedclust.fcm.local_sums : the per-client step of federated exact FCM.

    Examples
    --------
    >>> import numpy as np
    >>> from sklearn.pipeline import make_pipeline
    >>> from sklearn.preprocessing import StandardScaler
    >>> from fedclust.fcm import FuzzyCMeans
    >>> X = np.array([[0.0, 0.1], [0.2, 0.0], [5.0, 5.1], [5.2, 4.9]])
    >>> pipe = make_pipeline(StandardScaler(), FuzzyCMeans(2, random_state=0)).fit(X)
    >>> pipe.predict(X).tolist() in ([0, 0, 1, 1], [1, 1, 0, 0])
    True
    """

    _parameter_constraints: dict = {
        "n_clusters": [Interval(Integral, 1, None, closed="left")],
        # the range of m depends on n_clusters: fuzzifier_problem checks it in fit
        "m": [Real],
        "tol": [Interval(Real, 0, None, closed="left")],
        "max_iter": [Interval(Integral, 1, None, closed="left")],
        "init": [StrOptions({"uniform", "k-means++"}), "array-like"],
        "random_state": [None, Interval(Integral, 0, None, closed="left"), np.random.Generator],
    }

    def __init__(self, n_clusters: int = 3, m: float = 2.0, tol: float = 0.005,
                 max_iter: int = 30, init: str | ArrayLike = "uniform",
                 random_state: int | np.random.Generator | None = None) -> None:
        self.n_clusters = n_clusters
        self.m = m
        self.tol = tol
        self.max_iter = max_iter
        self.init = init
        self.random_state = random_state

    def _check_params_vs_input(self, x: Float) -> None:
        problem = fuzzifier_problem(self.m, self.n_clusters)
        if problem is not None:
            raise ValueError(f"FuzzyCMeans: {problem}")
        if x.shape[0] < self.n_clusters:
            raise ValueError(f"n_samples={x.shape[0]} should be >= n_clusters={self.n_clusters}: "
                             "pass more samples or lower n_clusters")

    def _initial_centers(self, x: Float) -> Float:
        if isinstance(self.init, str):
            if self.init == "uniform":
                return random_centers(x.min(0), x.max(0), self.n_clusters, self.random_state)
            return kmeans_plusplus_centers(x, self.n_clusters, self.random_state)
        centers = _as_2d(self.init, "init")
        if centers.shape != (self.n_clusters, x.shape[1]):
            raise ValueError(f"init has shape {centers.shape}, expected "
                             f"(n_clusters, n_features) = {(self.n_clusters, x.shape[1])}")
        return centers

    @_fit_context(prefer_skip_nested_validation=True)
    def fit(self, X: ArrayLike, y: object = None) -> FuzzyCMeans:
        """Compute the fuzzy c-means clustering.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
            Training samples (dense; converted to float64).
        y : Ignored
            Not used, present for API consistency.

        Returns
        -------
        self : FuzzyCMeans
            Fitted estimator.
        """
        x = validate_data(self, X, dtype=np.float64)
        self._check_params_vs_input(x)
        res = fcm_from_centers(x, self._initial_centers(x), self.m, self.tol, self.max_iter)
        self.cluster_centers_, self.n_iter_ = res.centers, res.n_iter
        self.converged_, self.shifts_ = res.converged, res.shifts
        final = fcm_pass(np.ascontiguousarray(x), res.centers, self.m, sums=False,
                         memberships=True)      # one pass: memberships and objective
        self.memberships_ = final.memberships
        self.labels_ = final.memberships.argmax(axis=1)   # highest membership = nearest center
        self.objective_ = final.objective
        self._n_features_out = self.cluster_centers_.shape[0]
        return self

    def _check_test_data(self, X: ArrayLike) -> Float:
        check_is_fitted(self)
        return validate_data(self, X, dtype=np.float64, reset=False)

    def predict(self, X: ArrayLike) -> NDArray[np.intp]:
        """Index of the highest membership (= the nearest center) of each sample.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)

        Returns
        -------
        labels : ndarray of shape (n_samples,)
        """
        return squared_distances(self._check_test_data(X), self.cluster_centers_).argmin(axis=1)

    def predict_proba(self, X: ArrayLike) -> Float:
        """Fuzzy memberships of each sample; rows sum to 1.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)

        Returns
        -------
        memberships : ndarray of shape (n_samples, n_clusters)
        """
        return memberships(self._check_test_data(X), self.cluster_centers_, self.m)

    def transform(self, X: ArrayLike) -> Float:
        """Euclidean distance of each sample to each center (as :meth:`KMeans.transform`).

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)

        Returns
        -------
        distances : ndarray of shape (n_samples, n_clusters)
        """
        return euclidean_distances(self._check_test_data(X), self.cluster_centers_)

    def score(self, X: ArrayLike, y: object = None) -> float:
        """Opposite of the FCM objective :math:`J_m` of ``X`` at the fitted centers.

        Higher is better, as for :meth:`sklearn.cluster.KMeans.score`; compare scores only
        between models with the same ``n_clusters`` and ``m`` (:math:`J_m` falls as either grows).

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
        y : Ignored

        Returns
        -------
        score : float
        """
        return -objective(self._check_test_data(X), self.cluster_centers_, self.m)
