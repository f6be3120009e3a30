"""FedFCM's own messages, both ends (paper 003): what the server sends, what a node reads from
it, what the node replies (:mod:`client_apps.fcm_handlers`), and how the server checks and
reads the reply (:mod:`strategies.fcm.fedfcm`). The scaling and final messages are exact FCM's
(:mod:`strategies.wire.fcm`); the checks use the vocabulary of :mod:`strategies.wire.replies`.

The centers of every ``K`` travel in one ArrayRecord, one array ``k<K>`` each (:func:`key`).

======================  ========================  ===========================================
message                 field                     accepted
======================  ========================  ===========================================
``train.fedfcm_local``  ``local.k<K>``            ``(K, F)`` finite, in the box (weighted
                                                  means of the node's rows)
                        ``local.k<K>.support``    ``fedfcm.averaging=fedavg``: ``(K,)``
                                                  ``≥ 0``, total ``N`` (memberships sum to 1
                                                  per row)
                        ``metrics.local-iters``   an int ≥ 0
``query.fedfcm_db``     ``db.k<K>``               ``(1 + 2K,)`` finite: ``N``; ``K`` spreads
                                                  in ``[0, N·D^q]``; ``K`` membership sums
                                                  ``≥ 0``, total ``N``
                        ``local_index.k<K>``      ``(1,)``: NaN (too few rows) or finite
                                                  ``≥ 0``
                        ``eval.k<K>``             ``(len(codes), K)`` whole numbers ≥ 0, total
                                                  ``N``
every phase             privacy-guard notice      only with the guard on, and only from a node
                                                  that declared no ``N`` above the guard's
                                                  bound
======================  ========================  ===========================================
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
from flwr.app import RecordDict

from fedclust.fcm.phases import Box
from fedclust.fcm.validity import DBStatistics
from fedclust.fedfcm.loop import IndexStats, LocalCenters
from strategies.wire.fcm import Rows, eval_problem, rows_checked, scaling_record
from strategies.wire.records import array_record, content
from strategies.wire.replies import (
    FLOAT,
    NodeCheck,
    box_problem,
    first_problem,
    metric_problem,
    read_array,
    total_problem,
    values_problem,
)

LOCAL = "train.fedfcm_local"
DB = "query.fedfcm_db"


def key(k: int) -> str:
    """The array name of ``K`` in every record: ``k<K>``."""
    return f"k{k}"


def centers_request(centers: Mapping[int, np.ndarray], shift: np.ndarray, scale: np.ndarray
                    ) -> RecordDict:
    """Server side: ``train.fedfcm_local`` and ``query.fedfcm_db``: the global centers of every
    ``K`` asked (ascending) and the scaling."""
    return RecordDict({"centers": array_record(**{key(k): centers[k] for k in sorted(centers)}),
                       "scaling": scaling_record(shift, scale)})


def read_centers(rd: RecordDict) -> list[tuple[str, np.ndarray]]:
    """Node side: ``(name, centers)`` of every ``K`` of the message, in its order."""
    return [(name, arr.numpy()) for name, arr in rd.array_records["centers"].items()]


# ---------------------------------------------------------------------- train.fedfcm_local

def local_reply(local: Mapping[str, tuple[np.ndarray, np.ndarray | None]], iters: int
                ) -> RecordDict:
    """Node side: its local centers per ``K`` (by the name it received) and, when not None,
    their supports ``Σ_j u_kj`` (``<name>.support``); the most local iterations it ran."""
    out: dict[str, np.ndarray] = {}
    for name, (centers, support) in local.items():
        out[name] = centers
        if support is not None:
            out[f"{name}.support"] = support
    return content({"local": out}, {"local-iters": int(iters)})


def check_local(ks: list[int], f: int, box: Box, rows: Rows, needs_support: bool,
                bound: float | None) -> NodeCheck:
    """Server side, ``train.fedfcm_local``: the node's local centers of every active ``K`` (in
    the box) and, for federated averaging, their supports ``Σ_j u_kj`` (total ``N``)."""

    def check(nid: int, rd: RecordDict, n: int) -> str | None:
        for k in ks:
            centers, problem = read_array(rd, "local", key(k), kind=FLOAT, shape=(k, f))
            if problem:
                return problem
            problem = box_problem(f"local.{key(k)}", centers, np.ones(k), box.low, box.high)
            if problem:
                return problem
            if needs_support:
                name = f"{key(k)}.support"
                s, problem = read_array(rd, "local", name, kind=FLOAT, shape=(k,), low=0.0)
                if problem:
                    return problem
                problem = total_problem(f"local.{name}", float(s.sum()), n, n,
                                        f"memberships of N = {n} rows sum to 1 per row")
                if problem:
                    return problem
        return metric_problem(rd, "local-iters", int, low=0)

    return rows_checked(rows, bound, check)


def read_local(rd: RecordDict, ks: list[int], with_support: bool) -> LocalCenters | None:
    """Server side: K -> (local centers, supports or None) of a checked reply (None: the
    privacy guard's notice)."""
    if "local" not in rd.array_records:
        return None
    rec = rd.array_records["local"]
    return {k: (rec[key(k)].numpy(), rec[f"{key(k)}.support"].numpy() if with_support else None)
            for k in ks}


# ------------------------------------------------------------------------ query.fedfcm_db

def db_reply(stats: Mapping[str, DBStatistics], local_index: Mapping[str, float],
             tables: Mapping[str, np.ndarray], codes: np.ndarray | None) -> RecordDict:
    """Node side: its FedFuzzDB sums per ``K`` (by name), its own index per ``K`` (empty: not
    asked) and, on the evaluation path, its label × cluster tables with its label codes."""
    arrays: dict[str, dict[str, np.ndarray]] = {"db": {
        name: np.concatenate([[s.n], s.spread_sums, s.membership_sums])
        for name, s in stats.items()}}
    if local_index:
        arrays["local_index"] = {name: np.array([v]) for name, v in local_index.items()}
    if tables:
        arrays["eval"] = {**tables, "codes": codes}
    return content(arrays)


def check_db(ks: list[int], box: Box, rows: Rows, q: float, bound: float | None,
             with_eval: bool) -> NodeCheck:
    """Server side, ``query.fedfcm_db``: FedFuzzDB's sums ``(N, Σ‖x − c_i‖^q, Σ u_i)`` per
    ``K``, the local index per ``K`` (optional) and, on the evaluation path, the label ×
    cluster tables."""

    def check(nid: int, rd: RecordDict, n: int) -> str | None:
        reach = n * box.diameter2 ** (q / 2)
        for k in ks:
            name = f"db.{key(k)}"
            arr, problem = read_array(rd, "db", key(k), kind=FLOAT, shape=(1 + 2 * k,))
            if problem:
                return problem
            problem = _db_problem(name, arr, k, n, reach)
            if problem:
                return problem
            if "local_index" in rd.array_records:
                problem = read_array(rd, "local_index", key(k), kind=FLOAT, shape=(1,),
                                     nan_ok=True, low=0.0)[1]
                if problem:
                    return problem
        if with_eval and "eval" in rd.array_records:
            return eval_problem(rd, {key(k): k for k in ks}, n)
        return None

    return rows_checked(rows, bound, check)


def _db_problem(name: str, arr: np.ndarray, k: int, n: int, reach: float) -> str | None:
    """FedFuzzDB sums ``[N, spreads (K), membership sums (K)]`` of a node of ``n`` rows whose
    distances to a center are at most ``reach`` in total."""
    spread, mass = arr[1:1 + k], arr[1 + k:]
    return first_problem(
        total_problem(f"{name}[N]", float(arr[0]), n, n, "the node's declared row count"),
        lambda: values_problem(f"{name}[spread]", spread, low=0.0, high=reach * (1 + 1e-6)),
        lambda: values_problem(f"{name}[memberships]", mass, low=0.0),
        lambda: total_problem(f"{name}[memberships]", float(mass.sum()), n, n,
                              f"memberships of N = {n} rows sum to 1 per row"))


def read_index(rd: RecordDict, ks: list[int], local_index: bool, evaluate: bool
               ) -> IndexStats | None:
    """Server side: a checked ``query.fedfcm_db`` reply (None: the privacy guard's notice)."""
    if "db" not in rd.array_records:
        return None
    db = {}
    for k in ks:
        arr = rd.array_records["db"][key(k)].numpy()
        db[k] = DBStatistics(int(arr[0]), arr[1:1 + k], arr[1 + k:])
    out = IndexStats(db)
    if local_index and "local_index" in rd.array_records:
        out.local_index = [float(rd.array_records["local_index"][key(k)].numpy()[0]) for k in ks]
    if evaluate and "eval" in rd.array_records:
        rec = rd.array_records["eval"]
        out.codes = rec["codes"].numpy()
        out.tables = {k: rec[key(k)].numpy() for k in ks}
    return out
