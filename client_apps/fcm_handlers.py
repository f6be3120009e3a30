"""ClientApp handlers of exact federated FCM (paper 004) and FedFCM/FedFuzzDB (paper 003).

Every reply carries statistics only: per-feature min/max (and, for standard scaling, count,
mean, centred sum of squares) with the node's row count (not under SecAgg+), FCM local sums,
local centers, DB sums. What the server accepts in each reply is
:mod:`strategies.fcm_replies`. Evaluation statistics
(label × cluster contingency tables, with the node's label codes naming their rows) are sent
only when run config ``evaluate`` is true and the node allows it
(:func:`client_apps.evaluation.allows_evaluation`).
"""

from __future__ import annotations

import numpy as np
from flwr.app import Context, Message

from client_apps.base import app
from client_apps.common import array_record, reply, run_config, to_numpy
from client_apps.data import ClientData, load_client_data
from fedclust import fcm
from fedclust.data import scaling
from fedclust.data.local import compact_codes
from fedclust.fcm_keys import check_rows
from fedclust.fedfcm import labels_from_centers, local_step
from fedclust.metrics import contingency
from fedclust.validity import db_statistics, fuzzy_db


def _scaled_data(msg: Message, context: Context) -> tuple[ClientData, dict, np.ndarray]:
    cfg = run_config(context)
    data = load_client_data(context, cfg)
    sc = array_record(msg.content, "scaling")
    x = data.x if sc is None else scaling.apply(data.x, to_numpy(sc["shift"]),
                                                to_numpy(sc["scale"]))
    return data, cfg, x


def _eval_codes(data: ClientData) -> tuple[np.ndarray, np.ndarray]:
    """``(codes, rows)``: this node's distinct label codes (sorted) and each row's index in them."""
    codes, rows = np.unique(data.y_eval, return_inverse=True)
    return codes.astype(np.int64), rows.reshape(-1).astype(np.int64)


def _eval_table(data: ClientData, x: np.ndarray, centers: np.ndarray) -> np.ndarray:
    """Label × cluster counts (evaluation path), one row per code of :func:`_eval_codes`."""
    codes, rows = _eval_codes(data)
    return contingency(rows, labels_from_centers(x, centers), len(codes), centers.shape[0])


WITHHELD = {"withheld": 1}


def guard_withholds(cfg: dict, x: np.ndarray) -> bool:
    """Paper 004 §4.2's privacy guard, one rule for every reply of the FCM family: a node with
    ``N ≤ C(F+1)/F`` rows (C the most clusters the run fits: ``fcm.n-clusters``, or
    ``fedfcm.k-max``) sends no statistic of its rows in any phase — bounds, sums, local
    centers, index sums, objective, evaluation table. It still receives the final centers and
    keeps its own results."""
    if cfg["method"] == "fedfcm":
        on, c = cfg["fedfcm.privacy-guard"], cfg["fedfcm.k-max"]
    else:
        on, c = cfg["fcm.privacy-guard"], cfg["fcm.n-clusters"]
    n, f = x.shape
    return bool(on) and n <= c * (f + 1) / f


def refuse_too_few_rows(cfg: dict, x: np.ndarray) -> None:
    """Before any work: a run whose only node (``num-clients = 1``) holds fewer rows than the
    clusters it fits is degenerate (a center on every row, objective 0), so the node refuses
    it with a ConfigError (data-free: the key, the row count, the fix). With the privacy guard
    on, such a node withholds everything instead (its row count is not sent); with several
    nodes only the server knows the pooled row count."""
    guard = cfg["fedfcm.privacy-guard"] if cfg["method"] == "fedfcm" else cfg["fcm.privacy-guard"]
    if int(cfg["num-clients"]) == 1 and not guard:
        check_rows(cfg, int(x.shape[0]), "this run's only node")


@app.query("fcm_stats")
def fcm_stats(msg: Message, context: Context) -> Message:
    """Per-feature statistics for federated scaling and the server's initial-center box."""
    cfg = run_config(context)
    data = load_client_data(context, cfg)
    refuse_too_few_rows(cfg, data.x)
    if guard_withholds(cfg, data.x):
        return reply(msg, metrics=WITHHELD)
    st = scaling.column_stats(data.x)
    # needs counts for standard; minmax and none reveal only the bounds
    arrays = {"stats": {"stats": st.as_array()} if cfg["scaling"] == "standard"
              else {"min": st.min, "max": st.max}}
    if cfg.get("fcm.secure-aggregation") and cfg["evaluate"] and data.y_eval is not None:
        # the label codes this node holds: the server's union sets the rows of the securely
        # summed contingency table (evaluation path only)
        arrays["eval"] = {"codes": _eval_codes(data)[0]}
    # the row count lets the server check every later statistic of this node against it
    # (sums of memberships add up to N); under SecAgg+ N stays hidden (standard scaling
    # reveals it in the statistics anyway)
    secure = cfg["method"] == "exact-fcm" and cfg.get("fcm.secure-aggregation")
    return reply(msg, arrays=arrays, metrics={} if secure else {"rows": int(data.x.shape[0])})


@app.query("fcm_sums")
def fcm_sums(msg: Message, context: Context) -> Message:
    """Paper 004 Algorithm 2: ``U_c = Σ u^m``, ``WS_c = Σ u^m x`` for the received centers."""
    data, cfg, x = _scaled_data(msg, context)
    centers = to_numpy(msg.content["centers"]["centers"])
    if guard_withholds(cfg, x):
        return reply(msg, metrics=WITHHELD)
    u, ws = fcm.local_sums(x, centers, cfg["fcm.m"])
    return reply(msg, arrays={"sums": {"U": u, "WS": ws}}, metrics={"withheld": 0})


def fuzzifier(cfg: dict) -> float:
    """The run's m (exact FCM: ``fcm.m``; FedFCM: ``fedfcm.m``)."""
    return float(cfg["fedfcm.m"] if cfg["method"] == "fedfcm" else cfg["fcm.m"])


def keep_owner_results(msg: Message, context: Context, cfg: dict, x: np.ndarray,
                       centers: np.ndarray, shift: np.ndarray, scale: np.ndarray,
                       run_dir: str | None = None) -> None:
    """Write this node's FCM results for its owner (never sent): ``assignments.csv``
    (``row,label,u0,…``), ``centers.csv`` in the original feature units, the arrays
    ``fedclust predict`` needs, and ``result.json`` last."""
    from client_apps import results

    folder = results.owner_dir(msg, context, run_dir)
    if folder is None:
        return
    m = fuzzifier(cfg)
    u = fcm.memberships(x, centers, m)
    labels = np.argmax(u, axis=1)
    results.write_assignments(folder, labels, u)
    results.write_table(folder / "centers.csv", [f"f{i}" for i in range(centers.shape[1])],
                        centers * scale + shift)
    for name, arr in (("centers", centers), ("scaling_shift", shift), ("scaling_scale", scale)):
        results.save_array(folder / f"{name}.npy", arr)
    key = "fedfcm.m" if cfg["method"] == "fedfcm" else "fcm.m"
    results.write_predict_info(folder, cfg["method"], {key: m})
    results.write_result(folder, {
        "method": cfg["method"], "run_id": context.run_id, "rows": int(x.shape[0]),
        "n_clusters": int(centers.shape[0]), "m": m,
        "rows_per_cluster": np.bincount(labels, minlength=centers.shape[0]),
        "files": ["assignments.csv", "centers.csv"]})


@app.query("fcm_final")
def fcm_final(msg: Message, context: Context) -> Message:
    """Objective share J_m of this client and, on the evaluation path, its contingency table.

    The final centers arrive here: the node also keeps its owner's results
    (:func:`keep_owner_results`); nothing of them is in the reply.
    """
    data, cfg, x = _scaled_data(msg, context)
    centers = msg.content.array_records["centers"]["centers"].numpy()
    if "scaling" in msg.content.array_records:
        sc = msg.content.array_records["scaling"]
        shift, scale = sc["shift"].numpy(), sc["scale"].numpy()
    else:
        shift, scale = np.zeros(x.shape[1]), np.ones(x.shape[1])
    keep_owner_results(msg, context, cfg, x, centers, shift, scale)
    if guard_withholds(cfg, x):
        return reply(msg, metrics=WITHHELD)
    arrays = {"objective": {"J": np.array([fcm.objective(x, centers, fuzzifier(cfg))])}}
    # FedFCM's evaluation tables of every K already came with the FedFuzzDB statistics.
    if cfg["evaluate"] and data.y_eval is not None and cfg["method"] == "exact-fcm":
        arrays["eval"] = {"contingency": _eval_table(data, x, centers),
                          "codes": _eval_codes(data)[0]}
    return reply(msg, arrays=arrays)


def secure_final_vector(data: ClientData, x: np.ndarray, centers: np.ndarray, m: float,
                        fit_cfg: dict) -> np.ndarray:
    """What :func:`fcm_final` reports, limb-packed for one SecAgg+ sum (never sent in plain).

    ``[J]`` then this client's label × cluster table with one row per code of the server's
    ``fedclust.eval-codes`` (the union of the codes the nodes reported in the scaling phase;
    none: no evaluation; a client without labels sends zeros), then (when the server asks
    with ``fedclust.with-rows``) its row count, so that the server can check the totals.
    """
    from fedclust.secagg import LIMBS, pack_final

    vocab = np.frombuffer(fit_cfg.get("fedclust.eval-codes", b""), dtype="<i8").astype(np.int64)
    c = centers.shape[0]
    table = np.zeros((len(vocab), c))
    if len(vocab) and data.y_eval is not None and data.y_eval.size:
        table = contingency(compact_codes(data.y_eval, vocab), labels_from_centers(x, centers),
                            len(vocab), c)
    return pack_final(fcm.objective(x, centers, m), table, float(fit_cfg["fedclust.secure-scale"]),
                      float(fit_cfg["fedclust.secure-scale-table"]),
                      int(fit_cfg.get("fedclust.limbs", LIMBS)),
                      n=x.shape[0] if fit_cfg.get("fedclust.with-rows") else None)


@app.train("fedfcm_local")
def fedfcm_local(msg: Message, context: Context) -> Message:
    """Paper 003 step 3: local FCM to convergence from the global centers, for every active K.

    Returns the local centers; the supports ``Σ_j u_kj`` only for federated averaging (k-means
    averaging needs nothing else).
    """
    data, cfg, x = _scaled_data(msg, context)
    if guard_withholds(cfg, x):
        return reply(msg, metrics=WITHHELD)
    out, iters = {}, []
    for name, arr in msg.content.array_records["centers"].items():
        centers, support, n_iter = local_step(x, arr.numpy(), cfg["fedfcm.m"],
                                              cfg["fedfcm.local-tol"], cfg["fedfcm.local-max-iter"])
        out[name] = centers
        if cfg["fedfcm.averaging"] == "fedavg":
            out[f"{name}.support"] = support
        iters.append(n_iter)
    return reply(msg, arrays={"local": out}, metrics={"local-iters": int(max(iters, default=0))})


@app.query("fedfcm_db")
def fedfcm_db(msg: Message, context: Context) -> Message:
    """FedFuzzDB sums (N_l, Σ‖x−c_i‖^q, Σu_i) per K; optionally local index and eval tables."""
    data, cfg, x = _scaled_data(msg, context)
    if guard_withholds(cfg, x):
        return reply(msg, metrics=WITHHELD)
    m, p, q = cfg["fedfcm.m"], cfg["fedfcm.p"], cfg["fedfcm.q"]
    stats, local, evals = {}, {}, {}
    for name, arr in msg.content.array_records["centers"].items():
        centers = arr.numpy()
        k = centers.shape[0]
        s = db_statistics(x, centers, m, q)
        stats[name] = np.concatenate([[s.n], s.spread_sums, s.membership_sums])
        local_k_max = cfg["fedfcm.local-k-max"] or cfg["fedfcm.k-max"]
        if cfg["fedfcm.local-index"]:
            local[name] = np.array([_local_index(x, k, m, p, q, cfg) if k <= local_k_max
                                    else float("nan")])
        if cfg["evaluate"] and data.y_eval is not None:
            evals[name] = _eval_table(data, x, centers)
            evals["codes"] = _eval_codes(data)[0]
    arrays = {"db": stats}
    if local:
        arrays["local_index"] = local
    if evals:
        arrays["eval"] = evals
    return reply(msg, arrays=arrays)


def _local_index(x: np.ndarray, k: int, m: float, p: float, q: float, cfg: dict) -> float:
    """Non-federated fuzzy DB of this client's own FCM with K clusters (NaN if too few points).

    Local FCM from k-means++ seeding until ``‖U(t+1) − U(t)‖_F ≤ fedfcm.local-tol`` (paper 003
    §2.1.2, the same stopping rule as the federated local step).
    """
    if x.shape[0] <= k:
        return float("nan")
    seed = int(cfg["seed"]) + 7919 * k
    centers, _, _ = fcm.fcm_until_stable(
        x, fcm.kmeans_plusplus_centers(x, k, seed), m, cfg["fedfcm.local-tol"],
        cfg["fedfcm.local-max-iter"] * cfg["fedfcm.max-rounds"])
    return fuzzy_db(x, centers, m, p, q)
