r"""FedFCM: federated fuzzy c-means with k-means averaging (paper 003, §2.2.1), FedFuzzDB and
the choice of K.

This module holds the averaging functions and the local step. The server's loop is
:mod:`fedclust.fedfcm.loop`; the client steps :mod:`fedclust.fedfcm.client`; the choice of K
:mod:`fedclust.fedfcm.validity` (the index: :mod:`fedclust.fcm.validity`); the run-config
keys and settings :mod:`fedclust.fedfcm.keys`; in-memory clients
:mod:`fedclust.fedfcm.inmemory`.

Protocol (paper 003, steps 1–6): the server shares global centers; every client runs local
FCM to convergence from them (:func:`fedclust.fcm.fcm_until_stable`) and returns its local
centers; the server updates the global centers with an averaging function

.. math:: avg([c_k^{(l)}]_{k,l}) := kmeans([c_k^{(l)}]_{k,l}) \qquad (14)

— k-means over all stacked local centers (k-means++ in round 1, the previous global centers as
initialisation afterwards) — and stops when :math:`\sum_k \|c_{k,t} - c_{k,t+1}\| \le \epsilon`.
The *federated averaging* variant of [20, 21] instead takes, per center index, the mean of the
local centers weighted by their support :math:`\sum_j u_{kj}^{(l)}`.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import numpy as np

from fedclust.fcm import Float, fcm_until_stable

AVERAGING = ("kmeans", "fedavg")


def kmeans_average(local_centers: Sequence[Float], n_clusters: int, previous: Float | None,
                   random_state: int = 0, max_iter: int = 500) -> Float:
    """Eq. 14: k-means on all stacked local centers (unweighted).

    ``previous=None`` (round 1) uses k-means++; otherwise the previous global centers are the
    initialisation, which keeps the index of each global center stable across rounds.
    ``random_state`` may be any non-negative int (the server derives it from the run seed);
    scikit-learn takes it modulo 2**32.
    """
    from sklearn.cluster import KMeans  # imported here: clients never need it
    from sklearn.exceptions import ConvergenceWarning

    points = np.concatenate([np.asarray(c, dtype=np.float64) for c in local_centers])
    if points.shape[0] < n_clusters:
        raise ValueError(f"only {points.shape[0]} local centers for {n_clusters} clusters")
    init = "k-means++" if previous is None else np.asarray(previous, dtype=np.float64)
    with warnings.catch_warnings():
        # Coinciding local centers (clients agreeing exactly) make fewer distinct points than K.
        warnings.simplefilter("ignore", ConvergenceWarning)
        km = KMeans(n_clusters=n_clusters, init=init, n_init=1, max_iter=max_iter,
                    random_state=int(random_state) % 2**32).fit(points)
    return km.cluster_centers_


def support_weighted_average(local_centers: Sequence[Float], supports: Sequence[Float],
                             previous: Float) -> Float:
    r"""Federated averaging [20, 21]: :math:`c_k = \sum_l s^{(l)}_k c^{(l)}_k / \sum_l s^{(l)}_k`.

    Assumes center ``k`` means the same cluster on every client (true when all clients start
    from the same global centers and their data are i.i.d.). A center with no support keeps
    its previous position.
    """
    c = np.stack([np.asarray(v, dtype=np.float64) for v in local_centers])  # (P, K, F)
    s = np.stack([np.asarray(v, dtype=np.float64) for v in supports])       # (P, K)
    mass = s.sum(axis=0)
    out = np.array(previous, dtype=np.float64, copy=True)
    ok = mass > 0
    out[ok] = np.einsum("pk,pkf->kf", s, c)[ok] / mass[ok, None]
    return out


def average(method: str, local_centers: Sequence[Float], supports: Sequence[Float] | None,
            n_clusters: int, previous: Float | None, random_state: int = 0) -> Float:
    """Dispatch to :func:`kmeans_average` or :func:`support_weighted_average`.

    Only federated averaging uses ``supports``; k-means averaging needs the local centers alone
    (paper 003 shares nothing else), so clients send supports only for ``method="fedavg"``.
    """
    if method == "kmeans":
        return kmeans_average(local_centers, n_clusters, previous, random_state)
    if method == "fedavg":
        if previous is None or supports is None:
            raise ValueError("federated averaging needs the previous global centers and the "
                             "local supports")
        return support_weighted_average(local_centers, supports, previous)
    raise ValueError(f"averaging must be one of {AVERAGING}, got {method!r}")


def center_shift(old: Float, new: Float) -> float:
    r"""Paper 003 stopping quantity :math:`\sum_k \|c_{k,t} - c_{k,t+1}\|`."""
    return float(np.linalg.norm(np.asarray(new) - np.asarray(old), axis=1).sum())


def local_step(x: Float, global_centers: Float, m: float, tol: float, max_iter: int
               ) -> tuple[Float, Float, int]:
    """Client step: local FCM to convergence from the global centers.

    Returns the local centers, their support :math:`\\sum_j u_{kj}` (power 1, used only by the
    federated-averaging variant) and the number of local iterations.
    """
    centers, u, n_iter = fcm_until_stable(x, global_centers, m=m, tol=tol, max_iter=max_iter)
    return centers, u.sum(axis=0), n_iter
