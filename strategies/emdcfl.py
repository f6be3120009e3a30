"""Server loop of EMD-CFL (paper 001, Alg. 1) — and the entry point of its baselines.

Rounds (global epochs) ``r = 0 … R−1``:

1. The round's clients (all, or ``emdcfl.clients-per-round`` sampled without replacement)
   train their current cluster model locally (``train.emdcfl_local``); before they have been
   clustered every client is a singleton holding the shared initial model. On first contact a
   client creates its X25519 key pair and returns the public key.
2. Each cluster's model becomes the FedAvg (weighted by train size) of this round's members.
3. With ``emdcfl.recluster=on-join`` (default) when clients joined for the first time (round 0
   under full participation: one-shot, the paper's Alg. 1), with ``every-round`` in every round
   (the authors' partial-participation code), the server relays the latest local model of
   every client seen so far and all public keys (``query.emdcfl_embed``, one message per
   client), and receives per peer the projected clouds ``src`` (its train, own model) and
   ``tgt`` (its val, the peer's model) plus the scalar reference ``W(train_c, val_c)`` that the
   client computed under the same ``R_co``. The clustering step itself is Flower-free:
   :func:`fedclust.emdcfl.excess.cluster_clients` solves ``W(train_c, val_o)`` (equal-size
   clouds; a pair's second direction is skipped once the first failed, unless
   ``emdcfl.full-matrix``), subtracts ``c``'s reference, ANDs both directions; equal closed
   neighbourhoods form a cluster; clients not yet seen stay singletons. A cluster whose member
   set did not change keeps its model from step 2; a new or changed cluster starts from the
   FedAvg of its members' latest (possibly stale) local models.

Finally (:func:`evaluate_models`, the same for every baseline) the server saves every cluster's
model (``models/``) and sends each client its cluster's model with its cluster id; the client
keeps them for its data owner (``model.pt``, ``result.json``) and, on the evaluation path,
reports its test accuracy.

Every reply is checked (:mod:`strategies.emdcfl_replies`): an error reply, a late one or one of
the wrong shape is rejected with a logged reason, the node is named in ``history.jsonl``
``dropped_nodes`` (node id → reason) and the phase continues with the others. A phase that
keeps no client stops the run with a RuntimeError naming the phase and every node's reason.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import numpy as np
from flwr.app import RecordDict
from flwr.serverapp import Grid

from fedclust.emdcfl.cluster import Participation, cluster_fedavg, recluster_models
from fedclust.emdcfl.excess import PairClouds, Solver, cluster_clients
from fedclust.emdcfl.model import init_weights
from fedclust.emdcfl.privacy import projection_dim
from fedclust.results import Progress, RunRecorder
from strategies.common import (
    arrays,
    check_each,
    connected_clients,
    require_honest,
    send_and_collect,
)
from strategies.emdcfl_baselines import run_baseline
from strategies.emdcfl_common import (
    Traffic,
    Weights,
    dropped,
    evaluate_models,
    finish_metrics,
    model_record,
    require_replies,
    spec_of,
    train_round,
)
from strategies.emdcfl_replies import embed_reply

LOG = logging.getLogger("fedclust")

# "src"/"tgt" → peer id → (n, k) cloud; "reference" → peer id → W(train_c, val_c) (a float)
Replies = dict[str, dict[str, Any]]
WARN_MESSAGE_MIB = 256.0     # larger embedding messages: warn (memory, gRPC) and name the fix


def pair_inputs(replies: dict[int, Replies], order: list[int]
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


def peer_batches(members: list[int], batch: int) -> list[list[int]]:
    """Peers per embedding message: all (``batch`` 0) or slices of ``batch`` members."""
    size = batch or len(members)
    return [members[i:i + size] for i in range(0, len(members), size)]


def embed_message_mib(model: Weights, models: int) -> float:
    """MiB of the model arrays in an embedding message that carries ``models`` models."""
    return models * sum(np.asarray(a).nbytes for a in model) / 2**20


def warn_message_size(model: Weights, members: list[int], batch: int) -> float:
    """Largest embedding message in MiB; logs a warning with the fix above WARN_MESSAGE_MIB."""
    # a message holds the batch's models plus the receiver's own when it is not in the batch
    peers = max(len(b) for b in peer_batches(members, batch)) if members else 0
    models = peers + (peers < len(members))
    mib = embed_message_mib(model, models)
    if mib > WARN_MESSAGE_MIB:
        per_model = embed_message_mib(model, 1)
        fit = max(1, int(WARN_MESSAGE_MIB // per_model) - 1)
        LOG.warning(
            "EMD-CFL: embedding messages carry up to %d models (peers and the client's own), "
            "%.0f MiB (%.1f MiB per model), to each of %d clients at once: expect that much "
            "memory per message on the server, the SuperLink and every node. Pass "
            "emdcfl.embed-batch=%d (peer models per message; same distances) to keep "
            "messages under %.0f MiB", models, mib, per_model, len(members), fit,
            WARN_MESSAGE_MIB)
    return mib


def cluster_step(grid: Grid, cfg: dict[str, Any], seen: list[int], latest: dict[int, Weights],
                 pubs: dict[int, bytes], rnd: int, traffic: Traffic
                 ) -> tuple[dict[int, int], dict[str, Any]]:
    """Embedding exchange among ``seen`` clients, EMD matrix, adjacency, neighbourhood clusters.

    With ``emdcfl.embed-batch`` = B > 0 the peer models go out B at a time (one exchange per
    batch, each client also gets its own model); each pair's projection and subsample come from
    the pair seed, so the distances equal those of one message with every peer.
    """
    members = [n for n in seen if n in latest and n in pubs]
    spec, group = spec_of(cfg), f"embed-{rnd}"
    check = embed_reply(members, projection_dim(spec.embed_dim, cfg["emdcfl.proj-ratio"]),
                        cfg["emdcfl.max-samples"], all_but_sender=False,
                        metric=cfg["emdcfl.metric"])
    batches = peer_batches(members, cfg["emdcfl.embed-batch"])
    message_mib = warn_message_size(latest[members[0]], members, cfg["emdcfl.embed-batch"]) \
        if members else 0.0
    records = {n: model_record(latest[n]) for n in members}    # shared by all messages
    clouds: dict[int, Replies] = {n: {"src": {}, "tgt": {}, "reference": {}} for n in members}
    failed: dict[int, str] = {}
    embed_s = 0.0
    for b, batch in enumerate(batches):
        targets = [n for n in members if set(batch) - {n}]
        name = group if len(batches) == 1 else f"{group}-batch{b}"

        def content(nid: int, batch: list[int] = batch) -> RecordDict:
            rd = RecordDict({f"m:{n}": records[n] for n in sorted({nid, *batch})})
            rd["peers"] = arrays(ids=np.array(batch, dtype=np.uint64),   # ids are < 2**64
                                 pub=np.stack([np.frombuffer(pubs[n], np.uint8)
                                               for n in batch]))
            return rd

        ex = send_and_collect(grid, targets, content, "query.emdcfl_embed", name,
                              cfg["timeout"], validate=check)
        check_each(ex, lambda nid, rd, batch=batch: _peer_problem(nid, rd, batch), name)
        require_replies(ex, name)
        require_honest(ex, name, len(ex.replies), len(targets), cfg)
        traffic.add(ex, "clustering")
        embed_s += ex.seconds
        failed.update(ex.failed)
        for nid, rd in ex.replies.items():
            for record in ("src", "tgt"):
                clouds[nid][record].update(
                    {k: v.numpy() for k, v in rd.array_records[record].items()})
            clouds[nid]["reference"].update(dict(rd.metric_records["reference"]))
    answered = {n: clouds[n] for n in members if n not in failed}
    # a client that did not answer has no pair: no edge, it stays a singleton
    found = cluster_clients(members, pair_inputs(answered, members), cfg["emdcfl.epsilon"],
                            Solver.from_config(cfg), lazy=not cfg["emdcfl.full-matrix"])
    traffic.seconds["clustering"] += found.seconds
    labels = found.labels
    info = {"emd": found.distance, "excess": found.excess, "adjacency": found.adjacency,
            "members": members, "emd_s": found.seconds, "emd_solves": found.solves,
            "emd_skipped": found.skipped, "embed_s": embed_s, "embed_messages": len(batches),
            "embed_message_mib": message_mib,
            "dropped": {str(n): f"embed: {why}" for n, why in sorted(failed.items())}}
    return {n: int(labels[i]) for i, n in enumerate(members)}, info


def _peer_problem(nid: int, rd: RecordDict, batch: list[int]) -> str | None:
    """The reply holds exactly the clouds of the peers it was sent (not the sender itself)."""
    got = set(rd.array_records["src"])
    want = {str(n) for n in batch if n != nid}
    if got == want:
        return None
    if str(nid) in got:
        return f"'src' holds the sender's own id {nid} as a peer"
    return f"'src' has peers {sorted(got)}, expected the {len(want)} sent: {sorted(want)}"


def run_emdcfl(grid: Grid, cfg: dict[str, Any], recorder: RunRecorder) -> dict[str, Any]:
    t_start, traffic = time.perf_counter(), Traffic()
    nodes = connected_clients(grid, cfg)
    init = init_weights(spec_of(cfg), cfg["seed"])
    per_round = cfg["emdcfl.clients-per-round"] or len(nodes)
    part = Participation(nodes, min(per_round, len(nodes)), cfg["seed"])
    labels = {n: i for i, n in enumerate(nodes)}            # everyone starts a singleton
    cluster_models: dict[int, Weights] = {i: init for i in range(len(nodes))}
    latest: dict[int, Weights] = {}
    counts: dict[int, int] = {}
    declared: dict[int, int] = {}    # train sizes as first reported
    pubs: dict[int, bytes] = {}
    clustered: dict[int, int] = {}
    emd_s = embed_s = 0.0
    last_info: dict[str, Any] | None = None
    every_round = cfg["emdcfl.recluster"] == "every-round"
    progress = Progress(cfg["emdcfl.rounds"], "emdcfl round")
    for rnd in range(cfg["emdcfl.rounds"]):
        picked, grew = part.sample()
        todo = {n: cluster_models[labels[n]] for n in picked}
        new, cnt, losses, keys, ex = train_round(grid, cfg, todo, rnd, True, traffic,
                                                 declared)
        latest.update(new)
        counts.update(cnt)
        pubs.update(keys)
        record: dict[str, Any] = {"round": rnd, "participants": len(picked),
                                  "train_loss": float(np.mean(list(losses.values())))
                                  if losses else None, "train_s": ex.seconds,
                                  "dropped_nodes": dropped(ex, "train: ")}
        # this round's FedAvg inside the current clusters (kept by unchanged clusters below)
        cluster_models.update(cluster_fedavg({n: labels[n] for n in new}, new, counts))
        if grew or every_round:
            clustered, info = cluster_step(grid, cfg, part.seen, latest, pubs, rnd, traffic)
            emd_s += info["emd_s"]
            embed_s += info["embed_s"]
            last_info = info
            new_labels = part.labels(clustered)
            cluster_models, kept = recluster_models(labels, cluster_models, new_labels, latest,
                                                    counts, init)
            labels = new_labels
            record.update({"reclustered": True, "kept_clusters": kept, "emd_s": info["emd_s"],
                           "emd_solves": info["emd_solves"],
                           "emd_skipped": info["emd_skipped"],
                           "embed_s": info["embed_s"],
                           "embed_messages": info["embed_messages"],
                           "embed_message_mib": info["embed_message_mib"],
                           "dropped_nodes": merge_drops(record["dropped_nodes"],
                                                        info["dropped"])})
        record["num_clusters"] = len(set(labels.values()))
        record["clusters"] = [labels[n] for n in nodes]
        recorder.log_round(record)
        progress.step(rnd + 1, f"clusters={record['num_clusters']} loss={record['train_loss']}")
    out = evaluate_models(grid, cfg, {n: cluster_models[labels[n]] for n in nodes}, labels,
                          traffic, recorder)
    out = finish_metrics(out, traffic, t_start)
    out.update({"emd_s": emd_s, "embed_s": embed_s,
                "emd_share_of_run": emd_s / out["total_s"] if out["total_s"] else 0.0,
                "clustering_share_of_run": out["clustering_s"] / out["total_s"]
                if out["total_s"] else 0.0})
    if last_info is not None:
        recorder.save_array("emd_matrix", last_info["emd"])
        recorder.save_array("emd_excess", last_info["excess"])
        recorder.save_array("adjacency", last_info["adjacency"].astype(np.int8))
        recorder.save_array("clusters", np.array([labels[n] for n in last_info["members"]]))
        if cfg["plots"]:
            from fedclust.emdcfl.plots import emd_heatmap

            emd_heatmap(recorder.path("emd_heatmap.png"), last_info["emd"],
                        np.array([labels[n] for n in last_info["members"]]),
                        f"EMD-CFL {cfg['dataset']} ({cfg['emdcfl.rotation']}), seed {cfg['seed']}")
    return out


def merge_drops(*drops: dict[str, str]) -> dict[str, str]:
    """Union of ``dropped_nodes`` dicts; a node dropped twice keeps both reasons."""
    out: dict[str, str] = {}
    for d in drops:
        for n, why in d.items():
            out[n] = f"{out[n]} | {why}" if n in out else why
    return out


def preflight(cfg: dict[str, Any]) -> None:
    """Fail before any message when the base image files of the dataset are missing.

    The simulated clients regenerate their data from ``data-dir`` (MNIST or Fashion-MNIST
    train and test files; ``rotdigits`` is embedded). Skipped with ``emdcfl.preflight=false``
    (a deployment whose nodes read their own ``data-path`` files).

    Raises
    ------
    fedclust.data.images.DatasetError
        A file is missing: the message names it, the folder searched and where to get it.
    """
    if not cfg["emdcfl.preflight"]:
        return
    from fedclust.emdcfl.data import check_files
    from fedclust.emdcfl.keys import dataset_name

    check_files(dataset_name(cfg), cfg["data-dir"])


def run(grid: Grid, cfg: dict[str, Any], recorder: RunRecorder) -> dict[str, Any]:
    """``method=emdcfl``: EMD-CFL, or the baseline named by ``emdcfl.algorithm``
    (``preflight`` runs before, from the ServerApp's method registry)."""
    from fedclust.emdcfl.keys import uneven_groups

    if cfg["dataset"] == "blobs":
        LOG.warning("method=emdcfl: dataset 'blobs' (project default) means 'rotdigits'")
    warning = uneven_groups(cfg)
    if warning:
        LOG.warning("method=emdcfl: %s", warning)
    algorithm = cfg["emdcfl.algorithm"]
    if algorithm == "emdcfl":
        out = run_emdcfl(grid, cfg, recorder)
    else:
        out = run_baseline(algorithm, grid, cfg, recorder)
    out["algorithm"] = algorithm
    history_drops = [h.get("dropped_nodes") or {} for h in recorder.history]
    history_drops.append(out.get("eval_dropped_nodes", {}))
    history_drops.append(out.get("final_dropped_nodes", {}))
    out.setdefault("dropped_nodes", sorted({int(n) for drops in history_drops for n in drops}))
    return out
