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

import os
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

Float = NDArray[np.float64]

# A point sitting exactly on a center has distance 0; the reference code replaces it by the
# machine epsilon so that its membership becomes ~1 for that center instead of NaN.
_TINY = float(np.finfo(np.float64).tiny) ** 0.5


# Largest fuzzifier: memberships tend to 1/C as m grows, so U_c = sum_j u_cj^m ~ N C^-m. Beyond
# m log10(C) = MAX_UNDERFLOW_DIGITS the sums sink towards the float64 underflow (1e-308): with
# m = 1000 and C = 4 every U_c is exactly 0, the centers never move and the run "converges" on
# its random initial centers. M_MAX keeps m in a range with meaning (paper 004: m around 2).
# SecAgg+ sums U in fixed point with an absolute step of about 1e-15 (strategies/secure_fcm.py),
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
    np.maximum(d2, _TINY, out=d2)
    return d2


def memberships(x: ArrayLike, centers: ArrayLike, m: float = 2.0) -> Float:
    """Fuzzy memberships ``U`` of shape ``(n, C)``; rows sum to 1 (eq. 9 of paper 004)."""
    x, centers = _as_2d(x), _as_2d(centers, "centers")
    return _memberships_from_d2(squared_distances(x, centers), m)


def _memberships_from_d2(d2: Float, m: float) -> Float:
    # mu_cj ∝ d2_cj^{-1/(m-1)}; normalising by the row minimum keeps powers in range.
    if m == 2.0:
        inv = np.reciprocal(d2, out=d2)
    else:
        inv = d2
        inv /= d2.min(axis=1, keepdims=True)
        np.power(inv, -1.0 / (m - 1.0), out=inv)
    inv /= inv.sum(axis=1, keepdims=True)
    return inv


def local_sums(x: ArrayLike, centers: ArrayLike, m: float = 2.0, chunk_size: int = 8192,
               n_threads: int | None = None) -> tuple[Float, Float]:
    r"""Paper 004 Algorithm 2 (``LocalSums``), vectorised.

    Rows are processed in blocks of ``chunk_size`` with reused buffers: the ``(n, C)``
    temporaries of a one-shot version cost more in page faults than in arithmetic. Blocks are
    shared among ``n_threads`` Python threads (numpy releases the GIL) with BLAS pinned to one
    thread each, which also keeps small GEMMs from stalling on a busy machine; partial sums are
    added in block order, so the result does not depend on the thread count.
    (``bench/bench_fcm_local_sums.py``.)

    Returns
    -------
    U : ndarray of shape (C,)
        :math:`U_c = \sum_j \mu_{c,j}^m`.
    WS : ndarray of shape (C, F)
        :math:`WS_c = \sum_j \mu_{c,j}^m x_j`.
    """
    x, centers = _as_2d(x), _as_2d(centers, "centers")
    if x.shape[1] != centers.shape[1]:
        raise ValueError(f"X has {x.shape[1]} features but centers have {centers.shape[1]}")
    n = x.shape[0]
    chunk = max(1, min(chunk_size, n))
    starts = list(range(0, n, chunk))
    workers = max(1, min(n_threads or os.cpu_count() or 1, len(starts)))
    if workers == 1:
        u_sum, ws_sum, _ = _sums_of_blocks(x, centers, m, starts, chunk)
        return u_sum, ws_sum
    from concurrent.futures import ThreadPoolExecutor

    from threadpoolctl import threadpool_limits

    groups = [starts[i::workers] for i in range(workers)]
    with threadpool_limits(limits=1, user_api="blas"), ThreadPoolExecutor(workers) as pool:
        results = list(pool.map(lambda g: _sums_of_blocks(x, centers, m, g, chunk), groups))
    # add per block in block order: the same summation order as the single-thread path
    blocks = sorted((blk for res in results for blk in res[2]), key=lambda blk: blk[0])
    u_sum, ws_sum = np.zeros(centers.shape[0]), np.zeros_like(centers)
    for _, u_b, ws_b in blocks:
        u_sum += u_b
        ws_sum += ws_b
    return u_sum, ws_sum


def _sums_of_blocks(x: Float, centers: Float, m: float, starts: list[int], chunk: int
                    ) -> tuple[Float, Float, list[tuple[int, Float, Float]]]:
    """Local sums over the row blocks beginning at ``starts`` (also returned per block)."""
    c = centers.shape[0]
    vt = np.ascontiguousarray(centers.T)
    vv = np.einsum("ij,ij->i", centers, centers)
    u_sum, ws_sum = np.zeros(c), np.zeros((c, x.shape[1]))
    d2_buf, row_buf, xx_buf = np.empty((chunk, c)), np.empty((chunk, 1)), np.empty(chunk)
    blocks = []
    for start in starts:
        xb = x[start:start + chunk]
        b = xb.shape[0]
        w, rows, xx = d2_buf[:b], row_buf[:b], xx_buf[:b]
        np.dot(xb, vt, out=w)                      # w = ‖x‖² − 2x·v + ‖v‖²  (squared distances)
        w *= -2.0
        np.einsum("ij,ij->i", xb, xb, out=xx)
        w += xx[:, None]
        w += vv
        np.maximum(w, _TINY, out=w)
        if m == 2.0:                               # w = d^{-2/(m-1)}, then normalise -> mu
            np.reciprocal(w, out=w)
        else:
            w /= w.min(axis=1, keepdims=True)
            np.power(w, -1.0 / (m - 1.0), out=w)
        np.sum(w, axis=1, keepdims=True, out=rows)
        w /= rows
        if m == 2.0:                               # w = mu^m
            np.square(w, out=w)
        else:
            np.power(w, m, out=w)
        u_b, ws_b = w.sum(axis=0), w.T @ xb
        blocks.append((start, u_b, ws_b))
        u_sum += u_b
        ws_sum += ws_b
    return u_sum, ws_sum, blocks


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
    r"""FCM objective :math:`J_m = \sum_j \sum_c \mu_{c,j}^m \|x_j - v_c\|^2`."""
    x, centers = _as_2d(x), _as_2d(centers, "centers")
    d2 = squared_distances(x, centers)
    u = _memberships_from_d2(d2.copy(), m)
    return float(np.sum(u**m * d2))


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
    shifts: list[float] = []
    for it in range(1, max_iter + 1):
        u, ws = local_sums(x, v, m)
        new = update_centers(u, ws, v)
        shifts.append(float(np.linalg.norm(new - v)))
        v = new
        if shifts[-1] < tol:
            return FCMResult(v, it, True, shifts)
    return FCMResult(v, max_iter, False, shifts)


def fcm_until_stable(x: ArrayLike, centers: ArrayLike, m: float = 2.0, tol: float = 1e-4,
                     max_iter: int = 1000) -> tuple[Float, Float, int]:
    r"""Local FCM as in paper 003 §2.1.2: memberships from the given centers, then alternate
    eq. 6 / eq. 5 until :math:`\|U^{t+1}-U^{t}\|_F \le \epsilon` or ``max_iter``.

    Returns
    -------
    centers : ndarray (C, F)
    u : ndarray (n, C) memberships w.r.t. the returned centers
    n_iter : int
    """
    x = _as_2d(x)
    v = _as_2d(centers, "centers").copy()
    u = _memberships_from_d2(squared_distances(x, v), m)
    n_iter = 0
    while n_iter < max_iter:
        n_iter += 1
        w = u**m
        mass = w.sum(axis=0)
        v = update_centers(mass, w.T @ x, v)
        u_new = _memberships_from_d2(squared_distances(x, v), m)
        delta = float(np.linalg.norm(u_new - u))
        u = u_new
        if delta <= tol:
            break
    return v, u, n_iter


def __getattr__(name: str) -> object:
    # The estimator imports scikit-learn (about a second per ClientApp start): it is imported
    # on first access, so that `import fedclust.fcm` stays light.
    if name == "FuzzyCMeans":
        from fedclust.fcm.estimator import FuzzyCMeans

        return FuzzyCMeans
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
