r"""One pass of fuzzy c-means over the data: local sums, objective and memberships.

Every FCM computation in fedclust (an exact-FCM client round, a FedFCM local iteration, the
FedFuzzDB statistics, :class:`~fedclust.fcm.FuzzyCMeans`) is this pass. Per block of rows it
does, with :math:`r_{cj} = 1/d^2_{cj}` and :math:`d^2_{cj} = \|x_j - v_c\|^2`:

.. math::
    a_{cj} = r_{cj}\,/\max_k r_{kj},\qquad w_{cj} = a_{cj}^{1/(m-1)},\qquad
    S_j = \sum_c w_{cj},\qquad \mu_{cj} = w_{cj} / S_j,

so :math:`\mu_{cj}^m = w_{cj}\,a_{cj}\,S_j^{-m}` (because :math:`w^{m-1} = a`) with a single
power per element, none when :math:`m = 2` (:math:`w = a`). The objective needs no extra pass:
:math:`\mu^m_{cj} d^2_{cj} = w_{cj} S_j^{-m} d^2_{\min,j}`, hence (Hathaway & Bezdek 1995)

.. math:: J_m = \sum_j d^2_{\min,j}\, S_j^{1-m},

which for :math:`m = 2` is :math:`\sum_j 1/\sum_c d^{-2}_{cj}`.

The squared distances come from one GEMM of the block augmented as
:math:`[x_j, \|x_j\|^2, 1]` against :math:`[-2v_c, 1, \|v_c\|^2]`, and a second GEMM of
:math:`\mu^m` against the same augmented block returns :math:`WS_c = \sum_j \mu^m_{cj} x_j`
and :math:`U_c = \sum_j \mu^m_{cj}` together. Only block-sized temporaries exist (at most
``block`` × (C + F + 2) floats per thread), so memory does not grow with N beyond the data
itself and, for memberships, the (N, C) result.

Blocks are shared between threads (numpy releases the GIL; BLAS is pinned to one thread so the
small GEMMs do not oversubscribe the cores). Partial sums are added in block order, so results
do not depend on the number of threads.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple

import numpy as np
from numpy.typing import NDArray

Float = NDArray[np.float64]

# A point sitting exactly on a center has distance 0; it is replaced by this floor so that its
# membership becomes ~1 for that center instead of NaN.
TINY = float(np.finfo(np.float64).tiny) ** 0.5

BLOCK = 4096            # rows per block: the block's temporaries stay in the L2 cache


class Pass(NamedTuple):
    """What one FCM pass returns (fields the caller did not ask for are None)."""

    u: Float | None           # (C,)   U_c = Σ_j μ_cj^m
    ws: Float | None          # (C, F) WS_c = Σ_j μ_cj^m x_j
    objective: float          # J_m = Σ_j Σ_c μ_cj^m d²_cj
    memberships: Float | None  # (N, C) μ


_controller = None
_pool: tuple[int, ThreadPoolExecutor] | None = None     # (workers, pool), made on first use


def _blas_one_thread():
    """A context that pins BLAS to one thread (the controller is built once: ~0.4 ms saved per
    call)."""
    global _controller
    if _controller is None:
        from threadpoolctl import ThreadpoolController

        _controller = ThreadpoolController()
    return _controller.limit(limits=1, user_api="blas")


def augment(x: Float) -> Float:
    """``[x, ‖x‖², 1]`` of shape (N, F + 2): what :func:`fcm_pass` multiplies by the centers.

    Preparing it once lets repeated passes over the same data (the iterations of a fit) skip
    the per-block copy.
    """
    n, f = x.shape
    xa = np.empty((n, f + 2))
    xa[:, :f] = x
    np.einsum("ij,ij->i", x, x, out=xa[:, f])
    xa[:, f + 1] = 1.0
    return xa


def fcm_pass(x: Float, centers: Float, m: float, *, augmented: bool = False,
             sums: bool = True, memberships: bool = False, n_threads: int | None = None,
             block: int = BLOCK) -> Pass:
    """One pass over ``x`` (float64, C-contiguous, already validated) at ``centers``.

    Parameters
    ----------
    x : ndarray of shape (N, F), or (N, F + 2) from :func:`augment` when ``augmented``
    centers : ndarray of shape (C, F)
    m : float
        Fuzzifier, > 1.
    augmented : bool
        ``x`` is the output of :func:`augment`.
    sums : bool
        Return ``U`` and ``WS``.
    memberships : bool
        Return the (N, C) memberships.
    n_threads : int, optional
        Worker threads (default: all cores; one per ``2 * block`` rows at most).
    block : int
        Rows per block.
    """
    n = x.shape[0]
    f = x.shape[1] - 2 if augmented else x.shape[1]
    c = centers.shape[0]
    va = np.empty((f + 2, c))          # [-2vᵀ; 1; ‖v‖²]: [x, ‖x‖², 1] @ va = ‖x − v‖²
    va[:f] = -2.0 * centers.T
    va[f] = 1.0
    va[f + 1] = np.einsum("ij,ij->i", centers, centers)
    out = np.empty((n, c)) if memberships else None
    block = max(1, min(block, n))
    starts = list(range(0, n, block))
    pairs = n // (2 * block)    # (os.cpu_count costs microseconds: not for small inputs)
    workers = 1 if pairs < 2 else max(1, min(n_threads or os.cpu_count() or 1, pairs))

    def run(group: list[int]) -> list[tuple[int, float, Float | None]]:
        # a NaN or infinity in x spreads to the result, which the caller checks: no warnings
        with np.errstate(all="ignore"):
            return _blocks(x, augmented, centers, va, m, group, block, sums, out)

    if workers == 1:
        parts = run(starts)
    else:
        global _pool
        if _pool is None or _pool[0] < workers:
            _pool = (workers, ThreadPoolExecutor(workers, thread_name_prefix="fedclust-fcm"))
        with _blas_one_thread():
            groups = [starts[i::workers] for i in range(workers)]
            parts = [p for res in _pool[1].map(run, groups) for p in res]
        parts.sort(key=lambda p: p[0])
    acc = np.zeros((f + 2, c)) if sums else None
    objective = 0.0
    for _, j_b, s_b in parts:            # block order: independent of the thread count
        objective += j_b
        if acc is not None:
            acc += s_b
    if acc is None:
        return Pass(None, None, objective, out)
    return Pass(acc[f + 1].copy(), np.ascontiguousarray(acc[:f].T), objective, out)


def _blocks(x: Float, augmented: bool, centers: Float, va: Float, m: float, starts: list[int],
            block: int, sums: bool, out: Float | None) -> list[tuple[int, float, Float | None]]:
    """The pass over the blocks beginning at ``starts``: (start, J_b, [WS | ·· | U]) each."""
    f, c = va.shape[0] - 2, va.shape[1]
    if not augmented:
        xa_buf = np.empty((block, f + 2))
        xa_buf[:, f + 1] = 1.0
    generic = m != 2.0
    w_buf = np.empty((block, c))
    a_buf = np.empty((block, c)) if generic else None
    s_buf, t_buf = np.empty(block), np.empty(block)
    ones = np.ones(c)
    vv_max = float(va[f + 1].max())
    res = []
    for start in starts:
        stop = min(start + block, x.shape[0])
        b = stop - start
        if augmented:
            xa = x[start:stop]
        else:
            xa = xa_buf[:b]
            xa[:, :f] = x[start:stop]
            np.einsum("ij,ij->i", xa[:, :f], xa[:, :f], out=xa[:, f])
        w, s, t = w_buf[:b], s_buf[:b], t_buf[:b]
        np.dot(xa, va, out=w)                            # w = d² = ‖x‖² − 2x·v + ‖v‖²
        # Near a center the expansion cancels (error ~1e-16 (‖x‖² + ‖v‖²)): recompute those
        # rows as ‖x − v‖², which also makes a sample sitting on a center exactly 0.
        near = max(1e-6 * (float(xa[:, f].max()) + vv_max), TINY)   # > 0: rows at the origin
        if w.min() < near:
            rows = np.flatnonzero((w < near).any(axis=1))
            diff = xa[rows, None, :f] - centers[None]
            w[rows] = np.einsum("rcf,rcf->rc", diff, diff)
            np.maximum(w, TINY, out=w)
        np.reciprocal(w, out=w)                          # w = r = 1/d²
        if generic:
            a = a_buf[:b]
            np.maximum(w[:, 0], w[:, 1 % c], out=t)      # t = max_c r = 1/d²_min (by columns:
            for k in range(2, c):                        # a reduction along short rows is slow)
                np.maximum(t, w[:, k], out=t)
            np.reciprocal(t, out=t)                      # t = d²_min
            np.multiply(w, t[:, None], out=a)            # a = d²_min / d²  ∈ (0, 1]
            np.power(a, 1.0 / (m - 1.0), out=w)          # w = a^{1/(m-1)}
        np.dot(w, ones, out=s)                           # s = S = Σ_c w
        if generic:
            j_b = float(np.dot(np.power(s, 1.0 - m), t))  # J = Σ_j d²_min S^{1-m}
            if out is not None:
                np.divide(w, s[:, None], out=out[start:stop])           # μ = w / S
        else:
            np.reciprocal(s, out=s)                      # m = 2: s = 1/Σ_c r, J = Σ_j s
            j_b = float(np.sum(s))
            if out is not None:
                np.multiply(w, s[:, None], out=out[start:stop])         # μ = r / Σ r
        if not sums:
            res.append((start, j_b, None))
            continue
        if generic:
            np.multiply(w, a, out=w)                     # μ^m = w a S^{-m}  (w^{m-1} = a)
            np.power(s, -m, out=s)
            w *= s[:, None]
        else:
            w *= s[:, None]                              # μ² = (r / Σ r)²
            np.square(w, out=w)
        # [WS | Σ μ^m ‖x‖² | U]ᵀ; np.dot, not ``w.T @ xa``: the matmul of this shape does not
        # run in parallel with the other thread (measured), the dot does
        res.append((start, j_b, np.dot(xa.T, w)))
    return res
