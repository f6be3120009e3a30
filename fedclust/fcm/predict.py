"""``fedclust predict`` for the FCM family (exact FCM and FedFCM): the run's federated scaling,
then FCM memberships to its final centers (FedFCM: at the chosen K).

:func:`predict_fcm` is what :func:`fedclust.predict.predict` calls for ``method`` ``exact-fcm``
(for ``fedfcm`` through :func:`fedclust.fedfcm.predict.predict_fedfcm`); columns
``row,cluster,u0,…,u<C−1>``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from fedclust.predict.base import FAR_FACTOR, FIX_RUN, PredictError, Prediction, check_width


def predict_fcm(run_dir: Path, summary: dict[str, Any], x: np.ndarray,
                options: dict[str, Any], m_key: str = "") -> Prediction:
    """FCM memberships (paper 004 eq. 3 / paper 003 eq. 2) to the run's final centers, in the
    run's federated scaling; ``m`` from the run config's ``m_key`` (default: exact FCM's
    ``fcm.m``; FedFCM: :func:`fedclust.fedfcm.predict.predict_fedfcm`)."""
    from fedclust import fcm
    from fedclust.data import scaling

    if options:
        raise PredictError(f"method {summary['method']} takes no options, got {sorted(options)}."
                           f" Allowed: none. Fix: leave out --cluster")
    centers, shift, scale, m = fcm_model(run_dir, summary, m_key)
    check_width(x, centers.shape[1], "centers have")
    scaled = scaling.apply(x, shift, scale)
    u = fcm.memberships(scaled, centers, m)
    labels = np.argmax(u, axis=1)
    table = np.column_stack([np.arange(len(x)), labels, u])
    header = ["row", "cluster"] + [f"u{i}" for i in range(centers.shape[0])]
    return Prediction(header, table, ["%d", "%d"] + ["%.17g"] * centers.shape[0],
                      {"n_clusters": int(centers.shape[0]),
                       "far_rows": far_rows(scaled, centers)})


def far_rows(scaled: np.ndarray, centers: np.ndarray) -> int:
    """How many rows (in the run's scaled space) lie farther from their nearest center than
    :data:`fedclust.predict.base.FAR_FACTOR` times the spread of the centers (their largest
    distance to each other; the centers lie inside the training data, so honest new rows stay
    within a few spreads): rows far outside the data the run was fitted on."""

    with np.errstate(over="ignore", invalid="ignore"):
        d2 = ((scaled ** 2).sum(axis=1)[:, None] - 2.0 * scaled @ centers.T
              + (centers ** 2).sum(axis=1)[None, :])
    d = np.sqrt(np.maximum(d2.min(axis=1), 0.0))
    spread = float(np.sqrt(((centers[:, None, :] - centers[None, :, :]) ** 2).sum(axis=2))
                   .max())
    if not spread > 0:
        spread = max(float(np.abs(centers).max()), 1.0)
    with np.errstate(invalid="ignore"):
        return int(np.sum(~(d <= FAR_FACTOR * spread)))


def fcm_model(run_dir: Path, summary: dict[str, Any], m_key: str = ""
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
    """The final centers ``(C, F)``, the scaling ``shift, scale`` ``(F,)`` and ``m`` of an FCM
    run folder, each checked: centers 2-D and finite, scaling of their width, finite, ``scale
    > 0``, ``m`` a number in ``(1, M_MAX]`` that does not underflow with ``C`` clusters
    (:func:`fedclust.fcm.fuzzifier_problem`: beyond it every membership is ``1/C`` and every
    row would get label 0)."""
    from fedclust.fcm import M_MAX, MAX_UNDERFLOW_DIGITS, fuzzifier_problem

    centers = _array(run_dir, "centers.npy")
    shift = _array(run_dir, "scaling_shift.npy")
    scale = _array(run_dir, "scaling_scale.npy")
    where = run_dir / "centers.npy"
    if centers.ndim != 2 or 0 in centers.shape:
        raise PredictError(f"{where} has shape {centers.shape}. Allowed: 2-D (clusters, "
                           f"features), not empty. Fix: {FIX_RUN}")
    if not np.isfinite(centers).all():
        raise PredictError(f"{where} holds NaN or infinite values. Allowed: finite centers. "
                           f"Fix: {FIX_RUN}")
    width = centers.shape[1]
    for name, arr in (("scaling_shift.npy", shift), ("scaling_scale.npy", scale)):
        if arr.shape != (width,):
            raise PredictError(f"{run_dir / name} has shape {arr.shape} but the centers have "
                               f"{width} features. Allowed: shape ({width},). Fix: {FIX_RUN}")
        if not np.isfinite(arr).all():
            raise PredictError(f"{run_dir / name} holds NaN or infinite values. Allowed: "
                               f"finite values. Fix: {FIX_RUN}")
    if not (scale > 0).all():
        raise PredictError(f"{run_dir / 'scaling_scale.npy'} holds {int((scale <= 0).sum())} "
                           f"value(s) <= 0 (rows are divided by it). Allowed: values > 0. "
                           f"Fix: {FIX_RUN}")
    from fedclust.fcm.keys import FCMSettings

    key = m_key or FCMSettings.m_key
    src = run_dir / ("predict.json" if summary.get("scope") == "client" else "summary.json")
    if key not in summary["config"]:
        raise PredictError(f"{src} has no {key!r} in its config. Allowed: the run's fuzzifier, "
                           f"a number in (1, {M_MAX:g}]. Fix: {FIX_RUN}")
    m = summary["config"][key]
    c = centers.shape[0]
    problem = (f"{m!r} is not a number" if isinstance(m, bool) or not isinstance(m, (int, float))
               else fuzzifier_problem(float(m), c))
    if problem is not None:
        raise PredictError(f"{src} gives {key} = {m!r}: {problem}. Allowed: a number m in "
                           f"(1, {M_MAX:g}] with m*log10(C) <= {MAX_UNDERFLOW_DIGITS:g} (C = {c} "
                           f"clusters here). Fix: {FIX_RUN}")
    return centers, shift, scale, float(m)


def _array(run_dir: Path, name: str) -> np.ndarray:
    """A float64 array saved by the run (no pickled objects), or a :class:`PredictError`."""
    path = run_dir / name
    if not path.is_file():
        raise PredictError(f"{run_dir} lacks {name}: the run did not finish or was made by an "
                           f"older fedclust. Allowed: the folder of a finished run. Fix: "
                           f"{FIX_RUN}")
    try:
        arr = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError) as exc:
        raise PredictError(f"{path} is not a numpy array file ({type(exc).__name__}): the file "
                           f"is damaged. Allowed: the {name} fedclust wrote. Fix: "
                           f"{FIX_RUN}") from None
    if not isinstance(arr, np.ndarray) or not (np.issubdtype(arr.dtype, np.integer)
                                               or np.issubdtype(arr.dtype, np.floating)):
        raise PredictError(f"{path} holds {getattr(arr, 'dtype', type(arr).__name__)} values. "
                           f"Allowed: real numbers. Fix: {FIX_RUN}")
    return arr.astype(np.float64)
