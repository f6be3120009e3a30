"""EMD-CFL results on disk and ``fedclust predict`` for EMD-CFL runs.

Files (all written at the end of a run, never sent anywhere):

- server run folder: ``models/cluster_<c>.pt`` — the final model of every cluster ``c`` as a
  torch ``state_dict`` of :class:`fedclust.emdcfl.model.CNN` — and ``models/clusters.json``
  (written last): ``{"spec": {in_channels, size, c1, c2, embed_dim, num_classes}, "clusters":
  {"<c>": {"file": "cluster_<c>.pt", "clients": [node ids]}}}``;
- a client's owner folder: ``model.pt`` (its cluster's final model, same format),
  ``predict.json`` (``scope: "client"``: method, the config keys that shape the network, the
  spec, its cluster) and ``result.json`` (last).

:func:`predict_rows` is what :func:`fedclust.predict.predict` calls for ``method == "emdcfl"``.
"""

from __future__ import annotations

import dataclasses
import json
import pickle
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedclust.emdcfl.keys import model_spec
from fedclust.emdcfl.model import (
    ModelSpec,
    Weights,
    predict_classes,
    state_dict,
    weights_from_state_dict,
)
from fedclust.outputs import make_dirs, write_atomic, write_json
from fedclust.predict.base import PredictError, Prediction, check_width

MODELS_DIR = "models"
INDEX = "clusters.json"
OWNER_MODEL = "model.pt"
# run-config keys a data owner's predict.json keeps: they fix the network's shape
SPEC_KEYS = ("dataset", "emdcfl.algorithm", "emdcfl.conv1", "emdcfl.conv2", "emdcfl.embed-dim")


def spec_dict(spec: ModelSpec) -> dict[str, int]:
    return dataclasses.asdict(spec)


def save_model(path: Path, weights: Weights) -> Path:
    """``torch.save`` the weights as a CNN ``state_dict``, atomically."""
    state = state_dict(weights)
    return write_atomic(path, lambda fh: torch.save(state, fh))


def load_model(path: Path) -> Weights:
    """The weight arrays of a saved ``state_dict`` (:func:`save_model`).

    Raises
    ------
    PredictError
        The file is missing or not an EMD-CFL CNN ``state_dict``.
    """
    if not path.is_file():
        raise PredictError(f"{path} does not exist: the run did not finish, or was made by an "
                           f"older fedclust that did not save its models")
    try:
        return weights_from_state_dict(torch.load(path, map_location="cpu", weights_only=True))
    except (ValueError, RuntimeError, EOFError, pickle.UnpicklingError, KeyError, TypeError,
            AttributeError, OSError) as exc:
        raise PredictError(f"{path} is not an EMD-CFL model ({type(exc).__name__}: "
                           f"{' '.join(str(exc).split())[:200]}). Allowed: the model file "
                           f"fedclust wrote. Fix: {_FIX}") from None


def save_cluster_models(run_dir: str | Path, spec: ModelSpec, models: Mapping[int, Weights],
                        members: Mapping[int, list[int]]) -> Path:
    """Server side: every cluster's final model and ``models/clusters.json`` (last)."""
    folder = make_dirs(Path(run_dir) / MODELS_DIR)
    clusters = {}
    for c in sorted(models):
        name = f"cluster_{int(c)}.pt"
        save_model(folder / name, models[c])
        clusters[str(int(c))] = {"file": name, "clients": sorted(int(n) for n in members[c])}
    return write_json(folder / INDEX, {"spec": spec_dict(spec), "clusters": clusters})


_FIX = "point RUN_DIR at the unchanged folder fedclust wrote, or run the federation again"


def _plain_name(value: Any, where: Path, what: str) -> str:
    """A file name from a run's JSON: one plain name inside the folder, nothing else."""
    if not isinstance(value, str) or not value or value in (".", "..") or "/" in value \
            or "\\" in value:
        raise PredictError(f"{where} names {what} {value!r}. Allowed: a file name inside the "
                           f"folder. Fix: {_FIX}")
    return value


def _spec(stored: Mapping[str, Any] | None, config: Mapping[str, Any], where: Path) -> ModelSpec:
    if stored:
        try:
            spec = ModelSpec(**{k: int(v) for k, v in stored.items()})
        except (TypeError, ValueError, AttributeError):
            raise PredictError(f"{where} has a damaged model shape (spec) {stored!r}. Allowed: "
                               f"the spec fedclust wrote. Fix: {_FIX}") from None
        if min(dataclasses.astuple(spec)) < 1:
            raise PredictError(f"{where} has a model shape (spec) with a value < 1: "
                               f"{stored!r}. Allowed: positive sizes. Fix: {_FIX}")
        return spec
    try:
        return model_spec(config)
    except KeyError as exc:
        raise PredictError(f"{where} names no model shape (spec) and its config lacks "
                           f"{exc}: the run was made by an older fedclust") from exc


def _owner_model(run_dir: Path, summary: Mapping[str, Any], want: Any
                 ) -> tuple[int, Path, ModelSpec]:
    own = summary.get("cluster")
    if isinstance(own, bool) or not isinstance(own, int):
        raise PredictError(f"{run_dir / 'predict.json'} names cluster {own!r}. Allowed: the int "
                           f"fedclust wrote. Fix: {_FIX}")
    if want is not None and int(want) != own:
        raise PredictError(f"{run_dir} is a data owner's folder and holds only the model of its "
                           f"own cluster {own}; pass cluster={own} or no cluster, or point "
                           f"predict at the server's run folder for cluster {int(want)}")
    spec = _spec(summary.get("spec"), summary.get("config", {}), run_dir / "predict.json")
    name = _plain_name(summary.get("model", OWNER_MODEL), run_dir / "predict.json", "model")
    return own, run_dir / name, spec


def _server_model(run_dir: Path, summary: Mapping[str, Any], want: Any
                  ) -> tuple[int, Path, ModelSpec]:
    index_path = run_dir / MODELS_DIR / INDEX
    if not index_path.is_file():
        raise PredictError(f"{run_dir} lacks {MODELS_DIR}/{INDEX}: the run did not finish or "
                           f"was made by an older fedclust that did not save its models")
    try:
        index = json.loads(index_path.read_text(encoding="utf-8"))
        clusters = index["clusters"]
        available = sorted(int(c) for c in clusters)
        files = {int(c): _plain_name(v["file"], index_path, "model file")
                 for c, v in clusters.items()}
    except PredictError:
        raise
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        raise PredictError(f"{index_path} is damaged (not the JSON index of the cluster models "
                           f"fedclust wrote). Allowed: that index. Fix: {_FIX}") from None
    if not available:
        raise PredictError(f"{index_path} lists no cluster model. Allowed: the index fedclust "
                           f"wrote. Fix: {_FIX}")
    if want is None:
        if len(available) != 1:
            raise PredictError(
                f"the run in {run_dir} has {len(available)} clusters {available}: pass the "
                f"cluster whose model should predict, e.g. cluster={available[0]} "
                f"(CLI: --cluster {available[0]}); a data owner's cluster is in its "
                f"result.json and in the run's summary ('clusters', by client)")
        cluster = available[0]
    else:
        try:
            cluster = int(want)
        except (TypeError, ValueError):
            cluster = None
        if cluster not in available:
            raise PredictError(f"cluster={want!r} is not a cluster of the run in {run_dir}. "
                               f"Allowed: one of {available}")
    spec = _spec(index.get("spec"), summary.get("config", {}), index_path)
    return cluster, run_dir / MODELS_DIR / files[cluster], spec


def rows_to_images(x: np.ndarray, spec: ModelSpec) -> tuple[np.ndarray, str]:
    """Flattened rows → images ``(N, H, W)`` (grey) or ``(N, H, W, 3)`` (RGB, channels last)
    in 0…255, and the pixel scale found.

    Rows whose values all lie in [0, 1] (an image folder, or images stored as fractions) are
    multiplied by 255; other rows are taken as 0…255 pixels, as the run's images were.
    """
    side, channels = spec.size, spec.in_channels
    kind = "grey" if channels == 1 else f"{channels}-channel, channels last"
    check_width(x, side * side * channels,
                f"model input ({side}×{side} {kind} images) has")
    x = np.asarray(x, dtype=np.float64)
    if not np.isfinite(x).all():
        raise PredictError("the rows hold NaN or infinite values; pixels must be finite")
    unit = bool(x.size) and float(x.min()) >= 0.0 and float(x.max()) <= 1.0
    if unit:
        x = x * 255.0
    shape = (len(x), side, side) if channels == 1 else (len(x), side, side, channels)
    return x.reshape(shape), "0-1" if unit else "0-255"


def predict_rows(run_dir: Path, summary: dict[str, Any], x: np.ndarray,
                 options: dict[str, Any]) -> Prediction:
    """Class predictions of one cluster's final model; ``row,label`` (label = class).

    ``run_dir`` is either the server's run folder (``options["cluster"]`` picks the cluster;
    required when the run has more than one) or a data owner's folder (its own cluster's
    ``model.pt``; no option needed).

    Raises
    ------
    PredictError
        Unknown option, missing or unknown cluster, missing model files, rows of the wrong
        width.
    """
    unknown = sorted(set(options) - {"cluster"})
    if unknown:
        raise PredictError(f"method emdcfl takes only the option 'cluster', got {unknown}")
    want = options.get("cluster")
    if summary.get("scope") == "client":
        cluster, path, spec = _owner_model(run_dir, summary, want)
    else:
        cluster, path, spec = _server_model(run_dir, summary, want)
    images, scale = rows_to_images(x, spec)
    weights = load_model(path)
    labels = predict_classes(spec, weights, images)
    table = np.column_stack([np.arange(len(labels)), labels])
    return Prediction(["row", "label"], table, ["%d", "%d"],
                      {"cluster": cluster, "model": str(path), "pixel_scale": scale})
