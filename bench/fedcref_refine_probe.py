"""Who wins the samples in FedCRef's refinement (paper 000 Algorithm 2), iteration 1.

Runs one FedCRef iteration on a generated MNIST system with the in-memory clients (the same
client steps and seeds as the ClientApp), records every client's reconstruction errors under
its own cluster models and under all community models, and reports:

- ACC at the start, after Algorithm 2 with the own models only (what local-only does), and
  after Algorithm 2 with own + community models (the paper's step);
- the share of samples whose best model is a community model, and the share of those that
  are not of the class that community model wins most (evaluation only: uses labels);
- the ACC that re-runs of Algorithm 2 on the same errors give with each model's errors divided
  by its typical error on its own data (``scaled``), by its median error on the client's data
  (``localmed``), with only the communities the client is a member of (``members``), or with
  the community model in place of the own model of each member cluster (``replace``), or with
  each sample offered only the communities of the cluster whose own model reconstructs it best
  (``gated``: a sample whose best own model is an isolated cluster's stays with the own models).

    python bench/fedcref_refine_probe.py --data-dir "$FEDCLUST_DATA_DIR" --seed 100 \\
        --samples-per-cluster 150 --clients 25
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")


def main() -> None:
    from fedclust.config import validate
    from fedclust.fedcref import algorithm
    from fedclust.fedcref import client as core
    from fedclust.fedcref.initial import initial_clustering
    from fedclust.fedcref.inmemory import InMemoryClients
    from fedclust.fedcref.refine import cluster_refine, label_agreement

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data-dir", default=os.environ.get("FEDCLUST_DATA_DIR", "data"))
    ap.add_argument("--seed", type=int, default=100)
    ap.add_argument("--samples-per-cluster", type=int, default=150)
    ap.add_argument("--clients", type=int, default=25)
    ap.add_argument("--dirtiness", type=float, default=0.3)
    ap.add_argument("--rule", default="eq2", choices=["eq2", "ratio"])
    ap.add_argument("--split", default="train", choices=["train", "all"])
    args = ap.parse_args()

    cfg = validate({"method": "fedcref", "dataset": "mnist", "data-dir": args.data_dir,
                    "num-clients": args.clients, "seed": args.seed,
                    "fedcref.samples-per-cluster": args.samples_per_cluster,
                    "fedcref.dirtiness": args.dirtiness, "fedcref.max-iterations": 1,
                    "fedcref.assoc-rule": args.rule, "fedcref.split": args.split,
                    "output-dir": "unused"})
    xs, ys, starts = [], [], []
    for i in range(args.clients):
        x, y = core.client_data(cfg, i)
        starts.append(initial_clustering(
            "dirty", x, int(np.unique(y).size), y_true=y, dirtiness=args.dirtiness,
            random_state=core.derive_seed(cfg["seed"], core.client_key(x), 0)))
        xs.append(x)
        ys.append(y)
    clients = InMemoryClients(xs, starts, cfg, ys=ys)

    records, groups_seen = [], []
    refine, community_models = core.refine, algorithm.community_models

    def spy_refine(state, x, params):
        com = core.ae.errors(params, x) if core.ae.n_models(params) else np.zeros((0, len(x)))
        own, before = state.own_errors[state.model_clusters], state.labels.copy()
        agreement = refine(state, x, params)
        records.append((own, com, before, state.labels.copy()))
        return agreement

    def spy_communities(clients_, t, groups, *args):
        groups_seen.append([list(g) for g in groups])
        return community_models(clients_, t, groups, *args)

    core.refine, algorithm.community_models = spy_refine, spy_communities
    try:
        out = algorithm.run(clients, algorithm.Settings.from_config(cfg))
    finally:
        core.refine, algorithm.community_models = refine, community_models
    groups = groups_seen[0] if groups_seen else []
    print(f"seed {args.seed}, {args.clients} clients x {args.samples_per_cluster} per cluster, "
          f"{args.rule}: {len(groups)} communities, ACC {out.summary['eval_acc_start']:.3f} -> "
          f"{out.summary['eval_acc_end']:.3f}")
    if not groups:
        return

    # a community's typical error: its model's median error on its members' cluster samples
    com_scale = np.array([np.median(np.concatenate(
        [records[ci][1][g][records[ci][2] == q] for ci, q in members]))
        for g, members in enumerate(groups)])
    res: dict[str, list[float]] = {k: [] for k in ("start", "own only", "paper", "scaled",
                                                   "localmed", "members", "replace", "gated")}
    won = won_other = total = 0
    for i, (own, com, before, after) in enumerate(records):
        y, k = clients.ys[i], clients.states[i].k
        mc = list(clients.states[i].model_clusters)

        def acc(labels, y=y):
            return label_agreement(y, labels)

        errors = np.concatenate([own, com])
        best = np.argmin(errors, axis=0)
        total += len(y)
        for g in np.unique(best[best >= len(own)]):
            yg = y[best == g]
            won += len(yg)
            won_other += int(np.sum(yg != np.bincount(yg).argmax()))
        own_scale = np.array([np.median(own[j][before == q]) if np.any(before == q)
                              else np.median(own[j]) for j, q in enumerate(mc)])
        mine = [g for g, m in enumerate(groups) if any(ci == i for ci, _ in m)]
        replaced = own.copy()
        for g in mine:
            for ci, q in groups[g]:
                if ci == i:
                    replaced[mc.index(q)] = com[g]
        res["start"].append(acc(before))
        res["own only"].append(acc(cluster_refine(own, k)[0]))
        res["paper"].append(acc(after))
        res["scaled"].append(acc(cluster_refine(np.concatenate(
            [own / own_scale[:, None], com / com_scale[:, None]]), k)[0]))
        res["localmed"].append(acc(cluster_refine(
            errors / np.median(errors, axis=1, keepdims=True), k)[0]))
        res["members"].append(acc(cluster_refine(np.concatenate([own, com[mine]]), k)[0]))
        res["replace"].append(acc(cluster_refine(replaced, k)[0]))
        best_own = np.asarray(mc)[np.argmin(own, axis=0)]
        allowed = np.array([np.isin(best_own, [q for ci, q in m if ci == i]) for m in groups]
                           ).reshape(len(groups), -1)
        res["gated"].append(acc(cluster_refine(np.concatenate(
            [own, np.where(allowed, com, np.inf)]), k)[0]))
    print(f"samples whose best model is a community model: {won / total:.3f}; of those, not of "
          f"that model's majority class: {won_other / max(won, 1):.3f}")
    print("iteration-1 ACC by refinement variant: "
          + ", ".join(f"{k} {np.mean(v):.3f}" for k, v in res.items()))


if __name__ == "__main__":
    main()
