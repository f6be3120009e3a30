"""Server loop of exact federated fuzzy c-means (paper 004, Algorithm 1).

Round t: sample ⌈γM⌉ clients, send V(t); each returns ``U = Σ u^m`` and ``WS = Σ u^m x``
(or withholds them under the privacy guard); ``V(t+1) = ΣWS / ΣU`` (a cluster with zero mass
keeps its center); stop when ``‖V(t+1) − V(t)‖_F < ε`` or after ``max-rounds``.
With γ = 1 the centers equal centralized FCM from the same initialisation.

``fcm.incremental=true`` (plain sums only): the server keeps every client's latest ``(U, WS)``
(:class:`fedclust.fcm.incremental.LatestSums`), replaces the answering clients' entries and
updates from the sum over all of them; it stops when every client that can answer has answered
and the centers moved less than ε since the oldest stored sums were computed (the drift).
A client that drops keeps its latest sums in the total.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import numpy as np
from flwr.app import RecordDict
from flwr.serverapp import Grid

from fedclust import fcm
from fedclust.fcm import incremental
from fedclust.results import Progress, RunRecorder
from strategies.common import (
    Exchange,
    array_record,
    arrays,
    check_each,
    connected_clients,
    eval_coverage,
    node_name,
    require_honest,
    result_record,
    send_and_collect,
    to_numpy,
)
from strategies.fcm_common import check_pooled_rows, eval_ari, eval_tables, federated_scaling
from strategies.fcm_replies import (
    final_reply,
    guard_bound,
    secure_final_problem,
    secure_sums_problem,
    sums_reply,
)

LOG = logging.getLogger("fedclust")


def run(grid: Grid, cfg: dict[str, Any], recorder: RunRecorder) -> dict[str, Any]:
    nodes = connected_clients(grid, cfg)
    rng = np.random.default_rng(cfg["seed"])
    sc = federated_scaling(grid, nodes, cfg)
    c = cfg["fcm.n-clusters"]
    centers = fcm.random_centers(sc.low, sc.high, c, rng)
    recorder.save_array("initial_centers", centers)
    f = centers.shape[1]
    n_sample = max(1, math.ceil(cfg["fcm.fraction"] * len(nodes)))
    bound = None
    if cfg["fcm.secure-aggregation"]:
        from strategies.secure_fcm import check_secure_round, secure_bound

        check_secure_round(min(n_sample, len(nodes)))
        bound = secure_bound(sc.low, sc.high)
    store = incremental.LatestSums(c, f) if cfg["fcm.incremental"] else None
    check_sums = sums_reply(c, f, sc.box, sc.rows, cfg["fcm.m"], guard_bound(cfg, c, f))
    causes = _Silence()
    silent: set[int] = set()
    down: set[int] = set(sc.exchange.failed)
    progress = Progress(cfg["fcm.max-rounds"], "exact-fcm round")
    totals = {"bytes_sent": sc.exchange.bytes_sent, "bytes_received": sc.exchange.bytes_received}
    dropped_all: set[int] = set(sc.exchange.failed)
    converged, shift, rnd, rounds_with_contributions = False, float("inf"), 0, 0
    for rnd in range(1, cfg["fcm.max-rounds"] + 1):
        # Sample positions, not ids: node ids are uint64 and numpy would turn them into floats.
        picks = rng.choice(len(nodes), size=min(n_sample, len(nodes)), replace=False)
        sampled = sorted(nodes[int(i)] for i in picks)
        content = RecordDict({"centers": arrays(centers=centers), "scaling": sc.record()})
        if cfg["fcm.secure-aggregation"]:
            # SecAgg+: the server learns only ΣU and ΣWS over the sampled clients.
            from strategies.secure_fcm import secure_sums

            u, ws, ex, n_contrib, rows = secure_sums(grid, sampled, content, c, f, cfg, rnd,
                                                     bound)
            if n_contrib:
                _check_secure_total(secure_sums_problem(u, ws, rows, sc.box, c, cfg["fcm.m"]),
                                    f"round-{rnd}", sampled, ex)
                if not ex.failed and len(sampled) == len(nodes):
                    check_pooled_rows(cfg, {}, len(sampled), 0, int(round(rows)))
            withheld = 0
            sums = [None] * n_contrib
        else:
            ex = send_and_collect(grid, sampled, content, "query.fcm_sums", f"round-{rnd}",
                                  cfg["timeout"])
            check_each(ex, check_sums, f"round-{rnd}")
            by_node = {nid: (to_numpy(rec["U"]), to_numpy(rec["WS"]))
                       for nid, r in ex.replies.items()
                       if (rec := array_record(r, "sums")) is not None}
            sums = list(by_node.values())
            withheld = len(ex.replies) - len(sums)
            require_honest(ex, f"round-{rnd}", len(sums), len(sampled), cfg)
            silent |= set(ex.replies) - set(by_node)
            u = np.sum([s[0] for s in sums], axis=0) if sums else np.zeros(c)
            ws = np.sum([s[1] for s in sums], axis=0) if sums else np.zeros((c, f))
            if store is not None:
                store.replace(rnd, centers, by_node)
        # Every contributing client adds Σ_c u^m > 0 to ΣU: ΣU = 0 means nobody contributed (also
        # under SecAgg+, where a client withheld by the privacy guard sends zeros).
        someone = float(np.sum(u)) > 0
        rounds_with_contributions += int(someone)
        if store is not None:
            u, ws = store.totals()
        new = fcm.update_centers(u, ws, centers)
        shift = float(np.linalg.norm(new - centers))
        centers = new
        totals["bytes_sent"] += ex.bytes_sent
        totals["bytes_received"] += ex.bytes_received
        dropped_all |= set(ex.failed)
        # under SecAgg+ a summed round with ΣU = 0 is the guard's zeros
        causes.note(ex, withheld if not cfg["fcm.secure-aggregation"] or someone
                    else len(sums))
        entry = {"round": rnd, "shift": shift, "sampled": len(sampled),
                 "contributed": len(sums), "withheld": withheld,
                 "dropped_nodes": {str(k): v for k, v in ex.failed.items()},
                 "empty_clusters": int((u <= 0).sum()), "seconds": ex.seconds}
        if store is not None:
            # the clients that can answer: not kept silent by the privacy guard (it depends
            # only on N) and not down (dropped when last asked; their latest sums stay)
            down = (down - set(ex.replies)) | set(ex.failed)
            required = set(nodes) - silent - down
            drift = store.drift(centers, required)
            entry.update({"clients_with_sums": len(store),
                          "oldest_sums_age": store.oldest_age(rnd),
                          "drift": drift if math.isfinite(drift) else None})
        recorder.log_round(entry)
        progress.step(rnd, f"shift {shift:.3g} | {len(sums)}/{len(sampled)} clients")
        if not someone:
            _no_contribution(rnd, len(sampled), len(nodes), ex, withheld, c, f, cfg)
        if store is not None:
            if incremental.converged(store, required, centers, cfg["fcm.epsilon"]):
                converged = True
                break
        elif shift < cfg["fcm.epsilon"] and sums:   # a round nobody contributed to proves nothing
            converged = True
            break
    if rounds_with_contributions == 0:
        raise RuntimeError(causes.message(rnd, c, f, cfg))
    recorder.save_array("centers", centers)
    recorder.save_array("centers_unscaled", centers * sc.scale + sc.shift)
    recorder.save_array("scaling_shift", sc.shift)
    recorder.save_array("scaling_scale", sc.scale)
    metrics: dict[str, Any] = {"rounds": rnd, "converged": converged, "final_shift": shift,
                               "rounds_with_contributions": rounds_with_contributions,
                               "scaling_withheld_clients": sc.withheld,
                               "n_clients": len(nodes), "incremental": store is not None,
                               **totals}
    if store is not None:
        metrics.update({"clients_with_sums": len(store),
                        "oldest_sums_age": store.oldest_age(rnd)})
    # The final centers reach every node in this message; each keeps its owner's results.
    final = RecordDict({"centers": arrays(centers=centers), "scaling": sc.record(),
                        "result": result_record(recorder.dir)})
    if cfg["fcm.secure-aggregation"]:
        # SecAgg+ again: the server learns ΣJ (and the summed evaluation table), not each J.
        from strategies.secure_fcm import secure_final

        codes = sc.eval_codes if cfg["evaluate"] else sc.eval_codes[:0]
        objective, table, ex, n_final, rows = secure_final(grid, nodes, final, c, f, cfg,
                                                           rnd + 1, codes, str(recorder.dir),
                                                           bound)
        if n_final:
            _check_secure_total(secure_final_problem(objective, table, rows, sc.box), "final",
                                nodes, ex)
        metrics["objective"] = objective
        if cfg["evaluate"]:
            metrics["eval_ari"] = eval_ari([(codes, table)] if table is not None else [])
            metrics["eval_coverage"] = eval_coverage(
                "exact-fcm", len(sc.eval_nodes - set(ex.failed)) if table is not None else 0,
                len(nodes), int(round(float(table.sum()))) if table is not None else 0)
    else:
        ex = send_and_collect(grid, nodes, final, "query.fcm_final", "final", cfg["timeout"])
        check_each(ex, final_reply(c, sc.box, sc.rows, guard_bound(cfg, c, f),
                                   bool(cfg["evaluate"])), "final")
        shares = [r.array_records["objective"]["J"].numpy()[0] for r in ex.replies.values()
                  if "objective" in r.array_records]
        require_honest(ex, "final", len(shares), len(nodes), cfg)
        metrics["objective"] = float(sum(shares))
        metrics["objective_withheld_clients"] = len(ex.replies) - len(shares)
        if cfg["evaluate"]:
            tables = eval_tables(list(ex.replies.values()))
            metrics["eval_ari"] = eval_ari(tables)
            metrics["eval_coverage"] = eval_coverage(
                "exact-fcm", len(tables), len(nodes), sum(int(t.sum()) for _, t in tables))
    metrics["dropped_nodes"] = sorted(dropped_all | set(ex.failed))
    if cfg["plots"]:
        from fedclust.plots import plot_series

        plot_series(recorder.path("shift.png"), {"‖V(t+1) − V(t)‖_F": [
            h["shift"] for h in recorder.history]}, "round", "center shift", log=True,
            hline=cfg["fcm.epsilon"])
    return metrics


class _Silence:
    """Why rounds got no contribution, over the whole run: nodes withheld by the privacy
    guard, nodes that did not answer, nodes whose replies the server's checks excluded."""

    def __init__(self) -> None:
        self.withheld = 0
        self.dropped: dict[int, str] = {}
        self.excluded: dict[int, str] = {}

    def note(self, ex: Exchange, withheld: int) -> None:
        self.withheld += withheld
        for nid, why in ex.failed.items():
            if nid in ex.excluded:
                self.excluded[nid] = why.removeprefix("rejected reply: ")
            else:
                self.dropped[nid] = why

    def message(self, rounds: int, c: int, f: int, cfg: dict[str, Any]) -> str:
        """The stop message of a run nobody contributed to, naming the causes seen."""
        guard = cfg["fcm.privacy-guard"] and self.withheld
        parts, fixes = [], []
        if guard:
            whom = ("every client that answered (SecAgg+: it sends zeros)"
                    if cfg["fcm.secure-aggregation"] else f"{self.withheld} repl(y/ies)")
            parts.append(
                f"the privacy guard withheld {whom} (a client with N <= C(F+1)/F = "
                f"{c * (f + 1) / f:.3g} points, C = {c} clusters, F = {f} features, sends "
                f"nothing)")
            fixes.append("lower fcm.n-clusters or set fcm.privacy-guard=false")
        if self.excluded:
            parts.append("the server's checks excluded " + "; ".join(
                f"{node_name(n)} ({why})" for n, why in sorted(self.excluded.items())))
            fixes.append("check the excluded nodes (their data, their fedclust version, "
                         "whether they can be trusted) or remove them")
        if self.dropped:
            parts.append(f"{len(self.dropped)} node(s) did not answer ("
                         + "; ".join(f"{node_name(n)}: {why}"
                                     for n, why in sorted(self.dropped.items())) + ")")
            fixes.append("check the nodes' logs for dropouts and the run config 'timeout'")
        return (f"exact FCM: no client contributed to any of the {rounds} round(s), so the "
                f"result would be the random initial centers: "
                f"{'; '.join(parts) or 'no client was sampled'}. Fix: "
                f"{'; '.join(fixes) or 'start the nodes'}.")


def _check_secure_total(problem: str | None, phase: str, asked: list[int], ex: Exchange
                        ) -> None:
    """Stop on an implausible SecAgg+ total: one of the round's contributors sent bad sums,
    and SecAgg+ hides which one."""
    if not problem:
        return
    who = sorted(set(asked) - set(ex.failed))
    raise RuntimeError(
        f"exact FCM with SecAgg+: the securely summed statistics of phase '{phase}' are "
        f"implausible ({problem}). One of the {len(who)} contributing nodes "
        f"({', '.join(node_name(n) for n in who)}) sent bad sums; secure aggregation hides "
        f"each node's own sums, so the server cannot tell which one. Fix: check those nodes "
        f"(their data, their fedclust version), or run once with "
        f"fcm.secure-aggregation=false, whose per-node checks name the node.")


def _no_contribution(rnd: int, n_sampled: int, n_nodes: int, ex: Exchange,
                     withheld: int, c: int, f: int, cfg: dict[str, Any]) -> None:
    """Warn about a round nobody contributed to; stop at once when every later round must be
    the same (all clients sampled, none dropped or excluded: the guard depends only on N, C
    and F)."""
    LOG.warning("[round-%d] no client contributed (%d sampled, %d withheld by the privacy "
                "guard%s, %d dropped, %d of them excluded by the server's checks): the centers "
                "stay where they are", rnd, n_sampled, withheld,
                " or SecAgg+ zeros" if cfg["fcm.secure-aggregation"] else "",
                len(ex.failed), len(ex.excluded))
    if cfg["fcm.privacy-guard"] and n_sampled == n_nodes and not ex.failed:
        silence = _Silence()
        silence.note(ex, n_sampled if cfg["fcm.secure-aggregation"] else withheld)
        raise RuntimeError(silence.message(rnd, c, f, cfg))
