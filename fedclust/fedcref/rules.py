r"""FedCRef's variants as small objects, chosen once from the settings.

A research option enters here as a new class of an existing rule, never as a new ``if`` in
the loop (:mod:`fedclust.fedcref.algorithm`) or in a client step (:mod:`fedclust.fedcref.client`).

**Association rules** (Algorithm 1 lines 10–15, run by client i for its cluster q and the
received models; :meth:`ClientSettings.association_rule
<fedclust.fedcref.keys.ClientSettings.association_rule>` builds one):

- :class:`Eq2` — the paper's eq. (2): ``Pr{Normalize_[0,1]|E_iq→iq − E_jp→iq| ≤ θ} ≥ α``.
- :class:`Ratio` — ``Q_a over x ∈ H_q of [log E_jp(x) − log E_iq(x)] ≤ ε`` on the samples
  ``H_q`` held out from ``AE_iq``'s training.
- :class:`Calibrated` — the same statistic ``≤ λ ·`` that of the client's closest other
  cluster model.
- :class:`Confident` (the default) — three one-sided sign tests at level β: as good as the own
  model, as good as the best foreign model, better than the client's other cluster models.

A rule sees one cluster at a time (:class:`Cluster`) and returns a :class:`Verdict`;
:func:`fedclust.fedcref.association.accept_matrix` runs it over a client's clusters.

**Links policies** (which iterations may link clusters, ``fedcref.new-links``): :class:`Every`
(the paper), :class:`First`, :class:`Once`, :class:`Partners`. The cluster graphs that use them
(:class:`~fedclust.fedcref.association.Mutual` with its
:class:`~fedclust.fedcref.association.GraphCuts`, and the baselines) are in
:mod:`fedclust.fedcref.association`; :attr:`Settings.cluster_graph
<fedclust.fedcref.keys.Settings.cluster_graph>` builds one.

**Refinements** (which models a sample may go to in Algorithm 2;
:meth:`ClientSettings.refinement <fedclust.fedcref.keys.ClientSettings.refinement>`):
:class:`PaperRefine`, :class:`GatedRefine`, :class:`CoveredRefine`.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

import numpy as np
from numpy.typing import NDArray

Node = tuple[int, int]           # (client, local cluster)
Edge = tuple[Node, Node]

_TINY = float(np.finfo(np.float32).tiny)
# cluster size (samples) at which the confident test's margin to the best is fedcref.best-margin
BEST_MARGIN_SIZE = 60


# ------------------------------------------------------------------------- statistics

def normalized_gap(e_own: NDArray, e_foreign: NDArray) -> NDArray[np.float64]:
    """``Normalize_[0,1] |e_own − e_foreign|`` along the last axis (all zeros if constant)."""
    d = np.abs(np.asarray(e_own, dtype=np.float64) - np.asarray(e_foreign, dtype=np.float64))
    lo = d.min(axis=-1, keepdims=True)
    span = d.max(axis=-1, keepdims=True) - lo
    return np.where(span > 0, (d - lo) / np.where(span > 0, span, 1.0), 0.0)


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


def sign_test_p(successes: NDArray, trials: int | NDArray) -> NDArray[np.float64]:
    """One-sided sign test: ``P(Bin(trials, ½) ≥ successes)`` (1 when there are no trials)."""
    from scipy.stats import binom

    successes = np.asarray(successes)
    trials = np.broadcast_to(np.asarray(trials), successes.shape)
    return np.where(trials > 0, binom.sf(successes - 1, trials, 0.5), 1.0)


def _log(errors: NDArray) -> NDArray[np.float64]:
    return np.log(np.maximum(np.asarray(errors, np.float64), _TINY))


# ------------------------------------------------------------------------- association rules

@dataclass(frozen=True)
class Cluster:
    """What client i has on its local cluster q for the association test.

    Attributes
    ----------
    q : the cluster
    own : (K, n) errors of each of the client's K own models on q's n samples (row q: q's own
        model ``AE_iq``; a row of a cluster with no model may hold NaNs)
    foreign : (F, n) errors of the F received models on the same samples
    held : (n,) samples held out from ``AE_iq``'s training, or None (rules that hold none out)
    """

    q: int
    own: NDArray
    foreign: NDArray
    held: NDArray[np.bool_] | None = None

    def on_held(self, errors: NDArray) -> NDArray:
        """``errors`` restricted to the held-out samples (all of them when none are held out)."""
        return errors if self.held is None else errors[..., self.held]

    def others(self, errors: NDArray) -> list[int]:
        """The client's other clusters whose models have finite ``errors`` rows (an "own
        different" anchor)."""
        return [r for r in range(len(errors)) if r != self.q and np.all(np.isfinite(errors[r]))]


@dataclass(frozen=True)
class Verdict:
    """A rule's answer for one cluster: which foreign models it accepts, and the continuous
    scores that choose one per foreign client (``fedcref.assoc-best-per-client``: the best
    ``score``, ties broken by the lower median log ``ratio``)."""

    ok: NDArray[np.bool_]
    score: NDArray
    ratio: NDArray

    @classmethod
    def none(cls, f: int) -> Verdict:
        """Abstain: accept none of ``f`` models."""
        return cls(np.zeros(f, dtype=bool), np.zeros(f), np.zeros(f))


class AssociationRule(Protocol):
    """How a client tests a cluster against the received models (one class per rule)."""

    #: the statistic runs over samples held out from the own model's training
    held_out: ClassVar[bool]
    #: a cluster with fewer samples abstains (accepts nothing)
    min_size: int

    def test(self, c: Cluster) -> Verdict:
        """Which of ``c.foreign`` cluster ``c.q`` accepts."""


@dataclass(frozen=True)
class Eq2:
    """The paper's eq. (2)::

        D = Normalize_[0,1] |E_iq→iq − E_jp→iq|,     accept  ⇔  Pr{D ≤ θ} ≥ α

    over all the cluster's samples (the own model is trained on every one). Scale-free: a
    foreign model ``c``× worse on every sample scores the same for every ``c``.
    """

    theta: float = 0.2
    alpha: float = 0.75
    min_size: int = 2
    held_out: ClassVar[bool] = False

    def accepts(self, own: NDArray, foreign: NDArray) -> NDArray[np.bool_]:
        """Eq. (2) for ``own`` (n,) errors and ``foreign`` (..., n): bool ``foreign.shape[:-1]``."""
        return accept_score(own, foreign, self.theta) >= self.alpha

    def test(self, c: Cluster) -> Verdict:
        score = accept_score(c.own[c.q], c.foreign, self.theta)
        return Verdict(score >= self.alpha, score, log_ratio_quantile(c.own[c.q], c.foreign, 0.5))


@dataclass(frozen=True)
class Ratio:
    """Not in the paper (``fedcref.assoc-rule=ratio``)::

        accept  ⇔  Q_a over x ∈ H_q of [ log E_jp(x) − log E_iq(x) ]  ≤  ε

    with ``H_q`` the samples held out from ``AE_iq``'s training and ``Q_a`` the ``a``-quantile
    (median by default): the foreign model reconstructs the typical held-out sample within a
    factor ``e^ε`` of the own model.
    """

    epsilon: float = 0.15
    quantile: float = 0.5
    min_size: int = 2
    held_out: ClassVar[bool] = True

    def test(self, c: Cluster) -> Verdict:
        ratio = log_ratio_quantile(c.on_held(c.own[c.q]), c.on_held(c.foreign), self.quantile)
        return Verdict(ratio <= self.epsilon, -ratio, ratio)


@dataclass(frozen=True)
class Calibrated:
    """Not in the paper, not recommended (``fedcref.assoc-rule=calibrated``): the ratio
    statistic ``s_m`` compared with two anchors the client has without labels — "same" is 0
    and "different" is ``s_d = min over q' ≠ q of s_iq'``, that of its closest other own model::

        accept  ⇔  s_m ≤ λ · s_d

    A cluster whose client has no other modelled cluster (no "different" anchor) accepts
    nothing.
    """

    lam: float = 0.9
    quantile: float = 0.5
    min_size: int = 2
    held_out: ClassVar[bool] = True

    def test(self, c: Cluster) -> Verdict:
        own = c.on_held(c.own)
        ratio = log_ratio_quantile(own[c.q], c.on_held(c.foreign), self.quantile)
        others = c.others(own)
        if not others:
            return Verdict.none(len(c.foreign))
        different = float(log_ratio_quantile(own[c.q], own[others], self.quantile).min())
        return Verdict(ratio <= self.lam * different, -ratio, ratio)


@dataclass(frozen=True)
class Confident:
    r"""Not in the paper, the default (``fedcref.assoc-rule=confident``): which foreign models
    are interchangeable with the own model ``AE_q``, shown by one-sided sign tests at level β.

    A foreign model f is accepted when every part holds:

    1. **as good as the own model** (:meth:`as_good_as_own`, on the h held-out samples
       ``H_q``): the sign test on ``#{x ∈ H_q : log E_f(x) − log E_q(x) ≤ ε}`` rejects
       "median > ε" (ε: ``margin``): ``P(Bin(h, ½) ≥ count) ≤ β``;
    2. **as good as the best foreign model** (:meth:`as_good_as_best`, all n samples of q, which
       no foreign model has seen; skipped with ``best_margin=None``): the same test on
       ``#{x : log E_f(x) − log E_b(x) ≤ δ_n}``, b the foreign model of lowest mean log error
       and ``δ_n = δ · max(1, n / 60)^γ`` (δ: ``best_margin``, γ: ``growth``): among several
       clients' models the right class is the best one, and a model of a similar class trails
       it on most samples even where it stays within ε of a weak own model;
    3. **better than every other own cluster model** (:meth:`beats_others`): for each other
       own cluster q', on the ``m`` samples of q that q's own model reconstructs better than
       q''s, ``#{x : E_f(x) < E_q'(x)}`` rejects "f wins at most half": ``P(Bin(m, ½) ≥ count)
       ≤ β``. A model that cannot beat the client's own clusters is no evidence of the same
       distribution, however close its errors are to the own ones.

    Every bound widens as the counts shrink, so with few samples the test abstains (with h < 6
    held-out samples no count reaches β = 0.02). With no other own cluster (no "different"
    anchor) nothing is accepted.
    """

    margin: float = 0.3
    best_margin: float | None = 0.1
    beta: float = 0.02
    growth: float = 0.0
    min_size: int = 2
    held_out: ClassVar[bool] = True

    def as_good_as_own(self, f: NDArray, o: NDArray, held: NDArray[np.bool_]
                       ) -> NDArray[np.bool_]:
        """Part 1 on log errors ``f`` (F, n) and ``o`` (n,)."""
        close = (f[:, held] - o[held] <= self.margin).sum(axis=1)
        return sign_test_p(close, int(held.sum())) <= self.beta

    def as_good_as_best(self, f: NDArray) -> NDArray[np.bool_]:
        """Part 2 on log errors ``f`` (F, n) (all true with ``best_margin=None``)."""
        if self.best_margin is None:
            return np.ones(f.shape[0], dtype=bool)
        best = int(np.argmin(f.mean(axis=1)))
        delta_n = self.best_margin * max(1.0, f.shape[1] / BEST_MARGIN_SIZE) ** self.growth
        near = (f - f[best] <= delta_n).sum(axis=1)
        return sign_test_p(near, f.shape[1]) <= self.beta

    def beats_others(self, f: NDArray, o: NDArray, r: NDArray) -> NDArray[np.bool_]:
        """Part 3 on log errors ``f`` (F, n), ``o`` (n,) and the other own models' ``r`` (R, n)."""
        mine = o[None, :] < r                                  # (R, n): samples q explains better
        wins = ((f[:, None, :] < r[None, :, :]) & mine[None]).sum(axis=2)          # (F, R)
        return (sign_test_p(wins, mine.sum(axis=1)[None, :]) <= self.beta).all(axis=1)

    def parts(self, own: NDArray, foreign: NDArray, others: NDArray, held: NDArray[np.bool_]
              ) -> NDArray[np.bool_]:
        """The three parts, rows of a ``(3, F)`` bool array, for the errors ``own`` (n,),
        ``foreign`` (F, n) and ``others`` (R, n) on q's samples, ``held`` (n,) held out from
        ``own``'s training. With no foreign model or no other own cluster every part is
        false."""
        held = np.asarray(held, dtype=bool)
        f, o = _log(foreign), _log(own)
        out = np.zeros((3, f.shape[0]), dtype=bool)
        if f.shape[0] == 0 or len(others) == 0:
            return out
        out[0] = self.as_good_as_own(f, o, held)
        out[1] = self.as_good_as_best(f)
        out[2] = self.beats_others(f, o, _log(others))
        return out

    def accepts(self, own: NDArray, foreign: NDArray, others: NDArray, held: NDArray[np.bool_]
                ) -> NDArray[np.bool_]:
        """Every part holds (arguments as :meth:`parts`): (F,) bool."""
        return self.parts(own, foreign, others, held).all(axis=0)

    def test(self, c: Cluster) -> Verdict:
        assert c.held is not None
        ok = self.accepts(c.own[c.q], c.foreign, c.own[c.others(c.own)], c.held)
        ratio = log_ratio_quantile(c.on_held(c.own[c.q]), c.on_held(c.foreign), 0.5)
        return Verdict(ok, -ratio, ratio)


ASSOCIATION_RULES: dict[str, type] = {"eq2": Eq2, "ratio": Ratio, "calibrated": Calibrated,
                                      "confident": Confident}


# ------------------------------------------------------------------------- links policies

def partners(links: Collection[Edge], nodes: Collection[Node]) -> dict[int, list[Node]]:
    """Per client, the nodes linked by ``links`` to one of its clusters, among ``nodes``
    (sorted; clients without such a node are left out)."""
    present = set(nodes)
    out: dict[int, set[Node]] = {}
    for a, b in links:
        if a in present and b in present:
            out.setdefault(a[0], set()).add(b)
            out.setdefault(b[0], set()).add(a)
    return {ci: sorted(ns) for ci, ns in sorted(out.items())}


@dataclass(frozen=True)
class Ask:
    """Who tests what in one association: the clients ``asked``, and with ``only`` the foreign
    nodes each of them tests (None: every foreign node)."""

    asked: list[int]
    only: Mapping[int, list[Node]] | None = None


class LinkPolicy(Protocol):
    """Which iterations may link clusters (``fedcref.new-links``). ``first`` is the first
    association's links (None before it)."""

    def ask(self, first: set[Edge] | None, nodes: list[Node], responding: list[int]
            ) -> Ask | None:
        """Who cross-evaluates this iteration; None: nobody, the first links are kept."""

    def allowed(self, edges: list[Edge], first: set[Edge] | None) -> list[Edge] | None:
        """The mutual ``edges`` this policy lets through; None: all (nothing is blocked)."""


@dataclass(frozen=True)
class Every:
    """The paper: every iteration cross-evaluates every pair, and any two clusters may link."""

    def ask(self, first: set[Edge] | None, nodes: list[Node], responding: list[int]
            ) -> Ask | None:
        return Ask(responding)

    def allowed(self, edges: list[Edge], first: set[Edge] | None) -> list[Edge] | None:
        return None


@dataclass(frozen=True)
class First(Every):
    """Later iterations test the first iteration's links again and keep or drop them, never
    add one (refined clusters can drift into mixtures of groups)."""

    def allowed(self, edges: list[Edge], first: set[Edge] | None) -> list[Edge] | None:
        return None if first is None else [e for e in edges if e in first]


@dataclass(frozen=True)
class Once(Every):
    """Later iterations keep the first iteration's links without a new cross-evaluation."""

    def ask(self, first: set[Edge] | None, nodes: list[Node], responding: list[int]
            ) -> Ask | None:
        return Ask(responding) if first is None else None


@dataclass(frozen=True)
class Partners(First):
    """As :class:`First`, but a client receives only the models of its clusters'
    first-iteration partners (the only links a re-test can keep), and a client without any
    has nothing to test."""

    def ask(self, first: set[Edge] | None, nodes: list[Node], responding: list[int]
            ) -> Ask | None:
        if first is None:
            return Ask(responding)
        only = partners(first, nodes)
        return Ask([ci for ci in responding if ci in only], only)


LINK_POLICIES: dict[str, type] = {"every": Every, "first": First, "once": Once,
                                  "partners": Partners}


class Step(Protocol):
    """What the association phase of one iteration offers a cluster graph
    (:class:`fedclust.fedcref.algorithm` implements it)."""

    #: the clients that answered this iteration's local phase
    responding: list[int]
    #: the first association's links (None before it)
    first_links: set[Edge] | None

    def cross_evaluate(self, nodes: list[Node], ask: Ask) -> tuple[list[Node], list[Edge]]:
        """Lines 10–13: the asked clients test the foreign models, and Γ has an edge where both
        directions accept. Returns the nodes of the clients that answered (or had nothing to
        test) and the mutual edges."""

    def node_hist(self) -> dict[Node, NDArray]:
        """Each node's true-class histogram (evaluation path only)."""


class ClusterGraph(Protocol):
    """Where Γ's edges come from (``fedcref.association``)."""

    def edges(self, step: Step, nodes: list[Node], rec: dict[str, Any]
              ) -> tuple[list[Node], list[Edge]]:
        """The graph's nodes and edges this iteration (``rec``: the iteration's record)."""


# ------------------------------------------------------------------------- refinements

@dataclass(frozen=True)
class Offer:
    """The community models offered to a client's refinement: ``models`` (stacked), the
    client's clusters in each (``members[g]``, empty for a community it is not in), and their
    community numbers in the run (``ids``)."""

    models: Any
    members: list[list[int]]
    ids: NDArray[np.int64]


class Refinement(Protocol):
    """Which models a sample may go to in Algorithm 2 (``fedcref.refine``). ``q*(x)`` is the
    cluster whose own model reconstructs x best."""

    #: the client is offered every community model (else only its own communities)
    offers_all: ClassVar[bool]
    #: the reply carries one confirmation bit per community offered
    confirms: ClassVar[bool]
    #: the client keeps its gate (which models each own-best cluster allows) for prediction
    gates: ClassVar[bool]

    def allow(self, view: RefineView) -> tuple[NDArray[np.bool_], NDArray[np.bool_]]:
        """``(allow, confirmed)``: ``allow[r, m]`` — a sample whose best own model is row r
        may go to candidate m (own models first, then the community models); ``confirmed``
        per community model."""


@dataclass(frozen=True)
class RefineView:
    """A client's view in refinement: its modelled clusters (``clusters``, own-model rows),
    the errors of its own (``own``, all K rows) and of the offered community models
    (``com``), its labels and held-out samples, and the members of each community offered."""

    clusters: NDArray[np.int64]
    own: NDArray
    com: NDArray
    labels: NDArray[np.int64]
    held: NDArray[np.bool_] | None
    members: list[list[int]]

    def own_only(self) -> NDArray[np.bool_]:
        """Every own-best row may go to the own models, to no community model."""
        n_own, n_com = len(self.clusters), len(self.com)
        allow = np.zeros((n_own, n_own + n_com), dtype=bool)
        allow[:, :n_own] = True
        return allow


@dataclass(frozen=True)
class PaperRefine:
    """The paper: every own and every community model."""

    offers_all: ClassVar[bool] = True
    confirms: ClassVar[bool] = False
    gates: ClassVar[bool] = False

    def allow(self, view: RefineView) -> tuple[NDArray[np.bool_], NDArray[np.bool_]]:
        n_own = len(view.clusters)
        return (np.ones((n_own, n_own + len(view.com)), dtype=bool),
                np.zeros(len(view.com), dtype=bool))


@dataclass(frozen=True)
class GatedRefine:
    """The own models, and the communities that hold ``q*(x)``: a sample never goes to a
    community whose member clusters its own models do not favour."""

    offers_all: ClassVar[bool] = False
    confirms: ClassVar[bool] = False
    gates: ClassVar[bool] = True

    def allow(self, view: RefineView) -> tuple[NDArray[np.bool_], NDArray[np.bool_]]:
        allow, n_own = view.own_only(), len(view.clusters)
        for g in range(len(view.com)):
            for q in view.members[g]:
                j = np.flatnonzero(view.clusters == q)
                allow[j, n_own + g] = True
        return allow, np.zeros(len(view.com), dtype=bool)


@dataclass(frozen=True)
class CoveredRefine:
    """The client first *confirms* each community it is in with the confident test (margin,
    β, no comparison with the best) on its member clusters' samples (:meth:`confirm`). A
    sample whose ``q*(x)`` is in a confirmed community goes to the best of the client's
    confirmed community models and the own models of its clusters that no confirmed community
    covers; any other sample keeps its own models. A community model never wins a sample
    whose best own model is a cluster no confirmed community covers."""

    margin: float = 0.3
    beta: float = 0.02
    offers_all: ClassVar[bool] = False
    confirms: ClassVar[bool] = True
    gates: ClassVar[bool] = True

    def confirm(self, view: RefineView) -> NDArray[np.bool_]:
        """Which of its communities the client confirms.

        Community g is confirmed when, for each of the client's clusters q in it, the
        community model passes the confident test against q's own model (on q's samples,
        q's held-out samples for the equivalence part, the client's other cluster models as
        the "different" anchor). A community the client is not in is never confirmed.
        Without held-out samples (``assoc-rule=eq2`` trains the own models on every sample)
        there is nothing to test on, and every community the client is in counts as
        confirmed.

        The converse check — that g passes the test for none of the client's clusters outside
        g — is not made: a community model is trained on several clients' data, and against
        own models trained on one client's it passes for other classes too (on MNIST, 10
        clients × 150 per cluster, it rejected every community of the first iteration).
        """
        if view.held is None:
            return np.array([bool(qs) for qs in view.members], dtype=bool)
        test = Confident(self.margin, None, self.beta)
        modelled = [int(q) for q in view.clusters]

        def passes(q: int, g: int) -> bool:
            whole = view.labels == q
            others = [r for r in modelled if r != q]
            if whole.sum() < 2 or not others:
                return False
            return bool(test.accepts(view.own[q, whole], view.com[g:g + 1, whole],
                                     view.own[others][:, whole], view.held[whole])[0])

        out = np.zeros(len(view.members), dtype=bool)
        for g, qs in enumerate(view.members):
            qs = [int(q) for q in qs if int(q) in modelled]
            if qs:
                out[g] = all(passes(q, g) for q in qs)
        return out

    def allow(self, view: RefineView) -> tuple[NDArray[np.bool_], NDArray[np.bool_]]:
        allow, n_own = view.own_only(), len(view.clusters)
        confirmed = self.confirm(view)
        covered = [r for r, q in enumerate(view.clusters)
                   if any(q in view.members[g] for g in np.flatnonzero(confirmed))]
        uncovered = np.setdiff1d(np.arange(n_own), covered)
        for r in covered:
            allow[r, :n_own] = False
            allow[r, uncovered] = True
            allow[r, n_own + np.flatnonzero(confirmed)] = True
        return allow, confirmed


REFINEMENTS: dict[str, type] = {"paper": PaperRefine, "gated": GatedRefine,
                                "covered": CoveredRefine}


def refinement_of(mode: str | Refinement) -> Refinement:
    """``mode`` as a :class:`Refinement` (a name of ``fedcref.refine``: the default margins)."""
    if isinstance(mode, str):
        if mode not in REFINEMENTS:
            raise ValueError(f"refine mode must be one of {tuple(REFINEMENTS)}, got {mode!r}")
        return REFINEMENTS[mode]()
    return mode


