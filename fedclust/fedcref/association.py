"""Cluster association (paper 000 §4.2, Algorithm 1 lines 10–16) and communities (§4.3).

Association test, run by client i for its cluster q and a received model AE_jp (eq. 2)::

    D = Normalize_[0,1] |E_iq→iq − E_jp→iq|,     accept  ⇔  Pr{D ≤ θ} ≥ α

where E_m→iq is the vector of per-sample reconstruction errors of model m on the samples of
cluster q and Normalize_[0,1] is min–max scaling over those samples. The client reports only
the accept bits; the server links Q_iq and Q_jp when *both* directions accept (line 13).
Communities are the connected components with ≥ 2 clusters; the others are isolated.

Ratio test (not in the paper; ``fedcref.assoc-rule=ratio``), scale-aware where eq. (2) is
not (its min–max normalisation makes a foreign model ``c``× worse on every sample score the
same for every ``c``)::

    accept  ⇔  Q_a over x ∈ H_q of [ log E_jp(x) − log E_iq(x) ]  ≤  ε

with ``H_q`` the samples of cluster q held out from the training of ``AE_iq`` (so that the own
model's in-sample optimism does not set the scale), ``Q_a`` the ``a``-quantile (median by
default): the foreign model is accepted when it reconstructs the typical held-out sample within
a factor ``e^ε`` of the own model.

Calibrated test (not in the paper; ``fedcref.assoc-rule=calibrated``): the same statistic
``s_m = Q_a over x ∈ H_q of [ log E_m(x) − log E_iq(x) ]``, compared with two anchors the client
has without labels — "same" is 0 (its own model on held-out samples) and "different" is
``s_d = min over q' ≠ q of s_iq'``, the statistic of the client's own closest *other* cluster
model on the same samples::

    accept  ⇔  s_m ≤ λ · s_d

so a foreign model is accepted when it is closer to the own model than a fraction λ of the way
to the client's nearest other cluster. There is no ε to set per dataset: the scale comes from
the client's own clusters. A cluster whose client has no other modelled cluster (no
"different" anchor) accepts nothing.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable

import networkx as nx
import numpy as np
from numpy.typing import NDArray


def normalized_gap(e_own: NDArray, e_foreign: NDArray) -> NDArray[np.float64]:
    """``Normalize_[0,1] |e_own − e_foreign|`` along the last axis (all zeros if constant)."""
    d = np.abs(np.asarray(e_own, dtype=np.float64) - np.asarray(e_foreign, dtype=np.float64))
    lo = d.min(axis=-1, keepdims=True)
    span = d.max(axis=-1, keepdims=True) - lo
    return np.where(span > 0, (d - lo) / np.where(span > 0, span, 1.0), 0.0)


def accepts(e_own: NDArray, e_foreign: NDArray, theta: float, alpha: float) -> NDArray[np.bool_]:
    """Eq. (2): ``Pr{Normalize|e_own − e_foreign| ≤ θ} ≥ α``.

    Parameters
    ----------
    e_own : (n,) errors of the cluster's own model on its n samples
    e_foreign : (..., n) errors of one or more foreign models on the same samples
    theta : association threshold θ (paper: 0.2)
    alpha : required probability α in (0, 1] (paper: the 75th percentile, 0.75)

    Returns
    -------
    bool array of shape ``e_foreign.shape[:-1]``
    """
    return accept_score(e_own, e_foreign, theta) >= alpha


def accept_score(e_own: NDArray, e_foreign: NDArray, theta: float) -> NDArray[np.float64]:
    """``Pr{Normalize|e_own − e_foreign| ≤ θ}`` per foreign model (0 when there are no samples)."""
    e_foreign = np.asarray(e_foreign)
    if e_foreign.shape[-1] == 0:
        return np.zeros(e_foreign.shape[:-1])
    d = normalized_gap(np.broadcast_to(e_own, e_foreign.shape), e_foreign)
    return (d <= theta).mean(axis=-1)


def log_ratio_quantile(e_own: NDArray, e_foreign: NDArray, quantile: float
                       ) -> NDArray[np.float64]:
    """``Q_quantile[log e_foreign − log e_own]`` over the samples, per foreign model (+inf when
    there are no samples)."""
    e_foreign = np.asarray(e_foreign, dtype=np.float64)
    if e_foreign.shape[-1] == 0:
        return np.full(e_foreign.shape[:-1], np.inf)
    tiny = np.finfo(np.float32).tiny
    gap = np.log(np.maximum(e_foreign, tiny)) - np.log(np.maximum(np.asarray(e_own,
                                                                              np.float64), tiny))
    return np.quantile(gap, quantile, axis=-1)


RULES = ("eq2", "ratio", "calibrated")
HELD_OUT_RULES = ("ratio", "calibrated")     # rules measured on samples held out from training


def accept_matrix(labels: NDArray[np.int64], own_errors: NDArray, foreign_errors: NDArray,
                  theta: float, alpha: float, min_size: int = 2,
                  groups: NDArray[np.int64] | None = None, rule: str = "eq2",
                  epsilon: float = 0.15, quantile: float = 0.5,
                  held_out: NDArray[np.bool_] | None = None, lam: float = 0.5
                  ) -> NDArray[np.bool_]:
    """Client-side association: which foreign models each local cluster accepts.

    Parameters
    ----------
    labels : (n,) current local clustering (0..K−1)
    own_errors : (K, n) errors of the K local models on all local samples
        (row q is E_iq→·; a cluster with no model may hold NaNs)
    foreign_errors : (F, n) errors of F received models on all local samples
    theta, alpha : eq. (2), see :func:`accepts`
    min_size : clusters with fewer samples accept nothing (and, for ``"ratio"``, clusters
        without a held-out sample)
    groups : (F,) optional owner (foreign client) of each foreign model. When given, a local
        cluster accepts at most one model per foreign client: the accepted one with the best
        score, ties broken by the lower median log error ratio (a continuous score, so the
        choice does not depend on the order of the models). ``None`` tests all pairs as the
        paper does; the run config turns this on by default
        (``fedcref.assoc-best-per-client``, a named deviation, docs/fedcref.md).
    rule : ``"eq2"`` (the paper), ``"ratio"`` or ``"calibrated"`` (module docstring)
    epsilon, quantile : ``ε`` and ``a`` of the ratio test (``a`` also of the calibrated one)
    held_out : (n,) samples held out from the own models' training (``"ratio"`` and
        ``"calibrated"`` only: the statistic runs over the held-out samples of each cluster)
    lam : ``λ`` of the calibrated test

    Returns
    -------
    (K, F) bool
    """
    if rule not in RULES:
        raise ValueError(f"rule must be one of {RULES}, got {rule!r}")
    if rule in HELD_OUT_RULES and held_out is None:
        raise ValueError(f"rule {rule!r} needs the held-out samples (held_out)")
    k = own_errors.shape[0]
    out = np.zeros((k, foreign_errors.shape[0]), dtype=bool)
    for q in range(k):
        mask = labels == q
        if mask.sum() < min_size:
            continue
        if rule in HELD_OUT_RULES:
            mask = mask & held_out
        if not mask.any() or not np.all(np.isfinite(own_errors[q, mask])):
            continue
        if foreign_errors.shape[0] == 0:
            continue
        ratio = log_ratio_quantile(own_errors[q, mask], foreign_errors[:, mask],
                                   quantile if rule in HELD_OUT_RULES else 0.5)
        if rule == "calibrated":
            others = [r for r in range(k) if r != q and np.all(np.isfinite(own_errors[r, mask]))]
            if not others:
                continue                                  # no "different" anchor
            different = float(log_ratio_quantile(own_errors[q, mask], own_errors[others][:, mask],
                                                 quantile).min())
            ok, score = ratio <= lam * different, -ratio
        elif rule == "ratio":
            ok, score = ratio <= epsilon, -ratio
        else:
            score = accept_score(own_errors[q, mask], foreign_errors[:, mask], theta)
            ok = score >= alpha
        if groups is not None:
            for g in np.unique(groups[ok]):
                cand = np.flatnonzero(ok & (groups == g))
                ok[cand] = False
                # best score; among equal scores the lowest median log ratio
                ok[cand[np.lexsort((ratio[cand], -score[cand]))[0]]] = True
        out[q] = ok
    return out


def mutual_edges(accept: dict[Hashable, set[Hashable]]) -> list[tuple[Hashable, Hashable]]:
    """Edges (a, b) such that a accepts b **and** b accepts a (Algorithm 1 line 13)."""
    edges = []
    for a, targets in accept.items():
        for b in targets:
            if a < b and a in accept.get(b, ()):  # type: ignore[operator]
                edges.append((a, b))
    return edges


def communities(nodes: Iterable[Hashable], edges: Iterable[tuple[Hashable, Hashable]]
                ) -> tuple[list[list[Hashable]], list[Hashable]]:
    """Connected components of the cluster graph Γ (networkx).

    Returns
    -------
    communities : components with ≥ 2 clusters (eq. 3), each sorted, ordered by first member
    isolated : clusters in no community (the set I)
    """
    g = nx.Graph()
    g.add_nodes_from(nodes)
    g.add_edges_from(edges)
    comps = [sorted(c) for c in nx.connected_components(g)]
    groups = sorted([c for c in comps if len(c) >= 2], key=lambda c: c[0])
    isolated = sorted(c[0] for c in comps if len(c) == 1)
    return groups, isolated


def perfect_edges(majority: dict[Hashable, int]) -> list[tuple[Hashable, Hashable]]:
    """Baseline "perfect associations": link clusters of different clients whose true majority
    class is the same (evaluation path only; nodes are ``(client, cluster)``)."""
    by_class: dict[int, list[Hashable]] = {}
    for node, c in majority.items():
        by_class.setdefault(int(c), []).append(node)
    edges = []
    for members in by_class.values():
        members = sorted(members)
        for a_i, a in enumerate(members):
            for b in members[a_i + 1:]:
                if a[0] != b[0]:  # type: ignore[index]
                    edges.append((a, b))
    return edges
