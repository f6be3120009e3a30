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

Node = tuple[int, int]           # (client, local cluster)

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


RULES = ("eq2", "ratio", "calibrated", "confident")
# rules measured on samples held out from training
HELD_OUT_RULES = ("ratio", "calibrated", "confident")


def sign_test_p(successes: NDArray, trials: int | NDArray) -> NDArray[np.float64]:
    """One-sided sign test: ``P(Bin(trials, ½) ≥ successes)`` (1 when there are no trials)."""
    from scipy.stats import binom

    successes = np.asarray(successes)
    trials = np.broadcast_to(np.asarray(trials), successes.shape)
    return np.where(trials > 0, binom.sf(successes - 1, trials, 0.5), 1.0)


def confident_accepts(own: NDArray, foreign: NDArray, others: NDArray, held: NDArray[np.bool_],
                      epsilon: float, beta: float, delta: float | None = None,
                      delta_growth: float = 0.0) -> NDArray[np.bool_]:
    """The confident test for one cluster q: which foreign models are interchangeable with the
    own model, shown by one-sided sign tests, each at level β.

    Parameters
    ----------
    own : (n,) errors of the cluster's own model ``AE_q`` on the cluster's n samples
    foreign : (F, n) errors of F foreign models on the same samples
    others : (R, n) errors of the client's own *other* cluster models on the same samples
        (R ≥ 1; with none the client cannot tell "same" from "different" and accepts nothing)
    held : (n,) samples held out from ``AE_q``'s training
    epsilon, beta, delta : ε, β and δ below (``delta=None``: no comparison with the best)
    delta_growth : γ: the cluster's margin to the best is ``δ_n = δ · max(1, n / 60)^γ``
        (``0``: δ at every size)

    A foreign model f is accepted when all hold at level β:

    - **as good as the own model** (equivalence, on the h held-out samples ``H_q``): the
      median of ``log E_f(x) − log E_q(x)`` over ``H_q`` is below ε, i.e. the sign test
      ``#{x ∈ H_q : log E_f(x) − log E_q(x) ≤ ε}`` rejects "median > ε":
      ``P(Bin(h, ½) ≥ count) ≤ β``;
    - **as good as the best foreign model** (all n samples of q, which no foreign model has
      seen; with ``delta``): ``#{x : log E_f(x) − log E_b(x) ≤ δ_n} `` passes the same sign
      test, where b is the foreign model of lowest mean log error on q. Among several
      clients' models the right class is the best one, and a model of a similar class (a
      "9" on "4"s) trails it on most samples even where it stays within ε of a weak own model.
      The margin ``δ_n = δ · max(1, n / 60)^γ`` widens with the cluster's size
      (``fedcref.best-margin-growth``; the run config uses γ = 0.3): among many same-class
      models the best one can lead the others by more than δ on most samples;
    - **better than every other cluster's own model**: for each own other cluster q', on the
      ``m`` samples of q that the own model of q reconstructs better than the one of q',
      ``#{x : E_f(x) < E_q'(x)}`` rejects "f wins at most half of them":
      ``P(Bin(m, ½) ≥ count) ≤ β``. (A start of dirty clusters puts samples of q''s kind in
      q; q''s model explains those, and they say nothing about f.)

    Every bound widens as the sample counts shrink, so with few samples the test abstains
    (with h < 6 held-out samples no count reaches β = 0.02). The last part anchors
    "different" in the client's own clusters: a model that cannot beat them on most samples
    is no evidence of the same distribution, however close its errors are to the own ones.
    """
    return confident_parts(own, foreign, others, held, epsilon, beta, delta,
                           delta_growth).all(axis=0)


def confident_parts(own: NDArray, foreign: NDArray, others: NDArray, held: NDArray[np.bool_],
                    epsilon: float, beta: float, delta: float | None = None,
                    delta_growth: float = 0.0) -> NDArray[np.bool_]:
    """The three parts of :func:`confident_accepts`, each a (F,) bool row of the returned
    ``(3, F)`` array: as good as the own model, as good as the best foreign model (all true
    with ``delta=None``), better than each other own cluster's model. With no foreign model
    or no other own cluster every part is false."""
    held = np.asarray(held, dtype=bool)
    f = np.log(np.maximum(np.asarray(foreign, np.float64), _TINY))
    o = np.log(np.maximum(np.asarray(own, np.float64), _TINY))
    parts = np.zeros((3, f.shape[0]), dtype=bool)
    if f.shape[0] == 0 or len(others) == 0:
        return parts
    close = (f[:, held] - o[held] <= epsilon).sum(axis=1)
    parts[0] = sign_test_p(close, int(held.sum())) <= beta
    parts[1] = True
    if delta is not None:
        best = int(np.argmin(f.mean(axis=1)))
        delta_n = delta * max(1.0, f.shape[1] / BEST_MARGIN_SIZE) ** delta_growth
        near = (f - f[best] <= delta_n).sum(axis=1)
        parts[1] = sign_test_p(near, f.shape[1]) <= beta
    r = np.log(np.maximum(np.asarray(others, np.float64), _TINY))
    mine = o[None, :] < r                                  # (R, n): samples q explains better
    wins = ((f[:, None, :] < r[None, :, :]) & mine[None]).sum(axis=2)          # (F, R)
    parts[2] = (sign_test_p(wins, mine.sum(axis=1)[None, :]) <= beta).all(axis=1)
    return parts


_TINY = float(np.finfo(np.float32).tiny)
# cluster size (samples) at which the confident test's margin to the best is fedcref.best-margin
BEST_MARGIN_SIZE = 60


def accept_matrix(labels: NDArray[np.int64], own_errors: NDArray, foreign_errors: NDArray,
                  theta: float, alpha: float, min_size: int = 2,
                  groups: NDArray[np.int64] | None = None, rule: str = "eq2",
                  epsilon: float = 0.15, quantile: float = 0.5,
                  held_out: NDArray[np.bool_] | None = None, lam: float = 0.5,
                  beta: float = 0.05, delta: float | None = None, delta_growth: float = 0.0
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
    rule : ``"eq2"`` (the paper), ``"ratio"``, ``"calibrated"`` or ``"confident"`` (module
        docstring)
    epsilon, quantile : ``ε`` and ``a`` of the ratio test (``a`` also of the calibrated one;
        ``ε`` also of the confident one)
    held_out : (n,) samples held out from the own models' training (``"ratio"`` and
        ``"calibrated"`` only: the statistic runs over the held-out samples of each cluster)
    lam : ``λ`` of the calibrated test
    beta, delta, delta_growth : ``β``, ``δ`` and ``γ`` of the confident test
        (:func:`confident_accepts`)

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
        if rule == "confident":
            whole = labels == q
            others = [r for r in range(k) if r != q and np.all(np.isfinite(own_errors[r, whole]))]
            ok = confident_accepts(own_errors[q, whole], foreign_errors[:, whole],
                                   own_errors[others][:, whole], held_out[whole], epsilon, beta,
                                   delta, delta_growth)
            ratio = log_ratio_quantile(own_errors[q, mask], foreign_errors[:, mask], 0.5)
            score = -ratio
            if groups is not None:
                _best_per_group(ok, groups, score, ratio)
            out[q] = ok
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
            _best_per_group(ok, groups, score, ratio)
        out[q] = ok
    return out


def _best_per_group(ok: NDArray[np.bool_], groups: NDArray, score: NDArray, ratio: NDArray
                    ) -> None:
    """Keep, in place, one accepted model per group: the best score; among equal scores the
    lowest median log ratio."""
    for g in np.unique(groups[ok]):
        cand = np.flatnonzero(ok & (groups == g))
        ok[cand] = False
        ok[cand[np.lexsort((ratio[cand], -score[cand]))[0]]] = True


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


def split_conflicts(nodes: Iterable[Node], edges: Iterable[tuple[Node, Node]]
                    ) -> list[tuple[Node, Node]]:
    """Cut the cluster graph so that no component holds two clusters of one client.

    A client's clusters are, by its own clustering, different groups; a component that joins
    two of them joins two groups through other clients' clusters, the mark of a wrong
    association somewhere on the path. While a component holds two clusters ``u``, ``v`` of
    one client, a minimum set of edges separating them is removed (networkx
    ``minimum_edge_cut``): a wrong link between two well-connected communities is a thin
    bridge, so the cut takes it and leaves the communities. Deterministic: components,
    conflicting pairs and cuts are visited in sorted order. Nodes are ``(client, cluster)``.

    Returns the edges kept, in the input order.
    """
    g = nx.Graph()
    g.add_nodes_from(nodes)
    edges = list(edges)
    g.add_edges_from(edges)
    while True:
        pair = None
        for comp in sorted((sorted(c) for c in nx.connected_components(g)), key=lambda c: c[0]):
            by_client: dict[Hashable, list[Node]] = {}
            for n in comp:
                by_client.setdefault(n[0], []).append(n)
            clash = [m for m in by_client.values() if len(m) > 1]
            if clash:
                pair = (clash[0][0], clash[0][1])
                break
        if pair is None:
            break
        cut = nx.minimum_edge_cut(g, *pair)
        g.remove_edges_from(sorted(tuple(sorted(e)) for e in cut))
    return [e for e in edges if g.has_edge(*e)]


def cut_bridges(nodes: Iterable[Node], edges: Iterable[tuple[Node, Node]], min_side: int
                ) -> list[tuple[Node, Node]]:
    """Cut every link that alone joins two groups of at least ``min_side`` clusters each.

    Inside one kind of data the mutual tests confirm a cluster with several others, so a
    group of clusters of one kind is held together by many links. Two groups of different
    kinds that one mutual acceptance joins (MNIST 4s and 9s: a 9 model explains a client's
    4s nearly as well as a 4 model when that client has no 9s to compare with) hang on that
    one link: a bridge of the graph. A bridge whose removal leaves ``min_side`` or more
    clusters on each side is cut; a cluster hanging on one link (a side of 1) keeps it.

    Bridges are cut one at a time, the most balanced first (the one whose smaller side is
    largest; ties in sorted order), and recomputed after each cut, so a chain of links is
    cut in its middle rather than into pieces. ``min_side=0`` cuts nothing. Nodes are
    ``(client, cluster)``; returns the edges kept, in the input order.
    """
    edges = list(edges)
    if min_side < 1:
        return edges
    g = nx.Graph()
    g.add_nodes_from(nodes)
    g.add_edges_from(edges)
    while True:
        best: tuple[int, Node, Node] | None = None
        for a, b in sorted(tuple(sorted(e)) for e in nx.bridges(g)):
            g.remove_edge(a, b)
            smaller = min(len(nx.node_connected_component(g, a)),
                          len(nx.node_connected_component(g, b)))
            g.add_edge(a, b)
            if smaller >= min_side and (best is None or smaller > best[0]):
                best = (smaller, a, b)
        if best is None:
            return [e for e in edges if g.has_edge(*e)]
        g.remove_edge(best[1], best[2])


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
