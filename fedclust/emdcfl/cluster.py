"""From pairwise distances to clusters, and cluster-wise FedAvg (paper 001, §3, Alg. 1).

- Edge rule (additive, as in the authors' code): client ``c`` accepts ``o`` when
  ``W(train_c, val_o) − W(train_c, val_c) < ε``; the adjacency is the AND of both directions
  (each client can refuse unilaterally) and the diagonal is True (a self-loop).
- ε from the run's own excesses (``emdcfl.epsilon="auto"``, :func:`auto_epsilon`): where the
  pair excesses (the larger of a pair's two directions, which the AND rule decides on) show
  their clearest gap above the near-zero mode of same-distribution pairs, never above the
  clients' own reference distances ``W(train_c, val_c)``; with no gap, those references tell
  "all alike" from "all different", and a run that cannot tell keeps every client alone.
- Clusters: clients with **identical closed neighbourhoods** share a cluster, numbered in order
  of first appearance (the authors' ``cluster_neighborhoods``; not connected components).
- Aggregation: FedAvg inside each cluster weighted by training-set sizes.
- Partial participation: clients that have not taken part yet stay singletons.
- Reclustering: a cluster whose member set did not change keeps its model; a new or changed
  cluster starts from the FedAvg of its members' latest local models.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

#: ε never exceeds this many times the clients' median own reference ``W(train_c, val_c)``:
#: a peer whose validation data lie farther from ``c``'s training data than ``c``'s own
#: validation data do, by more than that distance itself, is not "the same distribution"
AUTO_CAP = 1.0
#: a gap is clear when it is at least this many times the spread of the pair excesses below it
AUTO_CLEAR = 1.5
#: the spread below a gap is at least this share of the median reference (a handful of pairs
#: at the bottom do not make every gap above them look clear)
AUTO_FLOOR = 0.2


@dataclass(frozen=True)
class EpsilonChoice:
    """How ε was set (``emdcfl.epsilon``: a number, or ``"auto"``: :func:`auto_epsilon`).

    Attributes
    ----------
    epsilon : float or None
        The ε of the AND rule; None: no ε could be read from the excesses, and no client
        is joined to another (``rule="no-gap"``).
    rule : str
        ``"given"`` (a number was passed), ``"gap"`` (the middle of the clearest gap),
        ``"all-alike"`` (no gap, every pair excess below the cap: one cluster),
        ``"all-different"`` (every pair excess at or above the cap: singletons),
        ``"no-gap"`` (no clear gap, pairs on both sides of the cap: cannot tell) or
        ``"no-pairs"`` (no pair measured).
    gap : (float, float) or None
        The largest pair excess below the chosen ε and the smallest above it (above the cap:
        a lower bound of it when the lazy step did not need its exact value).
    clearness : float or None
        The gap's width over the spread of the pair excesses below it.
    cap, scale : float
        The largest ε considered, and the median reference ``W(train_c, val_c)`` it is a
        multiple of (NaN for ``"given"``).
    pairs : int
        Client pairs whose excesses the rule read (both directions measured).
    warning : str or None
        Label-free text for the log and ``summary.json`` (``"no-gap"``).
    """

    epsilon: float | None
    rule: str
    gap: tuple[float, float] | None = None
    clearness: float | None = None
    cap: float = float("nan")
    scale: float = float("nan")
    pairs: int = 0
    warning: str | None = None

    def record(self) -> dict[str, Any]:
        """The choice as ``history.jsonl`` and ``summary.json`` hold it."""
        return {"epsilon": self.epsilon, "epsilon_rule": self.rule,
                "epsilon_gap": list(self.gap) if self.gap is not None else None,
                "epsilon_gap_clearness": self.clearness, "epsilon_cap": self.cap,
                "reference_median": self.scale, "epsilon_pairs": self.pairs}


def auto_epsilon(low: NDArray, exact: NDArray, scale: float
                 ) -> tuple[EpsilonChoice | None, NDArray[np.bool_]]:
    r"""ε from the run's excesses, or the directions still to solve before it is known.

    A pair ``{c, o}`` is decided by its pair excess ``x = max(E[c, o], E[o, c])`` (the AND
    rule). Let ``s`` be the median reference ``W(train_c, val_c)`` and ``L = AUTO_CAP · s``,
    the largest ε considered. Sorted, the pair excesses below ``L`` are
    ``y_1 ≤ … ≤ y_k``, and ``y_{k+1}`` is the smallest at or above ``L`` (∞ if none). Gap
    ``i`` lies between ``y_i`` and ``y_{i+1}`` (``i ≤ k``); its clearness is

    .. math:: \frac{y_{i+1} - y_i}{\max(y_i - \min(y_1, 0),\ \text{AUTO\_FLOOR}\cdot s)},

    its width over the spread of what lies below it, measured from zero (same-distribution
    excesses scatter around zero) or from the lowest excess when that is negative. Only gaps
    that end above zero are candidates. The clearest, when its clearness reaches
    ``AUTO_CLEAR``, gives ``ε = max((y_i + y_{i+1})/2, 0)``.
    Without a clear gap: every pair below ``L`` → all alike (``ε = L``, one cluster); none
    below → all different (``ε = L``, singletons); both → no ε (every client alone, with a
    warning).

    Parameters
    ----------
    low : (n, n) array
        Directed excesses ``E[c, o]``: the exact value where ``exact``, else a lower bound
        (from the dual bound of ``W``); NaN where the direction was not measured (its pair is
        left out).
    exact : (n, n) bool array
    scale : float
        The median reference ``s``.

    Returns
    -------
    choice : EpsilonChoice or None
        None while directions must still be solved.
    need : (n, n) bool array
        The directions to solve first (all False once ``choice`` is known). ε, the rule and
        the clusters only depend on the pair excesses below ``L`` and on whether any pair
        lies above, so a caller that solves exactly these gets the choice of the full matrix.
    """
    low = np.asarray(low, dtype=np.float64)
    exact = np.asarray(exact, dtype=bool)
    n = len(low)
    iu, ju = np.triu_indices(n, 1)
    a, b = low[iu, ju], low[ju, iu]
    measured = np.isfinite(a) & np.isfinite(b)
    i, j, a, b = iu[measured], ju[measured], a[measured], b[measured]
    x = np.maximum(a, b)                              # the pair excess, or a lower bound of it
    known = exact[i, j] & exact[j, i]
    need = np.zeros((n, n), dtype=bool)
    if len(x) == 0:                                   # no pair measured: nothing to join
        return EpsilonChoice(None, "no-pairs"), need
    cap = AUTO_CAP * scale
    # every pair that may lie below the cap, exactly; the pairs above need no exact value
    vague = ~known & (x < cap)
    if vague.any():
        for p, q in ((i[vague], j[vague]), (j[vague], i[vague])):
            need[p, q] = ~exact[p, q]
        return None, need
    below = np.sort(x[x < cap])
    above = x[x >= cap]
    common = {"cap": float(cap), "scale": float(scale), "pairs": int(len(x))}
    if len(below) == 0:
        return EpsilonChoice(float(cap), "all-different", None, None, **common), need
    # the gap above the last excess below the cap reaches at least the cap
    ys = np.append(below, cap) if len(above) else below
    gaps = np.diff(ys)
    spread = np.maximum(below[:len(gaps)] - min(below[0], 0.0), AUTO_FLOOR * scale)
    # a gap among negative excesses (all within the same-distribution noise) is no candidate
    clear = np.where(ys[1:] > 0, gaps / spread, -np.inf)
    best = int(np.argmax(clear)) if len(clear) else -1
    if best >= 0 and clear[best] >= AUTO_CLEAR:
        lo, hi = float(ys[best]), float(ys[best + 1])
        seen = hi if best + 1 < len(below) else float(above.min())
        return EpsilonChoice(max((lo + hi) / 2, 0.0), "gap", (lo, seen), float(clear[best]),
                             **common), need
    clearness = float(clear[best]) if best >= 0 and np.isfinite(clear[best]) else None
    if len(above) == 0:
        return EpsilonChoice(float(cap), "all-alike", None, clearness, **common), need
    said = "none" if clearness is None else f"{clearness:.2f}"
    warning = (f"emdcfl.epsilon=auto found no clear gap in the excesses of {len(x)} client "
               f"pairs (clearest {said}, needs {AUTO_CLEAR:g}): "
               f"{len(below)} pairs lie below the cap {cap:.4g} ({AUTO_CAP:g} x the median "
               f"reference W(train, val) {scale:.4g}) and {len(above)} above it, so it "
               f"cannot tell similar clients from different ones; every client stays alone. "
               f"Pass a number as emdcfl.epsilon to join clients whose excess lies below it")
    return EpsilonChoice(None, "no-gap", None, clearness, warning=warning, **common), need


def threshold_adjacency(excess: NDArray, epsilon: float | None) -> NDArray[np.bool_]:
    """Symmetric adjacency from ``excess[c, o] = W(train_c, val_o) − W(train_c, val_c)``.

    ``A[c, o] = (excess[c, o] < ε) AND (excess[o, c] < ε)``; ``A[c, c] = True``.
    NaN entries (pairs not measured) are no edge; ``epsilon=None`` joins no pair.
    """
    e = np.asarray(excess, dtype=np.float64)
    if epsilon is None:
        return np.eye(len(e), dtype=bool)
    if epsilon < 0:
        raise ValueError(f"epsilon must be >= 0, got {epsilon}")
    directed = np.where(np.isnan(e), False, e < epsilon)
    adj = directed & directed.T
    np.fill_diagonal(adj, True)
    return adj


def neighbourhood_clusters(adjacency: NDArray) -> NDArray[np.int64]:
    """Cluster id per client: equal closed neighbourhoods ⇒ equal id (first appearance order)."""
    adj = np.asarray(adjacency, dtype=bool)
    adj = adj | np.eye(len(adj), dtype=bool)
    ids: dict[bytes, int] = {}
    labels = np.empty(len(adj), dtype=np.int64)
    for i, row in enumerate(adj):
        labels[i] = ids.setdefault(np.packbits(row).tobytes(), len(ids))
    return labels


def weighted_average(weights: Sequence[Sequence[NDArray]], counts: Sequence[float]
                     ) -> list[NDArray]:
    """FedAvg: ``Σ n_i w_i / Σ n_i`` layer by layer."""
    n = np.asarray(counts, dtype=np.float64)
    if len(weights) == 0 or n.sum() <= 0:
        raise ValueError("nothing to average")
    coef = n / n.sum()
    return [np.tensordot(coef, np.stack([w[j] for w in weights]), axes=1).astype(np.float32)
            for j in range(len(weights[0]))]


def cluster_fedavg(labels: Mapping[int, int], models: Mapping[int, Sequence[NDArray]],
                   counts: Mapping[int, float]) -> dict[int, list[NDArray]]:
    """One model per cluster id from the members' models (clients without a model skipped)."""
    out: dict[int, list[NDArray]] = {}
    for k in sorted(set(labels.values())):
        members = [c for c, lab in labels.items() if lab == k and c in models]
        if members:
            out[k] = weighted_average([models[c] for c in members], [counts[c] for c in members])
    return out


class Participation:
    """Partial-participation bookkeeping (the authors' ``fit_emdcfl_partial``).

    Each round ``per_round`` clients are sampled without replacement; clustering is recomputed
    among all clients that have taken part so far; the others stay singletons.
    """

    def __init__(self, clients: Sequence[int], per_round: int, seed: int) -> None:
        self.clients = list(clients)
        if not 1 <= per_round <= len(self.clients):
            raise ValueError(f"clients per round must be in [1, {len(self.clients)}], "
                             f"got {per_round}")
        self.per_round = per_round
        self.rng = np.random.default_rng(seed)
        self.seen: list[int] = []

    def sample(self) -> tuple[list[int], bool]:
        """This round's clients and whether the participated set grew."""
        # choose positions, not ids: Flower node ids can exceed int64 (numpy would round them)
        pos = self.rng.choice(len(self.clients), self.per_round, replace=False)
        picked = sorted(self.clients[int(i)] for i in pos)
        new = [c for c in picked if c not in self.seen]
        self.seen = sorted(set(self.seen) | set(picked))
        return picked, bool(new)

    def labels(self, clustered: Mapping[int, int]) -> dict[int, int]:
        """Cluster id for every client: ``clustered`` ids for the seen, fresh singletons after."""
        out = dict(clustered)
        nxt = max(out.values(), default=-1) + 1
        for c in self.clients:
            if c not in out:
                out[c], nxt = nxt, nxt + 1
        return out


def members_of(labels: Mapping[int, int]) -> dict[int, frozenset[int]]:
    """Cluster id → its member set."""
    out: dict[int, set[int]] = {}
    for c, k in labels.items():
        out.setdefault(k, set()).add(c)
    return {k: frozenset(v) for k, v in out.items()}


def recluster_models(old_labels: Mapping[int, int], old_models: Mapping[int, Sequence[NDArray]],
                     new_labels: Mapping[int, int], latest: Mapping[int, Sequence[NDArray]],
                     counts: Mapping[int, float], default: Sequence[NDArray]
                     ) -> tuple[dict[int, list[NDArray]], int]:
    """Cluster models after a new clustering, and how many were kept.

    A new cluster with exactly the members of an old one keeps that cluster's model
    (``old_models``, already updated with this round's training); any other cluster gets the
    FedAvg of its members' ``latest`` local models (possibly from earlier rounds), or
    ``default`` when none of its members has trained yet.
    """
    old_sets = {members: k for k, members in members_of(old_labels).items()}
    out: dict[int, list[NDArray]] = {}
    kept = 0
    for k, members in members_of(new_labels).items():
        if members in old_sets and old_sets[members] in old_models:
            out[k] = list(old_models[old_sets[members]])
            kept += 1
            continue
        trained = sorted(c for c in members if c in latest)
        out[k] = (weighted_average([latest[c] for c in trained], [counts[c] for c in trained])
                  if trained else list(default))
    return out, kept
