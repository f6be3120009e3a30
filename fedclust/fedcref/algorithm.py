"""FedCRef's server loop, Algorithm 1 of paper 000, without Flower.

The loop talks to the clients through :class:`Clients`, four calls, one per phase. The
Flower strategy (:mod:`strategies.fedcref`) implements them with messages; the tests
implement them with direct calls (:mod:`fedclust.fedcref.inmemory`). Clients are numbered
``0..n−1`` in the order of the identity key each reports (never the engine's node ids), and a
cluster graph node is ``(client, local cluster)``.

One iteration ``t`` (line numbers are Algorithm 1's):

1. **Local models** (lines 6–8): every active client trains one autoencoder ``AE_iq`` per local
   cluster (eq. 1, clusters of at least ``min-cluster-size`` samples); inactive clients keep
   theirs. The server keeps the current version of every cluster model.
2. **Association** (lines 9–16): each client receives the foreign models, computes their
   per-sample errors on each local cluster ``q`` and tests eq. (2),
   ``Pr{Normalize_[0,1]|E_iq→iq − E_jp→iq| ≤ θ} ≥ α``, or the ratio test
   (:mod:`fedclust.fedcref.association`). Only the accept bits come back. With
   ``new-links=partners``, later iterations send a client only the models of its clusters'
   first-iteration partners (the only links a re-test can keep).
3. **Communities** (lines 17–20, eq. 3): Γ has an edge where *both* directions accept
   (line 13); communities are its connected components with ≥ 2 clusters, the rest is the
   isolated set ``I``.
4. **Community models** (lines 21–24): one FedAvg autoencoder per community, ``fl-rounds``
   rounds; each member trains on the union of its clusters in the community and the server
   averages, weighted by the members' sample counts. The community model is the aggregate.
5. **Refinement** (lines 25–31): every active client runs Algorithm 2 with its own models and
   all community models, and leaves the active set ``A`` when ``ACC(y', y) ≥ τ`` (eq. 4).
6. **Stop** (§4.5): :class:`~fedclust.fedcref.stopping.StabilityStop` — no active client, or
   communities and isolated counts stable for ``stop-window`` iterations, or
   ``max-iterations``. This follows the paper's text; Algorithm 1's ``while`` line reads
   otherwise (see :mod:`fedclust.fedcref.stopping`).

Evaluation (``evaluate``) uses the per-cluster true-class histograms some clients send; the
loop never uses them, except the explicit ``association="perfect"`` baseline.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
from numpy.typing import NDArray

from fedclust.fedcref import autoencoder as ae
from fedclust.fedcref.association import (
    communities,
    cut_bridges,
    mutual_edges,
    perfect_edges,
    split_conflicts,
)
from fedclust.fedcref.client import derive_seed
from fedclust.fedcref.evaluation import majority_classes, mean_accuracy, wrong_associations
from fedclust.fedcref.health import assess
from fedclust.fedcref.keys import Settings
from fedclust.fedcref.stopping import StabilityStop
from fedclust.results import coverage

LOG = logging.getLogger("fedclust")
Node = tuple[int, int]                    # (client, local cluster)
Model = dict[str, NDArray[np.float32]]    # one autoencoder: W0 (1, in, out), b0 (1, 1, out) ...


@dataclass
class LocalReply:
    """A client's answer to the local phase.

    Attributes
    ----------
    k : K_i, the number of local clusters
    version : version of the client's cluster models (changes when it retrains)
    models : ``{q: model}`` when the client (re)trained this iteration, else None (unchanged)
    modelled : the local clusters that have a model now (None: those of ``models``, or the
        last ones reported)
    hist : (K_i, C) true-class counts per cluster (evaluation only), or None
    """

    k: int
    version: int
    models: dict[int, Model] | None = None
    modelled: list[int] | None = None
    hist: NDArray[np.int64] | None = None


@dataclass
class Contribution:
    """A client's result of one FedAvg round for one community."""

    community: int
    model: ae.Params
    count: float


@dataclass
class RefineReply:
    """A client's answer to the refinement phase: ``ACC(previous, new labels)`` (eq. 4); with
    ``fedcref.refine=covered``, one bit per community it is in (confirmed or not, in the order
    of ``members``) and the share of its samples that community models label."""

    agreement: float
    hist: NDArray[np.int64] | None = None
    confirmed: list[bool] | None = None
    community_share: float | None = None


class Clients(Protocol):
    """What Algorithm 1 asks of the clients. A client missing from a reply dict did not
    answer (it is left out of that step)."""

    n: int   #: number of clients

    def local(self, t: int, active: Collection[int], seed: int) -> dict[int, LocalReply]:
        """Lines 6–8: clients in ``active`` retrain their cluster models (seed: the phase's)."""

    def associate(self, t: int, models: Mapping[Node, tuple[int, Model]],
                  asked: list[int], only: Mapping[int, list[Node]] | None = None
                  ) -> dict[int, NDArray[np.bool_]]:
        """Lines 9–16: each client of ``asked`` tests its clusters against every model of
        ``models`` (``node -> (version, model)``, sorted by node) that is not its own, or,
        with ``only``, against the models of ``only[i]`` (foreign nodes of ``models``, sorted).
        Returns per client a (K_i, F_i) accept matrix, columns in the order of the foreign
        nodes (:func:`foreign_nodes`)."""

    def community_round(self, t: int, rnd: int, params: ae.Params,
                        members: dict[int, list[tuple[int, list[int]]]], seed: int
                        ) -> dict[int, list[Contribution]]:
        """Line 22, one FedAvg round: client ``i`` trains community ``g`` (row g of the stacked
        ``params``) on its clusters ``qs`` for every ``(g, qs)`` in ``members[i]``."""

    def refine(self, t: int, targets: list[int], params: ae.Params,
               members: dict[int, list[tuple[int, list[int]]]]) -> dict[int, RefineReply]:
        """Lines 26–30: Algorithm 2 on each target client with the community ``params``;
        ``members[i]`` lists client i's communities and its clusters in each (as for
        :meth:`community_round`)."""

    def note_communities(self, t: int, members: dict[int, list[tuple[int, list[int]]]]
                         ) -> None:
        """Tell the members of communities whose model was reused, not trained, which
        community each of their clusters is in (for the data owner's results; the members of
        trained communities learn it from the community rounds)."""


@dataclass
class Outcome:
    """What a run of :func:`run` returns."""

    summary: dict[str, Any]
    history: list[dict[str, Any]]
    community_models: ae.Params = field(default_factory=list)
    start: dict[str, Any] = field(default_factory=dict)   # iteration 0, for Figure 4


def layer_sizes_of(model: Model) -> list[int]:
    """Layer sizes ``[d, h1, …, d]`` of one autoencoder from its weight shapes."""
    n_layers = sum(1 for name in model if name.startswith("W"))
    return [int(model["W0"].shape[1])] + [int(model[f"W{i}"].shape[2]) for i in range(n_layers)]


def foreign_nodes(nodes: Collection[Node], client: int,
                  only: Mapping[int, list[Node]] | None = None) -> list[Node]:
    """The nodes ``client`` tests in the association: ``only[client]`` when given, else every
    node of ``nodes`` (sorted) that is not its own."""
    if only is not None:
        return list(only.get(client, []))
    return [node for node in nodes if node[0] != client]


def partners(links: Collection[tuple[Node, Node]], nodes: Collection[Node]
             ) -> dict[int, list[Node]]:
    """Per client, the nodes linked by ``links`` to one of its clusters, among ``nodes``
    (sorted; clients without such a node are left out)."""
    present = set(nodes)
    out: dict[int, set[Node]] = {}
    for a, b in links:
        if a in present and b in present:
            out.setdefault(a[0], set()).add(b)
            out.setdefault(b[0], set()).add(a)
    return {ci: sorted(ns) for ci, ns in sorted(out.items())}


def _pad(tables: list[NDArray]) -> list[NDArray]:
    width = max((t.shape[1] for t in tables), default=0)
    return [np.pad(t, ((0, 0), (0, width - t.shape[1]))) for t in tables]


def community_members(groups: list[list[Node]]) -> dict[int, list[tuple[int, list[int]]]]:
    """Per client, the communities it is in and its clusters in each: ``{i: [(g, [q…])]}``."""
    by_client: dict[int, list[tuple[int, list[int]]]] = {}
    for g, members in enumerate(groups):
        per: dict[int, list[int]] = {}
        for ci, q in members:
            per.setdefault(ci, []).append(q)
        for ci, qs in per.items():
            by_client.setdefault(ci, []).append((g, qs))
    return by_client


def community_seed(seed: int, t: int) -> int:
    """The seed of iteration ``t``'s fresh community models (``ae.init_params`` over all
    communities): a receiver can rebuild them (int8-delta bases, :mod:`fedclust.fedcref.wire`)."""
    return derive_seed(seed, 7, t, 2)


def train_communities(clients: Clients, t: int, groups: list[list[Node]], layer: list[int],
                      s: Settings, kept: list[ae.Params | None] | None = None,
                      warm: list[ae.Params | None] | None = None) -> ae.Params:
    """Lines 21–24: ``fl-rounds`` rounds of FedAvg for all communities at once.

    Each round the members return their trained copy and sample count per community; the new
    community model is the count-weighted mean of the copies (a community nobody trained in a
    round keeps its model). ``kept[g]``, when given and not None, is community g's model from
    an earlier iteration: it is used as is and not trained. ``warm[g]``, when not None, is
    the model community g starts from instead of a fresh initialisation; it is trained for
    ``s.warm_rounds`` rounds (at most ``fl-rounds``) instead of ``fl-rounds``.
    """
    params = ae.init_params(len(groups), layer, community_seed(s.seed, t), s.ae_init)
    kept = kept or [None] * len(groups)
    warm = warm or [None] * len(groups)
    start = [k if k is not None else w for k, w in zip(kept, warm, strict=True)]
    if any(p is not None for p in start):
        params = ae.concat([start[g] if start[g] is not None else [p[g:g + 1] for p in params]
                            for g in range(len(groups))])
    rounds = [0 if kept[g] is not None else min(s.warm_rounds, s.fl_rounds)
              if warm[g] is not None else s.fl_rounds for g in range(len(groups))]
    for rnd in range(1, max(rounds, default=0) + 1):
        members = {ci: [(g, qs) for g, qs in m if rnd <= rounds[g]]
                   for ci, m in community_members(groups).items()}
        members = {ci: m for ci, m in members.items() if m}
        if not members:
            break
        seed = derive_seed(s.seed, t, 100 + rnd)
        replies = clients.community_round(t, rnd, params, members, seed)
        got: dict[int, list[tuple[ae.Params, float]]] = {}
        for ci in sorted(replies):
            for c in replies[ci]:
                if c.count > 0:
                    got.setdefault(c.community, []).append((c.model, float(c.count)))
        new = []
        for g in range(len(groups)):
            if g in got:
                stacks, weights = zip(*got[g], strict=True)
                new.append(ae.fedavg(list(stacks), list(weights)))
            else:
                new.append([p[g:g + 1] for p in params])
        params = ae.concat(new)
    return params


class _Reuse:
    """Community models that can be kept (``reuse-communities``).

    A community's model depends only on its members' data: the same set of clusters, on
    clients whose labels did not change since it was trained (a client's labels change only
    in a refinement that does not reproduce them, ACC < 1), gives the same training data, so
    retraining it would only redraw its random initialisation and batches.
    """

    def __init__(self) -> None:
        self.changed: dict[int, int] = {}    # client -> iteration its labels last changed
        self.models: dict[frozenset[Node], tuple[int, ae.Params]] = {}   # members -> (t, model)

    def kept(self, group: list[Node]) -> ae.Params | None:
        hit = self.models.get(frozenset(group))
        if hit is None:
            return None
        t, model = hit
        return model if all(self.changed.get(ci, 0) < t for ci, _ in group) else None

    def remember(self, t: int, groups: list[list[Node]], params: ae.Params) -> None:
        self.models = {frozenset(g): (t, [p[i:i + 1] for p in params])
                       for i, g in enumerate(groups)}

    def nearest(self, group: list[Node]) -> ae.Params | None:
        """The last iteration's community model with the most member clusters in common with
        ``group`` (ties: the larger Jaccard overlap, then the smallest sorted member list), or
        None when no member was in any community."""
        members = frozenset(group)
        ranked = [((-len(members & old), -len(members & old) / len(members | old),
                    tuple(sorted(old))), params)
                  for old, (_, params) in self.models.items() if members & old]
        return min(ranked, key=lambda r: r[0])[1] if ranked else None

    def refined(self, t: int, client: int, agreement: float) -> None:
        if agreement < 1.0:
            self.changed[client] = t


def community_models(clients: Clients, t: int, groups: list[list[Node]], layer: list[int],
                     s: Settings, reuse: _Reuse,
                     members: Mapping[Node, tuple[int, Model]] | None = None) -> ae.Params:
    """Lines 21–24; with ``reuse-communities``, only the communities whose members or data
    changed are trained, the others keep their model; with ``warm-start``, a trained community
    starts from the nearest community model of the last iteration (:meth:`_Reuse.nearest`),
    or, when none of its clusters was in a community, from the cluster model of its first
    member (``members``: the current cluster models, which the server already holds)."""
    kept = [reuse.kept(g) if s.reuse_communities else None for g in groups]
    warm: list[ae.Params | None] = [None] * len(groups)
    for i, g in enumerate(groups):
        if s.warm_start and kept[i] is None:
            warm[i] = reuse.nearest(g)
            if warm[i] is None and members and g[0] in members:
                warm[i] = ae.from_numpy(members[g[0]][1])
    params = train_communities(clients, t, groups, layer, s, kept, warm)
    if any(k is not None for k in kept):
        notes = {ci: [(g, qs) for g, qs in m if kept[g] is not None]
                 for ci, m in community_members(groups).items()}
        clients.note_communities(t, {ci: m for ci, m in notes.items() if m})
    reuse.remember(t, groups, params)
    return params


class _Evaluation:
    """The ``eval_*`` metrics from the clients' class histograms (never used by the loop)."""

    def __init__(self) -> None:
        self.hists: dict[int, NDArray] = {}

    def tables(self) -> list[NDArray]:
        return _pad([self.hists[i] for i in sorted(self.hists)])

    def node_hist(self) -> dict[Node, NDArray]:
        return {(i, q): h[q] for i, h in self.hists.items() for q in range(len(h))}

    def groups(self, groups: list[list[Node]]) -> dict[str, Any]:
        nh = self.node_hist()
        w, tot, pct = wrong_associations(groups, nh)
        major = majority_classes(nh)
        present = self.tables()
        holders = np.stack([(h.sum(0) > 0) for h in present]).sum(0) if present else np.zeros(0)
        return {"eval_wrong_associations": w, "eval_associated_clusters": tot,
                "eval_wrong_associations_pct": pct, "eval_global_k": int((holders > 0).sum()),
                "eval_ideal_communities": int((holders >= 2).sum()),
                # each community's members' true majority classes, to see what was merged
                "eval_community_classes": [[major.get(n, -1) for n in g] for g in groups]}


def run(clients: Clients, s: Settings,
        on_iteration: Callable[[dict[str, Any]], None] | None = None) -> Outcome:
    """Algorithm 1. ``on_iteration`` receives each iteration's record before the stop test
    (the strategy adds traffic and logs it)."""
    active = set(range(clients.n))
    store: dict[Node, tuple[int, Model]] = {}     # current version of every cluster model
    ks: dict[int, int] = {}
    ev = _Evaluation()
    reuse = _Reuse()
    stopper = StabilityStop(s.stop_window, s.stop_change)
    acc_start = float("nan")
    iso_start: int | None = None
    iso_first: int | None = None
    layer: list[int] | None = None
    comm_params: ae.Params = []
    history: list[dict[str, Any]] = []
    responding: list[int] = []
    stop_reason = "max-iterations"
    first_links: set[tuple[Node, Node]] | None = None    # the links of the first association
    t = 0
    for t in range(1, s.max_iterations + 1):
        rec: dict[str, Any] = {"iteration": t, "active_clients": len(active)}

        # 1. local cluster models (lines 6-8) ---------------------------------------------
        local = clients.local(t, active, derive_seed(s.seed, t, 1))
        if not local:
            raise RuntimeError(f"FedCRef iteration {t}: no client answered the local phase")
        for ci, r in local.items():
            ks[ci] = r.k
            if r.models is not None:
                for key in [key for key in store if key[0] == ci]:
                    del store[key]
                store.update({(ci, q): (r.version, m) for q, m in r.models.items()})
                if layer is None and r.models:
                    layer = layer_sizes_of(next(iter(r.models.values())))
            if r.modelled is not None:   # clusters emptied by refinement lose their model
                for key in [key for key in store if key[0] == ci and key[1] not in r.modelled]:
                    del store[key]
            if r.hist is not None:
                ev.hists[ci] = r.hist
        if t == 1 and s.evaluate and ev.hists:
            acc_start = mean_accuracy(ev.tables())
        responding = sorted(local)
        graph_nodes = sorted(key for key in store if key[0] in local)
        # clusters below min-cluster-size (or emptied by refinement) have no model, so they
        # are not graph nodes: left out of every cluster count, isolated_start included
        rec["unmodelled_clusters"] = int(sum(ks[i] for i in responding)) - len(graph_nodes)
        if iso_start is None:
            # the paper's "isolated start" (Tables 3-8, Fig. 4d): before any association every
            # cluster (that has a model) is isolated
            iso_start = len(graph_nodes)

        # 2. association on the clients (lines 9-16) --------------------------------------
        edges: list[tuple[Node, Node]] = []
        if s.association == "mutual" and s.new_links == "once" and first_links is not None:
            # the first association's links between clusters that still have a model; no
            # cross-evaluation
            present = set(graph_nodes)
            edges = [e for e in sorted(first_links) if e[0] in present and e[1] in present]
        elif s.association == "mutual":
            models = {key: store[key] for key in graph_nodes}
            only, asked = None, responding
            if s.new_links == "partners" and first_links is not None:
                # a re-test can keep only a first-iteration link: each client needs only its
                # clusters' partners, and a client without any has nothing to test
                only = partners(first_links, graph_nodes)
                asked = [ci for ci in responding if ci in only]
            answers = clients.associate(t, models, asked, only)
            accept: dict[Node, set[Node]] = {}
            for ci, mat in answers.items():
                foreign = foreign_nodes(graph_nodes, ci, only)
                for q in range(mat.shape[0]):
                    if (ci, q) in models:
                        accept[(ci, q)] = {foreign[j] for j in np.flatnonzero(mat[q])}
            not_asked = set(responding) - set(asked)      # kept: they had nothing to test
            graph_nodes = [key for key in graph_nodes
                           if key[0] in answers or key[0] in not_asked]
            edges = mutual_edges(accept)                               # line 13: both ways
            if s.new_links in ("first", "partners") and first_links is not None:
                kept = [e for e in edges if e in first_links]
                rec["blocked_links"] = len(edges) - len(kept)
                edges = kept
            if s.cannot_link:
                kept = split_conflicts(graph_nodes, edges)
                rec["cut_edges"] = len(edges) - len(kept)
                edges = kept
            if s.bridge_cut:
                kept = cut_bridges(graph_nodes, edges, s.bridge_cut)
                rec["bridge_cuts"] = len(edges) - len(kept)
                edges = kept
            if first_links is None:
                first_links = set(edges)
        elif s.association == "perfect":
            nh = ev.node_hist()
            edges = perfect_edges(majority_classes({k: nh[k] for k in graph_nodes if k in nh}))

        # 3. communities (lines 17-20, eq. 3) ----------------------------------------------
        groups, isolated = (communities(graph_nodes, edges) if s.association != "none"
                            else ([], list(graph_nodes)))
        rec.update({"communities": len(groups), "isolated": len(isolated),
                    "edges": len(edges), "clusters": len(graph_nodes)})
        if iso_first is None:
            iso_first = len(isolated)
        if s.evaluate and ev.hists:
            rec.update(ev.groups(groups))

        # 4. community models (lines 21-24) ------------------------------------------------
        comm_params = (community_models(clients, t, groups, layer, s, reuse, store)
                       if groups and layer is not None else [])

        # 5. refinement on the active clients (lines 25-31) ---------------------------------
        by_client = community_members(groups) if len(comm_params) else {}
        replies = clients.refine(t, sorted(active), comm_params, by_client)
        in_graph, refined, asked = {key[0] for key in graph_nodes}, set(replies), set(active)
        agreements = {}
        confirmed = unconfirmed = 0
        shares = []
        for ci, r in sorted(replies.items()):
            agreements[ci] = r.agreement
            if r.confirmed is not None:
                confirmed += sum(r.confirmed)
                unconfirmed += len(r.confirmed) - sum(r.confirmed)
            if r.community_share is not None:
                shares.append(r.community_share)
            reuse.refined(t, ci, r.agreement)
            if r.agreement >= s.tau:
                active.discard(ci)
            if r.hist is not None:
                ev.hists[ci] = r.hist
        if s.evaluate and ev.hists:
            rec["eval_acc"] = mean_accuracy(ev.tables())
        rec["active_after"] = len(active)
        rec["mean_agreement"] = (float(np.mean(list(agreements.values()))) if agreements
                                 else None)
        rec["sizes"] = [len(g) for g in groups]
        if confirmed + unconfirmed:
            rec["unconfirmed_memberships"] = unconfirmed
            rec["unconfirmed_pct"] = 100.0 * unconfirmed / (confirmed + unconfirmed)
        if shares:
            rec["community_share"] = float(np.mean(shares))
        if on_iteration is not None:
            on_iteration(rec)
        history.append(rec)

        # 6. stop (§4.5); a client that no longer answers cannot become stable, so it does
        # not keep the run going
        reason = stopper.update(len(groups), len(isolated), len(active & set(responding)))
        if reason is not None:
            stop_reason = reason
            break

    last = history[-1] if history else {}
    summary: dict[str, Any] = {
        "iterations": t, "stop_reason": stop_reason,
        "communities": last.get("communities"), "isolated_start": iso_start,
        "isolated_first": iso_first, "isolated_end": last.get("isolated"),
        "active_clients": len(active & set(responding)),
        "active_unresponsive": sorted(active - set(responding)),
        "association": s.association,
        "health": assess(history),
    }
    if history:     # the last iteration's figures: which clients they rest on
        everyone = range(clients.n)
        summary["communities_coverage"] = coverage("fedcref", "communities", in_graph, everyone)
        summary["refine_coverage"] = coverage("fedcref", "refine", refined, asked)
    for warning in summary["health"]["warnings"]:
        LOG.warning("fedcref: %s", warning)
    if s.evaluate:
        summary.update({"eval_acc_start": acc_start, "eval_acc_end": last.get("eval_acc"),
                        "eval_wrong_associations_pct": last.get("eval_wrong_associations_pct"),
                        "eval_global_k": last.get("eval_global_k"),
                        "eval_ideal_communities": last.get("eval_ideal_communities"),
                        "eval_nodes": len(ev.hists)})
    start = {"communities": 0, "isolated": iso_start, "active_clients": clients.n,
             "eval_acc": acc_start}
    return Outcome(summary=summary, history=history, community_models=comm_params, start=start)
