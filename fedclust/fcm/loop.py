r"""Exact federated fuzzy c-means, the server's loop (paper 004, Algorithm 1), without Flower.

The loop talks to the clients through :class:`Clients`, one call per phase. Three
implementations exist: plain messages (:class:`strategies.fcm.exact.FlowerClients`), SecAgg+
(:class:`strategies.fcm.secure.SecureClients`: the server learns only the sums over a round's
clients) and direct calls in one process (:class:`fedclust.fcm.inmemory.InMemoryClients`). How
the server combines a round's sums with earlier ones is an :class:`UpdateRule`: paper 004's
(:class:`RoundRule`) or the incremental one (:class:`IncrementalRule`).

0. **Scaling** (:func:`fedclust.fcm.phases.federate_scaling`): the clients send per-feature
   statistics; the server fixes one ``(shift, scale)`` and the box ``[low, high]`` of the
   scaled rows, and draws ``V(0)``: ``C`` centers uniformly in the box (seed ``seed``).
1. **Round t** (``t = 1 … T``, ``T = max-rounds``): sample ``⌈γM⌉`` of the ``M`` clients
   (positions drawn without replacement by the same generator) and send them ``V(t)``; each
   returns its *local sums* (Algorithm 2)

   .. math:: U_c = \sum_j u_{cj}^m, \qquad WS_c = \sum_j u_{cj}^m x_j,

   or withholds them under the privacy guard (``N ≤ C(F+1)/F``, §4.2).
2. **Update** (eq. 3–6): with :math:`(ΣU, ΣWS)` the rule's totals,

   .. math:: v_c(t+1) = \frac{\sum WS_c}{\sum U_c}

   (a cluster with zero mass keeps its center). With ``γ = 1`` this is centralized FCM from
   the same initialisation.
3. **Stop**: paper 004 — ``‖V(t+1) − V(t)‖_F < ε`` in a round somebody contributed to; the
   incremental rule — every client that can answer has sums on the server and the centers
   moved less than ``ε`` since the oldest of them were computed (the drift,
   :mod:`fedclust.fcm.incremental`).
4. **Final phase**: every client receives ``V(T)`` (and keeps its owner's results) and returns
   its objective share :math:`J_m = \sum_j \sum_c u_{cj}^m \|x_j - v_c\|^2` and, on the
   evaluation path, its label × cluster table.

A run in which no client contributed to any round stops with the causes (privacy guard,
dropouts, exclusions) instead of returning the random initial centers.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from fedclust import fcm
from fedclust.fcm import incremental
from fedclust.fcm.keys import FCMSettings
from fedclust.fcm.phases import (
    Client,
    FinalStats,
    Namer,
    NodeStats,
    Replies,
    Scaling,
    eval_ari,
    federate_scaling,
)
from fedclust.results import Progress, Record, coverage, eval_coverage

LOG = logging.getLogger("fedclust")
Float = np.ndarray


@dataclass
class RoundSums:
    """One round's answer: ``U = Σ u^m`` (C,) and ``WS = Σ u^m x`` (C, F), summed over the
    clients that contributed.

    Attributes
    ----------
    u, ws : arrays
        The totals (zeros when nobody contributed).
    contributed : int
        How many clients' sums are in the totals.
    phase : Replies
        The round's replies; ``got`` holds each client's ``(U, WS)`` when the server sees them.
    totals_only : bool
        The server saw the totals only (SecAgg+): no client's own sums, and a client the
        privacy guard keeps silent sends zeros among the contributions.
    """

    u: Float
    ws: Float
    contributed: int
    phase: Replies[tuple[Float, Float]] = field(default_factory=Replies)
    totals_only: bool = False

    def silent(self, someone: bool) -> int:
        """How many of the round's clients the privacy guard kept silent, as far as the server
        can tell: the notices it got; with totals only, every contributor of a round that
        summed to zero (``someone`` False: ``ΣU = 0``)."""
        if self.totals_only and not someone:
            return self.contributed
        return len(self.phase.withheld)


class Clients(Protocol):
    """What exact federated FCM asks of the clients. A client missing from a phase's replies
    did not answer (its reason is in ``failed``)."""

    #: the run's clients; a round samples positions of this list
    ids: list[Client]

    def name(self, client: Client) -> str:
        """How a message names ``client``."""

    def statistics(self) -> Replies[NodeStats]:
        """Phase 0: every client's per-feature statistics (and row count)."""

    def sums(self, rnd: int, sampled: list[Client], centers: Float, sc: Scaling) -> RoundSums:
        """Round ``rnd``: the local sums of the ``sampled`` clients from ``centers`` (C, F), in
        the scaled space of ``sc``."""

    def final(self, centers: Float, sc: Scaling) -> FinalStats:
        """The final phase: every client's objective share at ``centers`` (and, when the run
        evaluates, its label × cluster table); each client keeps its owner's results."""


# ---------------------------------------------------------------------------- update rules

class UpdateRule(Protocol):
    """How the server turns a round's sums into the totals of the update, and when it stops."""

    def totals(self, rnd: int, centers: Float, r: RoundSums) -> tuple[Float, Float]:
        """``(ΣU, ΣWS)`` of the update after round ``rnd`` (``centers``: those sent in it)."""

    def note(self, rnd: int, r: RoundSums, centers: Float) -> dict[str, Any]:
        """What the record of round ``rnd`` adds (``centers``: the updated ones)."""

    def converged(self, shift: float, r: RoundSums, centers: Float) -> bool:
        """Whether the loop stops after this round (``shift``: ``‖V(t+1) − V(t)‖_F``)."""

    def summary(self, rnd: int) -> dict[str, Any]:
        """What the run's metrics add after round ``rnd``."""


class RoundRule:
    """Paper 004: the update uses this round's sums; stop when the centers moved less than
    ``ε`` in a round somebody contributed to (a round nobody contributed to proves nothing)."""

    def __init__(self, epsilon: float) -> None:
        self.epsilon = epsilon

    def totals(self, rnd: int, centers: Float, r: RoundSums) -> tuple[Float, Float]:
        return r.u, r.ws

    def note(self, rnd: int, r: RoundSums, centers: Float) -> dict[str, Any]:
        return {}

    def converged(self, shift: float, r: RoundSums, centers: Float) -> bool:
        return shift < self.epsilon and r.contributed > 0

    def summary(self, rnd: int) -> dict[str, Any]:
        return {}


class IncrementalRule:
    """Incremental EM: the server keeps every client's latest sums
    (:class:`~fedclust.fcm.incremental.LatestSums`), replaces the answering clients' and
    updates from the sum over all of them; it stops when every client that can answer holds
    sums and their drift is below ``ε``. A client that drops keeps its latest sums in the
    total. Needs each client's own sums (not under SecAgg+)."""

    def __init__(self, clients: Sequence[Client], n_clusters: int, n_features: int,
                 epsilon: float, down: Collection[Client] = ()) -> None:
        self.store = incremental.LatestSums(n_clusters, n_features)
        self.clients = list(clients)
        self.epsilon = epsilon
        self.silent: set[Client] = set()   # kept silent by the privacy guard (depends on N)
        self.down: set[Client] = set(down)  # dropped when last asked
        self.required: set[Client] = set()

    def totals(self, rnd: int, centers: Float, r: RoundSums) -> tuple[Float, Float]:
        if r.totals_only:
            raise ValueError("the incremental rule needs each client's own sums")
        self.store.replace(rnd, centers, r.phase.got)
        return self.store.totals()

    def note(self, rnd: int, r: RoundSums, centers: Float) -> dict[str, Any]:
        # the clients that can answer: not kept silent by the privacy guard (it depends only
        # on N) and not down (dropped when last asked; their latest sums stay)
        self.silent |= set(r.phase.withheld)
        self.down = (self.down - r.phase.answered) | set(r.phase.failed)
        self.required = set(self.clients) - self.silent - self.down
        drift = self.store.drift(centers, self.required)
        return {"clients_with_sums": len(self.store), "oldest_sums_age": self.store.oldest_age(rnd),
                "drift": drift if math.isfinite(drift) else None}

    def converged(self, shift: float, r: RoundSums, centers: Float) -> bool:
        return incremental.converged(self.store, self.required, centers, self.epsilon)

    def summary(self, rnd: int) -> dict[str, Any]:
        return {"clients_with_sums": len(self.store),
                "oldest_sums_age": self.store.oldest_age(rnd)}


# ------------------------------------------------------------------------------------ loop

def run(clients: Clients, s: FCMSettings, record: Record) -> dict[str, Any]:
    """Algorithm 1; returns the run's metrics. ``record`` gets one record per round and the
    arrays ``initial_centers``, ``centers`` (scaled space), ``centers_unscaled`` (the data's
    units), ``scaling_shift`` and ``scaling_scale``."""
    nodes = clients.ids
    rng = np.random.default_rng(s.seed)
    sc = federate_scaling(clients.statistics(), s, clients.name)
    c = s.n_clusters
    centers = fcm.random_centers(sc.low, sc.high, c, rng)
    record.save_array("initial_centers", centers)
    f = centers.shape[1]
    n_sample = max(1, math.ceil(s.fraction * len(nodes)))
    rule: UpdateRule = (IncrementalRule(nodes, c, f, s.epsilon, sc.phase.failed)
                        if s.incremental else RoundRule(s.epsilon))
    causes = _Silence()
    progress = Progress(s.max_rounds, "exact-fcm round")
    totals = {"bytes_sent": sc.phase.bytes_sent, "bytes_received": sc.phase.bytes_received}
    dropped_all: set[Client] = set(sc.phase.failed)
    converged, shift, rnd, rounds_with_contributions = False, float("inf"), 0, 0
    for rnd in range(1, s.max_rounds + 1):
        # 1. sample and ask: positions, not ids (node ids are uint64 and numpy would turn
        # them into floats)
        picks = rng.choice(len(nodes), size=min(n_sample, len(nodes)), replace=False)
        sampled = sorted(nodes[int(i)] for i in picks)
        r = clients.sums(rnd, sampled, centers, sc)
        # Every contributing client adds Σ_c u^m > 0 to ΣU: ΣU = 0 means nobody contributed
        # (also under SecAgg+, where a client withheld by the privacy guard sends zeros).
        someone = float(np.sum(r.u)) > 0
        rounds_with_contributions += int(someone)

        # 2. update (eq. 3-6)
        u, ws = rule.totals(rnd, centers, r)
        new = fcm.update_centers(u, ws, centers)
        shift = float(np.linalg.norm(new - centers))
        centers = new
        totals["bytes_sent"] += r.phase.bytes_sent
        totals["bytes_received"] += r.phase.bytes_received
        dropped_all |= set(r.phase.failed)
        causes.note(r, r.silent(someone))
        entry = {"round": rnd, "shift": shift, "sampled": len(sampled),
                 "contributed": r.contributed, "withheld": len(r.phase.withheld),
                 "dropped_nodes": {str(k): v for k, v in r.phase.failed.items()},
                 "empty_clusters": int((u <= 0).sum()), "seconds": r.phase.seconds}
        entry.update(rule.note(rnd, r, centers))
        record.log_round(entry)
        progress.step(rnd, f"shift {shift:.3g} | {r.contributed}/{len(sampled)} clients")
        if not someone:
            _no_contribution(rnd, len(sampled), len(nodes), r, c, f, s, clients.name)

        # 3. stop
        if rule.converged(shift, r, centers):
            converged = True
            break
    if rounds_with_contributions == 0:
        raise RuntimeError(causes.message(rnd, c, f, s, clients.name))
    record.save_array("centers", centers)
    record.save_array("centers_unscaled", centers * sc.scale + sc.shift)
    record.save_array("scaling_shift", sc.shift)
    record.save_array("scaling_scale", sc.scale)
    metrics: dict[str, Any] = {"rounds": rnd, "converged": converged, "final_shift": shift,
                               "rounds_with_contributions": rounds_with_contributions,
                               "scaling_withheld_clients": sc.withheld,
                               "n_clients": len(nodes), "incremental": s.incremental,
                               **totals}
    metrics.update(rule.summary(rnd))

    # 4. final phase: the final centers reach every client; each keeps its owner's results
    fin = clients.final(centers, sc)
    metrics["objective_coverage"] = coverage("exact-fcm", "objective", fin.objective_clients(),
                                             nodes)
    # a figure that no node's share holds is no figure
    metrics["objective"] = fin.objective if metrics["objective_coverage"]["nodes"] else None
    if fin.withheld is not None:
        metrics["objective_withheld_clients"] = fin.withheld
    if s.evaluate:
        metrics["eval_ari"] = eval_ari(fin.tables)
        metrics["eval_coverage"] = eval_coverage("exact-fcm", fin.eval_nodes, len(nodes),
                                                 fin.eval_rows)
    metrics["dropped_nodes"] = sorted(dropped_all | set(fin.phase.failed))
    return metrics


class _Silence:
    """Why rounds got no contribution, over the whole run: clients withheld by the privacy
    guard, clients that did not answer, clients whose replies the server's checks excluded."""

    def __init__(self) -> None:
        self.withheld = 0
        self.totals_only = False
        self.dropped: dict[Client, str] = {}
        self.excluded: dict[Client, str] = {}

    def note(self, r: RoundSums, withheld: int) -> None:
        self.withheld += withheld
        self.totals_only |= r.totals_only
        for nid, why in r.phase.failed.items():
            if nid in r.phase.excluded:
                self.excluded[nid] = why.removeprefix("rejected reply: ")
            else:
                self.dropped[nid] = why

    def message(self, rounds: int, c: int, f: int, s: FCMSettings, name: Namer) -> str:
        """The stop message of a run nobody contributed to, naming the causes seen."""
        guard = s.privacy_guard and self.withheld
        parts, fixes = [], []
        if guard:
            whom = ("every client that answered (SecAgg+: it sends zeros)"
                    if self.totals_only else f"{self.withheld} repl(y/ies)")
            parts.append(
                f"the privacy guard withheld {whom} (a client with N <= C(F+1)/F = "
                f"{c * (f + 1) / f:.3g} points, C = {c} clusters, F = {f} features, sends "
                f"nothing)")
            fixes.append("lower fcm.n-clusters or set fcm.privacy-guard=false")
        if self.excluded:
            parts.append("the server's checks excluded " + "; ".join(
                f"{name(n)} ({why})" for n, why in sorted(self.excluded.items())))
            fixes.append("check the excluded nodes (their data, their fedclust version, "
                         "whether they can be trusted) or remove them")
        if self.dropped:
            parts.append(f"{len(self.dropped)} node(s) did not answer ("
                         + "; ".join(f"{name(n)}: {why}"
                                     for n, why in sorted(self.dropped.items())) + ")")
            fixes.append("check the nodes' logs for dropouts and the run config 'timeout'")
        return (f"exact FCM: no client contributed to any of the {rounds} round(s), so the "
                f"result would be the random initial centers: "
                f"{'; '.join(parts) or 'no client was sampled'}. Fix: "
                f"{'; '.join(fixes) or 'start the nodes'}.")


def _no_contribution(rnd: int, n_sampled: int, n_nodes: int, r: RoundSums, c: int, f: int,
                     s: FCMSettings, name: Namer) -> None:
    """Warn about a round nobody contributed to; stop at once when every later round must be
    the same (all clients sampled, none dropped or excluded: the guard depends only on N, C
    and F)."""
    LOG.warning("[round-%d] no client contributed (%d sampled, %d withheld by the privacy "
                "guard%s, %d dropped, %d of them excluded by the server's checks): the centers "
                "stay where they are", rnd, n_sampled, len(r.phase.withheld),
                " or SecAgg+ zeros" if r.totals_only else "",
                len(r.phase.failed), len(r.phase.excluded))
    if s.privacy_guard and n_sampled == n_nodes and not r.phase.failed:
        silence = _Silence()
        silence.note(r, r.silent(False))
        raise RuntimeError(silence.message(rnd, c, f, s, name))
