"""Cluster association (paper 000 §4.2, Algorithm 1 lines 10–16) and communities (§4.3).

Association test, run by client i for its cluster q and a received model AE_jp (eq. 2)::

    D = Normalize_[0,1] |E_iq→iq − E_jp→iq|,     accept  ⇔  Pr{D ≤ θ} ≥ α

where E_m→iq is the vector of per-sample reconstruction errors of model m on the samples of
cluster q and Normalize_[0,1] is min–max scaling over those samples. The client reports only
the accept bits; the server links Q_iq and Q_jp when *both* directions accept (line 13).
Communities are the connected components with ≥ 2 clusters; the others are isolated.

The tests themselves (the paper's eq. (2) and the ratio, calibrated and confident tests
that are not in the paper) are the rule objects of :mod:`fedclust.fedcref.rules`; this module
runs one over a client's clusters (:func:`accept_matrix`) and builds the graph from the bits.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from dataclasses import dataclass
from typing import Any

import networkx as nx
import numpy as np
from numpy.typing import NDArray

from fedclust.fedcref.rules import (  # noqa: F401  (the statistics, re-exported)
    BEST_MARGIN_SIZE,
    AssociationRule,
    Cluster,
    Edge,
    Eq2,
    First,
    LinkPolicy,
    Step,
    accept_score,
    log_ratio_quantile,
    normalized_gap,
    sign_test_p,
)

Node = tuple[int, int]           # (client, local cluster)

def accepts(e_own: NDArray, e_foreign: NDArray, theta: float, alpha: float) -> NDArray[np.bool_]:
    """Eq. (2): ``Pr{Normalize|e_own − e_foreign| ≤ θ} ≥ α`` (:class:`~fedclust.fedcref.rules.Eq2`).

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
    return Eq2(theta, alpha).accepts(e_own, e_foreign)


def accept_matrix(labels: NDArray[np.int64], own_errors: NDArray, foreign_errors: NDArray,
                  rule: AssociationRule, held_out: NDArray[np.bool_] | None = None,
                  groups: NDArray[np.int64] | None = None) -> NDArray[np.bool_]:
    """Client-side association: which foreign models each local cluster accepts.

    Parameters
    ----------
    labels : (n,) current local clustering (0..K−1)
    own_errors : (K, n) errors of the K local models on all local samples
        (row q is E_iq→·; a cluster with no model may hold NaNs)
    foreign_errors : (F, n) errors of F received models on all local samples
    rule : the test (:mod:`fedclust.fedcref.rules`); a cluster with fewer than
        ``rule.min_size`` samples, without a held-out sample (a rule that measures on held-out
        samples) or whose own model's errors are not finite accepts nothing
    held_out : (n,) samples held out from the own models' training (rules with
        ``held_out``)
    groups : (F,) optional owner (foreign client) of each foreign model. When given, a local
        cluster accepts at most one model per foreign client: the accepted one with the best
        score, ties broken by the lower median log error ratio (a continuous score, so the
        choice does not depend on the order of the models). ``None`` tests all pairs as the
        paper does; the run config turns this on by default
        (``fedcref.assoc-best-per-client``, a named deviation, docs/fedcref.md).

    Returns
    -------
    (K, F) bool
    """
    if rule.held_out and held_out is None:
        raise ValueError(f"rule {type(rule).__name__} needs the held-out samples (held_out)")
    k = own_errors.shape[0]
    out = np.zeros((k, foreign_errors.shape[0]), dtype=bool)
    for q in range(k):
        whole = labels == q
        if whole.sum() < rule.min_size or foreign_errors.shape[0] == 0:
            continue
        held = held_out[whole] if rule.held_out else None
        own = own_errors[:, whole]
        measured = own[q] if held is None else own[q, held]
        if not measured.size or not np.all(np.isfinite(measured)):
            continue
        v = rule.test(Cluster(q, own, foreign_errors[:, whole], held))
        if groups is not None:
            _best_per_group(v.ok, groups, v.score, v.ratio)
        out[q] = v.ok
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


# ------------------------------------------------------------------------- cluster graphs

@dataclass(frozen=True)
class GraphCuts:
    """Links removed after the mutual test (not in the paper): ``cannot_link`` — no community
    holds two clusters of one client (:func:`split_conflicts`);
    ``bridge_cut`` — a link that alone joins two groups of at least this many clusters
    (:func:`cut_bridges`; 0: off)."""

    cannot_link: bool = True
    bridge_cut: int = 3

    def apply(self, nodes: list[Node], edges: list[Edge], rec: dict[str, Any]) -> list[Edge]:
        """The edges kept; ``rec`` gets how many each cut removed."""
        if self.cannot_link:
            kept = split_conflicts(nodes, edges)
            rec["cut_edges"] = len(edges) - len(kept)
            edges = kept
        if self.bridge_cut:
            kept = cut_bridges(nodes, edges, self.bridge_cut)
            rec["bridge_cuts"] = len(edges) - len(kept)
            edges = kept
        return edges


@dataclass(frozen=True)
class Mutual:
    """The algorithm (lines 9–16): the clients' mutual acceptances, as the links policy allows,
    less the graph cuts."""

    links: LinkPolicy = First()
    cuts: GraphCuts = GraphCuts()

    def edges(self, step: Step, nodes: list[Node], rec: dict[str, Any]
              ) -> tuple[list[Node], list[Edge]]:
        first = step.first_links
        ask = self.links.ask(first, nodes, step.responding)
        if ask is None:           # the first links between clusters that still have a model
            assert first is not None
            present = set(nodes)
            return nodes, [e for e in sorted(first) if e[0] in present and e[1] in present]
        nodes, edges = step.cross_evaluate(nodes, ask)
        kept = self.links.allowed(edges, first)
        if kept is not None:
            rec["blocked_links"] = len(edges) - len(kept)
            edges = kept
        edges = self.cuts.apply(nodes, edges, rec)
        if first is None:
            step.first_links = set(edges)
        return nodes, edges


@dataclass(frozen=True)
class Perfect:
    """Baseline (``association=perfect``, evaluation only): link clusters of different clients
    whose true majority class is the same."""

    def edges(self, step: Step, nodes: list[Node], rec: dict[str, Any]
              ) -> tuple[list[Node], list[Edge]]:
        from fedclust.fedcref.evaluation import majority_classes

        nh = step.node_hist()
        return nodes, perfect_edges(majority_classes({k: nh[k] for k in nodes if k in nh}))


@dataclass(frozen=True)
class Unlinked:
    """Baseline (``association=none``): no edge, every cluster stays isolated (local only)."""

    def edges(self, step: Step, nodes: list[Node], rec: dict[str, Any]
              ) -> tuple[list[Node], list[Edge]]:
        return nodes, []
