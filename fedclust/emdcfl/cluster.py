"""From pairwise distances to clusters, and cluster-wise FedAvg (paper 001, §3, Alg. 1).

- Edge rule (additive, as in the authors' code): client ``c`` accepts ``o`` when
  ``W(train_c, val_o) − W(train_c, val_c) < ε``; the adjacency is the AND of both directions
  (each client can refuse unilaterally) and the diagonal is True (a self-loop).
- ε from the run's own excesses (``emdcfl.epsilon="auto"``, :func:`auto_epsilon`): where the
  pair excesses (the larger of a pair's two directions, which the AND rule decides on) show
  their clearest gap above the near-zero mode of same-distribution pairs, measured in their
  own spread and never above twice the clients' own reference distances
  ``W(train_c, val_c)``; with no gap, those references tell "all alike" from "all
  different", and a run that cannot tell keeps every client alone.
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

# The automatic ε (:func:`auto_epsilon`), in units of the clients' median own reference
# ``s = W(train_c, val_c)`` (the noise floor of a comparison) and of the spread of the
# excesses below a gap; chosen on the tuning seeds 100-104 (docs/reports/emdcfl-experiments.md).
#: ε is looked for below this many times ``s``
AUTO_CAP = 2.0
#: no gap, and every pair excess below this many times ``s``: the clients are alike
AUTO_ALIKE = 1.0
#: a gap is clear when it is at least this many standard deviations of the excesses below it
#: (both directions of the pairs below it) wide
AUTO_CLEAR = 4.0
#: ... a standard deviation of at least this share of ``s`` (a few pairs below a gap do not
#: make it look clear)
AUTO_FLOOR = 0.1
#: ... and those excesses are the near-zero mode of same-distribution pairs: their mean is at
#: most this many of their standard deviations above zero
AUTO_CENTER = 1.0


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
        ``"all-alike"`` (no gap, every pair excess below the median reference: one
        cluster), ``"all-different"`` (no gap, none below it: singletons), ``"no-gap"`` (no
        clear gap, pairs on both sides: cannot tell) or ``"no-pairs"`` (no pair measured).
    gap : (float, float) or None
        The largest pair excess below the chosen ε and the smallest above it (above the cap:
        a lower bound of it when the lazy step did not need its exact value).
    clearness : float or None
        The clearest admissible gap's width in standard deviations of the excesses below it
        (both directions of the pairs below it).
    cap, scale : float
        The largest ε considered, and the median reference ``W(train_c, val_c)`` it is a
        multiple of (NaN for ``"given"``). ``"all-alike"`` and ``"all-different"`` set ε to
        ``AUTO_ALIKE · scale``.
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
    rule). Same-distribution pairs scatter around zero (the reference cancels the noise floor
    of a comparison); the rule looks for the clearest gap above that near-zero mode. Let ``s``
    be the median reference ``W(train_c, val_c)`` and ``L = AUTO_CAP · s``. Sorted, the pair
    excesses below ``L`` are ``y_1 ≤ … ≤ y_k``, and ``y_{k+1} = L`` when some pair lies at or
    above ``L``. Gap ``i`` lies between ``y_i`` and ``y_{i+1}``; with ``m_i`` and ``σ_i`` the
    mean and standard deviation of the excesses of both directions of the pairs ``y_1 … y_i``
    (same-distribution excesses scatter around zero in either direction) and
    ``σ'_i = max(σ_i, AUTO_FLOOR · s)``, its clearness is

    .. math:: (y_{i+1} - y_i) / σ'_i,

    the width of the gap in standard deviations of what lies below it. A gap counts when
    what lies below it is a near-zero mode (``m_i ≤ AUTO_CENTER · σ'_i``) and it ends above
    zero. The clearest such gap, when its clearness reaches ``AUTO_CLEAR``, gives
    ``ε = max((y_i + y_{i+1}) / 2, 0)``. Without a clear gap, the reference tells: every pair
    excess below ``AUTO_ALIKE · s`` → the clients are alike (one cluster); none below → all
    different (singletons); both → no ε: every client stays alone, with a warning.

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
        The directions to solve first (all False once ``choice`` is known). The choice only
        depends on the pair excesses below ``L`` and on how many lie above, so a caller that
        solves exactly these gets the choice of the full matrix.
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
    order = np.argsort(x, kind="stable")
    x, a, b = x[order], a[order], b[order]
    k = int(np.sum(x < cap))
    below = x[:k]
    above = len(x) - k
    common = {"cap": float(cap), "scale": float(scale), "pairs": int(len(x))}
    alike = AUTO_ALIKE * scale
    best, clearness = _clearest_gap(below, a[:k], b[:k], cap if above else None, scale)
    if best is not None and clearness >= AUTO_CLEAR:
        lo = float(below[best])
        hi = float(below[best + 1]) if best + 1 < len(below) else float(cap)
        seen = hi if best + 1 < len(below) else float(np.min(x[x >= cap]))
        return EpsilonChoice(max((lo + hi) / 2, 0.0), "gap", (lo, seen), clearness,
                             **common), need
    if len(below) == 0 or below[0] >= alike:
        return EpsilonChoice(float(alike), "all-different", None, clearness, **common), need
    if below[-1] < alike and not above:
        return EpsilonChoice(float(alike), "all-alike", None, clearness, **common), need
    said = "none" if clearness is None else f"{clearness:.2f}"
    split = int(np.sum(x < alike))
    warning = (f"emdcfl.epsilon=auto found no clear gap in the excesses of {len(x)} client "
               f"pairs (clearest {said} standard deviations, needs {AUTO_CLEAR:g}): {split} "
               f"pairs lie below the median reference W(train, val) {scale:.4g} and "
               f"{len(x) - split} above it, so it cannot tell similar clients from different "
               f"ones; every client stays alone. Pass a number as emdcfl.epsilon to join "
               f"clients whose excess lies below it")
    return EpsilonChoice(None, "no-gap", None, clearness, warning=warning, **common), need


def _clearest_gap(below: NDArray, a: NDArray, b: NDArray, top: float | None, scale: float
                  ) -> tuple[int | None, float | None]:
    """The clearest admissible gap above ``below[i]`` and its clearness
    (:func:`gap_clearness`); ``(None, None)`` when no gap is admissible."""
    clear = gap_clearness(below, a, b, top, scale)
    if len(clear) == 0 or not np.isfinite(clear).any():
        return None, None
    best = int(np.argmax(clear))
    return best, float(clear[best])


def gap_clearness(below: NDArray, a: NDArray, b: NDArray, top: float | None, scale: float
                  ) -> NDArray[np.float64]:
    """The clearness of the gap above each ``below[i]`` (sorted pair excesses below the cap,
    of directions ``a``, ``b``; the last gap reaches ``top``, the cap, when pairs lie above
    it), ``-inf`` where the gap is not admissible (:func:`auto_epsilon`). The near-zero mode
    below a gap is measured on both directions of its pairs: same-distribution excesses
    scatter around zero in either direction, while the larger of two is biased upwards."""
    ys = np.append(below, top) if top is not None else np.asarray(below)
    gaps = np.diff(ys)
    m = len(gaps)
    if m == 0:
        return np.zeros(0)
    count = 2 * np.arange(1, m + 1)
    shift = float(np.mean(a[:m] + b[:m]) / 2)     # shifted sums: no cancellation on offsets
    mean = np.cumsum(a[:m] + b[:m]) / count
    var = np.cumsum((a[:m] - shift) ** 2 + (b[:m] - shift) ** 2) / count - (mean - shift) ** 2
    sd = np.maximum(np.sqrt(np.maximum(var, 0.0)), AUTO_FLOOR * scale)
    ok = (mean <= AUTO_CENTER * sd) & (ys[1:] > 0)
    return np.where(ok, gaps / sd, -np.inf)


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
