"""Wasserstein (Earth Mover's) distances between projected embedding clouds (paper 001, §3).

``W(P, Q)`` is the optimal-transport cost between the empirical measures of two point clouds
with uniform weights ``a = 1/n``, ``b = 1/m`` and ground cost ``M = ot.dist(P, Q, metric)``
(the authors use ``metric="cosine"``). The exact network-simplex solver (``ot.emd2``) is the
default; when the two clouds have the same size the uniform problem is an assignment problem
(an optimal plan is a permutation, Birkhoff–von Neumann), solved exactly by
``scipy.optimize.linear_sum_assignment`` on the same cost matrix (equal to ``ot.emd2`` to
1e-10, tested; 2-3x faster). A non-converged network-simplex solve (iteration limit hit,
infeasible or unbounded) raises :class:`EMDError` instead of the silent warning POT gives.
Sinkhorn (entropic, ``reg`` relative to ``max(M)``) is an option (paper App. E.2); its two
failures, POT's "did not converge" (``numItermax`` reached) and "numerical errors"
(underflow) warnings, raise :class:`EMDError` too, while any other warning is passed on
unchanged.

Unbiased comparisons: the empirical ``W`` between two samples of *one* distribution shrinks
with the sample sizes, so EMD-CFL compares only equal-size clouds (:func:`equal_size`
subsamples the larger one, seeded by the run seed and the clouds' bytes).

The pairwise solves run in parallel worker processes (joblib/loky) that read every cloud from
one memory-mapped file written once, instead of receiving pickled copies of the clouds.
"""

from __future__ import annotations

import os
import tempfile
import warnings
import zlib
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from fedclust.errors import FedclustError

# POT 0.9 (ot/bregman/_sinkhorn.py, sinkhorn_knopp) reports both failures only as UserWarnings
SINKHORN_NOT_CONVERGED = "Sinkhorn did not converge"     # numItermax reached
SINKHORN_NUMERICAL = "numerical errors at iteration"      # u/v hit 0, inf or NaN; last iterate
SINKHORN_STOP = 1e-9                                     # marginal-violation tolerance
BOUND = "bound"         # pairwise_wasserstein's solver that returns dual_lower_bound, no W


class EMDError(FedclustError, RuntimeError):
    """The optimal-transport solver did not converge."""


def dual_lower_bound(m: NDArray) -> float:
    r"""A lower bound of the exact OT cost with uniform weights and ground cost ``m`` (n × k).

    Any potentials with :math:`f_i + g_j \le M_{ij}` bound the cost from below (LP duality):
    :math:`W \ge \tfrac1n\sum_i f_i + \tfrac1k\sum_j g_j`. Two feasible pairs are built in
    :math:`O(nk)`: :math:`f_i = \min_j M_{ij}`, :math:`g_j = \min_i (M_{ij} - f_i)`, and the
    same with rows and columns exchanged; the larger value is returned. A pair whose bound
    already exceeds the decision threshold needs no solve (``bench/bench_emdcfl_matrix.py``).
    """
    f = m.min(axis=1)
    g = (m - f[:, None]).min(axis=0)
    by_rows = f.mean() + g.mean()
    g = m.min(axis=0)
    f = (m - g[None, :]).min(axis=1)
    return float(max(by_rows, f.mean() + g.mean()))


def cost_matrix(p: NDArray, q: NDArray, metric: str = "cosine") -> NDArray[np.float64]:
    """The ground-cost matrix of two non-empty clouds as the solvers use it
    (:func:`ground_cost` in float64, >= 0, cosine NaN → 1)."""
    p, q = np.asarray(p, dtype=np.float64), np.asarray(q, dtype=np.float64)
    if len(p) == 0 or len(q) == 0:
        raise ValueError("empty point cloud")
    m = ground_cost(p, q, metric)
    if metric == "cosine":
        m = np.nan_to_num(m, nan=1.0)          # all-zero embeddings (dead ReLUs): distance 1
    # every ground cost is >= 0; 1 - cos and the expanded squared norms round to -1e-16 on
    # (nearly) parallel points, and a negative W is refused as a reply
    np.maximum(m, 0.0, out=m)
    return m


def wasserstein(p: NDArray, q: NDArray, metric: str = "cosine", solver: str = "emd",
                num_itermax: int = 1_000_000, reg: float = 0.1,
                at_least: float | None = None) -> float:
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
    at_least : float, optional
        Exact solver only: the caller only needs to know whether ``W >= at_least``. When the
        :func:`dual_lower_bound` already reaches it, NaN is returned without solving.

    Raises
    ------
    EMDError
        If the solver reports non-convergence.
    """
    m = cost_matrix(p, q, metric)
    a, b = np.full(len(p), 1.0 / len(p)), np.full(len(q), 1.0 / len(q))
    if solver == "emd" and at_least is not None and dual_lower_bound(m) >= at_least:
        return float("nan")
    if solver == "emd" and len(p) == len(q):
        from scipy.optimize import linear_sum_assignment

        rows, cols = linear_sum_assignment(m)
        return float(m[rows, cols].sum() / len(p))
    import ot  # the network simplex and Sinkhorn: POT

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


def ground_cost(p: NDArray, q: NDArray, metric: str) -> NDArray[np.float64]:
    """``ot.dist(p, q, metric)`` for the three metrics of ``emdcfl.metric``: POT's own
    formulas (the same numpy operations, so the same numbers), also where POT is not installed
    (an equal-size exact solve then needs only SciPy)."""
    if metric == "cosine":
        np1 = np.sqrt(np.einsum("ij,ij->i", p, p))
        np2 = np.sqrt(np.einsum("ij,ij->i", q, q))
        return 1.0 - (np.dot(p, q.T) / np1[:, None] / np2[None, :])
    if metric in ("euclidean", "sqeuclidean"):
        c = -2 * np.dot(p, q.T)
        c += np.einsum("ij,ij->i", p, p)[:, None]
        c += np.einsum("ij,ij->i", q, q)[None, :]
        c = np.maximum(c, 0)
        if metric == "euclidean":
            c = np.sqrt(c)
        if p is q:          # POT: a cloud against itself has an exact zero diagonal
            c = c * (1 - np.eye(len(p)))
        return c
    import ot

    return ot.dist(p, q, metric=metric)


def equal_size(p: NDArray, q: NDArray, seed: int = 0) -> tuple[NDArray, NDArray]:
    """``p`` and ``q`` with the larger one subsampled (without replacement) to the other's size.

    The generator is seeded by ``seed`` and CRC-32s of both clouds, so the same inputs always
    give the same subsample, whoever computes it and in whatever order.
    """
    if len(p) == len(q):
        return p, q
    rng = np.random.default_rng([int(seed) % 2**32, zlib.crc32(np.ascontiguousarray(p).data),
                                 zlib.crc32(np.ascontiguousarray(q).data)])
    small = min(len(p), len(q))
    if len(p) > small:
        return p[np.sort(rng.choice(len(p), small, replace=False))], q
    return p, q[np.sort(rng.choice(len(q), small, replace=False))]


# a job: (row offset, rows) of the first cloud and of the second one in the shared store, and
# the ``at_least`` of :func:`wasserstein` (NaN: none)
Job = tuple[int, int, int, int, float]
_STORES: dict[str, NDArray] = {}         # per worker process: path -> memory-mapped store


def _store(path: str) -> NDArray:
    if path not in _STORES:
        _STORES.clear()                  # one store per call: drop the previous call's file
        _STORES[path] = np.load(path, mmap_mode="r")
    return _STORES[path]


def _solve_jobs(store: NDArray | str, jobs: Sequence[Job], metric: str, solver: str,
                num_itermax: int, reg: float, seed: int | None) -> list[float]:
    cloud = _store(store) if isinstance(store, str) else store
    out = []
    for a, na, b, nb, limit in jobs:
        p, q = np.asarray(cloud[a:a + na]), np.asarray(cloud[b:b + nb])
        if seed is not None:
            p, q = equal_size(p, q, seed)
        if solver == BOUND:
            out.append(dual_lower_bound(cost_matrix(p, q, metric)))
            continue
        out.append(wasserstein(p, q, metric, solver, num_itermax, reg,
                               None if np.isnan(limit) else limit))
    return out


def pairwise_wasserstein(pairs: Sequence[tuple[NDArray, NDArray]], metric: str = "cosine",
                         solver: str = "emd", num_itermax: int = 1_000_000, reg: float = 0.1,
                         workers: int = 2, equalize_seed: int | None = None,
                         at_least: Sequence[float | None] | None = None
                         ) -> NDArray[np.float64]:
    """``W`` for each ``(p, q)`` in ``pairs``, in parallel over ``workers`` processes.

    ``workers <= 1`` solves in this process. Results are in the order of ``pairs``. With
    ``equalize_seed`` every pair is first cut to equal sizes (:func:`equal_size`). Each distinct
    cloud (by identity) is written once to a memory-mapped file that the workers read.
    ``at_least[i]`` (optional) is passed to :func:`wasserstein` for pair ``i``: NaN comes back
    where the lower bound alone shows ``W >= at_least[i]``. ``solver="bound"`` (:data:`BOUND`)
    returns each pair's :func:`dual_lower_bound` instead of its ``W`` (no solve).
    """
    pairs = [(np.asarray(p), np.asarray(q)) for p, q in pairs]
    if not pairs:
        return np.zeros(0)
    workers = max(1, min(int(workers), os.cpu_count() or 1, len(pairs)))
    offsets: dict[int, tuple[int, int]] = {}
    clouds: list[NDArray] = []
    rows = 0
    for p, q in pairs:
        for c in (p, q):
            if id(c) not in offsets:
                offsets[id(c)] = (rows, len(c))
                clouds.append(c)
                rows += len(c)
    limits = [np.nan if v is None else float(v) for v in (at_least or [None] * len(pairs))]
    jobs = [(*offsets[id(p)], *offsets[id(q)], lim)
            for (p, q), lim in zip(pairs, limits, strict=True)]
    width = {c.shape[1] if c.ndim == 2 else -1 for c in clouds}
    if len(width) != 1 or -1 in width:
        raise ValueError(f"clouds must be 2-D with one number of columns, got {sorted(width)}")
    store = np.concatenate(clouds).astype(np.result_type(*clouds), copy=False)
    if workers == 1:
        return np.array(_solve_jobs(store, jobs, metric, solver, num_itermax, reg,
                                    equalize_seed))
    bounds = np.linspace(0, len(jobs), workers * 4 + 1).astype(int)
    from joblib import Parallel, delayed

    with tempfile.TemporaryDirectory(prefix="fedclust-emd-") as tmp:
        path = str(Path(tmp) / "clouds.npy")
        np.save(path, store)
        del store
        results = Parallel(n_jobs=workers, backend="loky")(
            delayed(_solve_jobs)(path, jobs[lo:hi], metric, solver, num_itermax, reg,
                                 equalize_seed)
            for lo, hi in zip(bounds[:-1], bounds[1:]) if hi > lo)
    return np.array([v for chunk in results for v in chunk])
