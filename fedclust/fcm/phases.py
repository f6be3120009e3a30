"""What the two FCM-family loops share, without Flower: the replies of one phase, the federated
scaling phase (phase 0), the final phase's statistics, the evaluation tables, and the messages
that explain a phase nobody answered.

Exact FCM (:mod:`fedclust.fcm.loop`) and FedFCM (:mod:`fedclust.fedfcm.loop`) both start with
phase 0: every client sends per-feature statistics of its rows — min/max, or for standard
scaling count, mean and centred sum of squares (:mod:`fedclust.data.scaling`) — and, in plain
runs, its row count ``N``. The server combines them into one ``(shift, scale)`` that every
client applies, and into the federated bounds ``[low, high]`` of the scaled rows (the *box*):
the initial centers are drawn in it, and every later statistic is checked against it.

Clients are opaque hashable ids (node ids in a Flower run); a loop names one in a message with
its ``Clients.name``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

import numpy as np
from numpy.typing import NDArray

from fedclust.data import scaling
from fedclust.fcm.keys import FamilySettings
from fedclust.metrics import ari_from_contingency

LOG = logging.getLogger("fedclust")

Client = Hashable
T = TypeVar("T")
#: how a message names a client (``"node 1002 (site-b)"``)
Namer = Callable[[Client], str]


@dataclass
class Replies(Generic[T]):
    """What one phase brought back.

    Attributes
    ----------
    got : dict
        The usable statistics of every client that sent some, in client order (sums over
        clients are taken in this order, whatever the order of arrival).
    withheld : list
        The clients that answered with the privacy guard's notice (nothing of their rows).
    failed : dict
        Client -> why it brought nothing usable: no reply, an error reply, or a reply the
        server's checks refused (``"rejected reply: …"``).
    excluded : dict
        The part of ``failed`` whose reply the server's checks refused.
    seconds, bytes_sent, bytes_received
        The phase's wall time and payload traffic.
    """

    got: dict[Client, T] = field(default_factory=dict)
    withheld: list[Client] = field(default_factory=list)
    failed: dict[Client, str] = field(default_factory=dict)
    excluded: dict[Client, str] = field(default_factory=dict)
    seconds: float = 0.0
    bytes_sent: int = 0
    bytes_received: int = 0

    @property
    def answered(self) -> set[Client]:
        """The clients that answered usably: with statistics or the guard's notice."""
        return set(self.got) | set(self.withheld)


@dataclass(frozen=True)
class Box:
    """The federated bounds in the scaled space (the initial-center box)."""

    low: np.ndarray
    high: np.ndarray

    @property
    def diameter2(self) -> float:
        """Squared diagonal ``D²``: no two points of the box are farther apart."""
        return float(np.sum((np.asarray(self.high) - np.asarray(self.low)) ** 2))


# ------------------------------------------------------------------------------ phase 0

@dataclass
class NodeStats:
    """One client's answer to the scaling phase.

    Attributes
    ----------
    stats : ColumnStats
        Bounds (and, for standard scaling, count, mean and M2) of its rows.
    rows : int or None
        The row count ``N`` it declared (None: hidden, SecAgg+ with minmax or no scaling).
    codes : array of int, or None
        Its label codes (SecAgg+ evaluation path: the rows of the summed table).
    """

    stats: scaling.ColumnStats
    rows: int | None = None
    codes: NDArray[np.int64] | None = None


@dataclass
class Scaling:
    """The outcome of phase 0.

    Attributes
    ----------
    shift, scale : arrays (F,)
        Every client's rows become ``(x − shift) / scale``.
    low, high : arrays (F,)
        The federated bounds in the scaled space (initial-center box).
    phase : Replies
        The scaling phase's replies (failures, traffic).
    eval_codes : array of int
        The union of the label codes the clients reported (SecAgg+ evaluation path).
    withheld : int
        Clients the privacy guard kept silent.
    rows : dict
        The row count each speaking client declared (none under SecAgg+ with minmax or no
        scaling, where ``N`` stays hidden).
    eval_nodes : set
        The clients that reported label codes.
    """

    shift: np.ndarray
    scale: np.ndarray
    low: np.ndarray
    high: np.ndarray
    phase: Replies[NodeStats]
    eval_codes: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    withheld: int = 0
    rows: dict[Client, int] = field(default_factory=dict)
    eval_nodes: set[Client] = field(default_factory=set)

    @property
    def box(self) -> Box:
        return Box(self.low, self.high)

    @property
    def n_features(self) -> int:
        return int(self.low.size)


def federate_scaling(phase: Replies[NodeStats], s: FamilySettings, name: Namer) -> Scaling:
    """Phase 0, server side: the scaling and the box from the clients' statistics.

    Raises
    ------
    RuntimeError
        No client sent statistics (naming why), or the statistics hold no row.
    ConfigError
        More clusters than the speaking clients' rows (:func:`check_pooled_rows`).
    """
    speaking = phase.got
    withheld = len(phase.withheld)
    if not speaking:
        raise RuntimeError(no_statistic_message(s, "the scaling phase", withheld, phase, name))
    rows = {c: st.rows for c, st in speaking.items() if st.rows is not None}
    check_pooled_rows(s, rows, len(speaking), withheld)
    stats = [st.stats for st in speaking.values()]
    for feature, client, ratio in dominated_features(list(speaking), stats):
        LOG.warning("[scaling] feature %d: node %s alone spans %.3g times the range of every "
                    "other client together; with %s scaling the other clients' values of this "
                    "feature are squeezed into a sliver. Check that node's data for an outlier "
                    "or another unit%s", feature, client, ratio, s.scaling,
                    ", or use scaling=standard" if s.scaling == "minmax" else "")
    codes = [st.codes for st in speaking.values() if st.codes is not None]
    eval_codes = (np.unique(np.concatenate(codes)).astype(np.int64) if codes
                  else np.zeros(0, dtype=np.int64))
    shift, scale, low, high = combine_scaling(stats, s.scaling)
    if all(np.all(np.isfinite(a)) for a in (low, high)) and np.all(high == low):
        from fedclust.config import ConfigError

        raise ConfigError(
            f"{s.method}: every row of the {len(speaking)} node(s) that sent statistics is the "
            f"same point (every feature constant: the federated bounds have no width), so "
            f"{s.clusters} clusters cannot be told apart (several centers on one point, an "
            f"objective of about 0 reported as convergence). Allowed: data with at least "
            f"{s.clusters} distinct rows. Fix: check the nodes' data (a constant table, the "
            f"wrong columns), then run again")
    if not all(np.all(np.isfinite(a)) for a in (shift, scale, low, high)):
        raise RuntimeError(
            f"{s.method}: the {len(speaking)} node(s) that sent statistics in the scaling "
            f"phase hold no row between them (every one sent the bounds of an empty table), so "
            f"there is nothing to cluster. Fix: check the nodes' data (data-path, the "
            f"partition of each node), then run again.")
    return Scaling(shift, scale, low, high, phase, eval_codes, withheld, rows,
                   {c for c, st in speaking.items() if st.codes is not None})


def combine_scaling(stats: list[scaling.ColumnStats], kind: str
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The server's side of the scaling phase: ``(shift, scale)`` from the clients' statistics
    and the federated bounds ``(low, high)`` in the scaled space."""
    total = scaling.combine(stats) if kind == "standard" else scaling.ColumnStats(
        0, np.min([s.min for s in stats], axis=0), np.max([s.max for s in stats], axis=0),
        np.zeros_like(stats[0].min), np.zeros_like(stats[0].min))
    shift, scale = scaling.scaler(total, kind)
    return shift, scale, (total.min - shift) / scale, (total.max - shift) / scale


def dominated_features(clients: list[Client], stats: list[scaling.ColumnStats],
                       factor: float = 100.0) -> list[tuple[int, Client, float]]:
    """``(feature, client, ratio)`` where one client's values stretch the federated range of a
    feature more than ``factor`` times the range of all other clients together."""
    if len(stats) < 2:
        return []
    lo, hi = np.array([s.min for s in stats]), np.array([s.max for s in stats])
    # every client's "all the others" at once: the largest and smallest bound without it
    # (the second largest where it holds the largest), not one pass over the others per client
    n = len(stats)
    top = np.argsort(hi, axis=0, kind="stable")[-2:]        # second largest, largest
    bottom = np.argsort(lo, axis=0, kind="stable")[:2]      # smallest, second smallest
    cols = np.arange(hi.shape[1])
    rows = np.arange(n)[:, None]
    hi_rest = np.where(rows == top[1], hi[top[0], cols], hi[top[1], cols])
    lo_rest = np.where(rows == bottom[0], lo[bottom[1], cols], lo[bottom[0], cols])
    rest = hi_rest - lo_rest
    full = hi.max(axis=0) - lo.min(axis=0)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(rest > 0, full / rest, np.where(full > 0, np.inf, 1.0))
    out = []
    for i in np.flatnonzero((ratio > factor).any(axis=1)):
        out += [(int(j), clients[i], float(ratio[i, j])) for j in np.flatnonzero(
            ratio[i] > factor)]
    return out


def check_pooled_rows(s: FamilySettings, rows: Mapping[Client, int], speaking: int,
                      withheld: int, pooled: int | None = None) -> None:
    """Refuse more clusters than the clients that sent statistics hold rows, once their row
    counts are known (``rows`` by client, or their secure total ``pooled``; skipped when a
    client's count is not known: SecAgg+ with minmax scaling, before the first round).

    Raises
    ------
    ConfigError
        ``fcm.n-clusters`` (FedFCM: ``fedfcm.k-max``) above the pooled rows.
    """
    from fedclust.config import ConfigError

    if pooled is None and len(rows) < speaking:
        return
    c, key = s.clusters, s.clusters_key
    pooled = sum(rows.values()) if pooled is None else pooled
    if c <= pooled:
        return
    silent = (f" ({withheld} node(s) withheld by the privacy guard are not counted)"
              if withheld else "")
    raise ConfigError(
        f"run config '{key}' = {c}, but the {speaking} node(s) that sent statistics hold "
        f"{pooled} row(s) together{silent}: {c} clusters cannot be fitted to {pooled} row(s). "
        f"Allowed: at most {pooled}. Fix: lower {key}, or add data.")


# ------------------------------------------------------------------- nobody answered

def no_statistic_message(s: FamilySettings, phase: str, withheld: int, replies: Replies,
                         name: Namer) -> str:
    """Why ``phase`` got no statistic, naming the real cause: the privacy guard (only when it
    is on and withheld every answering client), clients that did not answer, or clients whose
    reply the server's checks excluded."""
    if withheld and not replies.failed:
        return guard_message(s, phase)
    excluded = {n: w.removeprefix("rejected reply: ") for n, w in replies.excluded.items()}
    dropped = {n: w for n, w in replies.failed.items() if n not in excluded}
    parts, fixes = [], []
    if withheld:
        parts.append(f"{withheld} withheld by the privacy guard")
        fixes.append("lower the number of clusters or turn the privacy guard off")
    if dropped:
        parts.append(f"{len(dropped)} did not answer or failed ("
                     + "; ".join(f"{name(n)}: {w}" for n, w in sorted(dropped.items()))
                     + ")")
        fixes.append("check the nodes' logs and the run config 'timeout'")
    if excluded:
        parts.append(f"{len(excluded)} excluded by the server's checks ("
                     + "; ".join(f"{name(n)}: {w}" for n, w in sorted(excluded.items()))
                     + ")")
        fixes.append("check the excluded nodes (their data, their fedclust version, whether "
                     "they can be trusted) or remove them")
    fix = "; ".join(fixes) or "start the nodes"
    return (f"{s.method}: no node sent a usable statistic in {phase}: "
            f"{', '.join(parts) or 'no node was asked'}. Fix: {fix}, then run again.")


def guard_message(s: FamilySettings, phase: str) -> str:
    """Why a phase got no statistic: every client was withheld by the privacy guard."""
    c, key, sym = s.clusters, s.clusters_key, s.clusters_symbol
    return (f"{s.method}: no client sent a statistic in {phase}: every answering client "
            f"was withheld by the privacy guard (a client with N <= {sym}(F+1)/F points, "
            f"{sym} = {c} from {key}, F features, sends nothing in any phase; for exact FCM "
            f"this is the rule N <= C(F+1)/F of paper 004). Fix: lower {key}, or set "
            f"{s.guard_key}=false (and check the nodes' logs for dropouts).")


# ---------------------------------------------------------------- final and evaluation

@dataclass
class FinalStats:
    """The final phase: every client's objective share at the final centers and, on the
    evaluation path, its label × cluster table.

    Attributes
    ----------
    objective : float
        ``J = Σ_clients J_m`` (NaN when a secure sum halted).
    phase : Replies
        The phase's replies (failures, traffic); ``got`` holds each client's ``J_m`` when the
        server sees them.
    withheld : int or None
        Clients that sent the privacy guard's notice (None: the server cannot tell, SecAgg+).
    tables : list of (codes, table)
        The evaluation tables: one per client, or the one securely summed table.
    eval_nodes, eval_rows : int
        How many clients and rows the tables rest on.
    covered : list or None
        The clients whose share the objective holds (None: those that sent one, ``phase.got``;
        under SecAgg+ the round's contributors).
    """

    objective: float
    phase: Replies[float]
    withheld: int | None = None
    tables: list[tuple[np.ndarray, np.ndarray]] = field(default_factory=list)
    eval_nodes: int = 0
    eval_rows: int = 0
    covered: list[Client] | None = None

    def objective_clients(self) -> list[Client]:
        """The clients the objective covers."""
        return sorted(self.phase.got if self.covered is None else self.covered)


def summed_contingency(tables: Sequence[tuple[np.ndarray, np.ndarray]]) -> np.ndarray:
    """Add per-client label × cluster tables row by label code.

    Each entry is ``(codes, table)``: row ``i`` of ``table`` counts the client's rows with label
    code ``codes[i]`` (codes are node-independent, :func:`fedclust.data.local.label_codes`), so
    clients holding different label sets still add up correctly.
    """
    if not tables:
        return np.zeros((0, 0), dtype=np.int64)
    vocab = np.unique(np.concatenate([np.asarray(c, dtype=np.int64) for c, _ in tables]))
    cols = max(t.shape[1] for _, t in tables)
    total = np.zeros((len(vocab), cols), dtype=np.int64)
    for codes, t in tables:
        rows = np.searchsorted(vocab, np.asarray(codes, dtype=np.int64))
        total[rows, : t.shape[1]] += t.astype(np.int64)
    return total


def eval_ari(tables: Sequence[tuple[np.ndarray, np.ndarray]]) -> float:
    """The ARI of the summed label × cluster table (NaN without tables)."""
    return ari_from_contingency(summed_contingency(tables)) if tables else float("nan")
