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
   ``Pr{Normalize_[0,1]|E_iq→iq − E_jp→iq| ≤ θ} ≥ α``, or another association rule
   (:mod:`fedclust.fedcref.rules`). Only the accept bits come back. The links policy
   (``new-links``) says which iterations may link: with ``partners``, later iterations send a
   client only the models of its clusters' first-iteration partners (the only links a re-test
   can keep).
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
from fedclust.fedcref.association import communities, mutual_edges
from fedclust.fedcref.client import derive_seed
from fedclust.fedcref.evaluation import majority_classes, mean_accuracy, wrong_associations
from fedclust.fedcref.health import assess
from fedclust.fedcref.keys import Settings
from fedclust.fedcref.rules import Ask, partners  # noqa: F401  (partners: re-exported)
from fedclust.fedcref.stopping import StabilityStop
from fedclust.results import coverage

LOG = logging.getLogger("fedclust")
Node = tuple[int, int]                    # (client, local cluster)
Edge = tuple[Node, Node]
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


@dataclass(frozen=True)
class CommunityStart:
    """What the communities of :func:`train_communities` start from: the autoencoders' layer
    sizes; ``kept[g]``, when not None, community g's model from an earlier iteration (used as
    is, not trained); ``warm[g]``, when not None, the model community g starts from instead of
    a fresh initialisation (trained ``warm-rounds`` rounds, at most ``fl-rounds``)."""

    layer: list[int]
    kept: list[ae.Params | None] | None = None
    warm: list[ae.Params | None] | None = None

    def rounds(self, g: int, s: Settings) -> int:
        """FedAvg rounds of community g."""
        if self.kept is not None and self.kept[g] is not None:
            return 0
        if self.warm is not None and self.warm[g] is not None:
            return min(s.warm_rounds, s.fl_rounds)
        return s.fl_rounds

    def params(self, n: int, seed: int, s: Settings) -> ae.Params:
        """The ``n`` communities' starting models (fresh ones drawn with ``seed``)."""
        params = ae.init_params(n, self.layer, seed, s.ae_init)
        kept, warm = self.kept or [None] * n, self.warm or [None] * n
        start = [k if k is not None else w for k, w in zip(kept, warm, strict=True)]
        if any(p is not None for p in start):
            params = ae.concat([start[g] if start[g] is not None else [p[g:g + 1] for p in params]
                                for g in range(n)])
        return params


def train_communities(clients: Clients, t: int, groups: list[list[Node]], s: Settings,
                      start: CommunityStart) -> ae.Params:
    """Lines 21–24: ``fl-rounds`` rounds of FedAvg for all communities at once.

    Each round the members return their trained copy and sample count per community; the new
    community model is the count-weighted mean of the copies (a community nobody trained in a
    round keeps its model). ``start`` says what each community starts from and how many
    rounds it trains (:class:`CommunityStart`).
    """
    params = start.params(len(groups), community_seed(s.seed, t), s)
    rounds = [start.rounds(g, s) for g in range(len(groups))]
    for rnd in range(1, max(rounds, default=0) + 1):
        members = {ci: [(g, qs) for g, qs in m if rnd <= rounds[g]]
                   for ci, m in community_members(groups).items()}
        members = {ci: m for ci, m in members.items() if m}
        if not members:
            break
        seed = derive_seed(s.seed, t, 100 + rnd)
        params = _fedavg(clients.community_round(t, rnd, params, members, seed), params,
                         len(groups))
    return params


def _fedavg(replies: dict[int, list[Contribution]], params: ae.Params, n: int) -> ae.Params:
    """Line 23: each community's count-weighted mean of its members' copies (a community
    nobody trained keeps ``params``' model)."""
    got: dict[int, list[tuple[ae.Params, float]]] = {}
    for ci in sorted(replies):
        for c in replies[ci]:
            if c.count > 0:
                got.setdefault(c.community, []).append((c.model, float(c.count)))
    new = []
    for g in range(n):
        if g in got:
            stacks, weights = zip(*got[g], strict=True)
            new.append(ae.fedavg(list(stacks), list(weights)))
        else:
            new.append([p[g:g + 1] for p in params])
    return ae.concat(new)


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


def community_models(clients: Clients, t: int, groups: list[list[Node]], s: Settings,
                     state: _State) -> ae.Params:
    """Lines 21–24; with ``reuse-communities``, only the communities whose members or data
    changed are trained, the others keep their model; with ``warm-start``, a trained community
    starts from the nearest community model of the last iteration (:meth:`_Reuse.nearest`),
    or, when none of its clusters was in a community, from the cluster model of its first
    member (the current cluster models, which the server already holds)."""
    reuse, members = state.reuse, state.store
    kept = [reuse.kept(g) if s.reuse_communities else None for g in groups]
    warm: list[ae.Params | None] = [None] * len(groups)
    for i, g in enumerate(groups):
        if s.warm_start and kept[i] is None:
            warm[i] = reuse.nearest(g)
            if warm[i] is None and members and g[0] in members:
                warm[i] = ae.from_numpy(members[g[0]][1])
    assert state.layer is not None
    params = train_communities(clients, t, groups, s, CommunityStart(state.layer, kept, warm))
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


@dataclass
class _State:
    """What Algorithm 1 carries from one iteration to the next, and the phases that update it.
    It is the :class:`~fedclust.fedcref.rules.Step` the cluster graph asks for the
    association (:meth:`cross_evaluate`)."""

    clients: Clients
    active: set[int]                      #: the active set A
    t: int = 0
    store: dict[Node, tuple[int, Model]] = field(default_factory=dict)   # current cluster models
    ks: dict[int, int] = field(default_factory=dict)
    ev: _Evaluation = field(default_factory=lambda: _Evaluation())
    reuse: _Reuse = field(default_factory=lambda: _Reuse())
    layer: list[int] | None = None
    responding: list[int] = field(default_factory=list)
    first_links: set[Edge] | None = None  #: the links of the first association
    acc_start: float = float("nan")
    iso_start: int | None = None
    iso_first: int | None = None
    in_graph: set[int] = field(default_factory=set)
    refined: set[int] = field(default_factory=set)
    asked: set[int] = field(default_factory=set)

    def local_models(self, s: Settings, rec: dict[str, Any]) -> list[Node]:
        """Lines 6–8: the active clients (re)train their cluster models; returns the graph's
        nodes, the modelled clusters of the clients that answered."""
        local = self.clients.local(self.t, self.active, derive_seed(s.seed, self.t, 1))
        if not local:
            raise RuntimeError(f"FedCRef iteration {self.t}: no client answered the local phase")
        for ci, r in local.items():
            self._keep(ci, r)
        if self.t == 1 and s.evaluate and self.ev.hists:
            self.acc_start = mean_accuracy(self.ev.tables())
        self.responding = sorted(local)
        nodes = sorted(key for key in self.store if key[0] in local)
        # clusters below min-cluster-size (or emptied by refinement) have no model, so they
        # are not graph nodes: left out of every cluster count, isolated_start included
        rec["unmodelled_clusters"] = int(sum(self.ks[i] for i in self.responding)) - len(nodes)
        if self.iso_start is None:
            # the paper's "isolated start" (Tables 3-8, Fig. 4d): before any association every
            # cluster (that has a model) is isolated
            self.iso_start = len(nodes)
        return nodes

    def _keep(self, ci: int, r: LocalReply) -> None:
        self.ks[ci] = r.k
        if r.models is not None:
            for key in [key for key in self.store if key[0] == ci]:
                del self.store[key]
            self.store.update({(ci, q): (r.version, m) for q, m in r.models.items()})
            if self.layer is None and r.models:
                self.layer = layer_sizes_of(next(iter(r.models.values())))
        if r.modelled is not None:   # clusters emptied by refinement lose their model
            for key in [key for key in self.store if key[0] == ci and key[1] not in r.modelled]:
                del self.store[key]
        if r.hist is not None:
            self.ev.hists[ci] = r.hist

    def cross_evaluate(self, nodes: list[Node], ask: Ask) -> tuple[list[Node], list[Edge]]:
        """Lines 10–13: each asked client tests the foreign models (the accept bits of
        eq. 2 or its replacement); Γ gets an edge where both directions accept."""
        models = {key: self.store[key] for key in nodes}
        answers = self.clients.associate(self.t, models, ask.asked, ask.only)
        accept: dict[Node, set[Node]] = {}
        for ci, mat in answers.items():
            foreign = foreign_nodes(nodes, ci, ask.only)
            for q in range(mat.shape[0]):
                if (ci, q) in models:
                    accept[(ci, q)] = {foreign[j] for j in np.flatnonzero(mat[q])}
        not_asked = set(self.responding) - set(ask.asked)      # kept: nothing to test
        nodes = [key for key in nodes if key[0] in answers or key[0] in not_asked]
        return nodes, mutual_edges(accept)                    # line 13: both ways

    def node_hist(self) -> dict[Node, NDArray]:
        return self.ev.node_hist()

    def communities(self, s: Settings, nodes: list[Node], edges: list[Edge],
                    rec: dict[str, Any]) -> tuple[list[list[Node]], list[Node]]:
        """Lines 17–20 (eq. 3): the connected components of Γ with ≥ 2 clusters, and the
        isolated set I."""
        groups, isolated = communities(nodes, edges)
        rec.update({"communities": len(groups), "isolated": len(isolated),
                    "edges": len(edges), "clusters": len(nodes)})
        if self.iso_first is None:
            self.iso_first = len(isolated)
        if s.evaluate and self.ev.hists:
            rec.update(self.ev.groups(groups))
        self.in_graph = {key[0] for key in nodes}
        return groups, isolated

    def refine(self, s: Settings, groups: list[list[Node]], params: ae.Params,
               rec: dict[str, Any]) -> None:
        """Lines 25–31: Algorithm 2 on every active client with the community ``params``; a
        client whose labels agree ``ACC(y', y) ≥ τ`` with its last ones (eq. 4) leaves A."""
        by_client = community_members(groups) if len(params) else {}
        replies = self.clients.refine(self.t, sorted(self.active), params, by_client)
        self.refined, self.asked = set(replies), set(self.active)
        agreements, shares = {}, []
        confirmed = unconfirmed = 0
        for ci, r in sorted(replies.items()):
            agreements[ci] = r.agreement
            if r.confirmed is not None:
                confirmed += sum(r.confirmed)
                unconfirmed += len(r.confirmed) - sum(r.confirmed)
            if r.community_share is not None:
                shares.append(r.community_share)
            self.reuse.refined(self.t, ci, r.agreement)
            if r.agreement >= s.tau:
                self.active.discard(ci)
            if r.hist is not None:
                self.ev.hists[ci] = r.hist
        if s.evaluate and self.ev.hists:
            rec["eval_acc"] = mean_accuracy(self.ev.tables())
        rec["active_after"] = len(self.active)
        rec["mean_agreement"] = (float(np.mean(list(agreements.values()))) if agreements
                                 else None)
        rec["sizes"] = [len(g) for g in groups]
        if confirmed + unconfirmed:
            rec["unconfirmed_memberships"] = unconfirmed
            rec["unconfirmed_pct"] = 100.0 * unconfirmed / (confirmed + unconfirmed)
        if shares:
            rec["community_share"] = float(np.mean(shares))

    def outcome(self, s: Settings, history: list[dict[str, Any]], params: ae.Params,
                stop_reason: str) -> Outcome:
        """The run's summary (and Figure 4's iteration 0) after the last iteration."""
        last = history[-1] if history else {}
        responding = set(self.responding)
        summary: dict[str, Any] = {
            "iterations": self.t, "stop_reason": stop_reason,
            "communities": last.get("communities"), "isolated_start": self.iso_start,
            "isolated_first": self.iso_first, "isolated_end": last.get("isolated"),
            "active_clients": len(self.active & responding),
            "active_unresponsive": sorted(self.active - responding),
            "association": s.association,
            "health": assess(history),
        }
        if history:     # the last iteration's figures: which clients they rest on
            everyone = range(self.clients.n)
            summary["communities_coverage"] = coverage("fedcref", "communities", self.in_graph,
                                                       everyone)
            summary["refine_coverage"] = coverage("fedcref", "refine", self.refined, self.asked)
        for warning in summary["health"]["warnings"]:
            LOG.warning("fedcref: %s", warning)
        if s.evaluate:
            summary.update({"eval_acc_start": self.acc_start,
                            "eval_acc_end": last.get("eval_acc"),
                            "eval_wrong_associations_pct": last.get("eval_wrong_associations_pct"),
                            "eval_global_k": last.get("eval_global_k"),
                            "eval_ideal_communities": last.get("eval_ideal_communities"),
                            "eval_nodes": len(self.ev.hists)})
        start = {"communities": 0, "isolated": self.iso_start, "active_clients": self.clients.n,
                 "eval_acc": self.acc_start}
        return Outcome(summary=summary, history=history, community_models=params, start=start)


def run(clients: Clients, s: Settings,
        on_iteration: Callable[[dict[str, Any]], None] | None = None) -> Outcome:
    """Algorithm 1 (the steps are in the module docstring). The variants are objects chosen
    once from ``s``: where the graph's edges come from and which iterations may link
    (:attr:`Settings.cluster_graph <fedclust.fedcref.keys.Settings.cluster_graph>`); the
    clients hold their association rule and refinement. ``on_iteration`` receives each
    iteration's record before the stop test (the strategy adds traffic and logs it)."""
    state = _State(clients, active=set(range(clients.n)))
    graph = s.cluster_graph
    stopper = StabilityStop(s.stop_window, s.stop_change)
    history: list[dict[str, Any]] = []
    params: ae.Params = []
    stop_reason = "max-iterations"
    for t in range(1, s.max_iterations + 1):
        state.t = t
        rec: dict[str, Any] = {"iteration": t, "active_clients": len(state.active)}
        # lines 6-8: the active clients train one autoencoder per local cluster (eq. 1)
        nodes = state.local_models(s, rec)
        # lines 9-16: cross-evaluation on the clients; an edge where both directions accept
        nodes, edges = graph.edges(state, nodes, rec)
        # lines 17-20 (eq. 3): communities and the isolated set I
        groups, isolated = state.communities(s, nodes, edges, rec)
        # lines 21-24: one FedAvg autoencoder per community
        params = (community_models(clients, t, groups, s, state)
                  if groups and state.layer is not None else [])
        # lines 25-31: Algorithm 2 on the active clients; a stable client leaves A (eq. 4)
        state.refine(s, groups, params, rec)
        if on_iteration is not None:
            on_iteration(rec)
        history.append(rec)
        # §4.5: stop when A is empty or the counts are stable; a client that no longer
        # answers cannot become stable, so it does not keep the run going
        reason = stopper.update(len(groups), len(isolated),
                                len(state.active & set(state.responding)))
        if reason is not None:
            stop_reason = reason
            break
    return state.outcome(s, history, params, stop_reason)
