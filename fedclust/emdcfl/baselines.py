"""Clustered-FL baselines of paper 001 on the same data, model, rounds and local epochs as
EMD-CFL: their decision rules, server steps and loops, written against
:class:`fedclust.emdcfl.clients.Clients` (no Flower). Every client trains every round
(``emdcfl.clients-per-round`` must be 0: checked in :func:`fedclust.emdcfl.keys.check`).

- ``oracle``: FedAvg inside the ground-truth groups (read on the evaluation path).
- ``fedavg``: one model for everyone.
- ``local``: every client trains alone.
- ``ifca``, ``cfl``: below.
- ``pacfl``: Vahidian et al.'s one-shot clustering by principal angles between the clients'
  class subspaces (:mod:`fedclust.emdcfl.pacfl`), then FedAvg per cluster.

- **CFL** (Sattler et al. 2020, as in the EMD-CFL authors' trainer): a cluster splits when the
  norm of its mean update is below ``EPS_1`` (near a stationary point of the joint objective),
  the largest client update norm is above ``EPS_2`` (some clients are far from stationary),
  the cluster has more than 2 members and the round is > 0. The split is complete-linkage
  agglomerative clustering into 2 groups on ``−cosine similarity`` of the client updates.
- **IFCA** (Ghosh et al. 2020): each client takes the cluster model with the lowest loss on
  its data (here: its validation set, as the authors' trainer does); the server averages each
  cluster's models weighted by train size (the authors' trainer; Ghosh et al. average
  unweighted).

The server steps (:func:`ifca_models`, :func:`cfl_step`) are plain functions, so the rules
are tested on their own. :func:`run_baseline` runs one baseline and returns every client's
final model and cluster; the final phase is :func:`fedclust.emdcfl.loop.run`'s, shared with
EMD-CFL.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from fedclust.emdcfl.clients import Clients, Traffic, Weights, singletons
from fedclust.emdcfl.cluster import cluster_fedavg
from fedclust.emdcfl.keys import EMDCFLSettings
from fedclust.results import Progress, Record

#: a baseline's result: every client's final model and its cluster
Outcome = tuple[dict[int, Weights], dict[int, int]]


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


# ------------------------------------------------------------------------------ the loops

def _init(s: EMDCFLSettings, seed: int) -> Weights:
    from fedclust.emdcfl.model import init_weights

    return init_weights(s.spec, seed)


def fixed(clients: Clients, s: EMDCFLSettings, record: Record, labels: dict[int, int],
          traffic: Traffic, progress: Progress, name: str) -> Outcome:
    """FedAvg inside fixed clusters ``labels`` for ``s.rounds`` rounds (oracle, fedavg, local
    and the second stage of PACFL), every cluster from the shared initial model."""
    nodes = clients.ids
    init = _init(s, s.seed)
    models = {k: init for k in set(labels.values())}
    for rnd in range(s.rounds):
        t = clients.train(rnd, {n: models[labels[n]] for n in nodes}, False)
        traffic.add(t, "training")
        models.update(cluster_fedavg({n: labels[n] for n in t.models}, t.models, t.counts))
        record.log_round({"round": rnd, "train_loss": float(np.mean(list(t.losses.values()))),
                          "train_s": t.seconds, "num_clusters": len(models),
                          "dropped_nodes": t.dropped("train: ")})
        progress.step(rnd + 1, name)
    return {n: models[labels[n]] for n in nodes}, labels


def oracle(clients: Clients, s: EMDCFLSettings, record: Record, traffic: Traffic,
           progress: Progress) -> Outcome:
    """FedAvg inside the ground-truth groups; a client that did not say is a singleton."""
    g = clients.groups()
    traffic.add(g, "clustering")
    truth = singletons(dict(g.truth), clients.ids)
    return fixed(clients, s, record, truth, traffic, progress, "oracle")


def ifca(clients: Clients, s: EMDCFLSettings, record: Record, traffic: Traffic,
         progress: Progress) -> Outcome:
    """IFCA: ``k`` cluster models from distinct initialisations; every round each client picks
    one and trains it, then :func:`ifca_models`. ``k`` is ``emdcfl.num-clusters``, or (0, on
    the evaluation path) the simulated dataset's group count, at least 2."""
    from fedclust.emdcfl.data import GROUND_TRUTH

    nodes = clients.ids
    k = s.num_clusters
    if k == 0:                  # evaluate=true only (keys.check): the simulated ground truth
        table = GROUND_TRUTH["backdoor" if s.dataset == "backdoor-mnist" else s.rotation]
        k = max(2, len(set(table)))
    models = {j: _init(s, s.seed + 7919 * j) for j in range(k)}
    choice: dict[int, int] = {n: 0 for n in nodes}
    for rnd in range(s.rounds):
        t = clients.ifca(rnd, [models[j] for j in range(k)])
        traffic.add(t, "training")
        choice.update(t.choices)
        models = ifca_models(models, choice, t.models, t.counts)
        record.log_round({"round": rnd, "k": k, "choices": [choice[n] for n in nodes],
                          "train_s": t.seconds, "dropped_nodes": t.dropped("train: ")})
        progress.step(rnd + 1, f"ifca k={k}")
    return {n: models[choice[n]] for n in nodes}, dict(choice)


def cfl(clients: Clients, s: EMDCFLSettings, record: Record, traffic: Traffic,
        progress: Progress) -> Outcome:
    """CFL from one cluster: every round FedAvg per cluster or a split (:func:`cfl_step`)."""
    nodes = clients.ids
    state = CFLState([list(nodes)], [_init(s, s.seed)])
    for rnd in range(s.rounds):
        owner = {n: i for i, members in enumerate(state.clusters) for n in members}
        t = clients.train(rnd, {n: state.models[owner[n]] for n in nodes}, False)
        traffic.add(t, "training")
        state, norms = cfl_step(state, t.models, t.counts, s.cfl_eps1, s.cfl_eps2, rnd)
        record.log_round({"round": rnd, "train_loss": float(np.mean(list(t.losses.values()))),
                          "norms": norms, "num_clusters": len(state.clusters),
                          "train_s": t.seconds, "dropped_nodes": t.dropped("train: ")})
        progress.step(rnd + 1, f"cfl clusters={len(state.clusters)}")
    owner = {n: i for i, members in enumerate(state.clusters) for n in members}
    return {n: state.models[owner[n]] for n in nodes}, owner


def pacfl(clients: Clients, s: EMDCFLSettings, record: Record, traffic: Traffic,
          progress: Progress) -> Outcome:
    """PACFL: one-shot clusters from the clients' class subspaces (principal angles, merged up
    to ``pacfl-threshold`` degrees), then FedAvg per cluster; a client without a usable reply
    is a singleton."""
    from fedclust.emdcfl.pacfl import angle_matrix, pacfl_clusters

    sub = clients.subspaces()
    traffic.add(sub, "clustering")
    answered = [n for n in clients.ids if n in sub.u]
    angles = angle_matrix([sub.u[n] for n in answered])
    found = pacfl_clusters(angles, s.pacfl_threshold)
    labels = singletons({n: int(k) for n, k in zip(answered, found)}, clients.ids)
    record.save_array("pacfl_angles", angles)
    return fixed(clients, s, record, labels, traffic, progress, "pacfl")


def _fixed_by(rule: Callable[[list[int]], dict[int, int]], name: str) -> Callable[..., Outcome]:
    def run(clients: Clients, s: EMDCFLSettings, record: Record, traffic: Traffic,
            progress: Progress) -> Outcome:
        return fixed(clients, s, record, rule(clients.ids), traffic, progress, name)

    return run


BASELINES: dict[str, Callable[..., Outcome]] = {
    "oracle": oracle,
    "fedavg": _fixed_by(lambda nodes: {n: 0 for n in nodes}, "fedavg"),
    "local": _fixed_by(lambda nodes: {n: i for i, n in enumerate(nodes)}, "local"),
    "ifca": ifca,
    "cfl": cfl,
    "pacfl": pacfl,
}


def run_baseline(algorithm: str, clients: Clients, s: EMDCFLSettings, record: Record,
                 traffic: Traffic) -> Outcome:
    """Run baseline ``algorithm``; returns every client's final model and cluster."""
    if algorithm not in BASELINES:
        raise ValueError(f"unknown baseline {algorithm!r}")
    return BASELINES[algorithm](clients, s, record, traffic,
                                Progress(s.rounds, f"{algorithm} round"))
