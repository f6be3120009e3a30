r"""Fuzzy c-means: the centralized algorithm and the federated LocalSums step (paper 004).

With fuzzifier :math:`m>1` (the paper's :math:`\lambda`), the membership of point
:math:`x_j` in cluster :math:`c` is

.. math:: \mu_{c,j} = \Big(\sum_{k=1}^{C} \big(\|x_j-v_c\| / \|x_j-v_k\|\big)^{2/(m-1)}\Big)^{-1},

and the center update (paper 004 eq. 3–6) is

.. math:: v_c = \frac{\sum_j \mu_{c,j}^m x_j}{\sum_j \mu_{c,j}^m}
              = \frac{\sum_m WS_c^{(m)}}{\sum_m U_c^{(m)}},

where client :math:`m` computes the *local sums* :math:`U^{(m)}_c=\sum_{j}\mu^m_{c,j}` and
:math:`WS^{(m)}_c=\sum_j \mu^m_{c,j}x_j` (Algorithm 2, ``LocalSums``). Because both sums
decompose over disjoint clients, the federated update equals the centralized one exactly.

This package's top level is numpy only (clients import it). The scikit-learn estimator
``FuzzyCMeans`` is defined in :mod:`fedclust.fcm.estimator`; ``from fedclust.fcm import
FuzzyCMeans`` imports that module on first use.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

from fedclust.fcm.kernel import BLOCK, TINY, Float, Pass, augment, fcm_pass

# Largest fuzzifier: memberships tend to 1/C as m grows, so U_c = sum_j u_cj^m ~ N C^-m. Beyond
# m log10(C) = MAX_UNDERFLOW_DIGITS the sums sink towards the float64 underflow (1e-308): with
# m = 1000 and C = 4 every U_c is exactly 0, the centers never move and the run "converges" on
# its random initial centers. M_MAX keeps m in a range with meaning (paper 004: m around 2).
# SecAgg+ sums U in fixed point with an absolute step of about 1e-15 (fedclust/fcm/secagg.py),
# so there U_c ~ N C^-m must stay far above it: m log10(C) <= SECURE_UNDERFLOW_DIGITS (with
# C = 4, m = 19 still matches the plain run to 2e-7; m = 30 is off by 1.5).
M_MAX = 100.0
MAX_UNDERFLOW_DIGITS = 200.0
SECURE_UNDERFLOW_DIGITS = 10.0


def fuzzifier_problem(m: float, n_clusters: int, secure: bool = False) -> str | None:
    """Why fuzzifier ``m`` cannot be used with ``n_clusters`` clusters, or None.

    ``m`` close to 1 is fine (memberships become crisp: hard k-means); a huge ``m`` makes every
    ``u^m`` underflow to 0 in float64 (``secure``: below the fixed-point step of SecAgg+).
    """
    import math

    if not (isinstance(m, (int, float, np.floating, np.integer)) and math.isfinite(m)):
        return f"m must be a finite number, got {m!r}"
    if not m > 1.0:
        return f"m must be > 1 (m -> 1 is hard k-means), got {m!r}"
    if m > M_MAX:
        return (f"m = {m:g} is above {M_MAX:g}: memberships u^m underflow towards 0 in float64 "
                f"(u ~ 1/C for large m), so the centers would not move")
    digits = m * math.log10(max(int(n_clusters), 2))
    limit = SECURE_UNDERFLOW_DIGITS if secure else MAX_UNDERFLOW_DIGITS
    if digits > limit:
        m_max = limit / math.log10(max(int(n_clusters), 2))
        where = ("the fixed-point sums of secure aggregation" if secure else "float64")
        return (f"m = {m:g} with {n_clusters} clusters: u^m ~ (1/{n_clusters})^{m:g} = "
                f"1e-{digits:.0f} underflows {where} (at most 1e-{limit:.0f}); "
                f"use m <= {m_max:.3g} with {n_clusters} clusters")
    return None


def _as_2d(x: ArrayLike, name: str = "X") -> Float:
    arr = np.asarray(x, dtype=np.float64)
    if arr.ndim != 2:
        raise ValueError(f"{name} must be 2-D (n_samples, n_features), got shape {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} contains NaN or infinite values; clean or impute them first")
    return arr


def squared_distances(x: Float, centers: Float) -> Float:
    """Squared Euclidean distances ``(n, C)`` via ``‖x‖² − 2 x·v + ‖v‖²`` (one GEMM)."""
    d2 = np.einsum("ij,ij->i", x, x)[:, None] - 2.0 * (x @ centers.T)
    d2 += np.einsum("ij,ij->i", centers, centers)[None, :]
    np.maximum(d2, TINY, out=d2)
    return d2


def _inputs(x: ArrayLike, centers: ArrayLike) -> tuple[Float, Float]:
    """``x`` and ``centers`` as C-contiguous float64 with matching features (no copy if they
    already are). Finiteness is checked on the pass's result (:func:`_checked`), not here: a
    separate check would be one more pass over the data."""
    x = np.ascontiguousarray(x, dtype=np.float64)
    centers = _as_2d(centers, "centers")
    if x.ndim != 2:
        raise ValueError(f"X must be 2-D (n_samples, n_features), got shape {x.shape}")
    if x.shape[1] != centers.shape[1]:
        raise ValueError(f"X has {x.shape[1]} features but centers have {centers.shape[1]}")
    return x, centers


def _checked(result: Pass, x: Float) -> Pass:
    """``result``, unless a NaN or infinity in ``x`` reached it: then the clear error."""
    finite = np.isfinite(result.objective) and all(
        a is None or np.isfinite(a).all() for a in (result.u, result.ws))
    if not finite:
        _as_2d(x)                       # raises with what is wrong and how to fix it
    return result


def memberships(x: ArrayLike, centers: ArrayLike, m: float = 2.0) -> Float:
    """Fuzzy memberships ``U`` of shape ``(n, C)``; rows sum to 1 (eq. 9 of paper 004)."""
    x, centers = _inputs(x, centers)
    res = _checked(fcm_pass(x, centers, m, sums=False, memberships=True), x)
    assert res.memberships is not None
    return res.memberships


def local_sums(x: ArrayLike, centers: ArrayLike, m: float = 2.0, chunk_size: int = BLOCK,
               n_threads: int | None = None) -> tuple[Float, Float]:
    r"""Paper 004 Algorithm 2 (``LocalSums``): one fused pass over the data.

    See :mod:`fedclust.fcm.kernel`: blocks of ``chunk_size`` rows, no (n, C) temporary,
    one power per element (none for m = 2), both GEMMs on an augmented block, blocks shared
    among ``n_threads`` threads; the result does not depend on the thread count.
    (``bench/bench_fcm_local_sums.py``.)

    Returns
    -------
    U : ndarray of shape (C,)
        :math:`U_c = \sum_j \mu_{c,j}^m`.
    WS : ndarray of shape (C, F)
        :math:`WS_c = \sum_j \mu_{c,j}^m x_j`.
    """
    x, centers = _inputs(x, centers)
    res = _checked(fcm_pass(x, centers, m, n_threads=n_threads, block=chunk_size), x)
    assert res.u is not None and res.ws is not None
    return res.u, res.ws


@dataclass(frozen=True)
class Pooled:
    """Several clients' rows stacked for :func:`local_sums_many`: the augmented rows
    (:func:`~fedclust.fcm.kernel.augment`) and where each client's rows start."""

    xa: Float                  # (N, F + 2), every client's rows one after the other
    starts: NDArray[np.int64]  # (S,) first row of each client (each client has rows)
    n_features: int

    @classmethod
    def of(cls, xs: list[Float]) -> Pooled:
        """The rows of ``xs`` (float64, 2-D, the same columns, none empty), stacked."""
        sizes = np.array([x.shape[0] for x in xs], dtype=np.int64)
        if len(xs) == 0 or sizes.min() == 0:
            raise ValueError("Pooled.of needs at least one client and rows in every client")
        starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
        return cls(augment(np.concatenate(xs)), starts, xs[0].shape[1])


def local_sums_many(pooled: Pooled, centers: ArrayLike, m: float = 2.0
                    ) -> tuple[Float, Float]:
    r""":func:`local_sums` of several clients at the same centers, in one pass over their
    stacked rows (an in-process simulation answers a round's clients together).

    The memberships of all rows come from one :func:`~fedclust.fcm.kernel.fcm_pass`; each
    client's :math:`U_c = \sum_j \mu_{c,j}^m` and :math:`WS_c = \sum_j \mu_{c,j}^m x_j` are
    then summed over its own rows. The sums equal :func:`local_sums`'s up to rounding (the
    order of the additions differs).

    Returns
    -------
    U : ndarray of shape (S, C)
    WS : ndarray of shape (S, C, F)
    """
    centers = _as_2d(centers, "centers")
    f = pooled.n_features
    mu = fcm_pass(pooled.xa, centers, m, augmented=True, sums=False,
                  memberships=True).memberships
    assert mu is not None
    um = mu * mu if m == 2.0 else np.power(mu, m)
    u = np.add.reduceat(um, pooled.starts, axis=0)
    s, n = len(pooled.starts), pooled.xa.shape[0]
    if n % s == 0 and np.array_equal(pooled.starts, np.arange(0, n, n // s)):
        # clients of equal size (the usual partition): one stacked product for all
        ws = np.matmul(um.reshape(s, n // s, -1).transpose(0, 2, 1),
                       pooled.xa[:, :f].reshape(s, n // s, f))
    else:
        stops = np.append(pooled.starts[1:], n)
        ws = np.empty((s, centers.shape[0], f))
        for k, (a, b) in enumerate(zip(pooled.starts, stops, strict=True)):
            np.dot(um[a:b].T, pooled.xa[a:b, :f], out=ws[k])
    if not (np.isfinite(u).all() and np.isfinite(ws).all()):
        _as_2d(pooled.xa[:, :f])        # raises with what is wrong and how to fix it
    return u, ws


def memberships_many(pooled: Pooled, centers: ArrayLike, m: float = 2.0
                     ) -> tuple[Float, Float]:
    r""":func:`memberships` and :func:`objective` of several clients at the same centers, in one
    pass over their stacked rows (an in-process simulation's final phase).

    Returns
    -------
    U : ndarray of shape (N, C)
        The memberships of every row, the clients' rows one after the other
        (``pooled.starts``); each row's equal :func:`memberships`'s up to rounding.
    J : ndarray of shape (S,)
        Each client's objective share :math:`\sum_j \sum_c \mu_{cj}^m d^2_{cj}` over its own
        rows (:func:`objective`'s, up to rounding).
    """
    centers = _as_2d(centers, "centers")
    f = pooled.n_features
    mu = fcm_pass(pooled.xa, centers, m, augmented=True, sums=False,
                  memberships=True).memberships
    assert mu is not None
    if not np.isfinite(mu).all():
        _as_2d(pooled.xa[:, :f])        # raises with what is wrong and how to fix it
    um = mu * mu if m == 2.0 else np.power(mu, m)
    per_row = np.einsum("ij,ij->i", um, squared_distances(pooled.xa[:, :f], centers))
    return mu, np.add.reduceat(per_row, pooled.starts)


def labels_from_centers(x: ArrayLike, centers: ArrayLike) -> NDArray[np.int64]:
    """Crisp labels ``(n,)``: the highest membership, which is the nearest center."""
    return squared_distances(np.asarray(x, dtype=np.float64),
                             np.asarray(centers, dtype=np.float64)).argmin(axis=1)


def update_centers(u_sum: Float, ws_sum: Float, previous: Float) -> Float:
    """Eq. 3: ``v_c = ΣWS_c / ΣU_c``; a cluster with zero mass keeps its previous center."""
    u_sum = np.asarray(u_sum, dtype=np.float64)
    out = np.array(previous, dtype=np.float64, copy=True)
    ok = u_sum > 0
    out[ok] = np.asarray(ws_sum, dtype=np.float64)[ok] / u_sum[ok, None]
    return out


def random_centers(low: ArrayLike, high: ArrayLike, n_clusters: int,
                   random_state: int | np.random.Generator | None = None) -> Float:
    """``n_clusters`` centers drawn uniformly inside the box ``[low, high]`` (per feature)."""
    rng = np.random.default_rng(random_state)
    low, high = np.asarray(low, dtype=np.float64), np.asarray(high, dtype=np.float64)
    return low + rng.random((n_clusters, low.size)) * (high - low)


def kmeans_plusplus_centers(x: ArrayLike, n_clusters: int,
                            random_state: int | np.random.Generator | None = None) -> Float:
    """``n_clusters`` initial centers by k-means++ seeding (scikit-learn's implementation)."""
    from sklearn.cluster import kmeans_plusplus

    seed = np.random.default_rng(random_state).integers(2**31 - 1)
    return kmeans_plusplus(_as_2d(x), n_clusters, random_state=int(seed))[0]


def objective(x: ArrayLike, centers: ArrayLike, m: float = 2.0) -> float:
    r"""FCM objective :math:`J_m = \sum_j \sum_c \mu_{c,j}^m \|x_j - v_c\|^2`
    (computed as :math:`\sum_j d^2_{\min,j} S_j^{1-m}`, see :mod:`fedclust.fcm.kernel`)."""
    x, centers = _inputs(x, centers)
    return _checked(fcm_pass(x, centers, m, sums=False), x).objective


@dataclass
class FCMResult:
    centers: Float
    n_iter: int
    converged: bool
    shifts: list[float]


def fcm_from_centers(x: ArrayLike, centers: ArrayLike, m: float = 2.0, tol: float = 0.005,
                     max_iter: int = 30) -> FCMResult:
    """Centralized FCM iterated from given centers; stop when ‖V(t+1) − V(t)‖_F < tol.

    This is the loop of paper 004 Algorithm 1 run on pooled data: with the same initial centers
    it produces the same sequence of centers as federated FCM with all clients.
    """
    x = _as_2d(x)
    v = _as_2d(centers, "centers").copy()
    xa = augment(x)                     # prepared once for all iterations
    shifts: list[float] = []
    for it in range(1, max_iter + 1):
        res = fcm_pass(xa, v, m, augmented=True)
        new = update_centers(res.u, res.ws, v)
        shifts.append(float(np.linalg.norm(new - v)))
        v = new
        if shifts[-1] < tol:
            return FCMResult(v, it, True, shifts)
    return FCMResult(v, max_iter, False, shifts)


def fcm_until_stable(x: ArrayLike, centers: ArrayLike, m: float = 2.0, tol: float = 1e-4,
                     max_iter: int = 1000) -> tuple[Float, Float, int]:
    r"""Local FCM as in paper 003 §2.1.2: memberships from the given centers, then alternate
    eq. 6 / eq. 5 until :math:`\|U^{t+1}-U^{t}\|_F \le \epsilon` or ``max_iter``.

    Each iteration is one pass: the memberships at the new centers and the sums that give the
    next centers come from the same pass.

    Returns
    -------
    centers : ndarray (C, F)
    u : ndarray (n, C) memberships w.r.t. the returned centers
    n_iter : int
    """
    x = _as_2d(x)
    v = _as_2d(centers, "centers").copy()
    xa = augment(x)
    res = fcm_pass(xa, v, m, augmented=True, memberships=True)
    n_iter = 0
    while n_iter < max_iter:
        n_iter += 1
        v = update_centers(res.u, res.ws, v)
        new = fcm_pass(xa, v, m, augmented=True, memberships=True)
        delta = float(np.linalg.norm(new.memberships - res.memberships))
        res = new
        if delta <= tol:
            break
    return v, res.memberships, n_iter


_ESTIMATOR_NAMES = ("FuzzyCMeans", "SCORERS", "fuzzy_db_scorer", "partition_coefficient",
                    "partition_coefficient_scorer", "xie_beni", "xie_beni_scorer")


def __getattr__(name: str) -> object:
    # The estimator imports scikit-learn (about a second per ClientApp start): it is imported
    # on first access, so that `import fedclust.fcm` stays light.
    if name in _ESTIMATOR_NAMES:
        from fedclust.fcm import estimator

        return getattr(estimator, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
