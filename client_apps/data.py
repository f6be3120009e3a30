"""What data a node holds.

- Simulation: the node is partition ``partition-id`` of ``num-partitions`` of the run's dataset
  (regenerated deterministically from the run config, cached per process).
- Deployment: the node reads its own file from node config ``data-path`` (format inferred or
  ``data-format``; optional ``label-column`` for evaluation only).

Every method's node reads its ``data-path`` through the one checked door of
:mod:`fedclust.data.local` (size limits, regular files, finite values, shapes, data-free and
path-free errors): tables with :func:`~fedclust.data.local.load_local_table` (FCM methods, here),
pixel tables with :func:`~fedclust.data.local.load_pixel_table` (FedCRef) and named image
arrays with :func:`~fedclust.data.local.load_image_arrays` (EMD-CFL's splits).
:func:`node_data_path` refuses a node that has neither a ``data-path`` nor a partition.

Labels reach the handlers only when the node may evaluate
(:func:`client_apps.evaluation.allows_evaluation`), as node-independent codes
(:func:`fedclust.data.local.label_codes`: a text label has the same code on every node, so the
server can add the nodes' label × cluster tables row by row).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np
from flwr.app import Context
from numpy.typing import NDArray

from client_apps.evaluation import allows_evaluation
from fedclust.config import ConfigError
from fedclust.data.local import load_local_table
from fedclust.data.partition import make_partition
from fedclust.data.tabular import OWN_DATA_HELP, Dataset, load_dataset

DATA_KEYS = ("dataset", "data-dir", "seed", "blobs.n-samples", "blobs.centers",
             "blobs.n-features", "blobs.std", "g2.dim", "g2.sigma", "hf.path", "hf.split",
             "hf.label-column", "hf.feature-columns", "hf.image-column")
PARTITION_KEYS = ("partition.kind", "partition.alpha", "partition.column",
                  "partition.classes-per-client", "partition.shards-per-client",
                  "partition.sizes")


@dataclass
class ClientData:
    x: NDArray[np.float64]
    y_eval: NDArray[np.int64] | None   # ground truth; evaluation path only


@lru_cache(maxsize=4)
def _dataset(items: tuple[tuple[str, Any], ...]) -> Dataset:
    return load_dataset(dict(items))


@lru_cache(maxsize=8)
def _partition(items: tuple[tuple[str, Any], ...], num_parts: int) -> list[np.ndarray]:
    cfg = dict(items)
    ds = _dataset(tuple((k, cfg[k]) for k in DATA_KEYS))
    return make_partition(cfg["partition.kind"], ds, num_parts, int(cfg["seed"]),
                          float(cfg["partition.alpha"]), cfg["partition.column"], options=cfg)


def simulated_partition(cfg: dict[str, Any], partition_id: int, num_partitions: int
                        ) -> ClientData:
    """The rows of partition ``partition_id`` of the run's dataset."""
    ds = _dataset(tuple((k, cfg[k]) for k in DATA_KEYS))
    parts = _partition(tuple((k, cfg[k]) for k in DATA_KEYS + PARTITION_KEYS), num_partitions)
    idx = parts[partition_id]
    return ClientData(ds.x[idx], ds.y[idx])


def node_data_path(context: Context, cfg: dict[str, Any]) -> str | None:
    """This node's ``data-path``, or None when it holds a partition of the run's dataset.

    Raises
    ------
    ConfigError
        The node has neither (run config ``dataset='local'`` without node config
        ``data-path``, or a deployed node without one): the message says how to give it.
    """
    node = context.node_config
    if "data-path" in node:
        return str(node["data-path"])
    if cfg["dataset"] == "local":
        raise ConfigError(OWN_DATA_HELP["local"])
    if "partition-id" not in node or "num-partitions" not in node:
        raise ConfigError(
            f"this node has no data: no node config 'data-path' (its own file) and no "
            f"'partition-id'/'num-partitions' (a partition of run config dataset="
            f"{cfg['dataset']!r}). Fix: start the SuperNode with --node-config "
            f"'data-path=\"/path/to/its/data.csv\"' and run with dataset='local', or with "
            f"--node-config 'partition-id=0 num-partitions=3'")
    return None


def load_client_data(context: Context, cfg: dict[str, Any]) -> ClientData:
    """This node's data (see module docstring)."""
    node = context.node_config
    path = node_data_path(context, cfg)
    if path is not None:
        x, y = load_local_table(path, str(node.get("data-format", "")),
                                str(node.get("label-column", "")), stable_labels=True)
        return ClientData(x, y if allows_evaluation(context, cfg) else None)
    parts = int(node["num-partitions"])
    if parts != int(cfg["num-clients"]):
        raise ConfigError(
            f"this node is one of num-partitions={parts} (the engine's node count) but the run "
            f"config says 'num-clients' = {cfg['num-clients']}. Allowed: equal counts. Fix: pass "
            f"--federation-config 'num-supernodes={cfg['num-clients']}' or num-clients={parts}.")
    data = simulated_partition(cfg, int(node["partition-id"]), parts)
    return ClientData(data.x, data.y_eval if allows_evaluation(context, cfg) else None)
