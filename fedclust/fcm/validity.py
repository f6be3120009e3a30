r"""Fuzzy Davies–Bouldin index of an FCM partition: centralized and federated (FedFuzzDB).

Paper 003, eqs. 7–13 and 15–17, with Minkowski :math:`p` for center distances and :math:`q`
for spreads (the paper uses p = 2, q = 1):

.. math::
   S_i^f = U_i \Big(\frac{1}{N}\sum_{l=1}^{P}\sum_{j=1}^{N_l}\|x_j^{(l)}-c_i\|^q\Big)^{1/q},
   \qquad U_i = \frac{1}{N}\sum_{l=1}^{P}\sum_{j=1}^{N_l} u_{ij}^{(l)},
   \qquad N = \sum_l N_l,

.. math::
   M_{ij} = \|c_i - c_j\|_p,\quad R_{ij} = \frac{S_i + S_j}{M_{ij}},\quad
   \bar R = \frac{1}{K}\sum_i \max_{j\ne i} R_{ij}.

Each client sends only :math:`N_l`, the spread sums :math:`\sum_j \|x_j-c_i\|^q` and the
membership sums :math:`\sum_j u_{ij}` (:func:`db_statistics`); the server adds them up
(:func:`federated_fuzzy_db`), which equals the centralized index on the pooled data.
FedFCM (:mod:`fedclust.fedfcm.validity`) chooses K with it; the scikit-learn estimator
scores with it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from fedclust.fcm import Float, memberships


@dataclass(frozen=True)
class DBStatistics:
    """A client's sufficient statistics for FedFuzzDB."""

    n: int
    spread_sums: Float       # (K,)  Σ_j ‖x_j − c_i‖^q
    membership_sums: Float   # (K,)  Σ_j u_ij


def db_statistics(x: Float, centers: Float, m: float = 2.0, q: float = 1.0) -> DBStatistics:
    """Local sums for FedFuzzDB (eq. 16–17 numerators) w.r.t. the global ``centers``."""
    x = np.asarray(x, dtype=np.float64)
    centers = np.asarray(centers, dtype=np.float64)
    diff = np.sqrt(np.maximum(
        np.einsum("ij,ij->i", x, x)[:, None] - 2 * x @ centers.T
        + np.einsum("ij,ij->i", centers, centers)[None, :], 0.0))
    spread = (diff**q).sum(axis=0) if q != 1 else diff.sum(axis=0)
    return DBStatistics(int(x.shape[0]), spread, memberships(x, centers, m).sum(axis=0))


def _db_from_spreads(spreads: Float, centers: Float, p: float) -> float:
    k = centers.shape[0]
    if k < 2:
        raise ValueError("the Davies–Bouldin index needs at least 2 clusters")
    diff = np.abs(centers[:, None, :] - centers[None, :, :])
    dist = (diff**p).sum(-1) ** (1.0 / p)
    with np.errstate(divide="ignore", invalid="ignore"):
        r = (spreads[:, None] + spreads[None, :]) / dist
    np.fill_diagonal(r, -np.inf)
    r = np.where(np.isnan(r), np.inf, r)   # coinciding centers: worst possible separation
    return float(r.max(axis=1).mean())


def federated_fuzzy_db(stats: Sequence[DBStatistics], centers: Float, p: float = 2.0,
                       q: float = 1.0) -> float:
    """FedFuzzDB (eq. 15–17) from the clients' :class:`DBStatistics`."""
    n = sum(s.n for s in stats)
    if n == 0:
        raise ValueError("no data points reported")
    spread = np.sum([s.spread_sums for s in stats], axis=0) / n
    mass = np.sum([s.membership_sums for s in stats], axis=0) / n
    return _db_from_spreads(mass * spread ** (1.0 / q), np.asarray(centers, dtype=np.float64), p)


def fuzzy_db(x: Float, centers: Float, m: float = 2.0, p: float = 2.0, q: float = 1.0) -> float:
    """Centralized fuzzy Davies–Bouldin index (eq. 7–13) on data ``x``."""
    return federated_fuzzy_db([db_statistics(x, centers, m, q)], centers, p, q)
