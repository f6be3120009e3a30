"""PACFL (Vahidian et al., AAAI 2023): one-shot clustering by principal angles between the
clients' data subspaces, as the EMD-CFL authors run it as a baseline (``fit_pacfl``, adapted
from the PACFL code).

1. Each client, for every class ``j`` in its validation set, takes the SVD of its class-``j``
   images (flattened, normalised as the model sees them; one column per image) and keeps the
   first ``basis`` left singular vectors (``K = 3``). ``U_c`` stacks them: ``(d, ≤ K·classes)``.
2. The server computes ``A[c, o] = min over column pairs arccos(clip(U_cᵀ U_o, −1, 1))`` in
   degrees (the smallest angle between any basis vector of ``c`` and any of ``o``: the PACFL
   code's measure).
3. Agglomerative clustering of ``A``: repeatedly merge the two closest clusters while their
   distance is ≤ ``threshold`` degrees; the merged row is the plain average of the two rows
   (the PACFL code's ``average`` linkage, i.e. WPGMA). One shot: the clusters never change.

What leaves a client: ``U_c``, orthonormal directions of its own data per class (not samples,
not labels, but more about the data than EMD-CFL's projected embeddings: each column is an
image-shaped principal direction of one class).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray


def class_subspaces(x: NDArray, y: NDArray, basis: int = 3) -> NDArray[np.float32]:
    """``U_c``: the first ``basis`` left singular vectors of each class's images, stacked.

    Parameters
    ----------
    x : (n, ...) array
        The client's images, normalised as the model's input (flattened here).
    y : (n,) int array
        Their labels (they stay on the client).
    basis : int
        Singular vectors per class (the PACFL code: 3).
    """
    if basis < 1:
        raise ValueError(f"basis must be >= 1, got {basis}")
    flat = np.asarray(x, dtype=np.float64).reshape(len(x), -1)
    y = np.asarray(y)
    if len(flat) == 0:
        raise ValueError("no images to build a subspace from")
    parts = []
    for label in np.unique(y):
        u, _, _ = np.linalg.svd(flat[y == label].T, full_matrices=False)
        u = u / np.maximum(np.linalg.norm(u, axis=0), 1e-12)
        parts.append(u[:, :basis])
    return np.hstack(parts).astype(np.float32)


def angle_matrix(subspaces: Sequence[NDArray]) -> NDArray[np.float64]:
    """``A[c, o]``: the smallest angle (degrees) between a column of ``U_c`` and one of
    ``U_o`` (symmetric; the diagonal is 0)."""
    n = len(subspaces)
    out = np.zeros((n, n))
    for i in range(n):
        for j in range(i + 1, n):
            cos = np.clip(np.asarray(subspaces[i], np.float64).T
                          @ np.asarray(subspaces[j], np.float64), -1.0, 1.0)
            out[i, j] = out[j, i] = float(np.degrees(np.arccos(cos).min()))
    return out


def pacfl_clusters(angles: NDArray, threshold: float) -> NDArray[np.int64]:
    """Cluster id per client: merge the closest pair while its distance is ≤ ``threshold``
    degrees, a merged cluster's distance being the average of its two parts' (WPGMA); ids in
    order of first appearance."""
    a = np.asarray(angles, dtype=np.float64)
    n = len(a)
    if a.shape != (n, n):
        raise ValueError(f"angles must be a square matrix, got shape {a.shape}")
    if n == 1:
        return np.zeros(1, dtype=np.int64)
    from scipy.cluster.hierarchy import fcluster, linkage
    from scipy.spatial.distance import squareform

    tree = linkage(squareform((a + a.T) / 2, checks=False), method="weighted")
    flat = fcluster(tree, t=threshold, criterion="distance")
    ids: dict[int, int] = {}
    return np.array([ids.setdefault(int(f), len(ids)) for f in flat], dtype=np.int64)
