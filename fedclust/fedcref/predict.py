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


GATE = "gate."


def save_models(path: Path, params: ae.Params, labels: NDArray, gate: ae.Params | None = None,
                allow: NDArray | None = None) -> Path:
    """Write stacked models, the label each one gives and the optional gate (atomically)."""
    labels = np.asarray(labels, dtype=np.int64)
    assert len(labels) == ae.n_models(params), "one label per model"
    arrays = ae.to_numpy(params)
    if gate is not None and ae.n_models(gate):
        allow = np.asarray(allow, dtype=bool)
        assert allow.shape == (ae.n_models(gate), len(labels)), "one gate row per own model"
        arrays.update({GATE + k: v for k, v in ae.to_numpy(gate).items()})
        arrays[GATE + "allow"] = allow
    return write_atomic(path, lambda fh: np.savez(fh, labels=labels, **arrays))


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


def _checked_models(path: Path) -> tuple[ae.Params, NDArray[np.int64], ae.Params,
                                         NDArray[np.bool_] | None]:
    """:func:`load_models` for ``fedclust predict``, checked (``W_l`` of shape ``(M, in, out)``
    chained from the row width back to it, ``b_l`` ``(M, 1, out)``, ``labels`` ``(M,)``
    ints, finite weights; a gate, when present, likewise, with ``gate.allow`` of shape
    ``(own models, M)``): a damaged file is a :class:`~fedclust.predict.base.PredictError`
    naming what is wrong, never a traceback."""
    import zipfile

    from fedclust.predict.base import PredictError

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
    gate = {k[len(GATE):]: v for k, v in arrays.items() if k.startswith(GATE)}
    main = {k: v for k, v in arrays.items() if not k.startswith(GATE)}
    if "labels" not in main:
        raise bad(f"holds the arrays {sorted(arrays)}")
    w, b = _stack_shapes(main, bad, "")
    m = w[0].shape[0]
    labels = main["labels"]
    if labels.shape != (m,) or not np.issubdtype(labels.dtype, np.integer):
        raise bad(f"holds labels of shape {labels.shape} and type {labels.dtype} for {m} "
                  f"models")
    allow = None
    gate_params: ae.Params = []
    if gate:
        if "allow" not in gate:
            raise bad(f"holds a gate without '{GATE}allow'")
        allow = gate.pop("allow")
        gw, _ = _stack_shapes({**gate, "labels": None}, bad, GATE)
        if gw[0].shape[1] != w[0].shape[1]:
            raise bad(f"holds gate models of width {gw[0].shape[1]} for models of width "
                      f"{w[0].shape[1]}")
        if allow.dtype != bool or allow.shape != (gw[0].shape[0], m):
            raise bad(f"holds '{GATE}allow' of shape {allow.shape} and type {allow.dtype}; "
                      f"expected booleans of shape {(gw[0].shape[0], m)}")
        gate_params = ae.from_numpy(gate)
    return (ae.from_numpy({k: v for k, v in main.items() if k != "labels"}),
            np.asarray(labels, dtype=np.int64), gate_params, allow)


def _stack_shapes(arrays: dict[str, Any], bad: Any, prefix: str
                  ) -> tuple[list[NDArray], list[NDArray]]:
    """The ``W_l``, ``b_l`` of one stack of autoencoders, checked (names, chained shapes,
    finite real weights); ``bad(what)`` makes the error."""
    layers = sum(1 for k in arrays if k.startswith("W"))
    names = {"labels"} | {f"{p}{i}" for i in range(layers) for p in "Wb"}
    if layers == 0 or set(arrays) != names:
        raise bad(f"holds the arrays {sorted(prefix + k for k in arrays if k != 'labels')}")
    w = [arrays[f"W{i}"] for i in range(layers)]
    b = [arrays[f"b{i}"] for i in range(layers)]
    m = w[0].shape[0] if w[0].ndim == 3 else -1
    shapes_ok = m > 0 and all(
        wi.ndim == 3 and bi.shape == (m, 1, wi.shape[2]) and wi.shape[0] == m
        and (i == 0 or wi.shape[1] == w[i - 1].shape[2])
        for i, (wi, bi) in enumerate(zip(w, b, strict=True))) and w[-1].shape[2] == w[0].shape[1]
    if not shapes_ok:
        raise bad(f"holds {prefix}models of inconsistent shapes {[x.shape for x in w]}")
    if not all(np.issubdtype(a.dtype, np.floating) and np.isfinite(a).all() for a in w + b):
        raise bad(f"holds {prefix}weights that are not finite real numbers")
    return w, b


def _threads(summary: dict[str, Any]) -> Any:
    """``fedcref.torch-threads`` of a run's saved config (its default if the run did not
    record it)."""
    from fedclust.fedcref.keys import FedCRefSettings

    key = FedCRefSettings.key_of("torch_threads")
    return summary.get("config", {}).get(key, FedCRefSettings.torch_threads)


def threads_of(summary: dict[str, Any]) -> int:
    """The torch threads the clients computed errors with (``fedcref.torch-threads``)."""
    return int(_threads(summary))


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
    """``fedclust predict`` for FedCRef: ``row,cluster`` (cluster space: see the module
    docstring)."""
    from fedclust.predict.base import PredictError, Prediction, check_width

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
    params, labels, gate, allow = _checked_models(path)
    check_width(x, int(params[0].shape[1]), "models take")
    threads = _threads(summary)
    if isinstance(threads, bool) or not isinstance(threads, int) or not 1 <= threads <= 4096:
        raise PredictError(f"the config of {run_dir} gives fedcref.torch-threads = {threads!r}. "
                           f"Allowed: an int from 1 to 4096. Fix: point RUN_DIR at the "
                           f"unchanged folder fedclust wrote")
    rows = unit_rows(x)
    out = assign(params, labels, rows, threads, gate, allow)
    table = np.column_stack([np.arange(len(rows)), out])
    return Prediction(["row", "cluster"], table, ["%d", "%d"],
                      {"cluster": "local cluster" if client else "community",
                       "n_models": int(ae.n_models(params))})
