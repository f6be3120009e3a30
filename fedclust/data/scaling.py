"""Federated feature scaling: clients send count, min, max, mean and centred sum of squares;
the server combines them exactly (Chan et al.'s pairwise update) — no row leaves a client.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

Float = NDArray[np.float64]


@dataclass(frozen=True)
class ColumnStats:
    n: int
    min: Float
    max: Float
    mean: Float
    m2: Float          # Σ (x − mean)²

    def as_array(self) -> Float:
        """Pack as a (5, F) array for a message: n, min, max, mean, m2."""
        f = self.min.size
        return np.vstack([np.full(f, float(self.n)), self.min, self.max, self.mean, self.m2])

    @staticmethod
    def from_array(arr: Float) -> ColumnStats:
        arr = np.asarray(arr, dtype=np.float64)
        return ColumnStats(int(arr[0, 0]), arr[1], arr[2], arr[3], arr[4])


def column_stats(x: Float) -> ColumnStats:
    """A client's local statistics."""
    x = np.asarray(x, dtype=np.float64)
    if x.shape[0] == 0:
        f = x.shape[1]
        return ColumnStats(0, np.full(f, np.inf), np.full(f, -np.inf), np.zeros(f), np.zeros(f))
    mean = x.mean(axis=0)
    return ColumnStats(x.shape[0], x.min(0), x.max(0), mean, ((x - mean) ** 2).sum(0))


def combine(stats: Sequence[ColumnStats]) -> ColumnStats:
    """Merge clients' statistics into the statistics of the pooled data."""
    total = stats[0]
    for s in stats[1:]:
        n = total.n + s.n
        if n == 0:
            continue
        delta = s.mean - total.mean
        mean = total.mean + delta * (s.n / n)
        m2 = total.m2 + s.m2 + delta**2 * (total.n * s.n / n)
        total = ColumnStats(n, np.minimum(total.min, s.min), np.maximum(total.max, s.max), mean,
                            m2)
    return total


def scaler(stats: ColumnStats, kind: str) -> tuple[Float, Float]:
    """``(shift, scale)`` so that ``(x − shift) / scale`` is MinMax- or standard-scaled.

    Constant columns get scale 1 (as scikit-learn does).
    """
    f = stats.min.size
    if kind == "none":
        return np.zeros(f), np.ones(f)
    if kind == "minmax":
        shift, scale = stats.min, stats.max - stats.min
    elif kind == "standard":
        shift, scale = stats.mean, np.sqrt(stats.m2 / max(stats.n, 1))
    else:
        raise ValueError(f"scaling must be 'none', 'minmax' or 'standard', got {kind!r}")
    scale = np.where(scale > 0, scale, 1.0)
    return shift.copy(), scale


def apply(x: Float, shift: Float, scale: Float) -> Float:
    return (np.asarray(x, dtype=np.float64) - shift) / scale
