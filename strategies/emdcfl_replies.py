"""Checks of client replies for EMD-CFL and its baselines (``validate=`` of ``send_and_collect``).

Lives in strategies/ (not fedclust/) because it reads Flower RecordDicts.

A reply that fails a check is rejected with the returned reason, logged, and its node is
recorded in ``history.jsonl`` ``dropped_nodes``; the phase continues with the other clients.
Each check covers every record, key, dtype, shape and value range that the server loop reads
afterwards, so that no malformed reply reaches FedAvg, the EMD matrix or the metrics.

Every factory returns a ``RecordDict -> str | None`` (``None``: the reply is usable).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
from flwr.app import RecordDict

Check = Callable[[RecordDict], str | None]
PUBLIC_KEY_BYTES = 32          # raw X25519 public key


def _array(rd: RecordDict, record: str, key: str, dtype: str, shape: tuple[int, ...] | None
           ) -> tuple[np.ndarray | None, str | None]:
    """The array ``record.key`` if it exists, has ``dtype`` (and ``shape``) and is finite."""
    if record not in rd.array_records:
        return None, f"missing array record '{record}'"
    rec = rd.array_records[record]
    if key not in rec:
        return None, f"'{record}' lacks array '{key}'"
    arr = rec[key].numpy()
    if arr.dtype != np.dtype(dtype):
        return None, f"'{record}.{key}' has dtype {arr.dtype}, expected {dtype}"
    if shape is not None and tuple(arr.shape) != tuple(shape):
        return None, f"'{record}.{key}' has shape {tuple(arr.shape)}, expected {tuple(shape)}"
    if arr.dtype.kind == "f" and not np.all(np.isfinite(arr)):
        return None, f"'{record}.{key}' has non-finite values"
    return arr, None


def model_problem(rd: RecordDict, shapes: Sequence[tuple[int, ...]], record: str = "model"
                  ) -> str | None:
    """``record`` holds exactly the arrays ``"0" … "L-1"``, float32, with the global shapes."""
    if record not in rd.array_records:
        return f"missing array record '{record}'"
    keys = set(rd.array_records[record])
    wanted = {str(i) for i in range(len(shapes))}
    if keys != wanted:
        return (f"'{record}' has {len(keys)} arrays {sorted(keys)[:4]}…, expected the "
                f"{len(shapes)} arrays '0'…'{len(shapes) - 1}' of the global model")
    for i, shape in enumerate(shapes):
        _, problem = _array(rd, record, str(i), "float32", tuple(shape))
        if problem:
            return problem
    return None


def metric_problem(rd: RecordDict, name: str, kind: type, low: float | None = None,
                   high: float | None = None) -> str | None:
    """MetricRecord ``metrics`` has ``name``: an ``int`` (``kind=int``) or a finite number
    (``kind=float``), inside ``[low, high]`` when given."""
    if "metrics" not in rd.metric_records:
        return "missing metric record 'metrics'"
    rec = rd.metric_records["metrics"]
    if name not in rec:
        return f"'metrics' lacks '{name}'"
    value = rec[name]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"'metrics.{name}' = {value!r} is not a number"
    if kind is int and not isinstance(value, int):
        return f"'metrics.{name}' = {value!r} is not an int"
    if not math.isfinite(value):
        return f"'metrics.{name}' = {value!r} is not finite"
    if (low is not None and value < low) or (high is not None and value > high):
        return f"'metrics.{name}' = {value!r} is outside [{low}, {high}]"
    return None


def first_problem(*problems: str | None) -> str | None:
    return next((p for p in problems if p), None)


def train_reply(shapes: Sequence[tuple[int, ...]], keygen: bool) -> Check:
    """``train.emdcfl_local``: model of the global shapes, ``num-examples`` ≥ 1, finite
    ``train-loss`` and, with ``keygen``, a 32-byte uint8 public key ``pub.key``."""

    def check(rd: RecordDict) -> str | None:
        return first_problem(
            model_problem(rd, shapes),
            metric_problem(rd, "num-examples", int, low=1),
            metric_problem(rd, "train-loss", float),
            _array(rd, "pub", "key", "uint8", (PUBLIC_KEY_BYTES,))[1] if keygen else None)

    return check


def ifca_reply(shapes: Sequence[tuple[int, ...]], k: int) -> Check:
    """``train.emdcfl_ifca``: model of the global shapes, ``num-examples`` ≥ 1, ``choice`` in
    ``0 … k−1``."""

    def check(rd: RecordDict) -> str | None:
        return first_problem(model_problem(rd, shapes),
                             metric_problem(rd, "num-examples", int, low=1),
                             metric_problem(rd, "choice", int, low=0, high=k - 1))

    return check


def embed_reply(members: Sequence[int], proj_dim: int, max_samples: int,
                all_but_sender: bool = True) -> Check:
    """``query.emdcfl_embed``: array records ``src`` and ``tgt`` each hold one float32
    ``(n, proj_dim)`` array per other member (``1 ≤ n ≤ max_samples``), finite, and metric
    record ``reference`` one finite ``W(train, val) ≥ 0`` per member, all under the same peer
    ids: all members but one (the sender; checked by the caller, who knows it), or, with
    ``all_but_sender=False`` (peers sent in batches), a non-empty subset of the members (the
    caller checks the exact set it sent). Nothing else: no own-validation cloud."""
    ids = {str(m) for m in members}

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
                arr, problem = _array(rd, record, key, "float32", None)
                if problem:
                    return problem
                if arr.ndim != 2 or arr.shape[1] != proj_dim or not 1 <= len(arr) <= max_samples:
                    return (f"'{record}.{key}' has shape {tuple(arr.shape)}, expected "
                            f"(1…{max_samples}, {proj_dim})")
        for key in sorted(peers):
            value = rd.metric_records["reference"][key]
            if (isinstance(value, bool) or not isinstance(value, (int, float))
                    or not math.isfinite(value) or value < 0):
                return f"'reference.{key}' = {value!r} is not a finite distance >= 0"
        return None

    return check


def pacfl_reply(rows: int, max_columns: int) -> Check:
    """``query.emdcfl_pacfl``: ``subspace.u`` a finite float32 ``(rows, k)`` array with
    ``1 ≤ k ≤ max_columns`` (basis vectors per class × classes), columns of unit norm."""

    def check(rd: RecordDict) -> str | None:
        arr, problem = _array(rd, "subspace", "u", "float32", None)
        if problem:
            return problem
        if arr.ndim != 2 or arr.shape[0] != rows or not 1 <= arr.shape[1] <= max_columns:
            return (f"'subspace.u' has shape {tuple(arr.shape)}, expected ({rows}, "
                    f"1…{max_columns})")
        if not np.allclose(np.linalg.norm(arr.astype(np.float64), axis=0), 1.0, atol=1e-3):
            return "'subspace.u' columns are not unit vectors"
        return None

    return check


def eval_reply() -> Check:
    """``evaluate.emdcfl_eval`` with ``evaluate=true``: ``test-acc`` in [0, 1], integer
    ``cluster`` and, when present, ``backdoor-acc`` in [0, 1]."""

    def check(rd: RecordDict) -> str | None:
        backdoor = ("metrics" in rd.metric_records
                    and "backdoor-acc" in rd.metric_records["metrics"])
        return first_problem(
            metric_problem(rd, "test-acc", float, 0.0, 1.0),
            metric_problem(rd, "cluster", int),
            metric_problem(rd, "backdoor-acc", float, 0.0, 1.0) if backdoor else None)

    return check


def final_reply() -> Check:
    """``evaluate.emdcfl_eval`` with ``evaluate=false`` (the final message that hands every node
    its cluster model): an integer ``num-test`` ≥ 0."""

    def check(rd: RecordDict) -> str | None:
        return metric_problem(rd, "num-test", int, low=0)

    return check


def group_reply() -> Check:
    """``query.emdcfl_group``: an integer ground-truth ``cluster``."""

    def check(rd: RecordDict) -> str | None:
        return metric_problem(rd, "cluster", int)

    return check
