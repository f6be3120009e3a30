"""The choice of K by FedFCM (paper 003): the argmin of the federated fuzzy
Davies–Bouldin index over K, with the elbow of the curve beside it. The index itself
(centralized and federated, eqs. 7–13 and 15–17) is :mod:`fedclust.fcm.validity`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


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
