"""Evaluation metrics (ground truth is used only on the evaluation path).

ARI is computed from a contingency table, so a federated evaluation can add up per-client
tables (true label × predicted cluster) without any client revealing its labels row by row.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.typing import ArrayLike, NDArray

# scipy is imported where it is used: this module is on every ClientApp message's import path
# (evaluation tables), and scipy.stats alone costs ~0.8 s per deployment message.


def contingency(y_true: ArrayLike, y_pred: ArrayLike, n_true: int, n_pred: int
                ) -> NDArray[np.int64]:
    """Counts ``C[i, j]`` of points with true label ``i`` and predicted cluster ``j``."""
    yt, yp = np.asarray(y_true, dtype=np.int64), np.asarray(y_pred, dtype=np.int64)
    table = np.zeros((n_true, n_pred), dtype=np.int64)
    np.add.at(table, (yt, yp), 1)
    return table


def _pairs(counts: ArrayLike) -> NDArray[np.float64]:
    """``counts`` choose 2 (float), as ``scipy.special.comb(counts, 2)``."""
    v = np.asarray(counts, dtype=np.float64)
    return v * (v - 1) / 2.0


def ari_from_contingency(table: ArrayLike) -> float:
    """Adjusted Rand index (Hubert & Arabie) from a contingency table."""
    t = np.asarray(table, dtype=np.float64)
    n = t.sum()
    sum_comb = _pairs(t).sum()
    a, b = _pairs(t.sum(axis=1)).sum(), _pairs(t.sum(axis=0)).sum()
    total = _pairs(n)
    expected = a * b / total if total > 0 else 0.0
    max_index = (a + b) / 2
    if max_index == expected:
        return 1.0
    return float((sum_comb - expected) / (max_index - expected))


def adjusted_rand(y_true: ArrayLike, y_pred: ArrayLike) -> float:
    yt, yp = np.unique(y_true, return_inverse=True)[1], np.unique(y_pred, return_inverse=True)[1]
    return ari_from_contingency(contingency(yt, yp, yt.max() + 1, yp.max() + 1))


def hungarian_accuracy(y_true: ArrayLike, y_pred: ArrayLike) -> float:
    """Clustering accuracy: the best one-to-one matching of clusters to labels (Hungarian)."""
    yt, yp = np.unique(y_true, return_inverse=True)[1], np.unique(y_pred, return_inverse=True)[1]
    if yt.size == 0:
        return float("nan")
    table = contingency(yt, yp, yt.max() + 1, yp.max() + 1)
    from scipy.optimize import linear_sum_assignment

    rows, cols = linear_sum_assignment(-table)
    return float(table[rows, cols].sum() / yt.size)


def matched_center_distance(a: ArrayLike, b: ArrayLike) -> float:
    """min over permutations π of ‖A − B_π‖_F (paper 004 Fig. 1b), via linear assignment."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    cost = ((a[:, None, :] - b[None, :, :]) ** 2).sum(-1)
    from scipy.optimize import linear_sum_assignment

    rows, cols = linear_sum_assignment(cost)
    return float(np.sqrt(cost[rows, cols].sum()))


def mean_ci(values: Sequence[float], confidence: float = 0.95) -> tuple[float, float]:
    """Mean and half-width of the Student-t confidence interval (0 for a single value)."""
    v = np.asarray([x for x in values if x is not None and np.isfinite(x)], dtype=np.float64)
    if v.size == 0:
        return float("nan"), float("nan")
    if v.size == 1:
        return float(v[0]), 0.0
    from scipy import stats

    half = stats.t.ppf(0.5 + confidence / 2, v.size - 1) * v.std(ddof=1) / np.sqrt(v.size)
    return float(v.mean()), float(half)


def format_ci(values: Sequence[float], nd: int = 3, scale: float = 1.0) -> str:
    """``mean ± half-width`` of :func:`mean_ci` (values times ``scale``); one value alone."""
    mean, half = mean_ci([v * scale for v in values])
    return f"{mean:.{nd}f}" if len(values) < 2 else f"{mean:.{nd}f} ± {half:.{nd}f}"
