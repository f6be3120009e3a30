"""The federated system generator of paper 000 §5.2 and the simulated initial clusterings.

N clients; client i gets K_i ~ U{k_min..k_max} classes (default 2..|U|/2) drawn without
replacement from the global class set U, and S unlabeled samples per class. No sample is on two
clients unless the overlap O > 0: then, for every class, ``round(O·S)`` samples form a pool that
every cluster of that class holds (so any two same-class clusters share exactly a fraction O of
their samples), and the remaining ``S − round(O·S)`` samples of each cluster are its own.
If the dataset has too few distinct samples of some class, :class:`SystemError_` says how many
are needed and available — samples are never duplicated silently.

The ground-truth labels are used here only to *generate* the system and, on the evaluation path,
to score it; the algorithm never sees them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from fedclust.errors import BadInputError


class SystemSizeError(BadInputError, ValueError):
    """The dataset cannot supply the requested system without duplicating samples."""


@dataclass
class ClientSlice:
    """One client's share: dataset row indices, their true classes, and the client's classes."""

    indices: NDArray[np.int64]
    y: NDArray[np.int64]
    classes: NDArray[np.int64]

    @property
    def k(self) -> int:
        return int(self.classes.size)


def generate_system(y: NDArray[np.int64], n_clients: int, samples_per_cluster: int,
                    k_range: tuple[int, int] = (2, 0), overlap: float = 0.0,
                    random_state: int = 0) -> list[ClientSlice]:
    """Generate the clients of paper 000 §5.2.

    Parameters
    ----------
    y : (n,) int
        True classes of the dataset rows (the global class set U = unique(y)).
    n_clients : int
    samples_per_cluster : int
        S, samples of each class on a client.
    k_range : (k_min, k_max)
        Range of K_i (inclusive); ``k_max = 0`` means ⌊|U| / 2⌋.
    overlap : float in [0, 1)
        O, fraction of a cluster's samples shared with the other clusters of the same class.
    random_state : int

    Returns
    -------
    list of ClientSlice, in client order; samples of a client are grouped by class.

    Raises
    ------
    SystemSizeError
        If some class has fewer distinct samples than the system needs.
    """
    y = np.asarray(y, dtype=np.int64)
    classes = np.unique(y)
    n_u = classes.size
    k_min, k_max = k_range
    k_max = k_max or n_u // 2
    k_max = min(k_max, n_u)
    if not 1 <= k_min <= k_max:
        raise SystemSizeError(f"K_i range [{k_min}, {k_max}] is empty for |U| = {n_u} classes")
    rng = np.random.default_rng(random_state)
    ks = rng.integers(k_min, k_max + 1, size=n_clients)
    chosen = [np.sort(rng.choice(classes, size=k, replace=False)) for k in ks]
    s = int(samples_per_cluster)
    shared = int(round(overlap * s))
    own = s - shared
    holders = {int(c): [i for i in range(n_clients) if c in chosen[i]] for c in classes}
    shortages = []
    for c in classes:
        need = (shared + own * len(holders[int(c)])) if holders[int(c)] else 0
        have = int(np.sum(y == c))
        if need > have:
            shortages.append(f"class {int(c)}: needs {need}, has {have}")
    if shortages:
        raise SystemSizeError(
            f"the dataset has too few distinct samples for {n_clients} clients × {s} samples per "
            f"cluster (overlap {overlap}): " + "; ".join(shortages) +
            ". Fix: lower num-clients or fedcref.samples-per-cluster; for MNIST-like datasets "
            "use fedcref.split=\"all\" (train + test images; the default 'train' split has "
            "fewer); or try another seed (the classes each client is dealt depend on it, so "
            "some seeds fit where others do not); or use a larger dataset (samples are never "
            "duplicated).")
    parts: list[list[NDArray[np.int64]]] = [[] for _ in range(n_clients)]
    for c in classes:
        hold = holders[int(c)]
        if not hold:
            continue
        pool = rng.permutation(np.flatnonzero(y == c))
        common = pool[:shared]
        for j, i in enumerate(hold):
            mine = pool[shared + j * own: shared + (j + 1) * own]
            parts[i].append(np.concatenate([common, mine]))
    out = []
    for i in range(n_clients):
        idx = np.concatenate(parts[i]).astype(np.int64)
        out.append(ClientSlice(idx, y[idx], chosen[i].astype(np.int64)))
    return out


def dirty_clustering(y_true: NDArray[np.int64], dirtiness: float, random_state: int = 0
                     ) -> NDArray[np.int64]:
    """Simulated ("dirty uniform") initial clustering of one client.

    Cluster q = the q-th class of the client (the true split); then every sample moves, with
    probability ``dirtiness``, to a uniformly random *other* cluster. ``dirtiness = 0`` is the
    oracle split. Labels are 0..K_i−1.
    """
    _, labels = np.unique(np.asarray(y_true), return_inverse=True)
    k = int(labels.max()) + 1 if labels.size else 0
    if k < 2 or dirtiness <= 0:
        return labels.astype(np.int64)
    rng = np.random.default_rng(random_state)
    move = rng.random(labels.size) < dirtiness
    shift = rng.integers(1, k, size=labels.size)          # uniform over the k−1 other clusters
    return np.where(move, (labels + shift) % k, labels).astype(np.int64)
