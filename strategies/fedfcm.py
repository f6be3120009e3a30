"""Server loop of FedFCM with k-means averaging + FedFuzzDB + choice of K (paper 003, §2.2).

All candidate K in ``[k-min, k-max]`` are fitted *together*: one message per round carries the
global centers of every K that has not converged yet, so choosing K costs as many round trips
as fitting the slowest K, not the sum over K. After the fit, one more message collects the
FedFuzzDB statistics (and the optional local index) of every K.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from flwr.app import RecordDict
from flwr.serverapp import Grid

from fedclust import fcm
from fedclust.fedfcm import average, center_shift
from fedclust.fedfcm.validity import DBStatistics, choose_k, federated_fuzzy_db
from fedclust.results import Progress, RunRecorder
from strategies.common import (
    arrays,
    check_each,
    connected_clients,
    eval_coverage,
    require_honest,
    result_record,
    send_and_collect,
)
from strategies.fcm_common import (
    eval_ari,
    eval_tables,
    federated_scaling,
    no_statistic_message,
)
from strategies.fcm_replies import db_reply, final_reply, guard_bound, local_reply


def _key(k: int) -> str:
    return f"k{k}"


def run(grid: Grid, cfg: dict[str, Any], recorder: RunRecorder) -> dict[str, Any]:
    nodes = connected_clients(grid, cfg)
    rng = np.random.default_rng(cfg["seed"])
    sc = federated_scaling(grid, nodes, cfg)
    ks = list(range(cfg["fedfcm.k-min"], cfg["fedfcm.k-max"] + 1))
    centers = {k: fcm.random_centers(sc.low, sc.high, k, rng) for k in ks}
    previous: dict[int, np.ndarray | None] = {
        k: (None if cfg["fedfcm.averaging"] == "kmeans" else centers[k]) for k in ks}
    rounds_of = {k: 0 for k in ks}
    active = set(ks)
    dropped_all = set(sc.exchange.failed)
    traffic = [sc.exchange.bytes_sent, sc.exchange.bytes_received]
    progress = Progress(cfg["fedfcm.max-rounds"], "fedfcm round")
    needs_support = cfg["fedfcm.averaging"] == "fedavg"
    f = sc.low.size
    bound = guard_bound(cfg, cfg["fedfcm.k-max"], f)
    fitted = False      # whether any round got local centers
    for rnd in range(1, cfg["fedfcm.max-rounds"] + 1):
        content = RecordDict({"centers": arrays(**{_key(k): centers[k] for k in sorted(active)}),
                              "scaling": sc.record()})
        ex = send_and_collect(grid, nodes, content, "train.fedfcm_local", f"round-{rnd}",
                              cfg["timeout"])
        check_each(ex, local_reply(sorted(active), f, sc.box, sc.rows, needs_support, bound,
                                   _key), f"round-{rnd}")
        traffic[0] += ex.bytes_sent
        traffic[1] += ex.bytes_received
        dropped_all |= set(ex.failed)
        shifts = {}
        speaking = [r for r in ex.replies.values() if "local" in r.array_records]
        require_honest(ex, f"round-{rnd}", len(speaking), len(nodes), cfg)
        withheld = len(ex.replies) - len(speaking)
        if withheld and not speaking and not ex.failed:
            # every node withheld: the guard depends only on N, K and F, so for good
            raise RuntimeError(no_statistic_message(cfg, f"local round {rnd}", withheld, ex))
        if speaking:
            fitted = True
            for k in sorted(active):
                locals_ = [r.array_records["local"][_key(k)].numpy() for r in speaking]
                supports = ([r.array_records["local"][f"{_key(k)}.support"].numpy()
                             for r in speaking] if needs_support else None)
                seed = int(cfg["seed"]) * 1000 + k
                new = average(cfg["fedfcm.averaging"], locals_, supports, k, previous[k], seed)
                shifts[k] = center_shift(centers[k], new)
                centers[k], previous[k] = new, new
                rounds_of[k] = rnd
        done = {k for k, s in shifts.items() if s <= cfg["fedfcm.tol"]}
        active -= done
        recorder.log_round({"round": rnd, "shift": {str(k): v for k, v in shifts.items()},
                            "converged_k": sorted(done), "active_k": sorted(active),
                            "replies": len(ex.replies), "withheld": len(ex.replies) - len(speaking),
                            "dropped_nodes": {str(k): v for k, v in ex.failed.items()},
                            "seconds": ex.seconds})
        progress.step(rnd, f"{len(active)} K still moving | {len(ex.replies)} clients")
        if not active:
            break
    if not fitted:   # the centers would be the random initial ones
        raise RuntimeError(no_statistic_message(cfg, f"any of the {rnd} local round(s)",
                                                len(ex.replies) - len(speaking), ex))

    # FedFuzzDB (eq. 15-17) and optional local index / evaluation tables, every K in one message.
    content = RecordDict({"centers": arrays(**{_key(k): centers[k] for k in ks}),
                          "scaling": sc.record()})
    index_progress = Progress(1, "fedfuzzdb")
    index_progress.logger.info("fedfuzzdb: asking %d clients for the statistics of K %d..%d%s",
                               len(nodes), ks[0], ks[-1],
                               " and their local index" if cfg["fedfcm.local-index"] else "")
    ex = send_and_collect(grid, nodes, content, "query.fedfcm_db", "fedfuzzdb", cfg["timeout"])
    check_each(ex, db_reply(ks, sc.box, sc.rows, cfg["fedfcm.q"], bound, bool(cfg["evaluate"]),
                            _key), "fedfuzzdb")
    withheld = [n for n, r in ex.replies.items() if "db" not in r.array_records]
    for nid in withheld:
        del ex.replies[nid]   # withheld by the privacy guard: nothing to add
    require_honest(ex, "fedfuzzdb", len(ex.replies), len(nodes), cfg)
    if not ex.replies:
        raise RuntimeError(no_statistic_message(cfg, "the FedFuzzDB phase", len(withheld), ex))
    if not any(sc.rows.get(nid, 1) for nid in ex.replies):
        raise RuntimeError(f"fedfcm: the {len(ex.replies)} node(s) that answered the FedFuzzDB "
                           "phase hold no row, so no K can be scored. Fix: check the nodes' "
                           "logs for dropouts and the run config 'timeout', then run again.")
    index_progress.step(1, f"K {ks[0]}..{ks[-1]} scored | {len(ex.replies)} clients"
                        + (" (with local index)" if cfg["fedfcm.local-index"] else ""))
    dropped_all |= set(ex.failed)
    fed_db, local_db, aris = [], {}, {}
    for k in ks:
        stats = []
        for arr in (r.array_records["db"][_key(k)].numpy() for r in ex.replies.values()):
            stats.append(DBStatistics(int(arr[0]), arr[1:1 + k], arr[1 + k:]))
        fed_db.append(federated_fuzzy_db(stats, centers[k], cfg["fedfcm.p"], cfg["fedfcm.q"]))
        if cfg["evaluate"]:
            aris[k] = eval_ari(eval_tables(list(ex.replies.values()), _key(k)))
    if cfg["evaluate"]:
        tables = eval_tables(list(ex.replies.values()), _key(ks[0]))
        coverage = eval_coverage("fedfcm", len(tables), len(nodes),
                                 sum(int(t.sum()) for _, t in tables))
    if cfg["fedfcm.local-index"]:
        for nid, r in sorted(ex.replies.items()):
            if "local_index" in r.array_records:
                local_db[str(nid)] = [float(r.array_records["local_index"][_key(k)].numpy()[0])
                                      for k in ks]
    choice = choose_k(ks, fed_db)
    for k in ks:
        recorder.save_array(f"centers_k{k}", centers[k])
    recorder.save_array("centers", centers[choice.best_k])
    recorder.save_array("centers_unscaled", centers[choice.best_k] * sc.scale + sc.shift)
    recorder.save_array("scaling_shift", sc.shift)
    recorder.save_array("scaling_scale", sc.scale)
    # One more message (the K is chosen only now): every node keeps its owner's results at the
    # chosen K and returns its objective share J_m there.
    final = RecordDict({"centers": arrays(centers=centers[choice.best_k]),
                        "scaling": sc.record(), "result": result_record(recorder.dir)})
    fin = send_and_collect(grid, nodes, final, "query.fcm_final", "final", cfg["timeout"])
    check_each(fin, final_reply(choice.best_k, sc.box, sc.rows, bound, False), "final")
    require_honest(fin, "final", sum("objective" in r.array_records for r in fin.replies.values()),
                   len(nodes), cfg)
    dropped_all |= set(fin.failed)
    traffic[0] += ex.bytes_sent + fin.bytes_sent
    traffic[1] += fin.bytes_received
    metrics: dict[str, Any] = {
        **choice.as_dict(), "fedfuzzdb": dict(zip(map(str, ks), fed_db)),
        "rounds": {str(k): rounds_of[k] for k in ks}, "unconverged_k": sorted(active),
        "objective_best_k": float(sum(r.array_records["objective"]["J"].numpy()[0]
                                      for r in fin.replies.values()
                                      if "objective" in r.array_records)),
        "scaling_withheld_clients": sc.withheld,
        "averaging": cfg["fedfcm.averaging"], "n_clients": len(nodes),
        "dropped_nodes": sorted(dropped_all), "bytes_sent": traffic[0],
        "bytes_received": traffic[1] + ex.bytes_received,
    }
    if local_db:
        metrics["local_index"] = local_db
        metrics["local_best_k"] = {nid: int(ks[int(np.nanargmin(v))]) for nid, v in
                                   local_db.items() if np.isfinite(np.asarray(v)).any()}
    if cfg["evaluate"]:
        metrics["eval_ari"] = {str(k): v for k, v in aris.items()}
        metrics["eval_ari_best_k"] = aris[choice.best_k]
        metrics["eval_coverage"] = coverage
    if cfg["plots"]:
        from fedclust.plots import plot_index_vs_k

        plot_index_vs_k(recorder.path("index_vs_k.png"), ks, fed_db, local=local_db or None,
                        title=f"FedFuzzDB ({cfg['fedfcm.averaging']} averaging)")
    return metrics
