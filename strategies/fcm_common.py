"""Phases shared by the FCM-family server loops: federated scaling and evaluation tables."""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from flwr.app import RecordDict
from flwr.serverapp import Grid

from fedclust.data import scaling
from fedclust.metrics import ari_from_contingency
from strategies.common import (
    Exchange,
    arrays,
    node_name,
    reject,
    require_honest,
    send_and_collect,
)
from strategies.fcm_replies import Box, declared_rows, stats_reply

LOG = logging.getLogger("fedclust")


@dataclass
class Scaling:
    shift: np.ndarray
    scale: np.ndarray
    low: np.ndarray     # federated bounds in the scaled space (initial-center box)
    high: np.ndarray
    exchange: Exchange
    # label codes of a securely summed contingency table's rows (evaluation path): the union of
    # the codes the nodes reported in this phase
    eval_codes: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    withheld: int = 0   # clients the privacy guard kept silent
    # the row count each speaking node declared (plain runs; none under SecAgg+ with
    # minmax/none scaling, where N stays hidden)
    rows: dict[int, int] = field(default_factory=dict)
    # the nodes that reported label codes (SecAgg+ evaluation path)
    eval_nodes: set[int] = field(default_factory=set)

    def record(self) -> Any:
        return arrays(shift=self.shift, scale=self.scale)

    @property
    def box(self) -> Box:
        return Box(self.low, self.high)


def federated_scaling(grid: Grid, nodes: list[int], cfg: dict[str, Any]) -> Scaling:
    """Phase 0: clients send bounds (and, for standard scaling, counts/means/M2)."""
    kind = cfg["scaling"]
    ex = send_and_collect(grid, nodes, RecordDict(), "query.fcm_stats", "scaling",
                          cfg["timeout"], validate=stats_reply(cfg))
    speaking = {nid: c for nid, c in ex.replies.items() if "stats" in c.array_records}
    withheld = len(ex.replies) - len(speaking)
    dims = {nid: _n_features(c) for nid, c in speaking.items()}
    votes = Counter(dims.values()).most_common()
    if len(votes) > 1 and votes[0][1] == votes[1][1]:
        raise RuntimeError(f"the clients disagree on the number of features with no majority "
                           f"(features: clients = {dict(votes)}): check every node's data")
    if votes:
        common = votes[0][0]
        for nid, d in dims.items():
            if reject(ex, nid, None if d == common else
                      f"{d} features where the other clients have {common}", "scaling"):
                del speaking[nid]
    require_honest(ex, "scaling", len(speaking), len(nodes), cfg)
    if not speaking:
        raise RuntimeError(no_statistic_message(cfg, "the scaling phase", withheld, ex))
    rows = {nid: n for nid, c in speaking.items() if (n := declared_rows(c)) is not None}
    check_pooled_rows(cfg, rows, len(speaking), withheld)
    stats = []
    for content in speaking.values():
        rec = content.array_records["stats"]
        if "stats" in rec:
            stats.append(scaling.ColumnStats.from_array(rec["stats"].numpy()))
        else:
            lo, hi = rec["min"].numpy(), rec["max"].numpy()
            stats.append(scaling.ColumnStats(0, lo, hi, np.zeros_like(lo), np.zeros_like(lo)))
    for feature, nid, ratio in dominated_features(list(speaking), stats):
        LOG.warning("[scaling] feature %d: node %s alone spans %.3g times the range of every "
                    "other client together; with %s scaling the other clients' values of this "
                    "feature are squeezed into a sliver. Check that node's data for an outlier "
                    "or another unit%s", feature, nid, ratio, kind,
                    ", or use scaling=standard" if kind == "minmax" else "")
    codes = [c.array_records["eval"]["codes"].numpy() for c in speaking.values()
             if "eval" in c.array_records]
    eval_codes = (np.unique(np.concatenate(codes)).astype(np.int64) if codes
                  else np.zeros(0, dtype=np.int64))
    shift, scale, low, high = combine_scaling(stats, kind)
    if not all(np.all(np.isfinite(a)) for a in (shift, scale, low, high)):
        raise RuntimeError(
            f"{cfg['method']}: the {len(speaking)} node(s) that sent statistics in the scaling "
            f"phase hold no row between them (every one sent the bounds of an empty table), so "
            f"there is nothing to cluster. Fix: check the nodes' data (data-path, the "
            f"partition of each node), then run again.")
    return Scaling(shift, scale, low, high, ex, eval_codes, withheld, rows,
                   {nid for nid, c in speaking.items() if "eval" in c.array_records})


def check_pooled_rows(cfg: dict[str, Any], rows: dict[int, int], speaking: int,
                      withheld: int, pooled: int | None = None) -> None:
    """Refuse more clusters than the nodes that sent statistics hold rows, once their row
    counts are known (``rows`` by node, or their secure total ``pooled``; skipped when a
    node's count is not known: SecAgg+ with minmax scaling, before the first round).

    Raises
    ------
    ConfigError
        ``fcm.n-clusters`` (FedFCM: ``fedfcm.k-max``) above the pooled rows.
    """
    from fedclust.config import ConfigError

    if pooled is None and len(rows) < speaking:
        return
    if cfg["method"] == "fedfcm":
        c, key = int(cfg["fedfcm.k-max"]), "fedfcm.k-max"
    else:
        c, key = int(cfg["fcm.n-clusters"]), "fcm.n-clusters"
    pooled = sum(rows.values()) if pooled is None else pooled
    if c <= pooled:
        return
    silent = (f" ({withheld} node(s) withheld by the privacy guard are not counted)"
              if withheld else "")
    raise ConfigError(
        f"run config '{key}' = {c}, but the {speaking} node(s) that sent statistics hold "
        f"{pooled} row(s) together{silent}: {c} clusters cannot be fitted to {pooled} row(s). "
        f"Allowed: at most {pooled}. Fix: lower {key}, or add data.")


def no_statistic_message(cfg: dict[str, Any], phase: str, withheld: int, ex: Exchange) -> str:
    """Why ``phase`` got no statistic, naming the real cause: the privacy guard (only when it
    is on and withheld every answering node), nodes that did not answer, or nodes whose reply
    the server's checks excluded."""
    if withheld and not ex.failed:
        return guard_message(cfg, phase)
    excluded = {n: w.removeprefix("rejected reply: ") for n, w in ex.excluded.items()}
    dropped = {n: w for n, w in ex.failed.items() if n not in excluded}
    parts, fixes = [], []
    if withheld:
        parts.append(f"{withheld} withheld by the privacy guard")
        fixes.append("lower the number of clusters or turn the privacy guard off")
    if dropped:
        parts.append(f"{len(dropped)} did not answer or failed ("
                     + "; ".join(f"{node_name(n)}: {w}" for n, w in sorted(dropped.items()))
                     + ")")
        fixes.append("check the nodes' logs and the run config 'timeout'")
    if excluded:
        parts.append(f"{len(excluded)} excluded by the server's checks ("
                     + "; ".join(f"{node_name(n)}: {w}" for n, w in sorted(excluded.items()))
                     + ")")
        fixes.append("check the excluded nodes (their data, their fedclust version, whether "
                     "they can be trusted) or remove them")
    fix = "; ".join(fixes) or "start the nodes"
    return (f"{cfg['method']}: no node sent a usable statistic in {phase}: "
            f"{', '.join(parts) or 'no node was asked'}. Fix: {fix}, then run again.")


def guard_message(cfg: dict[str, Any], phase: str) -> str:
    """Why a phase got no statistic: every client was withheld by the privacy guard."""
    if cfg["method"] == "fedfcm":
        c, key, name = cfg["fedfcm.k-max"], "fedfcm.k-max", "K"
    else:
        c, key, name = cfg["fcm.n-clusters"], "fcm.n-clusters", "C"
    guard = "fedfcm.privacy-guard" if cfg["method"] == "fedfcm" else "fcm.privacy-guard"
    return (f"{cfg['method']}: no client sent a statistic in {phase}: every answering client "
            f"was withheld by the privacy guard (a client with N <= {name}(F+1)/F points, "
            f"{name} = {c} from {key}, F features, sends nothing in any phase; for exact FCM "
            f"this is the rule N <= C(F+1)/F of paper 004). Fix: lower {key}, or set "
            f"{guard}=false (and check the nodes' logs for dropouts).")


def dominated_features(nodes: list[int], stats: list[scaling.ColumnStats],
                       factor: float = 100.0) -> list[tuple[int, int, float]]:
    """``(feature, node, ratio)`` where one node's values stretch the federated range of a
    feature more than ``factor`` times the range of all other nodes together."""
    if len(stats) < 2:
        return []
    lo, hi = np.array([s.min for s in stats]), np.array([s.max for s in stats])
    out = []
    for i, nid in enumerate(nodes):
        others = np.arange(len(stats)) != i
        rest = hi[others].max(axis=0) - lo[others].min(axis=0)
        full = hi.max(axis=0) - lo.min(axis=0)
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = np.where(rest > 0, full / rest, np.where(full > 0, np.inf, 1.0))
        out += [(int(j), nid, float(ratio[j])) for j in np.flatnonzero(ratio > factor)]
    return out


def combine_scaling(stats: list[scaling.ColumnStats], kind: str
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The server's side of the scaling phase: ``(shift, scale)`` from the clients' statistics
    and the federated bounds ``(low, high)`` in the scaled space."""
    total = scaling.combine(stats) if kind == "standard" else scaling.ColumnStats(
        0, np.min([s.min for s in stats], axis=0), np.max([s.max for s in stats], axis=0),
        np.zeros_like(stats[0].min), np.zeros_like(stats[0].min))
    shift, scale = scaling.scaler(total, kind)
    return shift, scale, (total.min - shift) / scale, (total.max - shift) / scale


def _n_features(content: RecordDict) -> int:
    rec = content.array_records["stats"]
    return int((rec["stats"] if "stats" in rec else rec["min"]).numpy().shape[-1])


def summed_contingency(tables: list[tuple[np.ndarray, np.ndarray]]) -> np.ndarray:
    """Add per-client label × cluster tables row by label code.

    Each entry is ``(codes, table)``: row ``i`` of ``table`` counts the client's rows with label
    code ``codes[i]`` (codes are node-independent, :func:`fedclust.data.local.label_codes`), so
    nodes holding different label sets still add up correctly.
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


def eval_tables(replies: list[RecordDict], key: str = "contingency"
                ) -> list[tuple[np.ndarray, np.ndarray]]:
    """``(codes, table)`` of every reply that carries an evaluation record."""
    return [(r.array_records["eval"]["codes"].numpy(), r.array_records["eval"][key].numpy())
            for r in replies if "eval" in r.array_records]


def eval_ari(tables: list[tuple[np.ndarray, np.ndarray]]) -> float:
    return ari_from_contingency(summed_contingency(tables)) if tables else float("nan")
