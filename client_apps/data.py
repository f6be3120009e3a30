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

A node process keeps what it read (:func:`file_cached`, :func:`simulated_partition`): the
in-process grid and a Ray actor serve many messages, and many nodes, in one process, and every
message of a run needs the node's data. A file is read again when it changed (its inode, size,
modification or change time); the arrays handed out are read-only.

Labels reach the handlers only when the node may evaluate
(:func:`client_apps.evaluation.allows_evaluation`), as node-independent codes
(:func:`fedclust.data.local.label_codes`: a text label has the same code on every node, so the
server can add the nodes' label × cluster tables row by row).
"""

from __future__ import annotations

import os
import stat
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, TypeVar

import numpy as np
from flwr.app import Context
from numpy.typing import NDArray

from client_apps.evaluation import allows_evaluation
from fedclust.config import ConfigError
from fedclust.data.local import feature_names, load_local_table, names_digest
from fedclust.data.partition import make_partition
from fedclust.data.tabular import OWN_DATA_HELP, Dataset, load_dataset
from fedclust.outputs import file_identity

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
    columns: int = 0   # digest of the feature column names (0: none), fedclust.data.local


T = TypeVar("T")

CACHE_BYTES = 1024 ** 3
"""Most bytes of node data :func:`file_cached` keeps per process (the least recently used go
first)."""

_FILES: OrderedDict[tuple[Hashable, ...], tuple[Any, int]] = OrderedDict()
_files_bytes = 0


def _nbytes(value: Any) -> int:
    if isinstance(value, np.ndarray):
        return int(value.nbytes)
    if isinstance(value, (tuple, list)):
        return sum(_nbytes(v) for v in value)
    if isinstance(value, dict):
        return sum(_nbytes(v) for v in value.values())
    return 0


def _read_only(value: Any) -> Any:
    """``value`` with its arrays (also inside tuples, lists, dicts) made read-only."""
    if isinstance(value, np.ndarray):
        value.flags.writeable = False
    elif isinstance(value, (tuple, list)):
        for v in value:
            _read_only(v)
    elif isinstance(value, dict):
        for v in value.values():
            _read_only(v)
    return value


def file_cached(path: str, load: Callable[[], T], *key: Hashable) -> T:
    """``load()`` (which reads the file at ``path``), once per process while the file is the
    same: same device and inode, size, modification and change time (``key``: whatever else
    the result depends on, e.g. the format).

    Only a regular file is kept; anything else (a folder of images, a missing path: the loader
    says what is wrong) is loaded on every call. The arrays of a kept result are read-only
    (it is shared by every message): copy before changing them.
    """
    global _files_bytes
    try:
        st = os.stat(path)
    except OSError:
        return load()
    if not stat.S_ISREG(st.st_mode):
        return load()
    # the name and the file it names now (device and inode: a replaced file or a moved link
    # is read again)
    ident = (path, *file_identity(st), *key)
    hit = _FILES.get(ident)
    if hit is not None:
        _FILES.move_to_end(ident)
        return hit[0]
    value = _read_only(load())
    size = _nbytes(value)
    if size <= CACHE_BYTES:
        _FILES[ident] = (value, size)
        _files_bytes += size
        while _files_bytes > CACHE_BYTES:
            _files_bytes -= _FILES.popitem(last=False)[1][1]
    return value


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
    """The rows of partition ``partition_id`` of the run's dataset (read-only arrays)."""
    return _rows(tuple((k, cfg[k]) for k in DATA_KEYS + PARTITION_KEYS), partition_id,
                 num_partitions)


@lru_cache(maxsize=4096)
def _rows(items: tuple[tuple[str, Any], ...], partition_id: int, num_partitions: int
          ) -> ClientData:
    cfg = dict(items)
    ds = _dataset(tuple((k, cfg[k]) for k in DATA_KEYS))
    idx = _partition(items, num_partitions)[partition_id]
    return ClientData(_read_only(ds.x[idx]), _read_only(ds.y[idx]))


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
        fmt, column = str(node.get("data-format", "")), str(node.get("label-column", ""))

        def load() -> tuple[np.ndarray, np.ndarray | None, int]:
            table = load_local_table(path, fmt, column, stable_labels=True)
            return (*table, names_digest(feature_names(path, fmt, column)))

        x, y, names = file_cached(path, load, "table", fmt, column)
        return ClientData(x, y if allows_evaluation(context, cfg) else None, names)
    parts = int(node["num-partitions"])
    if parts != int(cfg["num-clients"]):
        raise ConfigError(
            f"this node is one of num-partitions={parts} (the engine's node count) but the run "
            f"config says 'num-clients' = {cfg['num-clients']}. Allowed: equal counts. Fix: pass "
            f"--federation-config 'num-supernodes={cfg['num-clients']}' or num-clients={parts}.")
    data = simulated_partition(cfg, int(node["partition-id"]), parts)
    return ClientData(data.x, data.y_eval if allows_evaluation(context, cfg) else None)
