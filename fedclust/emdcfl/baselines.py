"""Clustered-FL baselines' decision rules and server steps (the message loops are in
``strategies/emdcfl_baselines``).

- **CFL** (Sattler et al. 2020, as in the EMD-CFL authors' trainer): a cluster splits when the
  norm of its mean update is below ``EPS_1`` (near a stationary point of the joint objective),
  the largest client update norm is above ``EPS_2`` (some clients are far from stationary),
  the cluster has more than 2 members and the round is > 0. The split is complete-linkage
  agglomerative clustering into 2 groups on ``−cosine similarity`` of the client updates.
- **IFCA** (Ghosh et al. 2020): each client takes the cluster model with the lowest loss on
  its data (here: its validation set, as the authors' trainer does); the server averages each
  cluster's models weighted by train size (the authors' trainer; Ghosh et al. average
  unweighted).

The server steps (:func:`ifca_models`, :func:`cfl_step`) are plain functions the strategy
calls, so the rules are tested without Flower.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from fedclust.emdcfl.cluster import cluster_fedavg


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


def ifca_models(models: Mapping[int, Sequence[NDArray]], choice: Mapping[int, int],
                trained: Mapping[int, Sequence[NDArray]], counts: Mapping[int, float]
                ) -> dict[int, list[NDArray]]:
    """IFCA's server step: cluster ``j``'s model becomes the FedAvg (weighted by train size,
    as the EMD-CFL authors' trainer) of the clients that chose ``j`` and trained it; a cluster
    nobody chose keeps its model."""
    out = {j: list(w) for j, w in models.items()}
    out.update(cluster_fedavg({n: choice[n] for n in trained}, trained, counts))
    return out


@dataclass
class CFLState:
    """CFL's clusters (member lists) and one model per cluster."""

    clusters: list[list[int]]
    models: list[list[NDArray]]


def cfl_step(state: CFLState, trained: Mapping[int, Sequence[NDArray]],
             counts: Mapping[int, float], eps1: float, eps2: float, round_idx: int
             ) -> tuple[CFLState, list[dict[str, float]]]:
    """One CFL server round: per cluster, FedAvg of its members' models, or a split in two
    (:func:`cfl_should_split`, :func:`cfl_bipartition` on the updates against the cluster's
    model) with each half's FedAvg. Members that did not train stay in the first half (or the
    unsplit cluster). Returns the next state and the logged norms."""
    clusters, models, norms = [], [], []
    for i, members in enumerate(state.clusters):
        got = [n for n in members if n in trained]
        if not got:
            clusters.append(list(members))
            models.append(list(state.models[i]))
            continue
        base = flatten(state.models[i])
        updates = np.stack([flatten(trained[n]) - base for n in got])
        mean_norm, max_norm = update_norms(updates)
        norms.append({"cluster": i, "mean_norm": mean_norm, "max_norm": max_norm})
        if cfl_should_split(updates, eps1, eps2, round_idx):
            halves = cfl_bipartition(updates)
            missing = [n for n in members if n not in trained]
            for h in (0, 1):
                part = [n for n, lab in zip(got, halves) if lab == h]
                clusters.append(part + (missing if h == 0 else []))
                models.append(cluster_fedavg({n: 0 for n in part}, trained, counts)[0])
        else:
            clusters.append(list(members))
            models.append(cluster_fedavg({n: 0 for n in got}, trained, counts)[0])
    return CFLState(clusters, models), norms
