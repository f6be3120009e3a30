"""Wasserstein (Earth Mover's) distances between projected embedding clouds (paper 001, §3).

``W(P, Q)`` is the optimal-transport cost between the empirical measures of two point clouds
with uniform weights ``a = 1/n``, ``b = 1/m`` and ground cost ``M = ot.dist(P, Q, metric)``
(the authors use ``metric="cosine"``). The exact network-simplex solver (``ot.emd2``) is the
default; a non-converged solve (iteration limit hit, infeasible or unbounded) raises
:class:`EMDError` instead of the silent warning POT gives. Sinkhorn (entropic, ``reg`` relative
to ``max(M)``) is an option (paper App. E.2); its two failures, POT's "did not converge"
(``numItermax`` reached) and "numerical errors" (underflow) warnings, raise :class:`EMDError`
too, while any other warning is passed on unchanged.

The pairwise matrix is computed in parallel over pairs with worker processes (joblib/loky).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray

# POT 0.9 (ot/bregman/_sinkhorn.py, sinkhorn_knopp) reports both failures only as UserWarnings
SINKHORN_NOT_CONVERGED = "Sinkhorn did not converge"     # numItermax reached
SINKHORN_NUMERICAL = "numerical errors at iteration"      # u/v hit 0, inf or NaN; last iterate
SINKHORN_STOP = 1e-9                                     # marginal-violation tolerance


class EMDError(RuntimeError):
    """The optimal-transport solver did not converge."""


def wasserstein(p: NDArray, q: NDArray, metric: str = "cosine", solver: str = "emd",
                num_itermax: int = 1_000_000, reg: float = 0.1) -> float:
    """Optimal-transport cost between the uniform empirical measures of ``p`` and ``q``.

    Parameters
    ----------
    p, q : (n, d), (m, d) arrays
    metric : {"cosine", "euclidean", "sqeuclidean"}
        Ground cost passed to ``ot.dist``.
    solver : {"emd", "sinkhorn"}
    num_itermax : int
        Iteration limit of the solver (POT's default of 1e5 is too low above ~1 500 points).
    reg : float
        Sinkhorn regularisation, relative to ``max(M)``.

    Raises
    ------
    EMDError
        If the solver reports non-convergence.
    """
    import ot

    p, q = np.asarray(p, dtype=np.float64), np.asarray(q, dtype=np.float64)
    if len(p) == 0 or len(q) == 0:
        raise ValueError("empty point cloud")
    a, b = np.full(len(p), 1.0 / len(p)), np.full(len(q), 1.0 / len(q))
    m = ot.dist(p, q, metric=metric)
    if metric == "cosine":
        m = np.nan_to_num(m, nan=1.0)          # all-zero embeddings (dead ReLUs): distance 1
    if solver == "emd":
        cost, log = ot.emd2(a, b, m, numItermax=int(num_itermax), log=True)
        if log.get("warning") is not None or int(log.get("result_code", 1)) != 1:
            raise EMDError(f"exact EMD did not converge ({log.get('warning')}); "
                           f"raise emdcfl.num-itermax (now {num_itermax}) or lower "
                           f"emdcfl.max-samples")
        return float(cost)
    if solver == "sinkhorn":
        scale = float(m.max()) or 1.0
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            plan = ot.sinkhorn(a, b, m / scale, reg, numItermax=int(num_itermax),
                               stopThr=SINKHORN_STOP)
        for w in caught:
            text = str(w.message)
            if text.startswith(SINKHORN_NOT_CONVERGED):
                raise EMDError(f"Sinkhorn did not converge in {num_itermax} iterations "
                               f"(reg {reg}); raise emdcfl.num-itermax or "
                               f"emdcfl.sinkhorn-reg")
            if SINKHORN_NUMERICAL in text:
                raise EMDError(f"Sinkhorn stopped on numerical errors ({text.strip()}): "
                               f"exp(-M/reg) underflows at reg {reg}; raise "
                               f"emdcfl.sinkhorn-reg or use emdcfl.solver=\"emd\"")
        for w in caught:                # anything else is not a convergence failure: pass on
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
        return float((plan * m).sum())
    raise ValueError(f"unknown solver {solver!r}")


def _solve_chunk(args: tuple) -> list[float]:
    pairs, metric, solver, num_itermax, reg = args
    return [wasserstein(p, q, metric, solver, num_itermax, reg) for p, q in pairs]


def pairwise_wasserstein(pairs: Sequence[tuple[NDArray, NDArray]], metric: str = "cosine",
                         solver: str = "emd", num_itermax: int = 1_000_000, reg: float = 0.1,
                         workers: int = 2) -> NDArray[np.float64]:
    """``W`` for each ``(p, q)`` in ``pairs``, in parallel over ``workers`` processes.

    ``workers <= 1`` solves in this process. Results are in the order of ``pairs``.
    """
    pairs = list(pairs)
    if not pairs:
        return np.zeros(0)
    workers = max(1, min(int(workers), os.cpu_count() or 1, len(pairs)))
    if workers == 1:
        return np.array(_solve_chunk((pairs, metric, solver, num_itermax, reg)))
    n_chunks = workers * 4
    bounds = np.linspace(0, len(pairs), n_chunks + 1).astype(int)
    chunks = [(pairs[lo:hi], metric, solver, num_itermax, reg)
              for lo, hi in zip(bounds[:-1], bounds[1:]) if hi > lo]
    from joblib import Parallel, delayed

    results = Parallel(n_jobs=workers, backend="loky")(delayed(_solve_chunk)(c) for c in chunks)
    return np.array([v for chunk in results for v in chunk])
