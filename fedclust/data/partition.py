"""Partitioners: split a dataset's row indices across clients (simulation only). Seeded."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from fedclust.errors import BadInputError

Index = NDArray[np.int64]


class PartitionError(BadInputError, ValueError):
    """A partition cannot be made with the given settings."""

    data_free = True


def iid(n: int, num_clients: int, seed: int) -> list[Index]:
    """Shuffle and cut into ``num_clients`` near-equal parts."""
    _check(n, num_clients)
    perm = np.random.default_rng(seed).permutation(n)
    return [np.sort(p) for p in np.array_split(perm, num_clients)]


def stratified(y: NDArray[np.int64], num_clients: int, seed: int) -> list[Index]:
    """Each client gets (as nearly as possible) the same share of every class."""
    _check(y.size, num_clients)
    rng = np.random.default_rng(seed)
    order = np.concatenate([rng.permutation(np.flatnonzero(y == c)) for c in np.unique(y)])
    owner = (np.arange(order.size) + rng.integers(num_clients)) % num_clients
    return [np.sort(order[owner == k]) for k in range(num_clients)]


def by_column(groups: NDArray[np.int64], num_clients: int) -> list[Index]:
    """One client per distinct value of a column (e.g. bank marketing: one client per job)."""
    values = np.unique(groups)
    if values.size != num_clients:
        raise PartitionError(
            f"partition.kind='column' makes one client per value: this column has {values.size} "
            f"values but run config 'num-clients' = {num_clients}. Fix: num-clients={values.size}.")
    return [np.flatnonzero(groups == v) for v in values]


def recipe(y: NDArray[np.int64], counts: Sequence[dict[int, int]], seed: int) -> list[Index]:
    """Explicit per-client label counts, drawn without replacement (e.g. paper 003 §3.2.1)."""
    rng = np.random.default_rng(seed)
    pools = {int(c): list(rng.permutation(np.flatnonzero(y == c))) for c in np.unique(y)}
    parts = []
    for k, wanted in enumerate(counts):
        idx = []
        for label, n in wanted.items():
            pool = pools.get(int(label), [])
            if len(pool) < n:
                raise PartitionError(f"recipe for client {k} needs {n} points of class {label}, "
                                     f"only {len(pool)} are left")
            idx.extend(pool[:n])
            del pool[:n]
        parts.append(np.sort(np.asarray(idx, dtype=np.int64)))
    return parts


def dirichlet(y: NDArray[np.int64], num_clients: int, alpha: float, seed: int,
              min_size: int = 2, max_tries: int = 100) -> list[Index]:
    """Label skew: for every class, client shares ~ Dirichlet(alpha) (smaller = more skewed).

    Redrawn until every client has at least ``min_size`` points.
    """
    _check(y.size, num_clients * min_size)
    rng = np.random.default_rng(seed)
    classes = [np.flatnonzero(y == c) for c in np.unique(y)]
    for _ in range(max_tries):
        parts: list[list[int]] = [[] for _ in range(num_clients)]
        for idx in classes:
            idx = rng.permutation(idx)
            shares = rng.dirichlet(np.full(num_clients, alpha))
            cuts = (np.cumsum(shares)[:-1] * idx.size).astype(int)
            for k, piece in enumerate(np.split(idx, cuts)):
                parts[k].extend(piece.tolist())
        if min(len(p) for p in parts) >= min_size:
            return [np.sort(np.asarray(p, dtype=np.int64)) for p in parts]
    raise PartitionError(f"Dirichlet(alpha={alpha}) left a client with fewer than {min_size} "
                         f"points in {max_tries} draws. Fix: raise partition.alpha or lower "
                         f"num-clients.")


def _check(n: int, num_clients: int) -> None:
    if num_clients > n:
        raise PartitionError(f"cannot split {n} points across {num_clients} clients. Fix: lower "
                             f"run config 'num-clients'.")


#: kinds served by flwr-datasets' partitioners for every dataset (and iid, dirichlet for
#: dataset="hf"); the other kinds are fedclust's own (the papers' numbers rest on them)
FLWR_KINDS = ("pathological", "shard", "size", "linear")
#: the run-config keys of those partitioners' settings, with their defaults
OPTION_KEYS = {"partition.classes-per-client": 2, "partition.shards-per-client": 2,
               "partition.sizes": ""}


def flwr_partition(kind: str, y: NDArray[np.int64], num_clients: int, seed: int,
                   alpha: float = 0.5, options: Mapping[str, Any] | None = None
                   ) -> list[Index]:
    """Row indices per client from a flwr-datasets partitioner, splitting by the labels ``y``.

    ``iid``: :class:`~flwr_datasets.partitioner.IidPartitioner`; ``dirichlet``:
    ``DirichletPartitioner`` (``alpha``, every client ≥ 2 rows); ``pathological``:
    ``PathologicalPartitioner`` (``partition.classes-per-client`` classes per client);
    ``shard``: ``ShardPartitioner`` (``partition.shards-per-client`` shards per client);
    ``size``: ``SizePartitioner`` (``partition.sizes``: comma-separated rows per client);
    ``linear``: ``LinearPartitioner`` (client ``i`` gets a share proportional to ``i + 1``).

    Raises
    ------
    PartitionError
        flwr-datasets is not installed, or the partitioner refuses the settings (its reason
        and the fix).
    """
    opts = {**OPTION_KEYS, **dict(options or {})}
    try:
        import datasets
        from flwr_datasets import partitioner as fp
    except ImportError:
        raise PartitionError(f"partition.kind={kind!r} is served by flwr-datasets, which is not "
                             f"installed. Fix: pip install 'fedclust[hf]', or partition.kind="
                             f"iid (or stratified, dirichlet)") from None
    _check(y.size, num_clients)
    by = "label"
    try:
        if kind == "iid":
            part = fp.IidPartitioner(num_clients)
        elif kind == "dirichlet":
            part = fp.DirichletPartitioner(num_clients, by, alpha, min_partition_size=2,
                                           seed=seed)
        elif kind == "pathological":
            per, n_classes = int(opts["partition.classes-per-client"]), int(np.unique(y).size)
            if per > n_classes:
                raise PartitionError(f"run config 'partition.classes-per-client' = {per} is more "
                                     f"than the {n_classes} classes of this dataset. Allowed: "
                                     f"1..{n_classes}. Fix: partition.classes-per-client="
                                     f"{min(2, n_classes)}")
            part = fp.PathologicalPartitioner(num_clients, by,
                                              int(opts["partition.classes-per-client"]),
                                              seed=seed)
        elif kind == "shard":
            part = fp.ShardPartitioner(num_clients, by,
                                       num_shards_per_partition=int(
                                           opts["partition.shards-per-client"]), seed=seed)
        elif kind == "size":
            sizes = [int(v) for v in str(opts["partition.sizes"]).split(",") if v.strip()]
            if len(sizes) != num_clients:
                raise PartitionError(f"partition.kind='size' needs one size per client in "
                                     f"'partition.sizes' ({num_clients} clients), got "
                                     f"{len(sizes)}. Fix: partition.sizes=\"100,200,…\"")
            part = fp.SizePartitioner(sizes)
        elif kind == "linear":
            part = fp.LinearPartitioner(num_clients)
        else:
            raise PartitionError(f"unknown partition.kind {kind!r}")
        part.dataset = datasets.Dataset.from_dict({by: y.tolist(), "row": list(range(y.size))})
        parts = [np.sort(np.asarray(part.load_partition(i)["row"], dtype=np.int64))
                 for i in range(num_clients)]
    except PartitionError:
        raise
    except (ValueError, IndexError) as exc:
        raise PartitionError(f"partition.kind={kind!r} cannot split {y.size} rows of "
                             f"{np.unique(y).size} classes across {num_clients} clients: "
                             f"{' '.join(str(exc).split())[:300]}. Fix: lower num-clients or "
                             f"change the partition settings") from None
    empty = [i for i, p in enumerate(parts) if p.size == 0]
    if empty:
        raise PartitionError(f"partition.kind={kind!r} left client(s) {empty} without rows. "
                             f"Fix: lower num-clients or change the partition settings")
    return parts


def make_partition(kind: str, dataset: object, num_clients: int, seed: int, alpha: float = 0.5,
                   column: str = "", options: Mapping[str, Any] | None = None) -> list[Index]:
    """Dispatch on ``partition.kind`` (``options``: the ``partition.*`` settings of the
    flwr-datasets kinds, :data:`OPTION_KEYS`)."""
    y = dataset.y  # type: ignore[attr-defined]
    if kind in FLWR_KINDS or (kind in ("iid", "dirichlet")
                              and getattr(dataset, "name", "") == "hf"):
        return flwr_partition(kind, y, num_clients, seed, alpha, options)
    if kind == "iid":
        return iid(y.size, num_clients, seed)
    if kind == "stratified":
        return stratified(y, num_clients, seed)
    if kind == "dirichlet":
        return dirichlet(y, num_clients, alpha, seed)
    if kind == "column":
        groups = dataset.groups  # type: ignore[attr-defined]
        if column not in groups:
            raise PartitionError(
                f"run config 'partition.column' = {column!r} is not a grouping column of this "
                f"dataset. Allowed: {sorted(groups) or 'none (this dataset has no such column)'}."
                f" Fix: pass one of those, or another partition.kind (iid, stratified, "
                f"dirichlet).")
        return by_column(groups[column], num_clients)
    if kind == "recipe":
        counts = dataset.recipe  # type: ignore[attr-defined]
        if counts is None:
            raise PartitionError(f"run config 'partition.kind' = 'recipe' on dataset "
                                 f"{dataset.name!r}, which has no built-in recipe. Allowed: "
                                 f"'recipe' only with dataset='motivational'. Fix: "
                                 f"partition.kind=iid (or stratified, dirichlet).")
        if len(counts) != num_clients:
            raise PartitionError(f"this recipe has {len(counts)} clients but there are "
                                 f"{num_clients} partitions ('num-clients', and in simulation "
                                 f"the engine's num-supernodes). Fix: num-clients={len(counts)} "
                                 f"with --federation-config 'num-supernodes={len(counts)}'.")
        return recipe(y, counts, seed)
    raise PartitionError(f"unknown partition.kind {kind!r}")
