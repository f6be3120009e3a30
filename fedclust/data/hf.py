"""Hugging Face ``datasets`` as fedclust data: run config ``dataset="hf"`` and
``fedclust.simulate(dataset=<datasets.Dataset>, partitioner=…)``.

``hf.path`` is a folder written by ``Dataset.save_to_disk`` / ``DatasetDict.save_to_disk``
(read with ``datasets.load_from_disk``: no network), or a dataset name on the Hugging Face Hub
(``datasets.load_dataset``: needs the network the first time, then its cache). ``hf.split``
picks the split of a ``DatasetDict``. The features are ``hf.feature-columns`` (comma-separated;
empty: every numeric column but the label) or the pixels of ``hf.image-column`` (each image
flattened to one row of grey levels or RGB values, all images of one size); ``hf.label-column``
holds the ground truth (evaluation only) and is what label-skew partitioners split by.

Needs ``pip install 'fedclust[hf]'`` (``datasets``, ``flwr-datasets``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from fedclust.data.base import Dataset, DatasetError

INSTALL = "pip install 'fedclust[hf]'"


def _datasets() -> Any:
    try:
        import datasets
    except ImportError:
        raise DatasetError(f"dataset='hf' needs the Hugging Face datasets package, which is "
                           f"not installed. Fix: {INSTALL}") from None
    return datasets


def is_hf_dataset(obj: Any) -> bool:
    """A ``datasets.Dataset`` (told by its API: the package is imported only if it is)."""
    return hasattr(obj, "column_names") and hasattr(obj, "features") and hasattr(obj, "select")


def open_hf(path: str, split: str = "train") -> Any:
    """The ``datasets.Dataset`` at ``path`` (a ``save_to_disk`` folder, or a Hub name), split
    ``split`` of a ``DatasetDict``.

    Raises
    ------
    DatasetError
        Empty path, a folder ``save_to_disk`` did not write, a name the Hub cannot give (e.g.
        offline), or a missing split (the splits are listed).
    """
    if not path:
        raise DatasetError("run config dataset='hf' needs 'hf.path': a folder written by "
                           "datasets' save_to_disk, or a dataset name on the Hugging Face Hub. "
                           "Fix: --run-config 'hf.path=\"/path/to/saved\"'")
    datasets = _datasets()
    local = Path(path).expanduser()
    if local.exists():
        try:
            obj = datasets.load_from_disk(str(local))
        except (FileNotFoundError, ValueError, OSError) as exc:
            raise DatasetError(f"run config 'hf.path' = {path!r} is not a folder written by "
                               f"datasets' save_to_disk ({type(exc).__name__}). Fix: save the "
                               f"data with Dataset.save_to_disk(folder), or use "
                               f"dataset='files' for csv/npz files") from None
    else:
        try:
            obj = datasets.load_dataset(path, split=split or None)
        except Exception as exc:    # no network, no such dataset, gated …
            raise DatasetError(f"run config 'hf.path' = {path!r} is no local folder, and the "
                               f"Hugging Face Hub did not give it ({type(exc).__name__}: "
                               f"{' '.join(str(exc).split())[:200]}). Fix: a folder written by "
                               f"save_to_disk (works offline), or a Hub name with network "
                               f"access") from None
    if hasattr(obj, "keys") and not is_hf_dataset(obj):     # a DatasetDict
        if split not in obj:
            raise DatasetError(f"run config 'hf.split' = {split!r} is not a split of "
                               f"{path!r}. Allowed: {', '.join(sorted(obj))}")
        obj = obj[split]
    return obj


def _columns(text: str | Sequence[str] | None) -> list[str]:
    if text is None:
        return []
    if isinstance(text, str):
        return [c.strip() for c in text.split(",") if c.strip()]
    return [str(c) for c in text]


def _numeric(feature: Any) -> bool:
    dtype = str(getattr(feature, "dtype", ""))
    return dtype.startswith(("int", "uint", "float", "bool")) or type(feature).__name__ == \
        "ClassLabel"


def arrays_from_hf(ds: Any, label_column: str = "", feature_columns: str | Sequence[str] = "",
                   image_column: str = "", where: str = "hf"
                   ) -> tuple[NDArray[np.float64], np.ndarray | None, list[str]]:
    """Features, labels (None without a label column) and feature names of a
    ``datasets.Dataset``.

    The labels come back as the dataset holds them (numbers, booleans or text:
    :func:`fedclust.data.local.label_values`), never renumbered: a partition that holds classes
    {1, 2} keeps 1 and 2, so every client's labels mean the same (the coding is the node's,
    :func:`fedclust.data.local.label_codes`). A ``ClassLabel`` column gives its class numbers.

    Raises
    ------
    DatasetError
        A column that does not exist (the columns are listed), a non-numeric feature column
        (named), missing values, images of different sizes, both or neither of
        ``feature_columns`` and numeric columns.
    """
    columns = list(ds.column_names)
    wanted = _columns(feature_columns)
    for name, role in [*((c, "hf.feature-columns") for c in wanted),
                       (label_column, "hf.label-column"), (image_column, "hf.image-column")]:
        if name and name not in columns:
            raise DatasetError(f"{where}: {role} names {name!r}, which is not a column. "
                               f"Allowed: {', '.join(columns)}")
    if image_column and wanted:
        raise DatasetError(f"{where}: give hf.feature-columns or hf.image-column, not both")
    y = None
    if label_column:
        from fedclust.data.local import LocalDataError, label_values

        try:
            y = label_values(list(ds[label_column]), f"{where}: label column {label_column!r}")
        except LocalDataError as exc:
            raise DatasetError(f"{exc} (Dataset.filter drops rows)") from None
    if image_column:
        images = [np.asarray(img, dtype=np.float64) for img in ds[image_column]]
        shapes = {im.shape for im in images}
        if len(shapes) != 1:
            raise DatasetError(f"{where}: the images of {image_column!r} have {len(shapes)} "
                               f"sizes ({sorted(shapes)[:3]} …). Allowed: one size. Fix: resize "
                               f"them (Dataset.map)")
        x = np.stack(images).reshape(len(images), -1)
        return x, y, [f"{image_column}[{i}]" for i in range(x.shape[1])]
    if not wanted:
        wanted = [c for c in columns if c not in (label_column, image_column)
                  and _numeric(ds.features[c])]
        if not wanted:
            raise DatasetError(f"{where}: no numeric feature column (columns: "
                               f"{', '.join(columns)}). Fix: name them with hf.feature-columns, "
                               f"or an image column with hf.image-column")
    bad = [c for c in wanted if not _numeric(ds.features[c])]
    if bad:
        raise DatasetError(f"{where}: feature column(s) {bad} are not numeric ("
                           f"{', '.join(str(ds.features[c]) for c in bad)}). Allowed: numeric "
                           f"columns. Fix: leave them out of hf.feature-columns, or encode them")
    table = ds.select_columns(wanted).with_format("numpy")
    try:
        x = np.column_stack([np.asarray(table[c], dtype=np.float64) for c in wanted])
    except (TypeError, ValueError):
        raise DatasetError(f"{where}: a feature column has missing or non-scalar values. Fix: "
                           f"drop those rows or columns") from None
    if not np.isfinite(x).all():
        col = wanted[int(np.flatnonzero(~np.isfinite(x).all(axis=0))[0])]
        raise DatasetError(f"{where}: column {col!r} has missing or infinite values. Fix: drop "
                           f"or fill them")
    return x, y, wanted


def load_hf(cfg: dict[str, Any]) -> Dataset:
    """``dataset="hf"``: the ``hf.*`` keys (see the module docstring)."""
    from fedclust.common import setting

    ds = open_hf(str(setting(cfg, "hf.path")), str(setting(cfg, "hf.split")))
    x, y, names = arrays_from_hf(ds, str(setting(cfg, "hf.label-column")),
                                 str(setting(cfg, "hf.feature-columns")),
                                 str(setting(cfg, "hf.image-column")),
                                 where=f"run config hf.path={cfg.get('hf.path')!r}")
    if y is not None:      # one coding of the whole dataset, before it is partitioned
        y = np.unique(y, return_inverse=True)[1].reshape(-1).astype(np.int64)
    else:
        if cfg.get("evaluate") is True:     # the server's check (the nodes get no 'evaluate')
            raise DatasetError("run config dataset='hf' with evaluate=true needs the ground "
                               "truth: hf.label-column is empty. Fix: name the label column "
                               "(hf.label-column=\"label\"), or pass evaluate=false")
        y = np.zeros(len(x), dtype=np.int64)   # no ground truth (evaluate=false)
    return Dataset("hf", x, y, feature_names=names)


# ------------------------------------------------------------------ Flower Datasets inputs

def is_federated_dataset(obj: Any) -> bool:
    """A ``flwr_datasets.FederatedDataset`` (told by its API)."""
    return hasattr(obj, "load_partition") and hasattr(obj, "partitioners")


def is_dataset_dict(obj: Any) -> bool:
    """A ``datasets.DatasetDict`` (what ``load_dataset("csv", data_files=…)`` returns)."""
    return (isinstance(obj, Mapping) and len(obj) > 0
            and all(is_hf_dataset(v) for v in obj.values()))


def pick_split(obj: Any, split: str | None, where: str) -> Any:
    """Split ``split`` of a ``DatasetDict`` (its only split when ``split`` is None)."""
    names = sorted(obj.keys())
    if split is None:
        if len(names) != 1:
            raise DatasetError(f"{where}: the DatasetDict has splits {names}: say which one. "
                               f"Fix: split={names[0]!r}")
        split = names[0]
    if split not in obj:
        raise DatasetError(f"{where}: split={split!r} is not a split of the DatasetDict. "
                           f"Allowed: {', '.join(map(repr, names))}")
    return obj[split]


def _jsonable(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray) and value.size <= 1000:
        value = value.tolist()
    if isinstance(value, (list, tuple)) and all(isinstance(v, (bool, int, float, str))
                                                for v in value):
        return list(value)
    return repr(value)[:200]


def partitioner_record(partitioner: Any) -> dict[str, Any]:
    """A flwr-datasets partitioner as ``{"class": "<module>.<name>", "params": {…}}``: its
    constructor's parameters as it holds them (``_name`` or ``name`` attributes)."""
    import inspect

    cls = type(partitioner)
    params: dict[str, Any] = {}
    try:
        names = [n for n, prm in inspect.signature(cls.__init__).parameters.items()
                 if n != "self" and prm.kind not in (prm.VAR_POSITIONAL, prm.VAR_KEYWORD)]
    except (TypeError, ValueError):
        names = []
    for name in names:
        for attr in (f"_{name}", name):
            if attr in vars(partitioner):
                params[name] = _jsonable(vars(partitioner)[attr])
                break
    module = cls.__module__.split(".")
    # flwr_datasets.partitioner.dirichlet_partitioner -> the public flwr_datasets.partitioner
    public = ".".join(module[:2]) if module[0] == "flwr_datasets" else cls.__module__
    return {"class": f"{public}.{cls.__name__}", "params": params}


def dataset_record(ds: Any) -> dict[str, Any]:
    """What identifies a ``datasets.Dataset``: its name (builder, config), split, rows and
    fingerprint (a hash of its content and of every transform that made it)."""
    info = getattr(ds, "info", None)
    out = {"name": getattr(info, "dataset_name", None) or getattr(info, "builder_name", None),
           "config": getattr(info, "config_name", None),
           "split": None if getattr(ds, "split", None) is None else str(ds.split),
           "rows": int(ds.num_rows) if hasattr(ds, "num_rows") else None,
           "fingerprint": getattr(ds, "_fingerprint", None)}
    return {k: v for k, v in out.items() if v is not None}
