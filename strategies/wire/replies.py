"""Reply checks: the one vocabulary every server loop uses to judge what a node sent.

Nothing a node sends is trusted. Each reply is checked by one function per message, kept with
the rest of that message's code — its builder and its parser — in the method's wire module
(:mod:`strategies.wire.fcm` and :mod:`strategies.wire.fedfcm` for the FCM family;
:mod:`strategies.wire.emdcfl` for EMD-CFL and its baselines), and every such function is
built from the primitives here:

- presence: :func:`read_array`, :func:`metric_problem` (a record, a key);
- type: the dtype (exact, or its kind: float, integer);
- shape: exact shape or number of axes, non-empty;
- values: finite, sign and range ``[low, high]``, whole numbers (counts), NaN where allowed;
- physics: :func:`box_problem` (weighted sums whose ratio must lie in a box, e.g. FCM's
  ``WS_c / U_c`` inside the federated scaling box) and :func:`total_problem` (an identity such
  as "memberships sum to the node's row count").

A check returns ``None`` (the reply is usable) or a short reason naming the record, the key and
what is wrong. Reasons may quote an offending statistic (a node's reply is statistics, never
its rows). A check must not raise on a malformed reply; :func:`strategies.common.check_each`
and :func:`strategies.common.send_and_collect` still turn an exception into a rejection.

This module reads Flower RecordDicts and knows nothing of Exchanges or server loops; what
happens to a rejected reply (the node is excluded from the phase, named in the log, in
``history.jsonl`` and in ``summary.json``) is :mod:`strategies.common`'s.
"""

from __future__ import annotations

import json
import math
import re
import unicodedata
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, MetricRecord, RecordDict

from fedclust import npy

#: ``reply -> reason | None``: a check of one reply that needs nothing but the reply.
Check = Callable[[RecordDict], str | None]
#: ``(node id, reply) -> reason | None``: a check that needs what the node was sent or declared.
NodeCheck = Callable[[int, RecordDict], str | None]
Problem = str | None | Callable[[], str | None]

FLOAT = "f"        # dtype kinds for ``kind=``
INTEGER = "iu"


def first_problem(*problems: Problem) -> str | None:
    """The first reason among ``problems``; a callable is evaluated only when every earlier
    problem was ``None`` (so that a later check may rely on an earlier one)."""
    for p in problems:
        found = p() if callable(p) else p
        if found:
            return found
    return None


def all_of(*checks: Check) -> Check:
    """One :data:`Check` from several, stopping at the first reason."""
    def _check(content: RecordDict) -> str | None:
        return first_problem(*(lambda c=c: c(content) for c in checks))

    return _check


def values_problem(name: str, values: Any, *, finite: bool = True, nan_ok: bool = False,
                   low: float | None = None, high: float | None = None,
                   integral: bool = False, nonempty: bool = False) -> str | None:
    """What is wrong with the numbers ``values`` (an array or a scalar) named ``name``.

    Parameters
    ----------
    finite : bool
        Refuse NaN and ±inf (with ``nan_ok``, NaN is allowed and only ±inf refused).
    low, high : float, optional
        Inclusive bounds.
    integral : bool
        Whole numbers only (counts).
    nonempty : bool
        At least one value.
    """
    arr = np.asarray(values)
    if arr.dtype.kind not in "biuf":
        return f"'{name}' is not numeric (dtype {arr.dtype})"
    if nonempty and arr.size == 0:
        return f"'{name}' is empty"
    if arr.size == 0:
        return None
    arr = arr.astype(np.float64)
    lo, hi = float(arr.min()), float(arr.max())
    if math.isfinite(lo) and math.isfinite(hi):   # no NaN, no infinity: the bounds suffice
        if low is not None and lo < low:
            return f"'{name}' has a value {lo:.6g} below {low:g}"
        if high is not None and hi > high:
            return f"'{name}' has a value {hi:.6g} above {high:g}"
        if integral and np.any(arr != np.round(arr)):
            return f"'{name}' has values that are not whole numbers (counts)"
        return None
    nan = np.isnan(arr)
    if finite and not nan_ok and nan.any():
        return f"'{name}' has NaN values"
    if finite and np.isinf(arr).any():
        return f"'{name}' has infinite values"
    real = arr[~nan]
    if low is not None and real.size and real.min() < low:
        return f"'{name}' has a value {real.min():.6g} below {low:g}"
    if high is not None and real.size and real.max() > high:
        return f"'{name}' has a value {real.max():.6g} above {high:g}"
    if integral and real.size and np.any(real != np.round(real)):
        return f"'{name}' has values that are not whole numbers (counts)"
    return None


def read_array(rd: RecordDict, record: str, key: str, *, dtype: str | None = None,
               kind: str | None = None, shape: tuple[int, ...] | None = None,
               ndim: int | None = None, **value_rules: Any
               ) -> tuple[np.ndarray | None, str | None]:
    """The array ``record.key`` of reply ``rd`` and ``None``, or ``(None, reason)``.

    Parameters
    ----------
    dtype : str, optional
        Exact dtype (``"float32"``, ``"uint8"``).
    kind : str, optional
        Allowed dtype kinds (:data:`FLOAT`, :data:`INTEGER`).
    shape : tuple, optional
        Exact shape.
    ndim : int, optional
        Number of axes (when the length is free).
    **value_rules
        Passed to :func:`values_problem` (``finite`` defaults to True for float arrays).
    """
    rec = rd.get(record)
    if not isinstance(rec, ArrayRecord):
        return None, f"missing array record '{record}'"
    if key not in rec:
        return None, f"'{record}' lacks array '{key}'"
    try:
        arr = npy.from_array(rec[key])
    except Exception as exc:  # bytes that are no array
        return None, f"'{record}.{key}' is not a readable array ({type(exc).__name__})"
    name = f"{record}.{key}"
    if dtype is not None and arr.dtype != np.dtype(dtype):
        return None, f"'{name}' has dtype {arr.dtype}, expected {dtype}"
    if kind is not None and arr.dtype.kind not in kind:
        return None, f"'{name}' has dtype {arr.dtype}, expected {_kind_name(kind)}"
    if shape is not None and tuple(arr.shape) != tuple(shape):
        return None, f"'{name}' has shape {tuple(arr.shape)}, expected {tuple(shape)}"
    if ndim is not None and arr.ndim != ndim:
        return None, f"'{name}' has {arr.ndim} axes (shape {tuple(arr.shape)}), expected {ndim}"
    problem = values_problem(name, arr, **value_rules)
    return (None, problem) if problem else (arr, None)


def array_problem(rd: RecordDict, record: str, key: str, **rules: Any) -> str | None:
    """:func:`read_array` when only the verdict matters."""
    return read_array(rd, record, key, **rules)[1]


def arrays_exactly(rd: RecordDict, record: str, shapes: Mapping[str, tuple[int, ...]], *,
                   dtype: str | None = None, kind: str | None = FLOAT) -> str | None:
    """Array record ``record`` holds exactly the arrays ``shapes`` names (no more, no fewer),
    each of its shape, finite (models: every layer of the declared network)."""
    if record not in rd.array_records:
        return f"missing array record '{record}'"
    keys = set(rd.array_records[record])
    if keys != set(shapes):
        names = sorted(shapes)
        want = (f"the {len(names)} arrays {names}" if len(names) <= 6 else
                f"the {len(names)} arrays {names[0]!r}…{names[-1]!r}")
        return f"'{record}' has {len(keys)} arrays {sorted(keys)[:6]}, expected {want}"
    for key, shape in shapes.items():
        problem = array_problem(rd, record, key, dtype=dtype, kind=None if dtype else kind,
                                shape=tuple(shape))
        if problem:
            return problem
    return None


def metric_problem(rd: RecordDict, name: str, kind: type = float, low: float | None = None,
                   high: float | None = None, record: str = "metrics") -> str | None:
    """MetricRecord ``record`` has ``name``: an ``int`` (``kind=int``) or a finite number
    (``kind=float``), inside ``[low, high]`` when given."""
    rec = rd.get(record)
    if not isinstance(rec, MetricRecord):
        return f"missing metric record '{record}'"
    if name not in rec:
        return f"'{record}' lacks '{name}'"
    value = rec[name]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"'{record}.{name}' = {_short(value)} is not a number"
    if kind is int and not isinstance(value, int):
        return f"'{record}.{name}' = {value!r} is not an int"
    if not math.isfinite(value):
        return f"'{record}.{name}' = {value!r} is not finite"
    if (low is not None and value < low) or (high is not None and value > high):
        return f"'{record}.{name}' = {value!r} is outside [{low}, {high}]"
    return None


def withheld_notice(rd: RecordDict) -> bool:
    """Whether ``rd`` is the privacy guard's notice: no array, metric ``withheld`` = 1."""
    metrics = rd.get("metrics")
    return (isinstance(metrics, MetricRecord) and metrics.get("withheld", 0) == 1
            and not any(isinstance(r, ArrayRecord) for r in rd.values()))


def box_problem(name: str, sums: np.ndarray, weights: np.ndarray, low: np.ndarray,
                high: np.ndarray, rtol: float = 1e-6) -> str | None:
    """Weighted sums inside a box: ``weights[c] · low ≤ sums[c] ≤ weights[c] · high``.

    ``sums[c] / weights[c]`` is a weighted mean of points of the box (FCM's ``WS_c / U_c``), so
    it lies in the box; written without the division, a cluster of weight 0 must have sums 0.
    ``rtol`` (of ``weights[c]`` times the box's largest magnitude) absorbs round-off.
    """
    w = np.asarray(weights, dtype=np.float64)[:, None]
    s = np.asarray(sums, dtype=np.float64)
    lo, hi = np.asarray(low, dtype=np.float64), np.asarray(high, dtype=np.float64)
    tol = rtol * w * max(1.0, float(np.max(np.abs(np.concatenate([lo, hi]))))) + 1e-300
    out = (s < w * lo - tol) | (s > w * hi + tol)
    if not out.any():
        return None
    c, j = (int(i) for i in np.argwhere(out)[0])
    ratio = s[c, j] / w[c, 0] if w[c, 0] > 0 else float("inf")
    return (f"'{name}' row {c}, feature {j}: the weighted mean {ratio:.6g} lies outside the "
            f"federated box [{lo[j]:.6g}, {hi[j]:.6g}] (sums of points inside the box cannot "
            f"leave it)")


def total_problem(name: str, total: float, low: float, high: float, why: str,
                  rtol: float = 1e-6) -> str | None:
    """``low ≤ total ≤ high`` up to ``rtol`` (of ``high``): an identity or bound that honest
    statistics satisfy (``why`` says which)."""
    tol = rtol * max(1.0, abs(high))
    if math.isfinite(total) and low - tol <= total <= high + tol:
        return None
    span = f"{low:.6g}" if low == high else f"[{low:.6g}, {high:.6g}]"
    return f"'{name}' totals {total:.6g}, expected {span} ({why})"


# ------------------------------------------------------------------ across nodes

#: how far beyond the other nodes' bounds a node's bounds may reach, in typical spans
SPAN_FACTOR = 1e3
#: how many decades a node's count or size may lie above the other nodes' median
COUNT_DECADES = 6.0


def beyond_others(low: Mapping[int, np.ndarray], high: Mapping[int, np.ndarray], name: str,
                  factor: float = SPAN_FACTOR) -> dict[int, str]:
    """Nodes whose bounds reach far beyond what the other nodes' bounds imply: node → reason.

    A fixed cap (``|x| ≤ 1e150``) lets a node widen the federated box by ±1e140 and squeeze
    every honest node's data into a point. Here each node is judged by the others (leave one
    out, so a liar never judges itself): per feature the median of their lower and upper
    bounds, and the *typical span* — the largest of their median span, the gap between those
    medians, the range of their midpoints (sites whose data sit apart) and 1e-9 of their
    magnitude (for a feature every other node holds at one value, the typical span of their
    other features). A node whose bound lies more than ``factor``
    typical spans outside the medians is refused. Honest data do spread (a site with larger
    values, an outlier row); a bound a thousand spans away squeezes every other node's data
    into a thousandth of the box, and is named rather than believed. Nodes without rows
    (``±inf`` bounds) neither judge nor are judged; with one node there is nobody to judge by.
    """
    nodes = [n for n in sorted(low) if np.all(np.isfinite(low[n]))
             and np.all(np.isfinite(high[n]))]
    if len(nodes) < 2:
        return {}
    lo = np.array([np.asarray(low[n], dtype=np.float64) for n in nodes])
    hi = np.array([np.asarray(high[n], dtype=np.float64) for n in nodes])
    # every node's view of the others at once (leave_one_out): row i is what the loop "for
    # each node, the others without it" gives, value for value
    m_lo, m_hi = leave_one_out(lo, "median"), leave_one_out(hi, "median")
    mid = (lo + hi) / 2
    unit = np.maximum.reduce([leave_one_out(hi - lo, "median"), m_hi - m_lo,
                              leave_one_out(mid, "max") - leave_one_out(mid, "min"),
                              1e-9 * np.maximum(np.abs(m_lo), np.abs(m_hi))])
    for i in np.flatnonzero(np.any(unit <= 0, axis=1)):
        known = unit[i][unit[i] > 0]
        unit[i] = np.where(unit[i] > 0, unit[i], float(np.median(known)) if known.size else 1.0)
    over = np.maximum((m_lo - lo) / unit, (hi - m_hi) / unit)
    worst = np.argmax(over, axis=1)
    out: dict[int, str] = {}
    for i in np.flatnonzero(over[np.arange(len(nodes)), worst] > factor):
        nid, j = nodes[i], int(worst[i])
        value = lo[i, j] if m_lo[i, j] - lo[i, j] >= hi[i, j] - m_hi[i, j] else hi[i, j]
        out[nid] = (f"'{name}' of feature {j} reaches {value:.6g}, {over[i, j]:.3g} typical "
                    f"spans beyond the other nodes' bounds [{m_lo[i, j]:.6g}, "
                    f"{m_hi[i, j]:.6g}] (typical span {unit[i, j]:.3g}); more than {factor:g} "
                    f"is not the spread of honest data, and would squeeze every other node's "
                    f"data into a sliver of the federated box")
    return out


def leave_one_out(a: np.ndarray, stat: str) -> np.ndarray:
    """``out[i] = np.<stat>(np.delete(a, i, axis=0), axis=0)`` for every row ``i`` of ``a``
    (``stat``: ``"median"``, ``"max"`` or ``"min"``; at least 2 rows, no NaN), from one sort
    per column instead of one reduction per row: O(n log n), not O(n²), for n nodes. The
    median of an even count is the mean of the two middle values, as numpy's."""
    a = np.asarray(a, dtype=np.float64)
    flat = a.reshape(a.shape[0], -1)
    n = flat.shape[0]
    order = np.argsort(flat, axis=0, kind="stable")
    srt = np.take_along_axis(flat, order, axis=0)
    rank = np.empty_like(order)
    np.put_along_axis(rank, order, np.broadcast_to(np.arange(n)[:, None], order.shape), axis=0)
    if stat == "max":
        out = np.where(rank == n - 1, srt[n - 2], srt[n - 1])
    elif stat == "min":
        out = np.where(rank == 0, srt[1], srt[0])
    elif stat == "median":
        # the k-th of the others is the k-th of all below a node's rank, the (k+1)-th above it
        k1, k2 = (n - 2) // 2, (n - 1) // 2
        v1 = np.take_along_axis(srt, k1 + (k1 >= rank), axis=0)
        v2 = np.take_along_axis(srt, k2 + (k2 >= rank), axis=0)
        out = v1 if k1 == k2 else (v1 + v2) / 2
    else:
        raise ValueError(f"leave_one_out: stat {stat!r} is not median, max or min")
    return out.reshape(a.shape)


def above_others(values: Mapping[int, float], name: str, decades: float = COUNT_DECADES
                 ) -> dict[int, str]:
    """Nodes whose positive ``values`` (a count, a size, the norm of an update) lie more than
    ``decades`` orders of magnitude above the median of the other nodes' (leave one out):
    node → reason. Values of 0 neither judge nor are judged; with one node there is nobody to
    judge by. Only the upper side is refused: a node with far less data or a smaller update
    weighs less, not more."""
    logs = {n: math.log10(v) for n, v in values.items() if v > 0 and math.isfinite(v)}
    out: dict[int, str] = {}
    if len(logs) < 2:
        return out
    refs = leave_one_out(np.array(list(logs.values())), "median")
    for (nid, lv), ref in zip(logs.items(), refs.tolist(), strict=True):
        if lv - ref > decades:
            out[nid] = (f"'{name}' = {values[nid]:.6g} is {lv - ref:.3g} orders of magnitude "
                        f"above the other nodes' median {10 ** ref:.6g}; more than {decades:g} "
                        f"is not the spread of honest nodes")
    return out


#: the most characters of a node's own text (an error reason) that are logged or stored
NODE_TEXT_LIMIT = 300
_ESCAPES = re.compile(r"\x1b(\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(\x07|\x1b\\)?|[@-Z\\-_])")


def node_text(text: object, limit: int = NODE_TEXT_LIMIT) -> str:
    """Text a node sent (an error reason, a label), as the server may log or store it: quoted,
    terminal escape sequences removed, every other control or format character (newline,
    carriage return, bidirectional overrides …) a blank, cut to ``limit`` characters.

    A node's words then stay one quoted field of the server's line: it cannot start a line of
    its own (forging, say, a ``fedclust INFO done …`` line), colour the terminal, or fill the
    log. Every reason a node gives enters the server through this function
    (:func:`strategies.common.send_and_collect` and the SecAgg+ driver).
    """
    raw = _ESCAPES.sub("", str(text))
    clean = " ".join("".join(ch if unicodedata.category(ch)[0] != "C" else " "
                             for ch in raw).split())
    if len(clean) > limit:
        clean = f"{clean[:limit]}… ({len(clean) - limit} more characters)"
    return json.dumps(clean, ensure_ascii=False)


def _kind_name(kind: str) -> str:
    return {FLOAT: "a float dtype", INTEGER: "an integer dtype"}.get(kind, f"kind {kind!r}")


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
