"""EMD-CFL's messages and its baselines', both ends: what the server sends (the builders),
what a node reads from it (the parsers), what the node replies, and how the server checks and
reads that reply. The node side is :mod:`client_apps.emdcfl_handlers`, the server side
:mod:`strategies.emdcfl`; the checks use the vocabulary of :mod:`strategies.wire.replies`.

=========================  ===========================================  ======================
message                    server sends                                 node replies
=========================  ===========================================  ======================
``train.emdcfl_local``     ``model.0…L-1``, ``config.round``,           ``model``, ``metrics``
                           ``config.keygen``                            (``pub.key``)
``train.emdcfl_ifca``      ``c:<j>`` (the ``k`` cluster models),        ``model``, ``metrics``
                           ``config.k``, ``config.round``               (``choice``)
``query.emdcfl_embed``     ``m:<id>`` (the batch's models and the       ``src``, ``tgt``,
                           receiver's own), ``peers.ids``, ``peers.pub``  ``reference``
``query.emdcfl_pacfl``     nothing                                      ``subspace.u``
``evaluate.emdcfl_eval``   ``model``, ``result`` (``run-dir``,          ``metrics``
                           ``cluster``, ``num-clusters``)
``query.emdcfl_group``     nothing                                      ``metrics.cluster``
=========================  ===========================================  ======================

What the server accepts:

=========================  ===================  ==============================================
message                    field                accepted
=========================  ===================  ==============================================
``train.emdcfl_local``     ``model.0…L-1``      exactly the global model's arrays, float32, of
                                                its shapes, finite; no weight above 1000 times
                                                the largest magnitude of the layer it was sent
                                                (at least 1): local training moves weights, it
                                                does not blow them up
                           ``num-examples``     an int ≥ 1, the same in every round (the node's
                                                train split does not change)
                           ``train-loss``       a finite number ≥ 0 (cross-entropy)
                           ``pub.key``          32 uint8 bytes (X25519), when asked for
``train.emdcfl_ifca``      ``model…``,          as above
                           ``num-examples``
                           ``choice``           an int in ``0 … k−1``
``query.emdcfl_embed``     ``src/tgt.<peer>``   float32 ``(1…max-samples, proj-dim)``, finite,
                                                for exactly the peers sent
                           ``reference.<peer>`` a finite distance ≥ 0 (≤ 2 with the cosine
                                                ground cost, whose costs lie in [0, 2])
``query.emdcfl_pacfl``     ``subspace.u``       float32 ``(rows, 1…max)``, finite, unit columns
``evaluate.emdcfl_eval``   ``num-test``         an int ≥ 0
                           ``test-acc``,        ``evaluate=true``, from a node that allows
                           ``backdoor-acc``     evaluation: in [0, 1]
                           ``cluster``          with ``test-acc``: an int ≥ −1 (−1: unknown)
``query.emdcfl_group``     ``cluster``          an int ≥ 0
=========================  ===================  ==============================================

A reply that fails a check is rejected with the returned reason, logged, and its node is
excluded from the phase and recorded (``history.jsonl`` ``dropped_nodes`` and
``excluded_nodes``, ``summary.json`` ``excluded_nodes``); the phase continues with the other
clients unless too few are left (:func:`strategies.common.require_honest`).

Every check factory returns a :data:`~strategies.wire.replies.Check` or, where the node
matters (what it was sent, what it declared before), a
:data:`~strategies.wire.replies.NodeCheck`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, MetricRecord, RecordDict

from strategies.wire.records import array_record, content, to_numpy
from strategies.wire.replies import (
    Check,
    NodeCheck,
    above_others,
    arrays_exactly,
    first_problem,
    metric_problem,
    read_array,
)

TRAIN = "train.emdcfl_local"
IFCA = "train.emdcfl_ifca"
EMBED = "query.emdcfl_embed"
PACFL = "query.emdcfl_pacfl"
FINAL = "evaluate.emdcfl_eval"
GROUP = "query.emdcfl_group"

Weights = list[np.ndarray]
#: the evaluation metrics a node sends with ``evaluate=true`` when it allows evaluation
EVAL_KEYS = ("test-loss", "test-acc", "cluster", "set", "backdoor-acc")
PUBLIC_KEY_BYTES = 32          # raw X25519 public key
GROWTH = 1e3                   # largest weight / largest weight sent, at least 1
COSINE_MAX = 2.0               # cosine costs 1 − cos lie in [0, 2], so does their EMD


# ------------------------------------------------------------------------- shared parts

def model_record(weights: Sequence[np.ndarray]) -> ArrayRecord:
    """A model's layers as an ArrayRecord ``"0" … "L-1"``."""
    return array_record(**{str(i): np.asarray(w) for i, w in enumerate(weights)})


def read_model(record: ArrayRecord) -> Weights:
    """A model's layers from an ArrayRecord ``"0" … "L-1"`` (either end)."""
    return [to_numpy(record[str(i)]) for i in range(len(record))]


def shapes_of(weights: Sequence[np.ndarray]) -> list[tuple[int, ...]]:
    """Array shapes of a model (what every reply's model must match)."""
    return [tuple(np.shape(w)) for w in weights]


def _model_arrays(weights: Sequence[np.ndarray]) -> dict[str, np.ndarray]:
    return {str(i): w for i, w in enumerate(weights)}


# ---------------------------------------------------------------------- train.emdcfl_local

def train_request(model: Sequence[np.ndarray], config: ConfigRecord) -> RecordDict:
    """Server side: the model to train and ``config`` (:func:`train_config`)."""
    return RecordDict({"model": model_record(model), "config": config})


def train_config(rnd: int, keygen: bool) -> ConfigRecord:
    """Server side: the round and whether the node returns its public key (one record that
    every message of a round shares)."""
    return ConfigRecord({"round": rnd, "keygen": keygen})


def read_train(rd: RecordDict) -> tuple[Weights, int, bool]:
    """Node side: ``(model, round, keygen)`` of a ``train.emdcfl_local``."""
    conf = rd.config_records["config"]
    return (read_model(rd.array_records["model"]), int(conf["round"]),
            bool(conf.get("keygen", False)))


def train_reply(weights: Sequence[np.ndarray], n: int, loss: float, pub: bytes | None
                ) -> RecordDict:
    """Node side: the trained model, its train size and loss (and its public key)."""
    arrays: dict[str, dict[str, np.ndarray]] = {"model": _model_arrays(weights)}
    if pub is not None:
        arrays["pub"] = {"key": np.frombuffer(pub, dtype=np.uint8)}
    return content(arrays, {"num-examples": n, "train-loss": loss})


def read_trained(rd: RecordDict, keygen: bool) -> tuple[Weights, int, float, bytes | None]:
    """Server side: ``(model, num-examples, train-loss, public key)`` of a checked reply."""
    met = rd.metric_records["metrics"]
    pub = (rd.array_records["pub"]["key"].numpy().astype(np.uint8).tobytes() if keygen
           else None)
    return (read_model(rd.array_records["model"]), int(met["num-examples"]),
            float(met["train-loss"]), pub)


# ---------------------------------------------------------------------- train.emdcfl_ifca

def ifca_request(models: Sequence[Sequence[np.ndarray]], rnd: int) -> RecordDict:
    """Server side: the ``k`` cluster models, ``k`` and the round (the same for every node)."""
    rd = RecordDict({f"c:{j}": model_record(m) for j, m in enumerate(models)})
    rd["config"] = ConfigRecord({"k": len(models), "round": rnd})
    return rd


def read_ifca(rd: RecordDict) -> tuple[list[Weights], int]:
    """Node side: ``(cluster models, round)`` of a ``train.emdcfl_ifca``."""
    conf = rd.config_records["config"]
    return ([read_model(rd.array_records[f"c:{j}"]) for j in range(int(conf["k"]))],
            int(conf["round"]))


def ifca_reply(weights: Sequence[np.ndarray], n: int, loss: float, choice: int,
               val_losses: Sequence[float]) -> RecordDict:
    """Node side: the trained model of its ``choice`` and the validation losses it chose by."""
    return content({"model": _model_arrays(weights)},
                   {"num-examples": n, "train-loss": loss, "choice": choice,
                    "val-losses": [float(v) for v in val_losses]})


def read_choice(rd: RecordDict) -> int:
    """Server side: the cluster model a checked ``train.emdcfl_ifca`` reply trained."""
    return int(rd.metric_records["metrics"]["choice"])


# --------------------------------------------------------------------- query.emdcfl_embed

def embed_request(receiver: int, batch: Sequence[int], models: Mapping[int, ArrayRecord],
                  pubs: Mapping[int, bytes]) -> RecordDict:
    """Server side: the batch's models and the receiver's own (``models``: their records,
    built once per exchange), the batch's ids and public keys."""
    rd = RecordDict({f"m:{n}": models[n] for n in sorted({receiver, *batch})})
    rd["peers"] = array_record(ids=np.array(batch, dtype=np.uint64),   # ids are < 2**64
                               pub=np.stack([np.frombuffer(pubs[n], np.uint8) for n in batch]))
    return rd


def read_embed(rd: RecordDict, me: int
               ) -> tuple[Weights, list[int], dict[int, bytes], Callable[[], Iterator[Weights]]]:
    """Node side: ``(own model, peers, peer → public key, peer models)`` of a
    ``query.emdcfl_embed`` to node ``me``; the peer models come one at a time, in the order of
    ``peers`` (the node never holds them all deserialised)."""
    ids = rd.array_records["peers"]["ids"].numpy().astype(np.uint64)
    pubs = rd.array_records["peers"]["pub"].numpy().astype(np.uint8)
    pub_of = {int(i): p.tobytes() for i, p in zip(ids.tolist(), pubs)}
    peers = [int(i) for i in ids.tolist() if int(i) != me]

    def models() -> Iterator[Weights]:
        return (read_model(rd.array_records[f"m:{peer}"]) for peer in peers)

    return read_model(rd.array_records[f"m:{me}"]), peers, pub_of, models


def embed_reply(src: Mapping[str, np.ndarray], tgt: Mapping[str, np.ndarray],
                reference: Mapping[str, float]) -> RecordDict:
    """Node side: per peer id, the projected clouds and the scalar reference."""
    out = content({"src": dict(src), "tgt": dict(tgt)}, {"num-pairs": len(src)})
    out["reference"] = MetricRecord(dict(reference))
    return out


def read_clouds(rd: RecordDict) -> dict[str, dict[str, Any]]:
    """Server side: ``{"src": {peer: cloud}, "tgt": {peer: cloud}, "reference": {peer: W}}``
    of a checked reply (peer ids as strings)."""
    out: dict[str, dict[str, Any]] = {
        record: {k: v.numpy() for k, v in rd.array_records[record].items()}
        for record in ("src", "tgt")}
    out["reference"] = dict(rd.metric_records["reference"])
    return out


# --------------------------------------------------------------------- query.emdcfl_pacfl

def pacfl_reply(u: np.ndarray) -> RecordDict:
    """Node side: its class subspaces (orthonormal columns)."""
    return content({"subspace": {"u": u}})


def read_subspace(rd: RecordDict) -> np.ndarray:
    """Server side: ``subspace.u`` of a checked reply."""
    return rd.array_records["subspace"]["u"].numpy()


# ------------------------------------------------------------------ evaluate.emdcfl_eval

def final_request(model: Sequence[np.ndarray], result: ConfigRecord, cluster: int,
                  num_clusters: int) -> RecordDict:
    """Server side: the node's final model; ``result`` (the run's folder) with its cluster id
    and the number of clusters added."""
    result["cluster"], result["num-clusters"] = int(cluster), int(num_clusters)
    return RecordDict({"model": model_record(model), "result": result})


def read_final(rd: RecordDict) -> Weights:
    """Node side: the final model of an ``evaluate.emdcfl_eval``."""
    return read_model(rd.array_records["model"])


def final_reply(num_test: int, evaluation: Mapping[str, float | int] | None) -> RecordDict:
    """Node side: ``num-test`` and, only when the run evaluates and the node allows it, the
    evaluation metrics (:data:`EVAL_KEYS`)."""
    return content(metrics={"num-test": num_test, **(evaluation or {})})


def read_evaluation(rd: RecordDict) -> dict[str, Any] | None:
    """Server side: ``{"acc", "cluster", "num_test", "backdoor_acc"}`` of a checked reply that
    carries evaluation metrics (None: it carries none)."""
    met = rd.metric_records["metrics"]
    if "test-acc" not in met:
        return None
    return {"acc": float(met["test-acc"]), "cluster": int(met["cluster"]),
            "num_test": int(met["num-test"]),
            "backdoor_acc": float(met["backdoor-acc"]) if "backdoor-acc" in met else None}


# --------------------------------------------------------------------- query.emdcfl_group

def group_reply(cluster: int) -> RecordDict:
    """Node side: its ground-truth cluster."""
    return content(metrics={"cluster": int(cluster)})


def read_group(rd: RecordDict) -> int:
    """Server side: the cluster of a checked reply."""
    return int(rd.metric_records["metrics"]["cluster"])


# ------------------------------------------------------------------------- reply checks

def model_problem(rd: RecordDict, shapes: Sequence[tuple[int, ...]], record: str = "model"
                  ) -> str | None:
    """``record`` holds exactly the arrays ``"0" … "L-1"``, float32, with the global shapes."""
    return arrays_exactly(rd, record, {str(i): tuple(s) for i, s in enumerate(shapes)},
                          dtype="float32")


def growth_problem(rd: RecordDict, sent: Sequence[np.ndarray], record: str = "model"
                   ) -> str | None:
    """No layer of the reply's model exceeds :data:`GROWTH` times the largest magnitude of the
    layer the node was sent (at least 1): a checked model (``model_problem``) that one round of
    local training cannot have produced is refused."""
    for i, w in enumerate(sent):
        got = float(np.max(np.abs(rd.array_records[record][str(i)].numpy()), initial=0.0))
        cap = GROWTH * max(1.0, float(np.max(np.abs(w), initial=0.0)))
        if got > cap:
            return (f"'{record}.{i}' has a weight of magnitude {got:.3g}, above {cap:.3g} "
                    f"({GROWTH:g} times the layer it was sent): local training does not move "
                    "weights that far")
    return None


#: how many decades a node's model update may lie above the other nodes' median update
UPDATE_DECADES = 3.0


def across_trained(replies: Mapping[int, RecordDict], sent: Mapping[int, Sequence[np.ndarray]]
                   ) -> dict[int, str]:
    """Server side, the checked replies of a training phase judged against each other
    (:func:`strategies.wire.replies.above_others`): a node's update (the distance of its model
    from the one it was sent) more than :data:`UPDATE_DECADES` orders of magnitude above the
    other nodes' median, or a ``num-examples`` more than six above theirs, is refused. Honest
    nodes train with the same learning rate and epochs; a model scaled within the per-node cap
    (1000 times the model it was sent) would dominate every average it joins."""
    norms: dict[int, float] = {}
    sizes: dict[int, float] = {}
    for nid, rd in replies.items():
        if nid not in sent:
            continue
        model = read_model(rd.array_records["model"])
        norms[nid] = float(np.sqrt(sum(float(np.sum((np.asarray(w, np.float64)
                                                     - np.asarray(v, np.float64)) ** 2))
                                       for w, v in zip(model, sent[nid]))))
        sizes[nid] = float(rd.metric_records["metrics"]["num-examples"])
    return {**above_others(sizes, "metrics.num-examples"),
            **above_others(norms, "model (its distance from the model it was sent)",
                           UPDATE_DECADES)}


def check_train(shapes: Sequence[tuple[int, ...]], keygen: bool) -> Check:
    """``train.emdcfl_local``: model of the global shapes, ``num-examples`` ≥ 1, finite
    ``train-loss`` ≥ 0 and, with ``keygen``, a 32-byte uint8 public key ``pub.key``."""

    def check(rd: RecordDict) -> str | None:
        return first_problem(
            model_problem(rd, shapes),
            lambda: metric_problem(rd, "num-examples", int, low=1),
            lambda: metric_problem(rd, "train-loss", float, low=0.0),
            lambda: read_array(rd, "pub", "key", dtype="uint8",
                               shape=(PUBLIC_KEY_BYTES,))[1] if keygen else None)

    return check


def check_trained(sent: Mapping[int, Sequence[np.ndarray]], declared: dict[int, int]
                  ) -> NodeCheck:
    """What a checked training reply must also satisfy given the node: its model within
    :func:`growth_problem` of the model it was ``sent``, and ``num-examples`` equal to what it
    ``declared`` in earlier rounds (recorded here on first sight)."""

    def check(nid: int, rd: RecordDict) -> str | None:
        problem = growth_problem(rd, sent[nid])
        if problem:
            return problem
        n = int(rd.metric_records["metrics"]["num-examples"])
        if declared.setdefault(nid, n) != n:
            return (f"'metrics.num-examples' = {n}, but the node declared {declared[nid]} "
                    "train examples before (its train split does not change)")
        return None

    return check


def check_ifca(shapes: Sequence[tuple[int, ...]], k: int) -> Check:
    """``train.emdcfl_ifca``: model of the global shapes, ``num-examples`` ≥ 1, ``choice`` in
    ``0 … k−1``."""

    def check(rd: RecordDict) -> str | None:
        return first_problem(model_problem(rd, shapes),
                             lambda: metric_problem(rd, "num-examples", int, low=1),
                             lambda: metric_problem(rd, "choice", int, low=0, high=k - 1))

    return check


def check_embed(members: Sequence[int], proj_dim: int, max_samples: int,
                all_but_sender: bool = True, metric: str = "cosine") -> Check:
    """``query.emdcfl_embed``: array records ``src`` and ``tgt`` each hold one float32
    ``(n, proj_dim)`` array per other member (``1 ≤ n ≤ max_samples``), finite, and metric
    record ``reference`` one finite ``W(train, val) ≥ 0`` per member (≤ 2 under the cosine
    ground cost), all under the same peer ids: all members but one (the sender; checked by the
    caller, who knows it), or, with ``all_but_sender=False`` (peers sent in batches), a
    non-empty subset of the members (the caller checks the exact set it sent). Nothing else: no
    own-validation cloud."""
    ids = {str(m) for m in members}
    top = COSINE_MAX if metric == "cosine" else math.inf

    def check(rd: RecordDict) -> str | None:
        if set(rd.array_records) != {"src", "tgt"}:
            return (f"array records {sorted(rd.array_records)}, expected exactly "
                    "['src', 'tgt']")
        peers = set(rd.array_records["src"])
        if all_but_sender and (not peers <= ids or len(ids - peers) != 1):
            return (f"'src' has peers {sorted(peers)}, expected every member but the sender "
                    f"({len(ids) - 1} of {sorted(ids)})")
        if not all_but_sender and (not peers <= ids or not peers):
            return f"'src' has peers {sorted(peers)}, expected some of the members {sorted(ids)}"
        if set(rd.array_records["tgt"]) != peers:
            return f"'tgt' has peers {sorted(rd.array_records['tgt'])}, 'src' has {sorted(peers)}"
        if "reference" not in rd.metric_records:
            return "missing metric record 'reference'"
        if set(rd.metric_records["reference"]) != peers:
            return (f"'reference' has peers {sorted(rd.metric_records['reference'])}, 'src' has "
                    f"{sorted(peers)}")
        for record in ("src", "tgt"):
            for key in sorted(peers):
                arr, problem = read_array(rd, record, key, dtype="float32", ndim=2)
                if problem:
                    return problem
                if arr.shape[1] != proj_dim or not 1 <= len(arr) <= max_samples:
                    return (f"'{record}.{key}' has shape {tuple(arr.shape)}, expected "
                            f"(1…{max_samples}, {proj_dim})")
        for key in sorted(peers):
            if metric_problem(rd, key, float, low=0.0, high=top, record="reference"):
                value = rd.metric_records["reference"][key]
                return (f"'reference.{key}' = {value!r} is not a finite distance >= 0"
                        + (f" and <= {top:g} (the most a {metric} ground cost gives)"
                           if math.isfinite(top) else ""))
        return None

    return check


def check_pacfl(rows: int, max_columns: int) -> Check:
    """``query.emdcfl_pacfl``: ``subspace.u`` a finite float32 ``(rows, k)`` array with
    ``1 ≤ k ≤ max_columns`` (basis vectors per class × classes), columns of unit norm."""

    def check(rd: RecordDict) -> str | None:
        arr, problem = read_array(rd, "subspace", "u", dtype="float32", ndim=2)
        if problem:
            return problem
        if arr.shape[0] != rows or not 1 <= arr.shape[1] <= max_columns:
            return (f"'subspace.u' has shape {tuple(arr.shape)}, expected ({rows}, "
                    f"1…{max_columns})")
        if not np.allclose(np.linalg.norm(arr.astype(np.float64), axis=0), 1.0, atol=1e-3):
            return "'subspace.u' columns are not unit vectors"
        return None

    return check


def check_final(evaluate: bool) -> Check:
    """``evaluate.emdcfl_eval``: an integer ``num-test`` ≥ 0; with ``evaluate`` (the run asks
    for evaluation), a reply that carries ``test-acc`` (a node that allows evaluation) rests
    on ``num-test`` ≥ 1 rows and has ``test-acc`` in [0, 1], an integer ``cluster`` ≥ −1
    and, when present, ``backdoor-acc`` in [0, 1]. Without ``evaluate`` no evaluation metric
    is accepted."""

    def check(rd: RecordDict) -> str | None:
        problem = metric_problem(rd, "num-test", int, low=0)
        if problem:
            return problem
        met = rd.metric_records["metrics"]
        sent = sorted(k for k in EVAL_KEYS if k in met)
        if not evaluate:
            return (f"evaluation metrics {sent} with evaluate=false" if sent else None)
        if not sent:
            return None
        if met["num-test"] == 0:
            return f"evaluation metrics {sent} from no test rows (num-test = 0)"
        return first_problem(
            metric_problem(rd, "test-acc", float, 0.0, 1.0),
            lambda: metric_problem(rd, "cluster", int, low=-1),
            lambda: metric_problem(rd, "backdoor-acc", float, 0.0, 1.0)
            if "backdoor-acc" in met else None)

    return check


def check_peers(batch: Sequence[int]) -> NodeCheck:
    """``query.emdcfl_embed``, given the node: the reply holds exactly the clouds of the peers
    it was sent (not the sender itself)."""

    def check(nid: int, rd: RecordDict) -> str | None:
        got = set(rd.array_records["src"])
        want = {str(n) for n in batch if n != nid}
        if got == want:
            return None
        if str(nid) in got:
            return f"'src' holds the sender's own id {nid} as a peer"
        return f"'src' has peers {sorted(got)}, expected the {len(want)} sent: {sorted(want)}"

    return check


def check_group() -> Check:
    """``query.emdcfl_group``: an integer ground-truth ``cluster`` ≥ 0."""

    def check(rd: RecordDict) -> str | None:
        return metric_problem(rd, "cluster", int, low=0)

    return check
