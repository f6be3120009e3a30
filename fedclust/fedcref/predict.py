"""Apply a finished FedCRef run to rows: each row goes to the model that reconstructs it best.

Two folders can be given to ``fedclust predict`` (the run folder holds ``summary.json``, an
owner folder ``predict.json``, both with method ``fedcref``):

- a client's **owner folder** (``scope: "client"``): its ``models.npz`` holds the models its
  last refinement selected, one per non-empty local cluster; the label is the client's **local
  cluster id** (0..K_i−1), the label space of its ``assignments.csv``. The client's own rows
  predict exactly to the labels it received at the end of the run.
- the server's **run folder**: ``community_models.npz`` holds the final iteration's community
  models; the label is the **community id** of that iteration (the ids in the clients'
  ``result.json``). A run that ended without any community has no such file.

Both files have the same layout: the stacked autoencoder weights ``W0, b0, …, W<L−1>,
b<L−1>`` (model i: ``h ← relu(h @ W_l[i] + b_l[i])``, sigmoid on the last layer) and
``labels`` (the label model i gives). A row's error is the mean squared difference between
the row and its reconstruction; the lowest error wins (the lower model index on a tie).

A client that refined with ``fedcref.refine=gated`` or ``covered`` also saves its gate: its
own cluster models (``gate.W0 …``) and ``gate.allow`` (one row per own model, one column per
model above). A row first finds its best own model; it may then go only to the models that
row of ``allow`` permits.

Rows are used as the clients' models saw them: float32 in [0, 1]; rows with any value above 1
are taken as 8-bit pixels and divided by 255, as a node does with its own file. Errors are
computed with the clients' torch thread count (``fedcref.torch-threads``): the same rows on
the same machine give the same labels bit for bit.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from fedclust.fedcref import autoencoder as ae

MODELS = "models.npz"                       # in a client's owner folder
COMMUNITY_MODELS = "community_models.npz"   # in the server's run folder


def unit_rows(x: NDArray) -> NDArray[np.float32]:
    """Rows as the models see them: float32 in [0, 1] (pixels above 1 are divided by 255)."""
    x = np.asarray(x, dtype=np.float32)
    x = x.reshape(len(x), -1)
    if x.size and x.max() > 1.0:
        x = x / 255.0
    return x.astype(np.float32, copy=False)


GATE = "gate."


def save_models(path: Path, params: ae.Params, labels: NDArray, gate: ae.Params | None = None,
                allow: NDArray | None = None) -> Path:
    """Write stacked models, the label each one gives and the optional gate (atomically)."""
    labels = np.asarray(labels, dtype=np.int64)
    assert len(labels) == ae.n_models(params), "one label per model"
    extra: dict[str, NDArray] = {}
    if gate is not None and ae.n_models(gate):
        allow = np.asarray(allow, dtype=bool)
        assert allow.shape == (ae.n_models(gate), len(labels)), "one gate row per own model"
        extra = {GATE + k: v for k, v in ae.to_numpy(gate).items()}
        extra[GATE + "allow"] = allow
    tmp = path.with_name(path.name + ".part.npz")
    np.savez(tmp, labels=labels, **ae.to_numpy(params), **extra)
    os.replace(tmp, path)
    return path


def load_models(path: Path) -> tuple[ae.Params, NDArray[np.int64], ae.Params,
                                     NDArray[np.bool_] | None]:
    """(models, labels, gate models (empty: no gate), gate.allow or None)."""
    with np.load(path) as z:
        labels = np.asarray(z["labels"], dtype=np.int64)
        params = ae.from_numpy({k: z[k] for k in z.files
                                if k != "labels" and not k.startswith(GATE)})
        gate = ae.from_numpy({k[len(GATE):]: z[k] for k in z.files
                              if k.startswith(GATE) and k != GATE + "allow"})
        allow = np.asarray(z[GATE + "allow"], dtype=bool) if GATE + "allow" in z.files else None
    return params, labels, gate, allow


def threads_of(summary: dict[str, Any]) -> int:
    """The torch threads the clients computed errors with (``fedcref.torch-threads``)."""
    return int(summary.get("config", {}).get("fedcref.torch-threads", 1))


def assign(params: ae.Params, labels: NDArray, x: NDArray, threads: int | None = None,
           gate: ae.Params | None = None, allow: NDArray | None = None) -> NDArray[np.int64]:
    """The label of the model with the lowest reconstruction error, for every row of ``x``
    (already in [0, 1]); with a gate, the lowest among the models that the row of ``allow``
    of the row's best gate model permits.

    ``threads``: compute the errors with this many torch threads (restored after). The
    matrix products round differently with another thread count, which can move a row whose
    two best models are within rounding; the clients' count reproduces their labels.
    """
    import torch

    before = torch.get_num_threads()
    if threads is not None and threads != before:
        torch.set_num_threads(int(threads))
    try:
        errors = ae.errors(params, x)
        if gate is not None and ae.n_models(gate) and allow is not None:
            best_own = np.argmin(ae.errors(gate, x), axis=0)
            errors = np.where(np.asarray(allow, dtype=bool)[best_own].T, errors, np.inf)
    finally:
        if torch.get_num_threads() != before:
            torch.set_num_threads(before)
    return np.asarray(labels, dtype=np.int64)[np.argmin(errors, axis=0)]


def predict_rows(run_dir: Path, summary: dict[str, Any], x: np.ndarray,
                 options: dict[str, Any]):
    """``fedclust predict`` for FedCRef: ``row,label`` (label space: see the module docstring)."""
    from fedclust.prediction import PredictError, Prediction, check_width

    if options:
        raise PredictError(f"method fedcref takes no options, got {sorted(options)}")
    client = summary.get("scope") == "client"
    path = Path(run_dir) / (MODELS if client else COMMUNITY_MODELS)
    if not path.is_file():
        if client:
            raise PredictError(f"{path} does not exist: this client never finished a "
                               f"refinement, so it has no models to apply")
        raise PredictError(
            f"{path} does not exist: the run ended without any community (or was made by an "
            f"older fedclust), so the server holds no models. Predict with a client's owner "
            f"folder instead (<run dir>/clients/<i>/ in simulation)")
    params, labels, gate, allow = load_models(path)
    if not ae.n_models(params):
        raise PredictError(f"{path} holds no models")
    check_width(x, int(params[0].shape[1]), "models take")
    rows = unit_rows(x)
    out = assign(params, labels, rows, threads_of(summary), gate, allow)
    table = np.column_stack([np.arange(len(rows)), out])
    return Prediction(["row", "label"], table, ["%d", "%d"],
                      {"label": "local cluster" if client else "community",
                       "n_models": int(ae.n_models(params))})
