"""What the server accepts from a node, message by message, for EMD-CFL and its baselines. The
node side of each message is :mod:`client_apps.emdcfl_handlers`; the checks use the vocabulary
of :mod:`strategies.wire.replies`.

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
                           ``test-acc``,        ``evaluate=true``: in [0, 1]
                           ``backdoor-acc``
                           ``cluster``          ``evaluate=true``: an int ≥ −1 (−1: unknown)
``query.emdcfl_group``     ``cluster``          an int ≥ 0
=========================  ===================  ==============================================

A reply that fails a check is rejected with the returned reason, logged, and its node is
excluded from the phase and recorded (``history.jsonl`` ``dropped_nodes`` and
``excluded_nodes``, ``summary.json`` ``excluded_nodes``); the phase continues with the other
clients unless too few are left (:func:`strategies.common.require_honest`).

Every factory returns a :data:`~strategies.wire.replies.Check` or, where the node matters (what it
was sent, what it declared before), a :data:`~strategies.wire.replies.NodeCheck`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
from flwr.app import RecordDict

from strategies.wire.replies import (
    Check,
    NodeCheck,
    arrays_exactly,
    first_problem,
    metric_problem,
    read_array,
)

PUBLIC_KEY_BYTES = 32          # raw X25519 public key
GROWTH = 1e3                   # largest weight / largest weight sent, at least 1
COSINE_MAX = 2.0               # cosine costs 1 − cos lie in [0, 2], so does their EMD


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


def train_reply(shapes: Sequence[tuple[int, ...]], keygen: bool) -> Check:
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


def trained_reply(sent: Mapping[int, Sequence[np.ndarray]], declared: dict[int, int]
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


def ifca_reply(shapes: Sequence[tuple[int, ...]], k: int) -> Check:
    """``train.emdcfl_ifca``: model of the global shapes, ``num-examples`` ≥ 1, ``choice`` in
    ``0 … k−1``."""

    def check(rd: RecordDict) -> str | None:
        return first_problem(model_problem(rd, shapes),
                             lambda: metric_problem(rd, "num-examples", int, low=1),
                             lambda: metric_problem(rd, "choice", int, low=0, high=k - 1))

    return check


def embed_reply(members: Sequence[int], proj_dim: int, max_samples: int,
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


def pacfl_reply(rows: int, max_columns: int) -> Check:
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


def eval_reply() -> Check:
    """``evaluate.emdcfl_eval`` with ``evaluate=true``: ``num-test`` ≥ 0, ``test-acc`` in
    [0, 1], an integer ``cluster`` ≥ −1 and, when present, ``backdoor-acc`` in [0, 1]."""

    def check(rd: RecordDict) -> str | None:
        backdoor = ("metrics" in rd.metric_records
                    and "backdoor-acc" in rd.metric_records["metrics"])
        return first_problem(
            metric_problem(rd, "num-test", int, low=0),
            lambda: metric_problem(rd, "test-acc", float, 0.0, 1.0),
            lambda: metric_problem(rd, "cluster", int, low=-1),
            lambda: metric_problem(rd, "backdoor-acc", float, 0.0, 1.0) if backdoor else None)

    return check


def final_reply() -> Check:
    """``evaluate.emdcfl_eval`` with ``evaluate=false`` (the final message that hands every node
    its cluster model): an integer ``num-test`` ≥ 0."""

    def check(rd: RecordDict) -> str | None:
        return metric_problem(rd, "num-test", int, low=0)

    return check


def group_reply() -> Check:
    """``query.emdcfl_group``: an integer ground-truth ``cluster`` ≥ 0."""

    def check(rd: RecordDict) -> str | None:
        return metric_problem(rd, "cluster", int, low=0)

    return check
