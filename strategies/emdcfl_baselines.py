"""Clustered-FL baselines of paper 001 on the same data, model, rounds and local epochs.

All run through the same ClientApp actions as EMD-CFL (``train.emdcfl_local``,
``train.emdcfl_ifca``, ``evaluate.emdcfl_eval``), so data, model and budget are identical:

- ``oracle``: FedAvg inside the ground-truth clusters (read on the evaluation path).
- ``fedavg``: one model for everyone.
- ``local``: every client trains alone.
- ``ifca``: ``k`` cluster models (distinct random inits); each round every client picks the
  model with the lowest validation loss, trains it; FedAvg per picked model (an empty cluster
  keeps its model).
- ``pacfl``: Vahidian et al.'s one-shot clustering by principal angles between the clients'
  class subspaces (:mod:`fedclust.emdcfl.pacfl`), then FedAvg per cluster.
- ``cfl``: Sattler's recursive bi-partitioning (EPS_1/EPS_2 on update norms, complete linkage
  on update cosine similarity), starting from one cluster.

Every client trains every round (``emdcfl.clients-per-round`` must be 0: checked in
``fedclust.emdcfl.keys.check``). Replies are checked as in EMD-CFL
(:mod:`strategies.emdcfl_replies`); ``dropped_nodes`` in ``history.jsonl`` maps node → reason.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
from flwr.app import ConfigRecord, RecordDict
from flwr.serverapp import Grid

from fedclust.emdcfl.baselines import CFLState, cfl_step, ifca_models
from fedclust.emdcfl.cluster import cluster_fedavg
from fedclust.emdcfl.data import GROUND_TRUTH
from fedclust.emdcfl.keys import dataset_name
from fedclust.emdcfl.model import init_weights, weights_from_record
from fedclust.emdcfl.pacfl import angle_matrix, pacfl_clusters
from fedclust.results import Progress, RunRecorder
from strategies.common import check_each, connected_clients, require_honest, send_and_collect
from strategies.emdcfl_common import (
    Traffic,
    dropped,
    evaluate_models,
    finish_metrics,
    model_record,
    require_replies,
    shapes_of,
    spec_of,
    train_round,
)
from strategies.emdcfl_replies import group_reply, ifca_reply, pacfl_reply, trained_reply


def _truth(grid: Grid, nodes: list[int], cfg: dict[str, Any], traffic: Traffic
           ) -> dict[int, int]:
    ex = send_and_collect(grid, nodes, RecordDict(), "query.emdcfl_group", "oracle-groups",
                          cfg["timeout"], validate=group_reply())
    traffic.add(ex, "clustering")
    require_replies(ex, "oracle-groups")
    require_honest(ex, "oracle-groups", len(ex.replies), len(nodes), cfg)
    truth = {n: int(rd.metric_records["metrics"]["cluster"]) for n, rd in ex.replies.items()}
    nxt = max(truth.values(), default=-1) + 1
    for n in nodes:                         # no answer: a singleton
        if n not in truth:
            truth[n], nxt = nxt, nxt + 1
    return truth


def _fixed(grid, cfg, recorder, nodes, labels, traffic, progress, name):
    init = init_weights(spec_of(cfg), cfg["seed"])
    models = {k: init for k in set(labels.values())}
    declared: dict[int, int] = {}
    for rnd in range(cfg["emdcfl.rounds"]):
        new, counts, losses, _, ex = train_round(
            grid, cfg, {n: models[labels[n]] for n in nodes}, rnd, False, traffic, declared)
        models.update(cluster_fedavg({n: labels[n] for n in new}, new, counts))
        recorder.log_round({"round": rnd, "train_loss": float(np.mean(list(losses.values()))),
                            "train_s": ex.seconds, "num_clusters": len(models),
                            "dropped_nodes": dropped(ex, "train: ")})
        progress.step(rnd + 1, name)
    return {n: models[labels[n]] for n in nodes}, labels


def _ifca(grid, cfg, recorder, nodes, traffic, progress):
    k = cfg["emdcfl.num-clusters"]
    if k == 0:                  # evaluate=true only (keys.check): the simulated ground truth
        table = GROUND_TRUTH["backdoor" if dataset_name(cfg) == "backdoor-mnist"
                             else cfg["emdcfl.rotation"]]
        k = max(2, len(set(table)))
    spec = spec_of(cfg)
    models = {j: init_weights(spec, cfg["seed"] + 7919 * j) for j in range(k)}
    choice: dict[int, int] = {n: 0 for n in nodes}
    declared: dict[int, int] = {}
    for rnd in range(cfg["emdcfl.rounds"]):
        content = RecordDict({f"c:{j}": model_record(models[j]) for j in range(k)})
        content["config"] = ConfigRecord({"k": k, "round": rnd})
        ex = send_and_collect(grid, nodes, content, "train.emdcfl_ifca", f"ifca-{rnd}",
                              cfg["timeout"], validate=ifca_reply(shapes_of(models[0]), k))
        # the model a node trained is the one it chose
        sent = {n: models[int(rd.metric_records["metrics"]["choice"])]
                for n, rd in ex.replies.items()}
        check_each(ex, trained_reply(sent, declared), f"ifca-{rnd}")
        traffic.add(ex, "training")
        require_replies(ex, f"ifca-{rnd}")
        require_honest(ex, f"ifca-{rnd}", len(ex.replies), len(nodes), cfg)
        new, counts = {}, {}
        for n, rd in ex.replies.items():
            met = rd.metric_records["metrics"]
            choice[n] = int(met["choice"])
            new[n] = weights_from_record(rd.array_records["model"])
            counts[n] = int(met["num-examples"])
        models = ifca_models(models, choice, new, counts)
        recorder.log_round({"round": rnd, "k": k, "choices": [choice[n] for n in nodes],
                            "train_s": ex.seconds, "dropped_nodes": dropped(ex, "train: ")})
        progress.step(rnd + 1, f"ifca k={k}")
    return {n: models[choice[n]] for n in nodes}, dict(choice)


def _cfl(grid, cfg, recorder, nodes, traffic, progress):
    state = CFLState([list(nodes)], [init_weights(spec_of(cfg), cfg["seed"])])
    declared: dict[int, int] = {}
    for rnd in range(cfg["emdcfl.rounds"]):
        owner = {n: i for i, members in enumerate(state.clusters) for n in members}
        new, counts, losses, _, ex = train_round(
            grid, cfg, {n: state.models[owner[n]] for n in nodes}, rnd, False, traffic,
            declared)
        state, norms = cfl_step(state, new, counts, cfg["emdcfl.cfl-eps1"],
                                cfg["emdcfl.cfl-eps2"], rnd)
        recorder.log_round({"round": rnd, "train_loss": float(np.mean(list(losses.values()))),
                            "norms": norms, "num_clusters": len(state.clusters),
                            "train_s": ex.seconds, "dropped_nodes": dropped(ex, "train: ")})
        progress.step(rnd + 1, f"cfl clusters={len(state.clusters)}")
    owner = {n: i for i, members in enumerate(state.clusters) for n in members}
    return {n: state.models[owner[n]] for n in nodes}, owner


def _pacfl(grid, cfg, recorder, nodes, traffic, progress):
    """PACFL: one-shot clusters from the clients' class subspaces, then FedAvg per cluster
    (:mod:`fedclust.emdcfl.pacfl`); a client without a usable reply is a singleton."""
    spec = spec_of(cfg)
    rows = spec.in_channels * spec.size * spec.size
    ex = send_and_collect(grid, nodes, RecordDict(), "query.emdcfl_pacfl", "pacfl-subspaces",
                          cfg["timeout"], validate=pacfl_reply(
                              rows, cfg["emdcfl.pacfl-basis"] * spec.num_classes))
    traffic.add(ex, "clustering")
    require_replies(ex, "pacfl-subspaces")
    require_honest(ex, "pacfl-subspaces", len(ex.replies), len(nodes), cfg)
    answered = [n for n in nodes if n in ex.replies]
    angles = angle_matrix([ex.replies[n].array_records["subspace"]["u"].numpy()
                           for n in answered])
    found = pacfl_clusters(angles, cfg["emdcfl.pacfl-threshold"])
    labels = {n: int(k) for n, k in zip(answered, found)}
    nxt = max(labels.values(), default=-1) + 1
    for n in nodes:
        if n not in labels:
            labels[n], nxt = nxt, nxt + 1
    recorder.save_array("pacfl_angles", angles)
    return _fixed(grid, cfg, recorder, nodes, labels, traffic, progress, "pacfl")


def run_baseline(algorithm: str, grid: Grid, cfg: dict[str, Any], recorder: RunRecorder
                 ) -> dict[str, Any]:
    """Run baseline ``algorithm`` and return the same metrics as EMD-CFL."""
    t_start, traffic = time.perf_counter(), Traffic()
    nodes = connected_clients(grid, cfg)
    progress = Progress(cfg["emdcfl.rounds"], f"{algorithm} round")
    if algorithm == "oracle":
        final, labels = _fixed(grid, cfg, recorder, nodes, _truth(grid, nodes, cfg, traffic),
                               traffic, progress, "oracle")
    elif algorithm == "fedavg":
        final, labels = _fixed(grid, cfg, recorder, nodes, {n: 0 for n in nodes}, traffic,
                               progress, "fedavg")
    elif algorithm == "local":
        final, labels = _fixed(grid, cfg, recorder, nodes, {n: i for i, n in enumerate(nodes)},
                               traffic, progress, "local")
    elif algorithm == "ifca":
        final, labels = _ifca(grid, cfg, recorder, nodes, traffic, progress)
    elif algorithm == "cfl":
        final, labels = _cfl(grid, cfg, recorder, nodes, traffic, progress)
    elif algorithm == "pacfl":
        final, labels = _pacfl(grid, cfg, recorder, nodes, traffic, progress)
    else:
        raise ValueError(f"unknown baseline {algorithm!r}")
    out = evaluate_models(grid, cfg, final, labels, traffic, recorder)
    return finish_metrics(out, traffic, t_start)
