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

Rows are used as the clients' models saw them: float32 in [0, 1]; rows with any value above 1
are taken as 8-bit pixels and divided by 255, as a node does with its own file. Errors are
computed with the clients' torch thread count (``fedcref.torch-threads``): the same rows on
the same machine give the same labels bit for bit.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from fedclust.fedcref import autoencoder as ae
from fedclust.outputs import write_atomic

MODELS = "models.npz"                       # in a client's owner folder
COMMUNITY_MODELS = "community_models.npz"   # in the server's run folder


def unit_rows(x: NDArray) -> NDArray[np.float32]:
    """Rows as the models see them: float32 in [0, 1] (pixels above 1 are divided by 255)."""
    x = np.asarray(x, dtype=np.float32)
    x = x.reshape(len(x), -1)
    if x.size and x.max() > 1.0:
        x = x / 255.0
    return x.astype(np.float32, copy=False)


def save_models(path: Path, params: ae.Params, labels: NDArray) -> Path:
    """Write stacked models and the label each one gives (atomically)."""
    labels = np.asarray(labels, dtype=np.int64)
    assert len(labels) == ae.n_models(params), "one label per model"
    arrays = ae.to_numpy(params)
    return write_atomic(path, lambda fh: np.savez(fh, labels=labels, **arrays))


def load_models(path: Path) -> tuple[ae.Params, NDArray[np.int64]]:
    with np.load(path) as z:
        labels = np.asarray(z["labels"], dtype=np.int64)
        params = ae.from_numpy({k: z[k] for k in z.files if k != "labels"})
    return params, labels


def _checked_models(path: Path) -> tuple[ae.Params, NDArray[np.int64]]:
    """:func:`load_models` for ``fedclust predict``, checked (``W_l`` of shape ``(M, in, out)``
    chained from the row width back to it, ``b_l`` ``(M, 1, out)``, ``labels`` ``(M,)``
    ints, finite weights): a damaged file is a
    :class:`~fedclust.prediction.PredictError` naming what is wrong, never a traceback."""
    import zipfile

    from fedclust.prediction import PredictError

    fix = ("Fix: point RUN_DIR at the unchanged folder fedclust wrote, or run the federation "
           "again")

    def bad(what: str) -> PredictError:
        return PredictError(f"{path} {what}. Allowed: the stacked autoencoders fedclust wrote "
                            f"(W0, b0, …, labels). {fix}")

    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, AttributeError) as exc:
        raise bad(f"is not a readable .npz file ({type(exc).__name__})") from None
    layers = sum(1 for k in arrays if k.startswith("W"))
    names = {"labels"} | {f"{p}{i}" for i in range(layers) for p in "Wb"}
    if layers == 0 or set(arrays) != names:
        raise bad(f"holds the arrays {sorted(arrays)}")
    w = [arrays[f"W{i}"] for i in range(layers)]
    b = [arrays[f"b{i}"] for i in range(layers)]
    labels = arrays["labels"]
    m = w[0].shape[0] if w[0].ndim == 3 else -1
    shapes_ok = m > 0 and all(
        wi.ndim == 3 and bi.shape == (m, 1, wi.shape[2]) and wi.shape[0] == m
        and (i == 0 or wi.shape[1] == w[i - 1].shape[2])
        for i, (wi, bi) in enumerate(zip(w, b))) and w[-1].shape[2] == w[0].shape[1]
    if not shapes_ok:
        raise bad(f"holds models of inconsistent shapes {[x.shape for x in w]}")
    if labels.shape != (m,) or not np.issubdtype(labels.dtype, np.integer):
        raise bad(f"holds labels of shape {labels.shape} and type {labels.dtype} for {m} "
                  f"models")
    if not all(np.issubdtype(a.dtype, np.floating) and np.isfinite(a).all() for a in w + b):
        raise bad("holds weights that are not finite real numbers")
    return ae.from_numpy({k: v for k, v in arrays.items() if k != "labels"}), \
        np.asarray(labels, dtype=np.int64)


def threads_of(summary: dict[str, Any]) -> int:
    """The torch threads the clients computed errors with (``fedcref.torch-threads``)."""
    return int(summary.get("config", {}).get("fedcref.torch-threads", 1))


def assign(params: ae.Params, labels: NDArray, x: NDArray, threads: int | None = None
           ) -> NDArray[np.int64]:
    """The label of the model with the lowest reconstruction error, for every row of ``x``
    (already in [0, 1]).

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
    params, labels = _checked_models(path)
    check_width(x, int(params[0].shape[1]), "models take")
    threads = summary.get("config", {}).get("fedcref.torch-threads", 1)
    if isinstance(threads, bool) or not isinstance(threads, int) or not 1 <= threads <= 4096:
        raise PredictError(f"the config of {run_dir} gives fedcref.torch-threads = {threads!r}. "
                           f"Allowed: an int from 1 to 4096. Fix: point RUN_DIR at the "
                           f"unchanged folder fedclust wrote")
    rows = unit_rows(x)
    out = assign(params, labels, rows, threads)
    table = np.column_stack([np.arange(len(rows)), out])
    return Prediction(["row", "label"], table, ["%d", "%d"],
                      {"label": "local cluster" if client else "community",
                       "n_models": int(ae.n_models(params))})
