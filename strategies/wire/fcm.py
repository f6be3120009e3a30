"""Exact federated FCM's messages, both ends (paper 004: plain, SecAgg+, incremental), and the
scaling and final messages FedFCM shares: what the server sends, what a node reads from it,
what the node replies (:mod:`client_apps.fcm_handlers`, :mod:`client_apps.secagg_handlers`),
and how the server checks and reads the reply (:mod:`strategies.fcm`). The checks use the
vocabulary of :mod:`strategies.wire.replies`.

======================  =========================================  =========================
message                 server sends                               node replies
======================  =========================================  =========================
``query.fcm_stats``     nothing                                    ``stats``, ``metrics.rows``
                                                                   (``eval.codes``)
``query.fcm_sums``      ``centers.centers`` (C, F), ``scaling``    ``sums.U``, ``sums.WS``,
                        (``shift``, ``scale``)                     ``metrics.withheld`` = 0
``query.fcm_final``     ``centers``, ``scaling``, ``result``       ``objective.J``
                        (``run-dir``)                              (``eval.contingency``,
                                                                   ``eval.codes``)
``train`` (SecAgg+)     FitIns ``[centers, shift, scale]`` and     FitRes: the limb-packed
                        the fit config (:class:`SecureRequest`)    vector, masked
======================  =========================================  =========================

A node the privacy guard keeps silent replies to every message with the notice
(:func:`withheld_reply`: no array, ``metrics.withheld`` = 1).

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
every phase             privacy-guard notice      only with the guard on, and only from a node
                                                  that declared no ``N`` above the guard's
                                                  bound
======================  ========================  ===========================================

FedFCM's own messages are :mod:`strategies.wire.fedfcm`. A node whose reply fails is excluded
from that phase (:mod:`strategies.common`). Under SecAgg+ the server sees only the masked
sums, so it checks the size of each masked vector (another size: the node is excluded,
:func:`masked_size_problem`) and the totals (:func:`secure_sums_problem`,
:func:`secure_final_problem`) against the round's total row count ``ΣN``, which each client
adds to the secure sum: ``ΣN·C^(1−m) ≤ Σ_c ΣU_c ≤ ΣN``, ``ΣWS_c / ΣU_c`` in the box,
``0 ≤ ΣJ ≤ ΣN·D²``, the summed table whole, ``≥ 0`` and at most ``ΣN``. A failing total stops
the run, naming the round's contributors (which of them sent it, secure aggregation hides).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord, RecordDict

from fedclust import npy
from fedclust.data.local import MAX_ABS
from fedclust.data.scaling import ColumnStats
from fedclust.fcm.phases import Box, NodeStats
from fedclust.fcm.secagg import PHASE_FINAL, PHASE_SUMS
from strategies.wire.records import array_record, content, get_array_record, to_numpy
from strategies.wire.replies import (
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

__all__ = ["Box", "withheld_notice"]

STATS = "query.fcm_stats"
SUMS = "query.fcm_sums"
FINAL = "query.fcm_final"

Rows = Mapping[int, int]


# ------------------------------------------------------------------- shared parts

def scaling_record(shift: np.ndarray, scale: np.ndarray) -> ArrayRecord:
    """The run's federated scaling, as every message after phase 0 carries it."""
    return array_record(shift=shift, scale=scale)


def read_scaling(rd: RecordDict) -> tuple[np.ndarray, np.ndarray] | None:
    """Node side: ``(shift, scale)`` of a message (None: it carries no scaling)."""
    sc = get_array_record(rd, "scaling")
    return None if sc is None else (to_numpy(sc["shift"]), to_numpy(sc["scale"]))


def read_centers(rd: RecordDict) -> np.ndarray:
    """Node side: the centers ``(C, F)`` of a ``query.fcm_sums``/``query.fcm_final``."""
    return to_numpy(rd["centers"]["centers"])


def withheld_reply() -> RecordDict:
    """Node side: the privacy guard's notice (no statistic of the node's rows)."""
    return content(metrics={"withheld": 1})


def notice_problem(nid: int, rows: Rows | None, bound: float | None) -> str | None:
    """Why a privacy-guard notice from ``nid`` cannot be honest (None: it can)."""
    if bound is None:
        return "sent the privacy guard's notice (withheld=1), but the run's privacy guard is off"
    if rows is not None and rows.get(nid, 0) > bound:
        return (f"sent the privacy guard's notice (withheld=1), but it declared N = {rows[nid]} "
                f"rows, above the guard's bound C(F+1)/F = {bound:.4g}")
    return None


def declared_n(nid: int, rows: Rows) -> tuple[int | None, str | None]:
    """The row count ``nid`` declared in the scaling phase, or why there is none."""
    if nid in rows:
        return rows[nid], None
    return None, ("declared no row count in the scaling phase (it missed that phase or "
                  "withheld there), so its statistics cannot be checked")


def rows_checked(rows: Rows, bound: float | None,
                 check: Callable[[int, RecordDict, int], str | None]) -> NodeCheck:
    """The check of a phase after scaling: the privacy guard's notice is checked against the
    guard (:func:`notice_problem`), any other reply needs the row count ``n`` its node
    declared in the scaling phase, and ``check(nid, reply, n)`` judges the rest."""

    def checked(nid: int, rd: RecordDict) -> str | None:
        if withheld_notice(rd):
            return notice_problem(nid, rows, bound)
        n, problem = declared_n(nid, rows)
        return problem or check(nid, rd, n)  # type: ignore[arg-type]  # n is set when no problem

    return checked


# ------------------------------------------------------------------------- query.fcm_stats

def stats_request() -> RecordDict:
    """Server side: ``query.fcm_stats`` carries nothing."""
    return RecordDict()


def stats_reply(stats: ColumnStats, standard: bool, rows: int | None,
                codes: np.ndarray | None = None, columns: int = 0) -> RecordDict:
    """Node side: its bounds (standard scaling: count, min, max, mean, M2), its row count
    ``rows`` (None: not sent, SecAgg+), its label ``codes`` (SecAgg+ evaluation path) and the
    digest of its feature column names (``columns``; 0: its file names none): the server
    compares the digests, so that a table whose columns are in another order is not summed
    position by position with the others."""
    arrays: dict[str, dict[str, np.ndarray]] = {
        "stats": {"stats": stats.as_array()} if standard else {"min": stats.min,
                                                               "max": stats.max}}
    if codes is not None:
        arrays["eval"] = {"codes": codes}
    metrics = ({} if rows is None else {"rows": int(rows)}) | (
        {"columns": int(columns)} if columns else {})
    return content(arrays, metrics)


def check_stats(standard: bool, guard_on: bool, secure: bool) -> Check:
    """Server side, ``query.fcm_stats``: the node's bounds (and standard scaling's count, mean,
    M2), its row count ``N`` (plain runs: not ``secure``) and, on the SecAgg+ evaluation path,
    its label codes."""

    def check(rd: RecordDict) -> str | None:
        if withheld_notice(rd):
            return None if guard_on else notice_problem(0, None, None)
        if get_array_record(rd, "stats") is None:
            return "neither 'stats' nor a privacy-guard notice"
        rows = None
        met = _metrics(rd)
        if not secure:
            problem = metric_problem(rd, "rows", int, low=0)
            if problem:
                return problem
            rows = int(met["rows"])
        problem = (_standard_problem(rd, rows) if standard else _minmax_problem(rd, rows))
        if not problem and met is not None and "columns" in met:
            problem = metric_problem(rd, "columns", int, low=1, high=2**62)
        if problem or get_array_record(rd, "eval") is None:
            return problem
        codes, problem = read_array(rd, "eval", "codes", kind=INTEGER, ndim=1)
        if problem:
            return problem
        if len(np.unique(codes)) != len(codes):
            return "'eval.codes' repeats a label code"
        return None

    return check


def _metrics(rd: RecordDict) -> MetricRecord | None:
    """The MetricRecord ``"metrics"`` of ``rd`` (None: none), without building
    ``rd.metric_records`` (a new view on every call)."""
    met = rd.get("metrics")
    return met if isinstance(met, MetricRecord) else None


def declared_rows(rd: RecordDict) -> int | None:
    """The row count a checked ``query.fcm_stats`` reply declared (None: none)."""
    met = _metrics(rd)
    if met is not None and "rows" in met:
        return int(met["rows"])
    rec = get_array_record(rd, "stats")
    if rec is not None and "stats" in rec:
        return int(to_numpy(rec["stats"])[0, 0])
    return None


def read_stats(rd: RecordDict) -> NodeStats | None:
    """Server side: a checked ``query.fcm_stats`` reply (None: the privacy guard's notice)."""
    rec = get_array_record(rd, "stats")
    if rec is None:
        return None
    if "stats" in rec:
        stats = ColumnStats.from_array(to_numpy(rec["stats"]))
    else:
        lo, hi = to_numpy(rec["min"]), to_numpy(rec["max"])
        stats = ColumnStats(0, lo, hi, np.zeros_like(lo), np.zeros_like(lo))
    ev = get_array_record(rd, "eval")
    codes = to_numpy(ev["codes"]) if ev is not None else None
    return NodeStats(stats, declared_rows(rd), codes)


def column_digest(rd: RecordDict) -> int:
    """Server side: the column-name digest of a checked ``query.fcm_stats`` reply (0: none)."""
    met = _metrics(rd)
    return int(met["columns"]) if met is not None and "columns" in met else 0


def n_features(rd: RecordDict) -> int:
    """Server side: the feature count of a checked ``query.fcm_stats`` reply with statistics."""
    rec = get_array_record(rd, "stats")
    assert rec is not None
    return int(to_numpy(rec["stats"] if "stats" in rec else rec["min"]).shape[-1])


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

def centers_request(centers: np.ndarray, shift: np.ndarray, scale: np.ndarray,
                    result: ConfigRecord | None = None) -> RecordDict:
    """Server side: ``query.fcm_sums`` (and, with the ``result`` record naming the run's
    folder, ``query.fcm_final``): the centers ``V`` (C, F) and the scaling."""
    out = RecordDict({"centers": array_record(centers=centers),
                      "scaling": scaling_record(shift, scale)})
    if result is not None:
        out["result"] = result
    return out


def sums_reply(u: np.ndarray, ws: np.ndarray) -> RecordDict:
    """Node side: its local sums ``U = Σ u^m`` (C,) and ``WS = Σ u^m x`` (C, F)."""
    return content({"sums": {"U": u, "WS": ws}}, {"withheld": 0})


def check_sums(c: int, f: int, box: Box, rows: Rows, m: float, bound: float | None
               ) -> NodeCheck:
    """Server side, ``query.fcm_sums``: ``U = Σ u^m`` and ``WS = Σ u^m x`` of the node's ``N``
    rows, or the privacy guard's notice."""

    def check(nid: int, rd: RecordDict, n: int) -> str | None:
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

    return rows_checked(rows, bound, check)


def sums_passing(replies: Mapping[int, RecordDict], c: int, f: int, box: Box, rows: Rows,
                 m: float) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """Server side: the replies of a round that pass :func:`check_sums` for sure, judged over
    all of them at once (numpy over the stacked sums), with their ``(U, WS)``.

    A reply is taken here only when it has the plain layout (metric ``withheld`` = 0, float64
    ``U`` of shape (C,) and ``WS`` of shape (C, F)), its node declared a row count, and its
    values pass every test of :func:`check_sums` (finite, ``U ≥ 0``, ``Σ U`` inside its bounds
    with a margin of half the tolerance, ``WS`` inside the box, the same expression). Every
    other reply goes through :func:`check_sums` itself, which names what is wrong."""
    nodes: list[int] = []
    arrays: list[tuple[Array, Array]] = []
    for nid, rd in replies.items():
        rec, met = rd.get("sums"), rd.get("metrics")
        if nid not in rows or not isinstance(rec, ArrayRecord) or not isinstance(
                met, MetricRecord) or "U" not in rec or "WS" not in rec:
            continue
        flag = met.get("withheld")
        if type(flag) is not int or flag != 0:
            continue
        nodes.append(nid)
        arrays.append((rec["U"], rec["WS"]))
    if not nodes:
        return {}
    # one read of all replies when they share one layout (the usual case), else one by one
    u, ws = (_stacked([a for a, _ in arrays], (c,)), _stacked([b for _, b in arrays], (c, f)))
    if u is None or ws is None:
        kept = []
        for nid, (a, b) in zip(nodes, arrays, strict=True):
            try:
                pair = to_numpy(a), to_numpy(b)
            except Exception:       # noqa: BLE001 - the per-reply check names it
                continue
            if (pair[0].dtype == np.float64 and pair[1].dtype == np.float64
                    and pair[0].shape == (c,) and pair[1].shape == (c, f)):
                kept.append((nid, *pair))
        if not kept:
            return {}
        nodes = [k[0] for k in kept]
        u, ws = np.stack([k[1] for k in kept]), np.stack([k[2] for k in kept])
    n = np.array([rows[nid] for nid in nodes], dtype=np.float64)
    with np.errstate(all="ignore"):
        ok = np.isfinite(u).all(axis=1) & np.isfinite(ws).all(axis=(1, 2)) & (u.min(axis=1) >= 0)
        total = u.sum(axis=1)
        tol = 0.5e-6 * np.maximum(1.0, np.abs(n))       # half total_problem's (rtol of N)
        ok &= (total >= n * float(c) ** (1.0 - m) - tol) & (total <= n + tol)
        lo, hi = np.asarray(box.low, dtype=np.float64), np.asarray(box.high, dtype=np.float64)
        w = u[:, :, None]
        # box_problem's expression, element by element
        btol = 1e-6 * w * max(1.0, float(np.max(np.abs(np.concatenate([lo, hi]))))) + 1e-300
        ok &= ~((ws < w * lo - btol) | (ws > w * hi + btol)).any(axis=(1, 2))
    return {nid: (u[k], ws[k]) for k, nid in enumerate(nodes) if ok[k]}


def _stacked(arrays: list[Array], shape: tuple[int, ...]) -> np.ndarray | None:
    """The float64 ``.npy`` arrays of ``shape``, stacked, read in one pass (None: not all
    of them are exactly that)."""
    if any(getattr(a, "stype", None) != npy.STYPE for a in arrays):
        return None
    try:
        out = npy.loads_many([a.data for a in arrays])
    except Exception:           # noqa: BLE001 - read one by one: the check names it
        return None
    return out if out is not None and out.dtype == np.float64 and out.shape[1:] == shape \
        else None


def read_sums(rd: RecordDict) -> tuple[np.ndarray, np.ndarray] | None:
    """Server side: ``(U, WS)`` of a checked reply (None: the privacy guard's notice)."""
    rec = get_array_record(rd, "sums")
    return None if rec is None else (to_numpy(rec["U"]), to_numpy(rec["WS"]))


# ------------------------------------------------------------------------- query.fcm_final

def final_reply(objective: float, table: np.ndarray | None = None,
                codes: np.ndarray | None = None) -> RecordDict:
    """Node side: its objective share ``J_m`` and, on the evaluation path, its label × cluster
    ``table`` with the label ``codes`` of its rows."""
    arrays: dict[str, dict[str, np.ndarray]] = {"objective": {"J": np.array([objective])}}
    if table is not None:
        arrays["eval"] = {"contingency": table, "codes": codes}
    return content(arrays)


def check_final(c: int, box: Box, rows: Rows, bound: float | None, with_eval: bool
                ) -> NodeCheck:
    """Server side, ``query.fcm_final``: the objective share ``J`` and, with ``with_eval``
    (exact FCM on the evaluation path), the node's label × cluster table."""

    def check(nid: int, rd: RecordDict, n: int) -> str | None:
        j, problem = read_array(rd, "objective", "J", kind=FLOAT, shape=(1,), low=0.0)
        if problem:
            return problem
        problem = total_problem("objective.J", float(j[0]), 0.0, n * box.diameter2,
                                f"N = {n} rows of the box, each at most D² from a center")
        if problem or not with_eval or get_array_record(rd, "eval") is None:
            return problem
        return eval_problem(rd, {"contingency": c}, n)

    return rows_checked(rows, bound, check)


def read_objective(rd: RecordDict) -> float | None:
    """Server side: ``J_m`` of a checked reply (None: the privacy guard's notice)."""
    rec = get_array_record(rd, "objective")
    return None if rec is None else float(to_numpy(rec["J"])[0])


def read_eval(rd: RecordDict, key: str = "contingency"
              ) -> tuple[np.ndarray, np.ndarray] | None:
    """Server side: ``(codes, table)`` of a checked reply's evaluation record (None: none)."""
    rec = get_array_record(rd, "eval")
    return None if rec is None else (to_numpy(rec["codes"]), to_numpy(rec[key]))


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


# ------------------------------------------------------------------ SecAgg+ (train)

@dataclass(frozen=True)
class SecureRequest:
    """What one SecAgg+ round asks of a node (the FitIns of Flower's legacy workflow).

    Attributes
    ----------
    centers, shift, scale : arrays
        The centers (C, F) and the run's scaling.
    final : bool
        The final phase (``J`` and the evaluation table) rather than a round's sums.
    divisor : float
        The public divisor ``S`` of ``WS`` (final: of ``J``).
    divisor_aux : float
        The divisor of ``U`` and the row count (final: of the table and the row count).
    limbs : int
        Limbs per value (:mod:`fedclust.fcm.secagg`).
    with_rows : bool
        Add the row count to the vector (the server checks the totals against it).
    eval_codes : array of int
        Final phase: the label codes of the summed table's rows (empty: no evaluation).
    run_dir : str
        Final phase: the run's folder (a simulated node keeps its owner's results there).
    """

    centers: np.ndarray
    shift: np.ndarray
    scale: np.ndarray
    final: bool
    divisor: float
    divisor_aux: float
    limbs: int
    with_rows: bool
    eval_codes: np.ndarray
    run_dir: str


def secure_parameters(centers: np.ndarray, shift: np.ndarray, scale: np.ndarray
                      ) -> list[np.ndarray]:
    """Server side: the FitIns parameters of a SecAgg+ round."""
    return [centers, shift, scale]


def secure_sums_config(divisor: float, divisor_u: float, limbs: int) -> dict[str, Any]:
    """Server side: the fit config of a round's secure sums ``[U, WS, N]``."""
    return {"fedclust.phase": PHASE_SUMS, "fedclust.secure-scale": divisor,
            "fedclust.secure-scale-u": divisor_u, "fedclust.limbs": limbs,
            "fedclust.with-rows": True}


def secure_final_config(divisor_j: float, divisor_table: float, limbs: int,
                        eval_codes: np.ndarray, run_dir: str) -> dict[str, Any]:
    """Server side: the fit config of the final phase's secure sum ``[J, table, N]``."""
    return {"fedclust.phase": PHASE_FINAL, "fedclust.secure-scale": divisor_j,
            "fedclust.secure-scale-table": divisor_table, "fedclust.limbs": limbs,
            "fedclust.eval-codes": np.asarray(eval_codes, dtype="<i8").tobytes(),
            "fedclust.run-dir": str(run_dir), "fedclust.with-rows": True}


def is_final(fit_config: Mapping[str, Any]) -> bool:
    """Whether a SecAgg+ fit config is the final phase's."""
    return fit_config["fedclust.phase"] == PHASE_FINAL


def read_secure_request(rd: RecordDict, default_limbs: int) -> SecureRequest:
    """Node side: the FitIns of a SecAgg+ round."""
    params = rd.array_records["fitins.parameters"]
    centers, shift, scale = (a.numpy() for a in params.values())
    cfg = rd.config_records["fitins.config"]
    final = cfg.get("fedclust.phase", PHASE_SUMS) == PHASE_FINAL
    divisor = float(cfg["fedclust.secure-scale"])
    aux = float(cfg["fedclust.secure-scale-table"] if final
                else cfg.get("fedclust.secure-scale-u", divisor))
    codes = np.frombuffer(cfg.get("fedclust.eval-codes", b""), dtype="<i8").astype(np.int64)
    return SecureRequest(centers, shift, scale, final, divisor, aux,
                         int(cfg.get("fedclust.limbs", default_limbs)),
                         bool(cfg.get("fedclust.with-rows")), codes,
                         str(cfg.get("fedclust.run-dir", "")))


def secure_reply(vector: np.ndarray) -> RecordDict:
    """Node side: the FitRes of a SecAgg+ round; ``secaggplus_mod`` masks ``vector`` and clears
    the plain array before anything leaves the node. The weight is always 1 (the node's row
    count is not revealed)."""
    return RecordDict({
        "fitres.parameters": ArrayRecord([vector]),
        "fitres.num_examples": MetricRecord({"num_examples": 1}),
        "fitres.metrics": ConfigRecord({}),
        "fitres.status": ConfigRecord({"code": 0, "message": "ok"}),
    })


#: what a node's reply to each SecAgg+ stage holds in its ``secaggplus_configs`` record:
#: key -> (element type, or None for a scalar of that type)
SECAGG_REPLY: dict[str, dict[str, tuple[type, bool]]] = {
    "setup": {"pk1": (bytes, False), "pk2": (bytes, False)},
    "share_keys": {"dsts": (int, True), "ctxts": (bytes, True)},
    "collect_masked_vectors": {"masked_params": (bytes, True)},
    "unmask": {"nids": (int, True), "shares": (bytes, True)},
}


def secagg_reply_problem(rd: RecordDict, stage: str, nodes: set[int]) -> str | None:
    """Server side: what is wrong with the form of a node's reply to SecAgg+ stage ``stage``
    (None: the keys and types Flower's workflow reads are there; node ids in them are among
    ``nodes``, the round's nodes). Flower's workflow reads them unchecked, so a reply without
    them — empty, or one of another stage replayed — would stop the run with a ``KeyError``;
    refused here, the node counts as dropped and the others' sum goes on."""
    expected = SECAGG_REPLY.get(stage)
    if expected is None:
        return None
    rec = rd.get("secaggplus_configs")
    if not isinstance(rec, ConfigRecord):
        return f"its reply to SecAgg+ stage '{stage}' has no 'secaggplus_configs' record"
    for key, (kind, is_list) in expected.items():
        if key not in rec:
            return f"its reply to SecAgg+ stage '{stage}' lacks '{key}'"
        value = rec[key]
        items = value if is_list else [value]
        if (is_list and not isinstance(value, list)) or not all(
                isinstance(v, kind) and not isinstance(v, bool) for v in items):
            return (f"'{key}' of its reply to SecAgg+ stage '{stage}' is not "
                    f"{'a list of ' if is_list else ''}{kind.__name__}")
    pairs = {"share_keys": ("dsts", "ctxts"), "unmask": ("nids", "shares")}.get(stage)
    if pairs and len(rec[pairs[0]]) != len(rec[pairs[1]]):
        return f"'{pairs[0]}' and '{pairs[1]}' of its SecAgg+ reply differ in length"
    if pairs and not set(rec[pairs[0]]) <= nodes:
        return f"'{pairs[0]}' of its SecAgg+ reply names nodes outside the round"
    if stage == "collect_masked_vectors":
        try:
            import flwr.compat.common.recorddict_compat as compat

            compat.recorddict_to_fitres(rd, True)
        except Exception as exc:  # a reply Flower cannot read as a fit result
            return f"its masked-vector reply is not a fit result ({type(exc).__name__})"
    return None


def masked_size_problem(rd: RecordDict, length: int) -> str | None:
    """Server side: what is wrong with the size of a masked vector in a SecAgg+ reply (None:
    no masked vector in it, or the right size). The values are masked; their size is not."""
    from flwr.common import bytes_to_ndarray

    rec = rd.config_records.get("secaggplus_configs")
    if rec is None or "masked_params" not in rec:
        return None
    try:
        size = sum(bytes_to_ndarray(b).size for b in rec["masked_params"])
    except Exception as exc:  # bytes that are no array
        return f"its masked vector is not readable ({type(exc).__name__})"
    if size != length + 1:   # secaggplus_mod puts the weight factor before the vector
        return f"its masked vector holds {size - 1} values, expected {length}"
    return None


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
