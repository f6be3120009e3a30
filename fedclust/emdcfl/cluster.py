"""From pairwise distances to clusters, and cluster-wise FedAvg (paper 001, §3, Alg. 1).

- Edge rule (additive, as in the authors' code): client ``c`` accepts ``o`` when
  ``W(train_c, val_o) − W(train_c, val_c) < ε``; the adjacency is the AND of both directions
  (each client can refuse unilaterally) and the diagonal is True (a self-loop).
- Clusters: clients with **identical closed neighbourhoods** share a cluster, numbered in order
  of first appearance (the authors' ``cluster_neighborhoods``; not connected components).
- Aggregation: FedAvg inside each cluster weighted by training-set sizes.
- Partial participation: clients that have not taken part yet stay singletons.
- Reclustering: a cluster whose member set did not change keeps its model; a new or changed
  cluster starts from the FedAvg of its members' latest local models.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from numpy.typing import NDArray


def threshold_adjacency(excess: NDArray, epsilon: float) -> NDArray[np.bool_]:
    """Symmetric adjacency from ``excess[c, o] = W(train_c, val_o) − W(train_c, val_c)``.

    ``A[c, o] = (excess[c, o] < ε) AND (excess[o, c] < ε)``; ``A[c, c] = True``.
    NaN entries (pairs not measured) are no edge.
    """
    if epsilon < 0:
        raise ValueError(f"epsilon must be >= 0, got {epsilon}")
    e = np.asarray(excess, dtype=np.float64)
    directed = np.where(np.isnan(e), False, e < epsilon)
    adj = directed & directed.T
    np.fill_diagonal(adj, True)
    return adj


def neighbourhood_clusters(adjacency: NDArray) -> NDArray[np.int64]:
    """Cluster id per client: equal closed neighbourhoods ⇒ equal id (first appearance order)."""
    adj = np.asarray(adjacency, dtype=bool)
    adj = adj | np.eye(len(adj), dtype=bool)
    ids: dict[bytes, int] = {}
    labels = np.empty(len(adj), dtype=np.int64)
    for i, row in enumerate(adj):
        labels[i] = ids.setdefault(np.packbits(row).tobytes(), len(ids))
    return labels


def weighted_average(weights: Sequence[Sequence[NDArray]], counts: Sequence[float]
                     ) -> list[NDArray]:
    """FedAvg: ``Σ n_i w_i / Σ n_i`` layer by layer."""
    n = np.asarray(counts, dtype=np.float64)
    if len(weights) == 0 or n.sum() <= 0:
        raise ValueError("nothing to average")
    coef = n / n.sum()
    return [np.tensordot(coef, np.stack([w[j] for w in weights]), axes=1).astype(np.float32)
            for j in range(len(weights[0]))]


def cluster_fedavg(labels: Mapping[int, int], models: Mapping[int, Sequence[NDArray]],
                   counts: Mapping[int, float]) -> dict[int, list[NDArray]]:
    """One model per cluster id from the members' models (clients without a model skipped)."""
    out: dict[int, list[NDArray]] = {}
    for k in sorted(set(labels.values())):
        members = [c for c, lab in labels.items() if lab == k and c in models]
        if members:
            out[k] = weighted_average([models[c] for c in members], [counts[c] for c in members])
    return out


class Participation:
    """Partial-participation bookkeeping (the authors' ``fit_emdcfl_partial``).

    Each round ``per_round`` clients are sampled without replacement; clustering is recomputed
    among all clients that have taken part so far; the others stay singletons.
    """

    def __init__(self, clients: Sequence[int], per_round: int, seed: int) -> None:
        self.clients = list(clients)
        if not 1 <= per_round <= len(self.clients):
            raise ValueError(f"clients per round must be in [1, {len(self.clients)}], "
                             f"got {per_round}")
        self.per_round = per_round
        self.rng = np.random.default_rng(seed)
        self.seen: list[int] = []

    def sample(self) -> tuple[list[int], bool]:
        """This round's clients and whether the participated set grew."""
        # choose positions, not ids: Flower node ids can exceed int64 (numpy would round them)
        pos = self.rng.choice(len(self.clients), self.per_round, replace=False)
        picked = sorted(self.clients[int(i)] for i in pos)
        new = [c for c in picked if c not in self.seen]
        self.seen = sorted(set(self.seen) | set(picked))
        return picked, bool(new)

    def labels(self, clustered: Mapping[int, int]) -> dict[int, int]:
        """Cluster id for every client: ``clustered`` ids for the seen, fresh singletons after."""
        out = dict(clustered)
        nxt = max(out.values(), default=-1) + 1
        for c in self.clients:
            if c not in out:
                out[c], nxt = nxt, nxt + 1
        return out


def members_of(labels: Mapping[int, int]) -> dict[int, frozenset[int]]:
    """Cluster id → its member set."""
    out: dict[int, set[int]] = {}
    for c, k in labels.items():
        out.setdefault(k, set()).add(c)
    return {k: frozenset(v) for k, v in out.items()}


def recluster_models(old_labels: Mapping[int, int], old_models: Mapping[int, Sequence[NDArray]],
                     new_labels: Mapping[int, int], latest: Mapping[int, Sequence[NDArray]],
                     counts: Mapping[int, float], default: Sequence[NDArray]
                     ) -> tuple[dict[int, list[NDArray]], int]:
    """Cluster models after a new clustering, and how many were kept.

    A new cluster with exactly the members of an old one keeps that cluster's model
    (``old_models``, already updated with this round's training); any other cluster gets the
    FedAvg of its members' ``latest`` local models (possibly from earlier rounds), or
    ``default`` when none of its members has trained yet.
    """
    old_sets = {members: k for k, members in members_of(old_labels).items()}
    out: dict[int, list[NDArray]] = {}
    kept = 0
    for k, members in members_of(new_labels).items():
        if members in old_sets and old_sets[members] in old_models:
            out[k] = list(old_models[old_sets[members]])
            kept += 1
            continue
        trained = sorted(c for c in members if c in latest)
        out[k] = (weighted_average([latest[c] for c in trained], [counts[c] for c in trained])
                  if trained else list(default))
    return out, kept
