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
    all_of,
    arrays,
    connected_clients,
    expect_arrays,
    result_record,
    send_and_collect,
)
from strategies.fcm_common import eval_ari, eval_tables, federated_scaling, withheld_ok

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

            u, ws, ex, n_contrib = secure_sums(grid, sampled, content, c, f, cfg, rnd, bound)
            withheld = 0
            sums = [None] * n_contrib
        else:
            ex = send_and_collect(grid, sampled, content, "query.fcm_sums", f"round-{rnd}",
                                  cfg["timeout"], validate=_sums_ok(c, f))
            by_node = {nid: (r.array_records["sums"]["U"].numpy(),
                             r.array_records["sums"]["WS"].numpy())
                       for nid, r in ex.replies.items() if "sums" in r.array_records}
            sums = list(by_node.values())
            withheld = len(ex.replies) - len(sums)
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
            _no_contribution(rnd, len(sampled), len(nodes), ex.failed, withheld, c, f, cfg)
        if store is not None:
            if incremental.converged(store, required, centers, cfg["fcm.epsilon"]):
                converged = True
                break
        elif shift < cfg["fcm.epsilon"] and sums:   # a round nobody contributed to proves nothing
            converged = True
            break
    if rounds_with_contributions == 0:
        raise RuntimeError(_NOBODY.format(rounds=rnd, c=c, f=f, bound=c * (f + 1) / f))
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
        objective, table, ex, _ = secure_final(grid, nodes, final, c, f, cfg, rnd + 1, codes,
                                               str(recorder.dir), bound)
        metrics["objective"] = objective
        if cfg["evaluate"]:
            metrics["eval_ari"] = eval_ari([(codes, table)] if table is not None else [])
    else:
        ex = send_and_collect(grid, nodes, final, "query.fcm_final", "final", cfg["timeout"],
                              validate=withheld_ok(expect_arrays("objective", ["J"])))
        shares = [r.array_records["objective"]["J"].numpy()[0] for r in ex.replies.values()
                  if "objective" in r.array_records]
        metrics["objective"] = float(sum(shares))
        metrics["objective_withheld_clients"] = len(ex.replies) - len(shares)
        if cfg["evaluate"]:
            metrics["eval_ari"] = eval_ari(eval_tables(list(ex.replies.values())))
    metrics["dropped_nodes"] = sorted(dropped_all | set(ex.failed))
    if cfg["plots"]:
        from fedclust.plots import plot_series

        plot_series(recorder.path("shift.png"), {"‖V(t+1) − V(t)‖_F": [
            h["shift"] for h in recorder.history]}, "round", "center shift", log=True,
            hline=cfg["fcm.epsilon"])
    return metrics


_NOBODY = (
    "exact FCM: no client contributed to any of the {rounds} round(s), so the result would be "
    "the random initial centers. Every client was either withheld by the privacy guard (a "
    "client with N <= C(F+1)/F = {bound:.3g} points, C = {c} clusters, F = {f} features, sends "
    "nothing) or did not answer. Fix: lower fcm.n-clusters or set fcm.privacy-guard=false "
    "(and check the nodes' logs for dropouts).")


def _no_contribution(rnd: int, n_sampled: int, n_nodes: int, failed: dict[int, str],
                     withheld: int, c: int, f: int, cfg: dict[str, Any]) -> None:
    """Warn about a round nobody contributed to; stop at once when every later round must be
    the same (all clients sampled, none dropped: the guard depends only on N, C and F)."""
    LOG.warning("[round-%d] no client contributed (%d sampled, %d withheld by the privacy "
                "guard%s, %d dropped): the centers stay where they are", rnd, n_sampled,
                withheld, " or SecAgg+ zeros" if cfg["fcm.secure-aggregation"] else "",
                len(failed))
    if cfg["fcm.privacy-guard"] and n_sampled == n_nodes and not failed:
        raise RuntimeError(_NOBODY.format(rounds=rnd, c=c, f=f, bound=c * (f + 1) / f))


def _sums_ok(c: int, f: int):
    shapes = expect_arrays("sums", ["U", "WS"], {"U": (c,), "WS": (c, f)})

    def check(content: RecordDict) -> str | None:
        if "sums" not in content.array_records:
            withheld = content.metric_records.get("metrics", {}).get("withheld", 0)
            return None if withheld == 1 else "neither sums nor a privacy-guard notice"
        return shapes(content)

    return all_of(check)
