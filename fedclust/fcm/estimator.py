"""Centralized fuzzy c-means as a scikit-learn estimator.

The numpy core is the top level of :mod:`fedclust.fcm`; it is what clients run, and importing
it does not import scikit-learn (which would add about a second to each ClientApp start, see
``tests/architecture/test_architecture.py``). This module builds the estimator on that core
in the style of
:class:`sklearn.cluster.KMeans`; ``from fedclust.fcm import FuzzyCMeans`` imports it on first
access to the name.

Deep Embedded Clustering, the other centralized baseline offered as an estimator, is
:class:`fedclust.fedcref.dec.DEC`.
"""

from __future__ import annotations

import warnings
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
from sklearn.exceptions import ConvergenceWarning
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

__all__ = ["FuzzyCMeans", "SCORERS", "fuzzy_db_scorer", "partition_coefficient",
           "partition_coefficient_scorer", "xie_beni", "xie_beni_scorer"]


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
        Maximum number of center updates. A fit that stops at ``max_iter`` with the centers
        still moving by ``tol`` or more warns with :class:`~sklearn.exceptions.ConvergenceWarning`
        (``converged_`` is False).
    init : {"uniform", "k-means++"} or array-like of shape (n_clusters, n_features), \
default="uniform"
        ``"uniform"`` draws centers uniformly in the data's bounding box, as the federated
        server does from the federated bounds; ``"k-means++"`` uses scikit-learn's seeding.
    n_init : int, default=1
        Number of starts from different initial centers (drawn one after the other from
        ``random_state``); the fit with the lowest objective :math:`J_m` is kept, as in
        :class:`sklearn.cluster.KMeans`. One start (the default) is federated exact FCM's
        reference: the same initial centers give the same centers. With explicit ``init``
        centers only one start is made (a :class:`RuntimeWarning` says so when ``n_init > 1``).
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
    fpc_ : float
        Fuzzy partition coefficient of the training memberships,
        :math:`\frac{1}{N}\sum_j \sum_c \mu_{c,j}^2` in :math:`[1/C, 1]` (scikit-fuzzy's
        ``fpc``; 1 is a crisp partition).
    n_iter_ : int
        Number of center updates run (of the kept start).
    converged_ : bool
        Whether the last center change was below ``tol`` (of the kept start).
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
        "n_init": [Interval(Integral, 1, None, closed="left")],
        "random_state": [None, Interval(Integral, 0, None, closed="left"), np.random.Generator],
    }

    def __init__(self, n_clusters: int = 3, m: float = 2.0, tol: float = 0.005,
                 max_iter: int = 30, init: str | ArrayLike = "uniform", n_init: int = 1,
                 random_state: int | np.random.Generator | None = None) -> None:
        self.n_clusters = n_clusters
        self.m = m
        self.tol = tol
        self.max_iter = max_iter
        self.init = init
        self.n_init = n_init
        self.random_state = random_state

    def _check_params_vs_input(self, x: Float) -> None:
        problem = fuzzifier_problem(self.m, self.n_clusters)
        if problem is not None:
            raise ValueError(f"FuzzyCMeans: {problem}")
        if x.shape[0] < self.n_clusters:
            raise ValueError(f"n_samples={x.shape[0]} should be >= n_clusters={self.n_clusters}: "
                             "pass more samples or lower n_clusters")

    def _initial_centers(self, x: Float, rng: int | np.random.Generator | None = None
                         ) -> Float:
        rng = self.random_state if rng is None else rng
        if isinstance(self.init, str):
            if self.init == "uniform":
                return random_centers(x.min(0), x.max(0), self.n_clusters, rng)
            return kmeans_plusplus_centers(x, self.n_clusters, rng)
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
        starts = self.n_init
        if not isinstance(self.init, str) and starts > 1:
            warnings.warn(f"FuzzyCMeans: explicit initial centers were passed (init=array): one "
                          f"start instead of n_init={starts}", RuntimeWarning, stacklevel=2)
            starts = 1
        # one start: the seed as given (the federated reference's centers); several: one
        # generator, each start drawing the next initial centers from it
        rng = (self.random_state if starts == 1 else
               self.random_state if isinstance(self.random_state, np.random.Generator) else
               np.random.default_rng(self.random_state))
        best, final = None, None
        for _ in range(starts):
            res = fcm_from_centers(x, self._initial_centers(x, rng), self.m, self.tol,
                                   self.max_iter)
            run = fcm_pass(np.ascontiguousarray(x), res.centers, self.m, sums=False,
                           memberships=True)      # one pass: memberships and objective
            if final is None or run.objective < final.objective:
                best, final = res, run
        self.cluster_centers_, self.n_iter_ = best.centers, best.n_iter
        self.converged_, self.shifts_ = best.converged, best.shifts
        if not best.converged:
            last = best.shifts[-1] if best.shifts else float("nan")
            warnings.warn(f"FuzzyCMeans: stopped at max_iter={self.max_iter} before "
                          f"converging (last center change {last:.3g} >= tol={self.tol:g}). "
                          f"Fix: raise max_iter or tol", ConvergenceWarning, stacklevel=2)
        self.memberships_ = final.memberships
        self.labels_ = final.memberships.argmax(axis=1)   # highest membership = nearest center
        self.objective_ = final.objective
        self.fpc_ = partition_coefficient(final.memberships)
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


# --------------------------------------------------------------------------- choosing K

def partition_coefficient(u: ArrayLike) -> float:
    r"""Bezdek's fuzzy partition coefficient :math:`\frac{1}{N}\sum_j\sum_c u_{j,c}^2`.

    Parameters
    ----------
    u : array-like of shape (n_samples, n_clusters)
        Memberships; rows sum to 1.

    Returns
    -------
    float
        In :math:`[1/C, 1]`; higher is a crisper partition.
    """
    u = np.asarray(u, dtype=np.float64)
    return float(np.einsum("ij,ij->", u, u) / u.shape[0])


def xie_beni(X: ArrayLike, centers: ArrayLike, m: float = 2.0) -> float:
    r"""Xie–Beni index :math:`\frac{\sum_j\sum_c u_{j,c}^m\|x_j-v_c\|^2}
    {N \min_{c\ne k}\|v_c-v_k\|^2}` (compactness over separation; lower is better).

    Parameters
    ----------
    X : array-like of shape (n_samples, n_features)
    centers : array-like of shape (n_clusters, n_features), n_clusters >= 2
    m : float, default=2.0
        Fuzzifier of the memberships.

    Returns
    -------
    float
        ``inf`` when two centers coincide.
    """
    x, v = _as_2d(X), _as_2d(centers, "centers")
    if v.shape[0] < 2:
        raise ValueError("the Xie–Beni index needs at least 2 clusters")
    separation = squared_distances(v, v)
    np.fill_diagonal(separation, np.inf)
    gap = float(separation.min())
    return np.inf if gap <= 0 else objective(x, v, m) / (x.shape[0] * gap)


def _fuzzy_db(x: Float, centers: Float, m: float) -> float:
    from fedclust.fcm.validity import fuzzy_db

    return fuzzy_db(x, centers, m)


def _fitted_centers(estimator: object) -> tuple[Float, float]:
    """The last step's centers and fuzzifier (a bare estimator or a Pipeline ending in one)."""
    final = estimator.steps[-1][1] if hasattr(estimator, "steps") else estimator
    check_is_fitted(final, "cluster_centers_")
    return np.asarray(final.cluster_centers_, dtype=np.float64), float(getattr(final, "m", 2.0))


def _transformed(estimator: object, X: ArrayLike) -> Float:
    """``X`` as the last step sees it (a Pipeline's earlier steps applied)."""
    if hasattr(estimator, "steps"):
        for _, step in estimator.steps[:-1]:
            if step is not None and step != "passthrough":
                X = step.transform(X)
    return _as_2d(X)


def fuzzy_db_scorer(estimator: object, X: ArrayLike, y: object = None) -> float:
    """Minus the fuzzy Davies–Bouldin index (paper 003, eq. 7–13) of ``X`` at the fitted
    centers: ``GridSearchCV(FuzzyCMeans(), {"n_clusters": range(2, 9)},
    scoring=fuzzy_db_scorer)`` keeps the K of the lowest index (the centralized version of
    FedFCM's choice). ``-inf`` for one cluster.

    Parameters
    ----------
    estimator : FuzzyCMeans, or a Pipeline ending in one (the earlier steps transform ``X``)
    X : array-like of shape (n_samples, n_features)
    y : Ignored

    Returns
    -------
    float
        Higher is better.
    """
    centers, m = _fitted_centers(estimator)
    if centers.shape[0] < 2:
        return -np.inf
    return -_fuzzy_db(_transformed(estimator, X), centers, m)


def partition_coefficient_scorer(estimator: object, X: ArrayLike, y: object = None) -> float:
    """The partition coefficient of ``X``'s memberships to the fitted centers (higher is
    crisper). It tends to fall as K grows: compare it across K together with an index that
    weighs separation (:func:`fuzzy_db_scorer`, :func:`xie_beni_scorer`)."""
    centers, m = _fitted_centers(estimator)
    return partition_coefficient(memberships(_transformed(estimator, X), centers, m))


def xie_beni_scorer(estimator: object, X: ArrayLike, y: object = None) -> float:
    """Minus the Xie–Beni index of ``X`` at the fitted centers (higher is better; ``-inf`` for
    one cluster or coinciding centers)."""
    centers, m = _fitted_centers(estimator)
    if centers.shape[0] < 2:
        return -np.inf
    return -xie_beni(_transformed(estimator, X), centers, m)


#: ``GridSearchCV(scoring=SCORERS, refit="fuzzy_db")`` reports all three per K.
SCORERS = {"fuzzy_db": fuzzy_db_scorer, "partition_coefficient": partition_coefficient_scorer,
           "xie_beni": xie_beni_scorer}
