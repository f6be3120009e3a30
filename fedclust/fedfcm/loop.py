r"""FedFCM with k-means averaging, FedFuzzDB and the choice of K: the server's loop (paper 003,
§2.2), without Flower.

The loop talks to the clients through :class:`Clients`, one call per phase: over Flower
messages (:class:`strategies.fcm.fedfcm.FlowerClients`) or by direct calls in one process
(:class:`fedclust.fedfcm.inmemory.InMemoryClients`).

0. **Scaling** (:func:`fedclust.fcm.phases.federate_scaling`), as exact FCM: one
   ``(shift, scale)`` and the box of the scaled rows; for every ``K`` in
   ``[k-min, k-max]``, ``K`` initial centers uniformly in the box (one generator, seed
   ``seed``, K ascending).
1. **Round t** (paper 003 steps 2–4), every K that has not converged *together* (one message
   carries the global centers of each; choosing K costs as many round trips as fitting the
   slowest K): each client runs local FCM to convergence from the global centers
   (:func:`fedclust.fedfcm.local_step`, ``‖U(t+1) − U(t)‖_F ≤ local-tol``) and returns its
   local centers (and, for federated averaging, their supports :math:`\sum_j u_{kj}`).
2. **Averaging** (step 5, eq. 14): per K, k-means over all stacked local centers
   (k-means++ in round 1, the previous global centers afterwards; seed
   ``1000·seed + K``), or the support-weighted mean of [20, 21]
   (:func:`fedclust.fedfcm.average`).
3. **Stop** (step 6), per K: :math:`\sum_k \|c_{k,t} - c_{k,t+1}\| \le` ``tol``; the loop
   ends when every K has stopped or after ``max-rounds``.
4. **FedFuzzDB** (eq. 15–17): one message asks every client, for every K, its sums
   :math:`N_l`, :math:`\sum_j \|x_j - c_i\|^q`, :math:`\sum_j u_{ij}`
   (:func:`fedclust.fcm.validity.db_statistics`) and, optionally, its own (local) index;
   the server adds them up (:func:`~fedclust.fcm.validity.federated_fuzzy_db`) and takes
   the K of the lowest index, with the elbow beside it (:func:`~fedclust.fedfcm.validity.choose_k`).
5. **Final phase**: the centers of the chosen K reach every client, which keeps its owner's
   results and returns its objective share there.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from fedclust import fcm
from fedclust.fcm.phases import (
    Client,
    FinalStats,
    NodeStats,
    Replies,
    Scaling,
    eval_ari,
    federate_scaling,
    no_statistic_message,
)
from fedclust.fcm.validity import DBStatistics, federated_fuzzy_db
from fedclust.fedfcm import average, center_shift
from fedclust.fedfcm.keys import FedFCMSettings
from fedclust.fedfcm.validity import choose_k
from fedclust.results import Progress, Record, coverage, eval_coverage

Float = np.ndarray
#: K -> (local centers (K, F), supports (K,) or None)
LocalCenters = dict[int, tuple[Float, Float | None]]


@dataclass
class IndexStats:
    """One client's answer to the FedFuzzDB phase.

    Attributes
    ----------
    db : dict
        K -> its :class:`~fedclust.fcm.validity.DBStatistics` at the global centers of K.
    local_index : list of float, or None
        Its own fuzzy DB index per K (NaN beyond ``local-k-max`` or with too few rows), when
        the run asks for it.
    codes : array of int, or None
        Its label codes (evaluation path), the rows of its tables.
    tables : dict
        K -> its label × cluster table at the global centers of K (evaluation path).
    """

    db: dict[int, DBStatistics]
    local_index: list[float] | None = None
    codes: np.ndarray | None = None
    tables: dict[int, np.ndarray] = field(default_factory=dict)


class Clients(Protocol):
    """What FedFCM asks of the clients. A client missing from a phase's replies did not
    answer (its reason is in ``failed``)."""

    #: the run's clients
    ids: list[Client]

    def name(self, client: Client) -> str:
        """How a message names ``client``."""

    def statistics(self) -> Replies[NodeStats]:
        """Phase 0: every client's per-feature statistics (and row count)."""

    def local(self, rnd: int, centers: dict[int, Float], sc: Scaling) -> Replies[LocalCenters]:
        """Round ``rnd``: every client's local centers from the global ``centers`` of each K
        still moving (K -> (K, F)), in the scaled space of ``sc``."""

    def index(self, centers: dict[int, Float], sc: Scaling) -> Replies[IndexStats]:
        """FedFuzzDB: every client's index statistics at the final centers of every K."""

    def final(self, centers: Float, sc: Scaling) -> FinalStats:
        """The final phase at the chosen K: every client's objective share; each client keeps
        its owner's results."""


def run(clients: Clients, s: FedFCMSettings, record: Record) -> dict[str, Any]:
    """Paper 003's FedFCM for every K, FedFuzzDB and the choice of K; returns the run's
    metrics. ``record`` gets one record per round and the arrays ``centers_k<K>``,
    ``centers`` (at the chosen K, scaled space), ``centers_unscaled``, ``scaling_shift`` and
    ``scaling_scale``."""
    nodes = clients.ids
    rng = np.random.default_rng(s.seed)
    sc = federate_scaling(clients.statistics(), s, clients.name)
    ks = s.ks
    centers = {k: fcm.random_centers(sc.low, sc.high, k, rng) for k in ks}
    previous: dict[int, Float | None] = {
        k: (None if s.averaging == "kmeans" else centers[k]) for k in ks}
    rounds_of = {k: 0 for k in ks}
    active = set(ks)
    dropped_all = set(sc.phase.failed)
    traffic = [sc.phase.bytes_sent, sc.phase.bytes_received]
    progress = Progress(s.max_rounds, "fedfcm round")
    fitted = False      # whether any round got local centers
    for rnd in range(1, s.max_rounds + 1):
        # 1. local FCM on every client, for every K still moving
        r = clients.local(rnd, {k: centers[k] for k in sorted(active)}, sc)
        traffic[0] += r.bytes_sent
        traffic[1] += r.bytes_received
        dropped_all |= set(r.failed)
        shifts = {}
        speaking = list(r.got.values())
        withheld = len(r.withheld)
        if withheld and not speaking and not r.failed:
            # every client withheld: the guard depends only on N, K and F, so for good
            raise RuntimeError(no_statistic_message(s, f"local round {rnd}", withheld, r,
                                                    clients.name))

        # 2. averaging (eq. 14) and 3. the stop test, per K
        if speaking:
            fitted = True
            for k in sorted(active):
                locals_ = [got[k][0] for got in speaking]
                supports = ([got[k][1] for got in speaking] if s.averaging == "fedavg"
                            else None)
                seed = s.seed * 1000 + k
                new = average(s.averaging, locals_, supports, k, previous[k], seed)
                shifts[k] = center_shift(centers[k], new)
                centers[k], previous[k] = new, new
                rounds_of[k] = rnd
        done = {k for k, v in shifts.items() if v <= s.tol}
        active -= done
        record.log_round({"round": rnd, "shift": {str(k): v for k, v in shifts.items()},
                          "converged_k": sorted(done), "active_k": sorted(active),
                          "replies": len(r.answered), "withheld": withheld,
                          "dropped_nodes": {str(k): v for k, v in r.failed.items()},
                          "seconds": r.seconds})
        progress.step(rnd, f"{len(active)} K still moving | {len(r.answered)} clients")
        if not active:
            break
    if not fitted:   # the centers would be the random initial ones
        raise RuntimeError(no_statistic_message(s, f"any of the {rnd} local round(s)",
                                                len(r.withheld), r, clients.name))

    # 4. FedFuzzDB (eq. 15-17), the optional local index and the evaluation tables
    ix, fed_db, aris, local_db = _index(clients, s, centers, sc)
    dropped_all |= set(ix.failed)
    if s.evaluate:
        tables = _tables(ix, ks[0])
        eval_cov = eval_coverage("fedfcm", len(tables), len(nodes),
                                 sum(int(t.sum()) for _, t in tables))
    choice = choose_k(ks, fed_db)
    for k in ks:
        record.save_array(f"centers_k{k}", centers[k])
    record.save_array("centers", centers[choice.best_k])
    record.save_array("centers_unscaled", centers[choice.best_k] * sc.scale + sc.shift)
    record.save_array("scaling_shift", sc.shift)
    record.save_array("scaling_scale", sc.scale)

    # 5. final phase (the K is chosen only now): every client keeps its owner's results at
    # the chosen K and returns its objective share there
    fin = clients.final(centers[choice.best_k], sc)
    dropped_all |= set(fin.phase.failed)
    traffic[0] += ix.bytes_sent + fin.phase.bytes_sent
    traffic[1] += fin.phase.bytes_received
    metrics: dict[str, Any] = {
        **choice.as_dict(), "fedfuzzdb": dict(zip(map(str, ks), fed_db)),
        "rounds": {str(k): rounds_of[k] for k in ks}, "unconverged_k": sorted(active),
        "objective_best_k": fin.objective if fin.objective_clients() else None,
        "objective_best_k_coverage": coverage("fedfcm", "objective_best_k",
                                              fin.objective_clients(), nodes),
        "fedfuzzdb_coverage": coverage("fedfcm", "fedfuzzdb", ix.got, nodes),
        "scaling_withheld_clients": sc.withheld,
        "averaging": s.averaging, "n_clients": len(nodes),
        "dropped_nodes": sorted(dropped_all), "bytes_sent": traffic[0],
        "bytes_received": traffic[1] + ix.bytes_received,
    }
    if local_db:
        metrics["local_index"] = local_db
        metrics["local_best_k"] = {nid: int(ks[int(np.nanargmin(v))]) for nid, v in
                                   local_db.items() if np.isfinite(np.asarray(v)).any()}
    if s.evaluate:
        metrics["eval_ari"] = {str(k): v for k, v in aris.items()}
        metrics["eval_ari_best_k"] = aris[choice.best_k]
        metrics["eval_coverage"] = eval_cov
    return metrics


def _index(clients: Clients, s: FedFCMSettings, centers: dict[int, Float], sc: Scaling
           ) -> tuple[Replies[IndexStats], list[float], dict[int, float], dict[str, list[float]]]:
    """Step 4: FedFuzzDB of every K from the clients' sums (eq. 15-17); with ``evaluate``, the
    ARI of every K; with ``local-index``, each client's own index per K. Returns the phase's
    replies, the index per K, the ARI per K and the local indexes by client."""
    ks = s.ks
    index_progress = Progress(1, "fedfuzzdb")
    index_progress.logger.info("fedfuzzdb: asking %d clients for the statistics of K %d..%d%s",
                               len(clients.ids), ks[0], ks[-1],
                               " and their local index" if s.local_index else "")
    ix = clients.index(centers, sc)
    if not ix.got:
        raise RuntimeError(no_statistic_message(s, "the FedFuzzDB phase", len(ix.withheld), ix,
                                                clients.name))
    if not any(sc.rows.get(nid, 1) for nid in ix.got):
        raise RuntimeError(f"fedfcm: the {len(ix.got)} node(s) that answered the FedFuzzDB "
                           "phase hold no row, so no K can be scored. Fix: check the nodes' "
                           "logs for dropouts and the run config 'timeout', then run again.")
    index_progress.step(1, f"K {ks[0]}..{ks[-1]} scored | {len(ix.got)} clients"
                        + (" (with local index)" if s.local_index else ""))
    fed_db, aris, local_db = [], {}, {}
    for k in ks:
        stats = [got.db[k] for got in ix.got.values()]
        fed_db.append(federated_fuzzy_db(stats, centers[k], s.p, s.q))
        if s.evaluate:
            aris[k] = eval_ari(_tables(ix, k))
    if s.local_index:
        for nid, got in sorted(ix.got.items()):
            if got.local_index is not None:
                local_db[str(nid)] = got.local_index
    return ix, fed_db, aris, local_db


def _tables(ix: Replies[IndexStats], k: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """``(codes, table)`` at K of every client that sent evaluation tables."""
    return [(got.codes, got.tables[k]) for got in ix.got.values()
            if got.codes is not None and k in got.tables]
