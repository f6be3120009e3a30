"""Pluggable initial local clustering (paper 000 Algorithm 1 line 3, §5.2).

- ``dirty``: the true split with each sample moved to a uniformly random other cluster with
  probability ``dirtiness`` (simulation; uses the client's true classes to build the split).
- ``kmeans``: k-means on the client's own data (cheap real option).
- ``dec``: Deep Embedded Clustering on the client's own data only (:mod:`fedclust.fedcref.dec`).

For ``kmeans``/``dec``, K_i is given, or estimated by the silhouette score over a range.

The run-config default ``fedcref.init=auto`` picks one per node (:func:`resolve_init`):
``dirty`` on a simulated node (paper reproduction), ``kmeans`` on a deployed node, which has
no true classes to build a dirty split from (or must not use them).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray
from sklearn.cluster import KMeans
from sklearn.metrics import silhouette_score

from fedclust.fedcref.system import dirty_clustering


def silhouette_k(z: NDArray, k_range: range, random_state: int = 0,
                 sample_size: int = 2000) -> int:
    """K with the highest silhouette score of k-means on ``z`` over ``k_range``."""
    best_k, best_s = k_range.start, -np.inf
    rng = np.random.RandomState(random_state)
    for k in k_range:
        if k >= len(z):
            break
        lab = KMeans(k, n_init=10, random_state=random_state).fit_predict(z)
        s = silhouette_score(z, lab, sample_size=min(sample_size, len(z)), random_state=rng)
        if s > best_s:
            best_k, best_s = k, s
    return best_k


INIT_KINDS = ("auto", "dirty", "kmeans", "dec")


def resolve_init(kind: str, simulated: bool) -> str:
    """The initial clustering a node runs for run config ``fedcref.init=kind``: ``auto`` is
    ``dirty`` on a simulated node and ``kmeans`` on a deployed one; other kinds are kept."""
    if kind not in INIT_KINDS:
        raise ValueError(f"unknown initial clustering {kind!r}; allowed: {', '.join(INIT_KINDS)}")
    if kind == "auto":
        return "dirty" if simulated else "kmeans"
    return kind


@dataclass(frozen=True)
class Dirty:
    """The true split with each sample moved to a random other cluster with probability
    ``dirtiness`` (simulation: needs the true classes)."""

    dirtiness: float = 0.0


@dataclass(frozen=True)
class DECStart:
    """Deep Embedded Clustering with ``options`` (keyword arguments of
    :class:`fedclust.fedcref.dec.DEC`)."""

    options: Mapping[str, Any] = field(default_factory=dict)


def initial_clustering(kind: str | Dirty | DECStart, x: NDArray[np.float32], k: int | range, *,
                       y_true: NDArray | None = None, random_state: int = 0
                       ) -> NDArray[np.int64]:
    """Initial labels (0..K−1) of one client's samples.

    Parameters
    ----------
    kind : ``"dirty"``, ``"kmeans"``, ``"dec"``, or the options of one: :class:`Dirty`,
        :class:`DECStart` (a name: the default options)
    x : (n, d) the client's samples in [0, 1]
    k : K_i; or a range of K_i over which ``kmeans``/``dec`` estimate it by silhouette
        (``dirty`` ignores it: its clusters are the true classes)
    y_true : true classes, required by ``dirty`` only (simulation)
    """
    kind = {"dirty": Dirty(), "dec": DECStart()}.get(kind, kind) if isinstance(kind, str) \
        else kind
    estimate = isinstance(k, range)
    if isinstance(kind, Dirty):
        if y_true is None:
            raise ValueError("dirty initial clustering is a simulation: it needs the true classes")
        return dirty_clustering(y_true, kind.dirtiness, random_state)
    # client seeds are 63-bit digests (fedclust.fedcref.client.client_key); scikit-learn
    # (KMeans, RandomState) accepts only [0, 2**32 - 1]
    random_state = int(random_state) % 2**32
    need = 2 if estimate else int(k)
    distinct = len(np.unique(np.asarray(x).reshape(len(x), -1), axis=0)) if len(x) else 0
    if distinct < need:
        from fedclust.data.local import LocalDataError

        raise LocalDataError(
            f"this node's {len(x)} row(s) hold {distinct} distinct point(s), fewer than the "
            f"{need} clusters FedCRef fits on a client (every feature constant, or duplicated "
            f"rows). Fix: give this node more varied data, or leave it out of the federation")
    if kind == "kmeans":
        if isinstance(k, range):
            k = silhouette_k(x, k, random_state)
        return KMeans(k, n_init=10, random_state=random_state).fit_predict(x).astype(np.int64)
    if isinstance(kind, DECStart):
        from fedclust.fedcref.dec import DEC

        dec = DEC(n_clusters=k.start if isinstance(k, range) else k, random_state=random_state,
                  **dict(kind.options))
        if isinstance(k, range):
            dec.pretrain(x)
            z = dec.embed(x)
            dec.n_clusters = silhouette_k(z, k, random_state)
        return dec.fit_predict(x).astype(np.int64)
    raise ValueError(f"unknown initial clustering {kind!r}; allowed: dirty, kmeans, dec")
