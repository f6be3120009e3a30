"""The run-config keys every method shares (:class:`CommonSettings`: the data, the clients,
the seed, where the results go, how long to wait), and :func:`common`, how a method's Settings
field holds one of them. This module imports only :mod:`fedclust.schema`."""

from __future__ import annotations

import errno
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from fedclust.schema import Key, KeyedSettings, param, ref, settings


def _csv_floats(value: str) -> str | None:
    if value == "":
        return None
    try:
        [float(v) for v in value.split(",")]
    except ValueError:
        return "expected comma-separated numbers, e.g. '0.3,0.7'"
    return None


def _csv_ints(value: str) -> str | None:
    if value == "":
        return None
    try:
        sizes = [int(v) for v in value.split(",")]
    except ValueError:
        return "expected comma-separated whole numbers, e.g. '100,200,300'"
    return None if min(sizes) >= 1 else "every size must be at least 1"


SEED_MAX = 2**32 - 1   # scikit-learn's random_state and numpy's RandomState stop here


def _is_link_loop(path: Path) -> bool:
    try:
        os.stat(path)
    except OSError as exc:
        return exc.errno == errno.ELOOP
    return False


def _folder_path(value: str) -> str | None:
    """``output-dir`` must be a folder or a path that can become one: not an existing file, and
    not below one (checked here, before any node is asked anything)."""
    if value == "":
        return None
    path = Path(value).expanduser()
    for part in (path, *path.parents):
        if part.is_symlink() and _is_link_loop(part):
            what = "it" if part == path else f"{str(part)!r}"
            return (f"{what} is a symbolic link loop (following its links comes back to a "
                    f"link already seen), not a folder: point output-dir at a real folder")
        if part.exists() or part.is_symlink():
            if part.is_dir():
                return None
            what = "it" if part == path else f"{str(part)!r}"
            return (f"{what} is an existing file, not a folder: results need a folder "
                    f"(new, empty, or of an earlier run with overwrite=true)")
    return None


@settings()
class CommonSettings(KeyedSettings):
    """The run-config keys every method shares: the data, the clients, the seed, where the
    results go, how long to wait. Each field declares its key (:func:`fedclust.schema.param`);
    a method's Settings refer to those it uses (:func:`common`)."""

    method: str = param("exact-fcm", "federated clustering method",
                        choices=("exact-fcm", "fedfcm", "fedcref", "emdcfl"))
    dataset: str = param("blobs", "dataset name (see docs/datasets.md)")
    num_clients: int = param(0, "number of clients; 0 = as many as the engine has (simulation: its "
                             "SuperNodes, each partition partition-id of num-partitions; "
                             "deployment: the connected nodes; dataset=files: one per file)", low=0,
                             high=10_000)
    seed: int = param(0, "master random seed (NumPy and scikit-learn take seeds below 2**32)",
                      low=0, high=SEED_MAX)
    output_dir: str = param("", "directory for summary.json, history.jsonl, arrays (empty: "
                            "~/fedclust-runs/<method>/<dataset>-seed<seed>-<time>)",
                            check=_folder_path)
    overwrite: bool = param(False, "reuse the output-dir of an earlier fedclust run: exactly what "
                            "that run wrote (its .fedclust-manifest.json) is removed first, and "
                            "anything else in the folder refuses the run; false: a non-empty "
                            "folder is refused")
    data_dir: str = param("", "folder with dataset files for file-based datasets; dataset=files: "
                          "one file (or image folder) per client, sorted by name")
    files_format: str = param("", "dataset=files: file format as node config 'data-format' (empty: "
                              "from the suffix; csv, tsv, npz, npy, parquet, images)",
                              name="files.format",
                              choices=("", "csv", "tsv", "txt", "npz", "npy", "parquet", "images"))
    files_label_column: str = param("", "dataset=files: a label column of the csv/tsv files "
                                    "(header name or 0-based index), as node config "
                                    "'label-column'; evaluation only", name="files.label-column")
    evaluate: bool = param(True, "compute ground-truth metrics (eval_*) on the evaluation path; a "
                           "deployed node takes part only with its node config "
                           "allow-evaluation=true")
    timeout: float = param(600.0, "seconds to wait for client replies per step", low=0.0,
                           low_open=True)
    min_clients: int = param(0, "deployment: wait for at least this many nodes before starting (0 "
                             "= num-clients, or 1 when num-clients is 0; then every connected node "
                             "takes part)", low=0)
    partition_kind: str = param("iid", "how the dataset is split across clients (simulation): "
                                "fedclust's iid, stratified, column, recipe, dirichlet; "
                                "flwr-datasets' pathological, shard, size, linear (and iid, "
                                "dirichlet for dataset=hf)", name="partition.kind",
                                choices=("iid", "stratified", "column", "recipe", "dirichlet",
                                          "pathological", "shard", "size", "linear"))
    partition_alpha: float = param(0.5, "Dirichlet concentration for label skew",
                                   name="partition.alpha", low=0.0, low_open=True)
    partition_column: str = param("", "column to split by (kind=column), e.g. 'job'",
                                  name="partition.column")
    partition_classes_per_client: int = param(2, "kind=pathological: classes per client",
                                              name="partition.classes-per-client", low=1)
    partition_shards_per_client: int = param(2, "kind=shard: label-sorted shards per client",
                                             name="partition.shards-per-client", low=1)
    partition_sizes: str = param("", "kind=size: rows per client, comma-separated (one per client)",
                                 name="partition.sizes", check=_csv_ints)
    scaling: str = param("minmax", "federated feature scaling before clustering",
                         choices=("none", "minmax", "standard"))
    blobs_n_samples: int = param(1500, "points of the generated 'blobs' dataset",
                                 name="blobs.n-samples", low=10)
    blobs_centers: int = param(4, "Gaussian components of the 'blobs' dataset",
                               name="blobs.centers", low=1)
    blobs_n_features: int = param(2, "dimension of the 'blobs' dataset", name="blobs.n-features",
                                  low=1)
    blobs_std: float = param(0.6, "standard deviation of 'blobs'", name="blobs.std", low=0.0,
                             low_open=True)
    g2_dim: int = param(2, "G2 set dimension D (file g2-D-sigma)", name="g2.dim", low=1)
    g2_sigma: int = param(10, "G2 set standard deviation sigma (file g2-D-sigma)", name="g2.sigma",
                          low=1)
    hf_path: str = param("", "dataset=hf: a folder written by Hugging Face datasets' save_to_disk "
                         "(offline), or a dataset name on the Hub (network)", name="hf.path")
    hf_split: str = param("train", "dataset=hf: the split of a DatasetDict", name="hf.split")
    hf_label_column: str = param("", "dataset=hf: the ground-truth column (evaluation only; "
                                 "label-skew partitions split by it)", name="hf.label-column")
    hf_feature_columns: str = param("", "dataset=hf: feature columns, comma-separated (empty: "
                                    "every numeric column but the label)",
                                    name="hf.feature-columns")
    hf_image_column: str = param("", "dataset=hf: an image column whose pixels are the features "
                                 "(instead of hf.feature-columns)", name="hf.image-column")
    plots: bool = param(True, "write PNG plots of the iteration story")
    tracker: str = param("", "experiment tracker the server also logs the run to: mlflow (params, "
                         "per-round metrics, artifacts; the store tracker-uri names) or "
                         "tensorboard (scalars in <output-dir>/tensorboard); needs pip install "
                         "'fedclust[mlflow]' or 'fedclust[tensorboard]' on the server only",
                         choices=("", "mlflow", "tensorboard"))
    tracker_uri: str = param("", "tracker=mlflow: the MLflow store (a server URL http://host:5000, "
                             "sqlite:////abs/mlflow.db, file:///abs/mlruns); empty: "
                             "MLFLOW_TRACKING_URI of the ServerApp's environment, else MLflow's "
                             "default. Under flwr run the ServerApp inherits the SuperLink's "
                             "environment, not the shell's: name the store here")
    tracker_experiment: str = param("", "tracker=mlflow: the experiment (empty: "
                                    "MLFLOW_EXPERIMENT_NAME of the ServerApp's environment, else "
                                    "'fedclust')")
    tracker_run_name: str = param("", "the run's name in the tracker (empty: the results folder's "
                                  "name; fedclust sweep -m: the job's overrides)")
    tracker_parent: str = param("", "tracker=mlflow: the id of a parent run this run is logged "
                                "under (fedclust sweep -m opens one parent run per sweep and sets "
                                "it)")

#: the common keys, in their order in ``pyproject.toml`` and ``docs/run-config.md``
COMMON_KEYS: list[Key] = CommonSettings.keys()


def common(name: str, doc: str = "", convert: Callable[[Any], Any] | None = None) -> Any:
    """A method's Settings field that holds the common key ``name`` (with its default; ``doc``:
    what it does there)."""
    return ref(next(k for k in COMMON_KEYS if k.name == name), doc, convert)


def setting(cfg: Mapping[str, Any], name: str) -> Any:
    """``cfg[name]``, or the common key ``name``'s default when ``cfg`` lacks it (a raw run
    config, the config an older run saved): a lookup that does not write the default again.
    Any key, a method's too: :func:`fedclust.config.setting`."""
    if name in cfg:
        return cfg[name]
    return next(k for k in COMMON_KEYS if k.name == name).default
