"""What the server accepts from a node, message by message, for the FCM family: exact FCM (plain,
SecAgg+, incremental) and FedFCM + FedFuzzDB. The node side of each message is
:mod:`client_apps.fcm_handlers`; the checks use the vocabulary of :mod:`strategies.replies`.

Every field of every reply is checked — its presence, dtype, shape, finiteness, sign, and the
physics the honest value obeys. ``N`` is the row count the node declared in the scaling phase
(plain runs), ``C``/``K`` the clusters, ``F`` the features, ``m`` the fuzzifier, and the *box*
the federated bounds ``[low, high]`` in the scaled space that the server itself combined from
the nodes' bounds (its squared diagonal is ``D²``):

======================  ========================  ===========================================
message                 field                     accepted
======================  ========================  ===========================================
``query.fcm_stats``     ``metrics.rows``          ``N``: an int ≥ 0 (not sent under SecAgg+)
                        ``stats.min/max``         ``(F,)`` floats, finite, ``|v| ≤ 1e150``
                                                  (what a node's loader accepts),
                                                  ``min ≤ max``; a node with ``N = 0`` sends
                                                  exactly ``+inf`` / ``-inf``
                        ``stats.stats``           ``scaling=standard``: ``(5, F)`` = count
                                                  (``N`` in every column), min, max, mean in
                                                  ``[min, max]``, M2 in
                                                  ``[0, N·(max − min)²/4]``
                        ``eval.codes``            SecAgg+ evaluation path: 1-D distinct ints
``query.fcm_sums``      ``metrics.withheld``      the int 0
                        ``sums.U``                ``(C,)`` finite, ``≥ 0``,
                                                  ``N·C^(1−m) ≤ ΣU ≤ N`` (memberships sum to
                                                  1 per row, so ``Σ_c u^m`` lies in
                                                  ``[C^(1−m), 1]``)
                        ``sums.WS``               ``(C, F)`` finite, ``WS_c / U_c`` in the box
``query.fcm_final``     ``objective.J``           ``(1,)`` finite, ``0 ≤ J ≤ N·D²`` (centers
                                                  and rows lie in the box, ``Σ_c u^m ≤ 1``)
                        ``eval.codes``            1-D distinct ints (exact FCM, evaluation)
                        ``eval.contingency``      ``(len(codes), C)`` whole numbers ≥ 0, total
                                                  ``N``
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

A node whose reply fails is excluded from that phase (:mod:`strategies.common`). Under SecAgg+
the server sees only the masked sums, so it checks the size of each masked vector (another
size: the node is excluded, :mod:`strategies.secure_fcm`) and the totals
(:func:`secure_sums_problem`, :func:`secure_final_problem`) against the round's total row count
``ΣN``, which each client adds to the secure sum: ``ΣN·C^(1−m) ≤ Σ_c ΣU_c ≤ ΣN``,
``ΣWS_c / ΣU_c`` in the box, ``0 ≤ ΣJ ≤ ΣN·D²``, the summed table whole, ``≥ 0`` and at most
``ΣN``. A failing total stops the run, naming the round's contributors (which of them sent it,
secure aggregation hides).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from flwr.app import RecordDict

from fedclust.data.local import MAX_ABS
from strategies.replies import (
    FLOAT,
    INTEGER,
    Check,
    NodeCheck,
    box_problem,
    first_problem,
    metric_problem,
    read_array,
    total_problem,
    values_problem,
    withheld_notice,
)

Rows = Mapping[int, int]


@dataclass(frozen=True)
class Box:
    """The federated bounds in the scaled space (the initial-center box)."""

    low: np.ndarray
    high: np.ndarray

    @property
    def diameter2(self) -> float:
        """Squared diagonal ``D²``: no two points of the box are farther apart."""
        return float(np.sum((np.asarray(self.high) - np.asarray(self.low)) ** 2))


def guard_bound(cfg: Mapping[str, Any], c: int, f: int) -> float | None:
    """``C(F+1)/F`` when the run's privacy guard is on, else None."""
    on = cfg["fedfcm.privacy-guard"] if cfg["method"] == "fedfcm" else cfg["fcm.privacy-guard"]
    return c * (f + 1) / f if on else None


def _notice_problem(nid: int, rows: Rows | None, bound: float | None) -> str | None:
    """Why a privacy-guard notice from ``nid`` cannot be honest (None: it can)."""
    if bound is None:
        return "sent the privacy guard's notice (withheld=1), but the run's privacy guard is off"
    if rows is not None and rows.get(nid, 0) > bound:
        return (f"sent the privacy guard's notice (withheld=1), but it declared N = {rows[nid]} "
                f"rows, above the guard's bound C(F+1)/F = {bound:.4g}")
    return None


def _declared(nid: int, rows: Rows) -> tuple[int | None, str | None]:
    if nid in rows:
        return rows[nid], None
    return None, ("declared no row count in the scaling phase (it missed that phase or "
                  "withheld there), so its statistics cannot be checked")


# ------------------------------------------------------------------------- query.fcm_stats

def stats_reply(cfg: Mapping[str, Any]) -> Check:
    """``query.fcm_stats``: the node's bounds (and standard scaling's count, mean, M2), its row
    count ``N`` (plain runs) and, on the SecAgg+ evaluation path, its label codes."""
    secure = cfg["method"] == "exact-fcm" and bool(cfg["fcm.secure-aggregation"])
    standard = cfg["scaling"] == "standard"
    guard_on = bool(cfg["fedfcm.privacy-guard"] if cfg["method"] == "fedfcm"
                    else cfg["fcm.privacy-guard"])

    def check(rd: RecordDict) -> str | None:
        if withheld_notice(rd):
            return None if guard_on else _notice_problem(0, None, None)
        if "stats" not in rd.array_records:
            return "neither 'stats' nor a privacy-guard notice"
        rows = None
        if not secure:
            problem = metric_problem(rd, "rows", int, low=0)
            if problem:
                return problem
            rows = int(rd.metric_records["metrics"]["rows"])
        problem = (_standard_problem(rd, rows) if standard else _minmax_problem(rd, rows))
        if problem or "eval" not in rd.array_records:
            return problem
        codes, problem = read_array(rd, "eval", "codes", kind=INTEGER, ndim=1)
        if problem:
            return problem
        if len(np.unique(codes)) != len(codes):
            return "'eval.codes' repeats a label code"
        return None

    return check


def declared_rows(rd: RecordDict) -> int | None:
    """The row count a checked ``query.fcm_stats`` reply declared (None: none)."""
    met = rd.metric_records.get("metrics")
    if met is not None and "rows" in met:
        return int(met["rows"])
    if "stats" in rd.array_records and "stats" in rd.array_records["stats"]:
        return int(rd.array_records["stats"]["stats"].numpy()[0, 0])
    return None


def _minmax_problem(rd: RecordDict, rows: int | None) -> str | None:
    lo, problem = read_array(rd, "stats", "min", kind=FLOAT, ndim=1, finite=False,
                             nonempty=True)
    if problem:
        return problem
    hi, problem = read_array(rd, "stats", "max", kind=FLOAT, shape=lo.shape, finite=False)
    return problem or _bounds_problem(lo, hi, rows)


def _bounds_problem(lo: np.ndarray, hi: np.ndarray, rows: int | None) -> str | None:
    """Bounds of a node's rows: finite, within what a node's loader accepts, ``min ≤ max``;
    a node with no row sends ``+inf``/``-inf`` (and only such a node)."""
    empty = bool(np.all(lo == np.inf) and np.all(hi == -np.inf))
    if rows == 0 or (rows is None and empty):
        return None if empty else "a node with no row must send min = +inf and max = -inf"
    limits = dict(low=-MAX_ABS, high=MAX_ABS)
    problem = first_problem(values_problem("stats.min", lo, **limits),
                            lambda: values_problem("stats.max", hi, **limits))
    if problem:
        return f"{problem} (a node's data are finite with |x| <= {MAX_ABS:g})"
    if np.any(lo > hi):
        j = int(np.argmax(lo > hi))
        return f"'stats.min' exceeds 'stats.max' in feature {j}"
    return None


def _standard_problem(rd: RecordDict, rows: int | None) -> str | None:
    st, problem = read_array(rd, "stats", "stats", kind=FLOAT, ndim=2, finite=False)
    if problem:
        return problem
    if st.shape[0] != 5 or st.shape[1] < 1:
        return f"'stats.stats' has shape {st.shape}, expected (5, features)"
    count, lo, hi, mean, m2 = st
    problem = values_problem("stats.stats[count]", count, low=0, integral=True)
    if problem:
        return problem
    if np.any(count != count[0]) or (rows is not None and count[0] != rows):
        return (f"'stats.stats' counts {np.unique(count)[:3].tolist()} disagree with each "
                f"other or with the declared N = {rows}")
    n = int(count[0])
    problem = _bounds_problem(lo, hi, n) or first_problem(
        lambda: values_problem("stats.stats[mean]", mean),
        lambda: values_problem("stats.stats[m2]", m2, low=0.0))
    if problem:
        return problem
    if n == 0:
        return "a node with no row must send mean 0 and M2 0" if np.any(mean) or np.any(m2) \
            else None
    span = hi - lo
    tol = 1e-9 * np.maximum(1.0, np.maximum(np.abs(lo), np.abs(hi)))
    if np.any(mean < lo - tol) or np.any(mean > hi + tol):
        return "'stats.stats' has a mean outside [min, max]"
    if np.any(m2 > n * span**2 / 4 * (1 + 1e-9) + tol):   # Popoviciu: variance <= range²/4
        return "'stats.stats' has an M2 above N·(max − min)²/4 (no data have that spread)"
    return None


# -------------------------------------------------------------------------- query.fcm_sums

def sums_reply(c: int, f: int, box: Box, rows: Rows, m: float, bound: float | None
               ) -> NodeCheck:
    """``query.fcm_sums``: ``U = Σ u^m`` and ``WS = Σ u^m x`` of the node's ``N`` rows, or the
    privacy guard's notice."""

    def check(nid: int, rd: RecordDict) -> str | None:
        if withheld_notice(rd):
            return _notice_problem(nid, rows, bound)
        n, problem = _declared(nid, rows)
        if problem:
            return problem
        problem = metric_problem(rd, "withheld", int, low=0, high=0)
        if problem:
            return f"{problem} (a node that sends sums withholds nothing)"
        u, problem = read_array(rd, "sums", "U", kind=FLOAT, shape=(c,), low=0.0)
        if problem:
            return problem
        ws, problem = read_array(rd, "sums", "WS", kind=FLOAT, shape=(c, f))
        if problem:
            return problem
        return first_problem(
            total_problem("sums.U", float(u.sum()), n * float(c) ** (1.0 - m), float(n),
                          f"Σ_c u^m of N = {n} rows lies in [N·C^(1−m), N]"),
            lambda: box_problem("sums.WS", ws, u, box.low, box.high))

    return check


# ------------------------------------------------------------------------- query.fcm_final

def final_reply(c: int, box: Box, rows: Rows, bound: float | None, with_eval: bool
                ) -> NodeCheck:
    """``query.fcm_final``: the objective share ``J`` and, with ``with_eval`` (exact FCM on
    the evaluation path), the node's label × cluster table."""

    def check(nid: int, rd: RecordDict) -> str | None:
        if withheld_notice(rd):
            return _notice_problem(nid, rows, bound)
        n, problem = _declared(nid, rows)
        if problem:
            return problem
        j, problem = read_array(rd, "objective", "J", kind=FLOAT, shape=(1,), low=0.0)
        if problem:
            return problem
        problem = total_problem("objective.J", float(j[0]), 0.0, n * box.diameter2,
                                f"N = {n} rows of the box, each at most D² from a center")
        if problem or not with_eval or "eval" not in rd.array_records:
            return problem
        return eval_problem(rd, {"contingency": c}, n)

    return check


def eval_problem(rd: RecordDict, tables: Mapping[str, int], n: int) -> str | None:
    """Evaluation record ``eval``: distinct integer ``codes`` and, per ``tables`` entry
    ``key → columns``, a ``(len(codes), columns)`` table of whole counts summing to ``n``."""
    codes, problem = read_array(rd, "eval", "codes", kind=INTEGER, ndim=1)
    if problem:
        return problem
    if len(np.unique(codes)) != len(codes):
        return "'eval.codes' repeats a label code"
    for key, cols in tables.items():
        table, problem = read_array(rd, "eval", key, shape=(len(codes), cols), low=0.0,
                                    integral=True)
        if problem:
            return problem
        problem = total_problem(f"eval.{key}", float(table.sum()), n, n,
                                "every row is counted once")
        if problem:
            return problem
    return None


# ---------------------------------------------------------------------- train.fedfcm_local

def local_reply(ks: list[int], f: int, box: Box, rows: Rows, needs_support: bool,
                bound: float | None, key: Callable[[int], str]) -> NodeCheck:
    """``train.fedfcm_local``: the node's local centers of every active ``K`` (in the box) and,
    for federated averaging, their supports ``Σ_j u_kj`` (total ``N``)."""

    def check(nid: int, rd: RecordDict) -> str | None:
        if withheld_notice(rd):
            return _notice_problem(nid, rows, bound)
        n, problem = _declared(nid, rows)
        if problem:
            return problem
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

    return check


# ------------------------------------------------------------------------ query.fedfcm_db

def db_reply(ks: list[int], box: Box, rows: Rows, q: float, bound: float | None,
             with_eval: bool, key: Callable[[int], str]) -> NodeCheck:
    """``query.fedfcm_db``: FedFuzzDB's sums ``(N, Σ‖x − c_i‖^q, Σ u_i)`` per ``K``, the local
    index per ``K`` (optional) and, on the evaluation path, the label × cluster tables."""

    def check(nid: int, rd: RecordDict) -> str | None:
        if withheld_notice(rd):
            return _notice_problem(nid, rows, bound)
        n, problem = _declared(nid, rows)
        if problem:
            return problem
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

    return check


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


# ------------------------------------------------------------------------ SecAgg+ totals

def secure_sums_problem(u: np.ndarray, ws: np.ndarray, rows: float, box: Box, c: int,
                        m: float) -> str | None:
    """The securely summed ``ΣU``, ``ΣWS`` and row count ``ΣN`` of a round: a sum of honest
    sums obeys what each one does — finite, ``ΣU ≥ 0`` with ``ΣN·C^(1−m) ≤ Σ_c ΣU_c ≤ ΣN``,
    ``ΣWS_c / ΣU_c`` in the box, ``ΣN`` a whole number of rows below ``2^40`` (the secure
    encoding's divisor: only clipped or garbled values come near it)."""
    tol = 1e-6 * max(1.0, abs(rows))
    n = float(np.round(rows))
    return first_problem(
        values_problem("ΣN", np.array([rows]), low=0.0, high=float(2**40)),
        lambda: None if abs(rows - n) <= 1e-6 * max(1.0, n) else
        f"'ΣN' = {rows:.6g} is not a whole number of rows",
        lambda: values_problem("ΣU", u, low=-tol),
        lambda: values_problem("ΣWS", ws),
        lambda: total_problem("ΣU", float(u.sum()), n * float(c) ** (1.0 - m), n,
                              f"Σ_c u^m of the round's ΣN = {n:.0f} rows"),
        lambda: box_problem("ΣWS", ws, np.maximum(u, 0.0), box.low, box.high))


def secure_final_problem(j: float, table: np.ndarray | None, rows: float, box: Box
                         ) -> str | None:
    """The securely summed objective (finite, ``0 ≤ ΣJ ≤ ΣN·D²``), evaluation table (whole
    counts ``≥ 0``, at most ``ΣN`` in total: nodes without labels send zeros) and row count."""
    n = float(np.round(rows))
    problem = first_problem(
        values_problem("ΣN", np.array([rows]), low=0.0, high=float(2**40)),
        lambda: None if abs(rows - n) <= 1e-6 * max(1.0, n) else
        f"'ΣN' = {rows:.6g} is not a whole number of rows",
        lambda: values_problem("ΣJ", np.array([j])),
        lambda: total_problem("ΣJ", j, 0.0, n * box.diameter2,
                              f"ΣN = {n:.0f} rows of the box, each at most D² from a center"))
    if problem or table is None:
        return problem
    rounded = np.round(table)
    if np.any(np.abs(table - rounded) > 1e-6) or np.any(rounded < 0):
        return "the summed evaluation table holds values that are not whole counts >= 0"
    return total_problem("Σ contingency", float(rounded.sum()), 0.0, n,
                         "at most one count per row")
