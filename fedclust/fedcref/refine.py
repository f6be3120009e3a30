"""Local cluster refinement (paper 000 Algorithm 2) and client stability (§4.5, eq. 4)."""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray
from scipy.optimize import linear_sum_assignment


def cluster_refine(errors: NDArray, k: int) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """Algorithm 2: greedy re-clustering of one client's samples with candidate models.

    For p = 1..K_i: every unassigned sample votes for its best remaining model
    (``argmin_j e_{k,M_j}``, line 7); the model with most votes, M_max, takes exactly those
    samples as cluster H_p (line 9) and leaves the candidate set (line 11). Samples still
    unassigned after K_i picks go to their best model among the selected ones (line 15). If the
    samples run out first, fewer than K_i clusters are formed.

    Parameters
    ----------
    errors : (M, n) reconstruction errors of the M candidate models (the client's own models
        and all community models) on its n samples; rows of NaN are ignored.
    k : K_i

    Returns
    -------
    labels : (n,) cluster index p (0-based, in order of selection)
    selected : (P,) row of ``errors`` chosen for each cluster, P ≤ K_i
    """
    e = np.where(np.isfinite(errors), errors, np.inf)
    m_count, n = e.shape
    labels = np.full(n, -1, dtype=np.int64)
    candidates = np.ones(m_count, dtype=bool) & np.isfinite(e).any(axis=1)
    selected: list[int] = []
    remaining = np.arange(n)
    for p in range(int(k)):
        if remaining.size == 0 or not candidates.any():
            break
        cand = np.flatnonzero(candidates)
        best = cand[np.argmin(e[np.ix_(cand, remaining)], axis=0)]
        votes = np.bincount(best, minlength=m_count)
        m_max = int(np.argmax(votes))
        take = remaining[best == m_max]
        labels[take] = p
        selected.append(m_max)
        candidates[m_max] = False
        remaining = remaining[best != m_max]
    sel = np.asarray(selected, dtype=np.int64)
    if remaining.size and sel.size:
        labels[remaining] = np.argmin(e[np.ix_(sel, remaining)], axis=0)
    return labels, sel


def label_agreement(a: NDArray, b: NDArray) -> float:
    """ACC(a, b) of eq. (4): the share of samples matched under the best one-to-one relabelling
    (Hungarian algorithm, scipy), for two labelings of the same samples."""
    a, b = np.asarray(a), np.asarray(b)
    if a.size == 0:
        return 1.0
    _, ai = np.unique(a, return_inverse=True)
    _, bi = np.unique(b, return_inverse=True)
    table = np.zeros((ai.max() + 1, bi.max() + 1), dtype=np.int64)
    np.add.at(table, (ai, bi), 1)
    return table_accuracy(table)


def table_accuracy(table: NDArray) -> float:
    """Hungarian accuracy of a contingency table (rows: true classes, columns: clusters)."""
    table = np.asarray(table)
    total = table.sum()
    if total == 0:
        return float("nan")
    rows, cols = linear_sum_assignment(-table)
    return float(table[rows, cols].sum() / total)
