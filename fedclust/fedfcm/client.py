"""FedFCM's client steps, without Flower: what a node computes from its own (scaled) rows for
the local round and for FedFuzzDB. The ClientApp handlers (:mod:`client_apps.fcm_handlers`)
and the in-memory clients (:mod:`fedclust.fedfcm.inmemory`) both call these, so both paths
compute the same numbers."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
from numpy.typing import NDArray

from fedclust import fcm
from fedclust.fcm.client import eval_table
from fedclust.fcm.validity import DBStatistics, db_statistics, fuzzy_db
from fedclust.fedfcm import local_step
from fedclust.fedfcm.keys import FedFCMSettings

Float = NDArray[np.float64]


def local_centers(x: Float, centers: Iterable[tuple[str, Float]], s: FedFCMSettings
                  ) -> tuple[dict[str, tuple[Float, Float | None]], int]:
    """Paper 003 step 3 for every K of ``centers`` (name -> global centers): local FCM to
    convergence from the global centers. Returns name -> (local centers, supports
    ``Σ_j u_kj`` for federated averaging, else None) and the most local iterations."""
    out, iters = {}, []
    for name, global_centers in centers:
        local, support, n_iter = local_step(x, global_centers, s.m, s.local_tol,
                                            s.local_max_iter)
        out[name] = (local, support if s.averaging == "fedavg" else None)
        iters.append(n_iter)
    return out, max(iters, default=0)


def index_stats(x: Float, centers: Iterable[tuple[str, Float]], s: FedFCMSettings,
                y: NDArray | None = None
                ) -> tuple[dict[str, DBStatistics], dict[str, float], dict[str, NDArray]]:
    """FedFuzzDB for every K of ``centers`` (name -> final centers): the sums
    ``(N, Σ‖x − c_i‖^q, Σ u_i)``, the client's own index (when ``s.local_index``; NaN beyond
    ``local-k-max``) and, with labels ``y`` on the evaluation path, the label × cluster tables."""
    stats, local, tables = {}, {}, {}
    for name, c in centers:
        k = c.shape[0]
        stats[name] = db_statistics(x, c, s.m, s.q)
        if s.local_index:
            local[name] = local_index(x, k, s) if k <= s.local_k else float("nan")
        if s.evaluate and y is not None:
            tables[name] = eval_table(y, x, c)
    return stats, local, tables


def local_index(x: Float, k: int, s: FedFCMSettings) -> float:
    """Non-federated fuzzy DB of this client's own FCM with K clusters (NaN if too few points).

    Local FCM from k-means++ seeding until ``‖U(t+1) − U(t)‖_F ≤ fedfcm.local-tol`` (paper 003
    §2.1.2, the same stopping rule as the federated local step).
    """
    if x.shape[0] <= k:
        return float("nan")
    seed = s.seed + 7919 * k
    centers, _, _ = fcm.fcm_until_stable(
        x, fcm.kmeans_plusplus_centers(x, k, seed), s.m, s.local_tol,
        s.local_max_iter * s.max_rounds)
    return fuzzy_db(x, centers, s.m, s.p, s.q)
