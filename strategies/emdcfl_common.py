"""Server-side pieces shared by EMD-CFL (:mod:`strategies.emdcfl`) and its baselines
(:mod:`strategies.emdcfl_baselines`): traffic accounting, the local-training round, the final
message with evaluation and model saving, and the run metrics.

Both loops import from here, never from each other.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, RecordDict
from flwr.serverapp import Grid

from fedclust.emdcfl.model import ModelSpec, spec_from_config, weights_from_record
from fedclust.metrics import adjusted_rand
from fedclust.results import RunRecorder
from strategies.common import (
    Exchange,
    arrays,
    check_each,
    eval_coverage,
    require_honest,
    result_record,
    send_and_collect,
)
from strategies.emdcfl_replies import eval_reply, final_reply, train_reply, trained_reply

Weights = list[np.ndarray]


class Traffic:
    """Bytes and seconds of every exchange, split into clustering and training."""

    def __init__(self) -> None:
        self.sent = self.received = 0
        self.seconds = {"training": 0.0, "clustering": 0.0, "evaluation": 0.0}

    def add(self, ex: Exchange, kind: str) -> None:
        self.sent += ex.bytes_sent
        self.received += ex.bytes_received
        self.seconds[kind] += ex.seconds


def model_record(weights: Weights) -> ArrayRecord:
    return arrays(**{str(i): np.asarray(w) for i, w in enumerate(weights)})


def spec_of(cfg: dict[str, Any]) -> ModelSpec:
    return spec_from_config(cfg)


def shapes_of(weights: Weights) -> list[tuple[int, ...]]:
    """Array shapes of a model (what every client reply must match)."""
    return [tuple(np.shape(w)) for w in weights]


def require_replies(ex: Exchange, phase: str) -> None:
    """Stop the run when a phase kept no client, naming the phase and every node's reason.

    Raises
    ------
    RuntimeError
        ``ex`` has no usable reply.
    """
    if ex.replies:
        return
    reasons = "; ".join(f"node {n}: {why}" for n, why in sorted(ex.failed.items()))
    raise RuntimeError(
        f"EMD-CFL phase '{phase}': no client left — every reply was missing, an error or "
        f"rejected ({reasons or 'no client was asked'}). Fix the cause named above (e.g. "
        "data-dir, node data-path files, timeout) and run again.")


def dropped(ex: Exchange, phase: str = "") -> dict[str, str]:
    """``history.jsonl`` ``dropped_nodes`` of one exchange: node id → reason."""
    return {str(n): f"{phase}{why}" for n, why in sorted(ex.failed.items())}


def train_round(grid: Grid, cfg: dict[str, Any], models: dict[int, Weights], rnd: int,
                keygen: bool, traffic: Traffic, declared: dict[int, int] | None = None
                ) -> tuple[dict[int, Weights], dict[int, int], dict[int, float],
                           dict[int, bytes], Exchange]:
    """Each node in ``models`` trains its model; returns new models, sizes, losses, pub keys.

    ``declared``: the train sizes the nodes reported in earlier rounds (kept up to date here);
    a node that reports another size is excluded (:func:`~strategies.emdcfl_replies.
    trained_reply`).
    """
    conf = ConfigRecord({"round": rnd, "keygen": keygen})

    def content(nid: int) -> RecordDict:
        return RecordDict({"model": model_record(models[nid]), "config": conf})

    shapes = shapes_of(next(iter(models.values()))) if models else []
    ex = send_and_collect(grid, sorted(models), content, "train.emdcfl_local", f"train-{rnd}",
                          cfg["timeout"], validate=train_reply(shapes, keygen))
    check_each(ex, trained_reply(models, {} if declared is None else declared), f"train-{rnd}")
    traffic.add(ex, "training")
    require_replies(ex, f"train-{rnd}")
    require_honest(ex, f"train-{rnd}", len(ex.replies), len(models), cfg)
    new, counts, losses, pubs = {}, {}, {}, {}
    for nid, rd in ex.replies.items():
        new[nid] = weights_from_record(rd.array_records["model"])
        counts[nid] = int(rd.metric_records["metrics"]["num-examples"])
        losses[nid] = float(rd.metric_records["metrics"]["train-loss"])
        if keygen:
            pubs[nid] = rd.array_records["pub"]["key"].numpy().astype(np.uint8).tobytes()
    return new, counts, losses, pubs, ex


def save_final_models(recorder: RunRecorder, cfg: dict[str, Any], models: dict[int, Weights],
                      found: dict[int, int]) -> None:
    """``models/cluster_<c>.pt`` for every final cluster (a torch ``state_dict``) and
    ``models/clusters.json`` (network shape, file and client ids of every cluster)."""
    from fedclust.emdcfl.predict import save_cluster_models

    members: dict[int, list[int]] = {}
    for n in sorted(models):
        members.setdefault(found[n], []).append(n)
    save_cluster_models(recorder.dir, spec_of(cfg),
                        {c: models[ns[0]] for c, ns in members.items()}, members)


def evaluate_models(grid: Grid, cfg: dict[str, Any], models: dict[int, Weights],
                    found: dict[int, int], traffic: Traffic, recorder: RunRecorder
                    ) -> dict[str, Any]:
    """The final message: every node gets its final (cluster) model, its cluster id and the
    results folder (config record ``"result"``) and keeps them for its data owner; with
    ``evaluate=true`` it also reports its test accuracy and ground truth, and the server computes
    the ARI of ``found``. The server saves every cluster's model first.
    """
    num_clusters = len(set(found.values()))
    out: dict[str, Any] = {"num_clusters": num_clusters,
                           "clusters": [found[n] for n in sorted(found)]}
    save_final_models(recorder, cfg, models, found)

    def content(nid: int) -> RecordDict:
        result = result_record(recorder.dir)
        result["cluster"], result["num-clusters"] = int(found[nid]), num_clusters
        return RecordDict({"model": model_record(models[nid]), "result": result})

    ex = send_and_collect(grid, sorted(models), content, "evaluate.emdcfl_eval", "evaluate",
                          cfg["timeout"],
                          validate=eval_reply() if cfg["evaluate"] else final_reply())
    traffic.add(ex, "evaluation")
    if not cfg["evaluate"]:      # training is over: a node that missed its model is only named
        out["final_dropped_nodes"] = dropped(ex)
        return out
    require_replies(ex, "evaluate")
    require_honest(ex, "evaluate", len(ex.replies), len(models), cfg)
    out["eval_dropped_nodes"] = dropped(ex)
    accs = {n: float(rd.metric_records["metrics"]["test-acc"]) for n, rd in ex.replies.items()}
    truth = {n: int(rd.metric_records["metrics"]["cluster"]) for n, rd in ex.replies.items()}
    bd = [float(rd.metric_records["metrics"]["backdoor-acc"]) for rd in ex.replies.values()
          if "backdoor-acc" in rd.metric_records["metrics"]]
    nodes = sorted(set(truth) & set(found))
    out.update({
        "eval_acc_mean": float(np.mean(list(accs.values()))) if accs else float("nan"),
        "eval_acc_worst": float(np.min(list(accs.values()))) if accs else float("nan"),
        "eval_ari": adjusted_rand([truth[n] for n in nodes], [found[n] for n in nodes]),
        "eval_truth": [truth.get(n, -1) for n in sorted(found)],
        "eval_acc_per_client": [accs.get(n, float("nan")) for n in sorted(found)],
        "eval_coverage": eval_coverage(
            "emdcfl", len(accs), len(models),
            sum(int(rd.metric_records["metrics"]["num-test"]) for rd in ex.replies.values())),
    })
    if bd:       # the targets: clients that report a backdoor accuracy (clean green set)
        out["eval_backdoor_acc_targets"] = float(np.mean(bd))
        out["eval_clean_acc_targets"] = float(np.mean(
            [accs[n] for n, rd in ex.replies.items()
             if "backdoor-acc" in rd.metric_records["metrics"]]))
    return out


def finish_metrics(out: dict[str, Any], traffic: Traffic, t_start: float) -> dict[str, Any]:
    total = time.perf_counter() - t_start
    out.update({"bytes_sent": traffic.sent, "bytes_received": traffic.received,
                "training_s": traffic.seconds["training"],
                "clustering_s": traffic.seconds["clustering"],
                "evaluation_s": traffic.seconds["evaluation"], "total_s": total})
    return out
