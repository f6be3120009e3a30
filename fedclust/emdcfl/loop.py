"""EMD-CFL's server loop (paper 001, Algorithm 1), without Flower, and the final phase it
shares with its baselines (:mod:`fedclust.emdcfl.baselines`).

The loop talks to the clients through :class:`~fedclust.emdcfl.clients.Clients`, one call per
phase: Flower messages (:class:`strategies.emdcfl.FlowerClients`) or direct calls in one
process (:class:`fedclust.emdcfl.inmemory.InMemoryClients`). Its settings are
:class:`~fedclust.emdcfl.keys.EMDCFLSettings`.

Rounds (global epochs) ``r = 0 … R−1`` (``R = emdcfl.rounds``):

1. **Local training** (Alg. 1 line 5): the round's clients (all, or ``clients-per-round``
   sampled without replacement, :class:`~fedclust.emdcfl.cluster.Participation`) train their
   current cluster model ``θ_k`` locally; before the first clustering every client is a
   singleton holding the shared initial model ``θ_0``. On first contact a client creates its
   X25519 key pair and returns the public key.
2. **FedAvg** per cluster: ``θ_k = Σ_{c∈k} n_c θ_c / Σ_{c∈k} n_c`` over this round's members
   (``n_c``: train size).
3. **Clustering** (lines 7–17), with ``recluster=on-join`` when clients took part for the
   first time (round 0 under full participation: one-shot, the paper's Alg. 1), with
   ``every-round`` in every round (the authors' partial-participation code), among all
   clients seen so far:

   a. every client ``c`` receives every seen client's latest local model and public key and
      returns, per peer ``o``, the projected clouds ``R_co·emb_c(train_c)`` and
      ``R_co·emb_c(val_o)`` (sent by ``o``) and the scalar ``W(train_c, val_c)``
      (:func:`fedclust.emdcfl.client.embed_pairs`; ``R_co`` is the pair's secret projection);
   b. the server solves ``W(train_c, val_o)`` (exact OT) and the excess
      ``E[c, o] = W(train_c, val_o) − W(train_c, val_c)``;
   c. ``A[c, o] = (E[c, o] < ε) ∧ (E[o, c] < ε)``; equal closed neighbourhoods of ``A`` form
      the clusters (:func:`fedclust.emdcfl.excess.cluster_clients`); clients not yet seen,
      or that did not answer, stay singletons. ``ε`` is ``emdcfl.epsilon``, or with
      ``"auto"`` read from the excesses (:func:`fedclust.emdcfl.cluster.auto_epsilon`); the
      round's record holds it, the gap it sat in and any label-free warning (no ε could be
      read; more than half the clients alone), which also go to the log.

   A cluster whose member set did not change keeps its model from step 2; a new or changed
   cluster starts from the FedAvg of its members' latest (possibly stale) local models
   (:func:`~fedclust.emdcfl.cluster.recluster_models`).

Finally (:func:`finish`, the same for every baseline) every client receives its cluster's
model and cluster id and keeps them for its data owner; on the evaluation path it reports its
test accuracy and ground-truth group, and the server computes the ARI of the clusters.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from fedclust.emdcfl.baselines import run_baseline
from fedclust.emdcfl.clients import LOG, Clients, Traffic, Weights
from fedclust.emdcfl.cluster import Participation, cluster_fedavg, recluster_models
from fedclust.emdcfl.excess import Clustering, PairClouds, cluster_clients
from fedclust.emdcfl.keys import EMDCFLSettings
from fedclust.metrics import adjusted_rand
from fedclust.results import Progress, Record, coverage, eval_coverage


def pair_inputs(replies: Mapping[int, Mapping[str, Mapping[str, Any]]], order: list[int]
                ) -> dict[tuple[int, int], PairClouds]:
    """Every ordered pair ``(c, o)`` whose three inputs arrived: ``c``'s ``src`` cloud and
    reference for ``o``, and ``o``'s ``tgt`` cloud for ``c``."""
    out = {}
    for c in order:
        if c not in replies:
            continue
        src, ref = replies[c]["src"], replies[c]["reference"]
        for o in order:
            if o == c or o not in replies or str(o) not in src or str(o) not in ref:
                continue
            tgt = replies[o]["tgt"]
            if str(c) in tgt:
                out[(c, o)] = PairClouds(src[str(o)], tgt[str(c)], float(ref[str(o)]))
    return out


def cluster_step(clients: Clients, s: EMDCFLSettings, seen: list[int],
                 latest: Mapping[int, Weights], pubs: Mapping[int, bytes], rnd: int,
                 traffic: Traffic) -> tuple[dict[int, int], Clustering, dict[str, Any]]:
    """Step 3 among the ``seen`` clients: the embedding exchange (a), the excess matrix (b),
    the adjacency and the neighbourhood clusters (c). Returns every member's cluster, the
    clustering and what the round's record adds."""
    members = [n for n in seen if n in latest and n in pubs]
    clouds = clients.embed(rnd, members, latest, pubs)
    traffic.add(clouds, "clustering")
    answered = {n: clouds.replies[n] for n in members if n in clouds.replies}
    # a client that did not answer has no pair: no edge, it stays a singleton
    found = cluster_clients(members, pair_inputs(answered, members), s.epsilon, s.solver,
                            lazy=not s.full_matrix)
    traffic.seconds["clustering"] += found.seconds
    for text in found.warnings:
        LOG.warning("emdcfl round %d: %s", rnd, text)
    info = {"emd_s": found.seconds, "emd_solves": found.solves, "emd_skipped": found.skipped,
            "embed_s": clouds.seconds, "embed_messages": clouds.messages,
            "embed_message_mib": clouds.message_mib,
            **(found.choice.record() if found.choice is not None else {}),
            "clustering_warnings": list(found.warnings)}
    return ({n: int(found.labels[i]) for i, n in enumerate(members)}, found,
            {**info, "dropped": clouds.dropped("embed: ")})


def emdcfl(clients: Clients, s: EMDCFLSettings, record: Record, traffic: Traffic
           ) -> tuple[dict[int, Weights], dict[int, int], dict[str, Any]]:
    """Algorithm 1 (steps 1–3 above). Returns every client's final model and cluster, and
    the metrics the run adds (EMD and embedding seconds). The last clustering's matrices go to
    ``record``: ``emd_matrix``, ``emd_excess``, ``adjacency``, ``clusters``."""
    from fedclust.emdcfl.model import init_weights

    nodes = clients.ids
    init = init_weights(s.spec, s.seed)
    part = Participation(nodes, min(s.clients_per_round or len(nodes), len(nodes)), s.seed)
    labels = {n: i for i, n in enumerate(nodes)}            # everyone starts a singleton
    cluster_models: dict[int, Weights] = {i: init for i in range(len(nodes))}
    latest: dict[int, Weights] = {}
    counts: dict[int, int] = {}
    pubs: dict[int, bytes] = {}
    emd_s = embed_s = 0.0
    last: Clustering | None = None
    progress = Progress(s.rounds, "emdcfl round")
    for rnd in range(s.rounds):
        # 1. local training of the round's clients, from their cluster's model
        picked, grew = part.sample()
        t = clients.train(rnd, {n: cluster_models[labels[n]] for n in picked}, True)
        traffic.add(t, "training")
        latest.update(t.models)
        counts.update(t.counts)
        pubs.update(t.pubs)
        entry: dict[str, Any] = {"round": rnd, "participants": len(picked),
                                 "train_loss": float(np.mean(list(t.losses.values())))
                                 if t.losses else None, "train_s": t.seconds,
                                 "dropped_nodes": t.dropped("train: ")}
        # 2. this round's FedAvg inside the current clusters (kept by unchanged clusters)
        cluster_models.update(cluster_fedavg({n: labels[n] for n in t.models}, t.models,
                                             counts))
        # 3. clustering when clients joined (or every round)
        if grew or s.recluster == "every-round":
            clustered, last, info = cluster_step(clients, s, part.seen, latest, pubs, rnd,
                                                 traffic)
            emd_s += info["emd_s"]
            embed_s += info["embed_s"]
            new_labels = part.labels(clustered)
            cluster_models, kept = recluster_models(labels, cluster_models, new_labels, latest,
                                                    counts, init)
            labels = new_labels
            dropped = merge_drops(entry["dropped_nodes"], info.pop("dropped"))
            entry.update({"reclustered": True, "kept_clusters": kept, **info,
                          "dropped_nodes": dropped})
        entry["num_clusters"] = len(set(labels.values()))
        entry["clusters"] = [labels[n] for n in nodes]
        record.log_round(entry)
        progress.step(rnd + 1, f"clusters={entry['num_clusters']} loss={entry['train_loss']}")
    extra: dict[str, Any] = {"emd_s": emd_s, "embed_s": embed_s}
    if last is not None:
        record.save_array("emd_matrix", last.distance)
        record.save_array("emd_excess", last.excess)
        record.save_array("adjacency", last.adjacency.astype(np.int8))
        record.save_array("clusters", np.array([labels[n] for n in last.members]))
        if last.choice is not None:     # the last clustering's ε, and how it was set
            extra.update(last.choice.record())
        extra["warnings"] = list(last.warnings)
    return {n: cluster_models[labels[n]] for n in nodes}, labels, extra


def merge_drops(*drops: dict[str, str]) -> dict[str, str]:
    """Union of ``dropped_nodes`` dicts; a node dropped twice keeps both reasons."""
    out: dict[str, str] = {}
    for d in drops:
        for n, why in d.items():
            out[n] = f"{out[n]} | {why}" if n in out else why
    return out


def finish(clients: Clients, s: EMDCFLSettings, models: Mapping[int, Weights],
           found: Mapping[int, int], traffic: Traffic) -> dict[str, Any]:
    """The final phase: every client gets its final (cluster) model and cluster id; on the
    evaluation path the metrics ``eval_*`` from the clients that evaluated: mean and worst
    test accuracy, the ARI of ``found`` against the ground-truth groups and, on Backdoor
    MNIST, the targets' clean and backdoor accuracy."""
    num_clusters = len(set(found.values()))
    out: dict[str, Any] = {"num_clusters": num_clusters,
                           "clusters": [found[n] for n in sorted(found)],
                           "clusters_coverage": coverage("emdcfl", "clusters", found,
                                                         clients.ids)}
    fin = clients.final(models, found)
    traffic.add(fin, "evaluation")
    if not s.evaluate:      # training is over: a client that missed its model is only named
        out["final_dropped_nodes"] = fin.dropped()
        return out
    out["eval_dropped_nodes"] = fin.dropped()
    ev = fin.evaluations
    accs = {n: e.acc for n, e in ev.items()}
    truth = {n: e.cluster for n, e in ev.items()}
    nodes = sorted(set(truth) & set(found))
    out.update({
        "eval_acc_mean": float(np.mean(list(accs.values()))) if accs else float("nan"),
        "eval_acc_worst": float(np.min(list(accs.values()))) if accs else float("nan"),
        "eval_ari": adjusted_rand([truth[n] for n in nodes], [found[n] for n in nodes])
        if nodes else float("nan"),
        "eval_truth": [truth.get(n, -1) for n in sorted(found)],
        "eval_acc_per_client": [accs.get(n, float("nan")) for n in sorted(found)],
        "eval_coverage": eval_coverage("emdcfl", len(accs), len(models),
                                       sum(e.num_test for e in ev.values())),
    })
    targets = [n for n, e in ev.items() if e.backdoor_acc is not None]
    if targets:      # the targets: clients that report a backdoor accuracy (clean green set)
        out["eval_backdoor_acc_targets"] = float(np.mean([ev[n].backdoor_acc
                                                          for n in targets]))
        out["eval_clean_acc_targets"] = float(np.mean([accs[n] for n in targets]))
    return out


def run(clients: Clients, s: EMDCFLSettings, record: Record) -> dict[str, Any]:
    """``method=emdcfl``: EMD-CFL (Algorithm 1), or the baseline ``s.algorithm`` on the same
    clients, then :func:`finish`; returns the run's metrics (``dropped_nodes``: every client
    dropped in any phase)."""
    t_start, traffic = time.perf_counter(), Traffic()
    extra: dict[str, Any] = {}
    if s.algorithm == "emdcfl":
        final, labels, extra = emdcfl(clients, s, record, traffic)
    else:
        final, labels = run_baseline(s.algorithm, clients, s, record, traffic)
    out = finish(clients, s, final, labels, traffic)
    total = time.perf_counter() - t_start
    out.update({"bytes_sent": traffic.sent, "bytes_received": traffic.received,
                "training_s": traffic.seconds["training"],
                "clustering_s": traffic.seconds["clustering"],
                "evaluation_s": traffic.seconds["evaluation"], "total_s": total})
    if extra:
        out.update({**extra, "emd_share_of_run": extra["emd_s"] / total if total else 0.0,
                    "clustering_share_of_run": out["clustering_s"] / total if total else 0.0})
    out["algorithm"] = s.algorithm
    drops = [h.get("dropped_nodes") or {} for h in record.history]
    drops += [out.get("eval_dropped_nodes", {}), out.get("final_dropped_nodes", {})]
    out.setdefault("dropped_nodes", sorted({int(n) for d in drops for n in d}))
    return out
