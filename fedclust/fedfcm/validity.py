r"""Fuzzy Davies–Bouldin index: centralized, federated (FedFuzzDB), and the choice of K.

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


def elbow(ks: Sequence[int], values: Sequence[float]) -> int:
    """Elbow of a curve by the maximum distance to the chord (Kneedle-style).

    Both axes are scaled to [0, 1]; the point farthest from the straight line joining the first
    and last points is the elbow. With fewer than 3 points the first K is returned.
    """
    ks_arr, v = np.asarray(ks, dtype=float), np.asarray(values, dtype=float)
    finite = np.isfinite(v)
    if not finite.any():
        return int(ks_arr[0])
    v = np.where(finite, v, v[finite].max())
    if ks_arr.size < 3:
        return int(ks_arr[int(np.argmin(v))])
    xs = (ks_arr - ks_arr[0]) / (ks_arr[-1] - ks_arr[0])
    span = v.max() - v.min()
    ys = (v - v.min()) / span if span > 0 else np.zeros_like(v)
    a = np.array([xs[-1] - xs[0], ys[-1] - ys[0]])
    dist = np.abs(a[0] * (ys - ys[0]) - a[1] * (xs - xs[0])) / np.linalg.norm(a)
    return int(ks_arr[int(np.argmax(dist))])


@dataclass
class KChoice:
    ks: list[int]
    index: list[float]
    best_k: int
    elbow_k: int

    def as_dict(self, prefix: str = "") -> dict[str, object]:
        return {f"{prefix}ks": self.ks, f"{prefix}index": self.index,
                f"{prefix}best_k": self.best_k, f"{prefix}elbow_k": self.elbow_k}


def choose_k(ks: Sequence[int], index: Sequence[float]) -> KChoice:
    """The argmin of the index over K (ties: the smaller K) and the elbow."""
    vals = np.asarray(index, dtype=float)
    best = int(list(ks)[int(np.nanargmin(np.where(np.isfinite(vals), vals, np.nan)))])
    return KChoice(list(map(int, ks)), [float(v) for v in vals], best, elbow(ks, vals))
