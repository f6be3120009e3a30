"""Clustered-FL baselines' decision rules (the server loops are in ``strategies/emdcfl_baselines``).

- **CFL** (Sattler et al. 2020, as in the EMD-CFL authors' trainer): a cluster splits when the
  norm of its mean update is below ``EPS_1`` (near a stationary point of the joint objective),
  the largest client update norm is above ``EPS_2`` (some clients are far from stationary),
  the cluster has more than 2 members and the round is > 0. The split is complete-linkage
  agglomerative clustering into 2 groups on ``−cosine similarity`` of the client updates.
- **IFCA** (Ghosh et al. 2020): each client takes the cluster model with the lowest loss on
  its data (here: its validation set, as the authors' trainer does).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray


def flatten(weights: Sequence[NDArray]) -> NDArray[np.float64]:
    return np.concatenate([np.asarray(w, dtype=np.float64).ravel() for w in weights])


def cosine_similarity(updates: NDArray) -> NDArray[np.float64]:
    u = np.asarray(updates, dtype=np.float64)
    u = u / np.maximum(np.linalg.norm(u, axis=1, keepdims=True), 1e-12)
    return u @ u.T


def cfl_should_split(updates: NDArray, eps1: float, eps2: float, round_idx: int) -> bool:
    """Sattler's criterion: ``‖mean Δ‖ < EPS_1`` and ``max ‖Δ_i‖ > EPS_2`` (size > 2, round > 0)."""
    u = np.asarray(updates, dtype=np.float64)
    if len(u) <= 2 or round_idx <= 0:
        return False
    mean_norm = float(np.linalg.norm(u.mean(axis=0)))
    max_norm = float(np.linalg.norm(u, axis=1).max())
    return mean_norm < eps1 and max_norm > eps2


def cfl_bipartition(updates: NDArray) -> NDArray[np.int64]:
    """Two groups by complete-linkage clustering on ``−cos(Δ_i, Δ_j)``."""
    from sklearn.cluster import AgglomerativeClustering

    sim = cosine_similarity(updates)
    model = AgglomerativeClustering(n_clusters=2, metric="precomputed", linkage="complete")
    return model.fit_predict(-sim).astype(np.int64)


def update_norms(updates: NDArray) -> tuple[float, float]:
    """(‖mean update‖, max ‖update‖), logged per cluster and round."""
    u = np.asarray(updates, dtype=np.float64)
    return float(np.linalg.norm(u.mean(axis=0))), float(np.linalg.norm(u, axis=1).max())


def ifca_assign(losses: NDArray) -> NDArray[np.int64]:
    """Cluster choice per client: ``argmin_k loss[i, k]`` (ties → lowest k)."""
    return np.asarray(losses).argmin(axis=1).astype(np.int64)
