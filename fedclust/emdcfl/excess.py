"""EMD-CFL's clustering step without Flower (paper 001, §3, Alg. 1 lines 11–17).

What the server holds for every ordered pair ``(c, o)`` of clients, all under the pair's secret
projection ``R_co`` (see :mod:`fedclust.emdcfl.privacy`):

- ``source``: client ``c``'s training embeddings under ``c``'s model (sent by ``c``);
- ``target``: client ``o``'s validation embeddings under ``c``'s model (sent by ``o``);
- ``reference``: the scalar ``W(train_c, val_c)`` that ``c`` computed itself from the same
  ``source`` subsample and its own validation embeddings (:func:`reference_distance`).

The step:

1. ``W[c, o] = W(source, target)`` on equal-size clouds (exact OT, :mod:`.distance`);
2. ``excess[c, o] = W[c, o] − reference[c, o]`` — ``c``'s own reference, never ``o``'s;
3. ``A[c, o] = (excess[c, o] < ε) AND (excess[o, c] < ε)``, ``A[c, c] = True``;
4. clients with identical closed neighbourhoods form a cluster (:mod:`.cluster`).

ε is a number, or ``"auto"``: read from the excesses themselves
(:func:`~fedclust.emdcfl.cluster.auto_epsilon`, :func:`auto_excess`).

With ``lazy=True`` (default) only what the decision needs is solved, and the clusters are
the same (tested):

- the direction ``(o, c)`` of a pair is not solved once ``(c, o)`` has failed the test (the
  AND rule cannot make that pair an edge any more);
- a direction is not solved when a lower bound of its ``W`` (the dual bound of
  :func:`~fedclust.emdcfl.distance.dual_lower_bound`, from the ground-cost matrix alone)
  already gives ``excess ≥ ε``.

With ``epsilon="auto"`` ε is not known before solving, and the lazy step has two stages:
the dual lower bound of every direction first (no solve), then exact solves of only the
directions the choice of ε depends on: both directions of every pair whose bounds may lie
below the largest ε considered (twice the median reference). Every other pair's bound already
puts it above any ε the rule can choose, so ε and the clusters are those of the full matrix
(tested).

The skipped entries of ``W`` and ``excess`` are NaN. ``lazy=False`` solves every direction
(the full matrix that heatmaps and ε sweeps need).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from fedclust.emdcfl.cluster import (
    EpsilonChoice,
    auto_epsilon,
    neighbourhood_clusters,
    threshold_adjacency,
)
from fedclust.emdcfl.distance import BOUND, equal_size, pairwise_wasserstein, wasserstein

AUTO = "auto"
#: more than this share of the clients left alone is reported (a label-free warning)
SINGLETON_SHARE = 0.5


@dataclass(frozen=True)
class PairClouds:
    """The server's inputs for the ordered pair ``(c, o)`` (see the module docstring)."""

    source: NDArray
    target: NDArray
    reference: float


@dataclass(frozen=True)
class Solver:
    """How each ``W`` is solved: ground cost, exact EMD or Sinkhorn, limits, workers, the seed
    of the equal-size subsamples (a run's: :attr:`fedclust.emdcfl.keys.EMDCFLSettings.solver`)."""

    metric: str = "cosine"
    solver: str = "emd"
    num_itermax: int = 1_000_000
    reg: float = 0.1
    workers: int = 1
    seed: int = 0

    def many(self, pairs: Sequence[tuple[NDArray, NDArray]],
             at_least: Sequence[float | None] | None = None) -> NDArray[np.float64]:
        return pairwise_wasserstein(pairs, self.metric, self.solver, self.num_itermax,
                                    self.reg, self.workers, equalize_seed=self.seed,
                                    at_least=at_least)

    def bounds(self, pairs: Sequence[tuple[NDArray, NDArray]]) -> NDArray[np.float64]:
        """The dual lower bound of each pair's ``W`` (no solve; exact solver only)."""
        return pairwise_wasserstein(pairs, self.metric, BOUND, workers=self.workers,
                                    equalize_seed=self.seed)


@dataclass
class Clustering:
    """Result of :func:`cluster_clients` (matrices indexed like ``members``)."""

    members: list[int]
    distance: NDArray[np.float64]      # W[c, o]; diagonal: mean reference of c; NaN: not solved
    excess: NDArray[np.float64]        # W[c, o] − reference[c, o]; diagonal 0
    adjacency: NDArray[np.bool_]
    labels: NDArray[np.int64]
    solves: int = 0
    skipped: int = 0
    seconds: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)
    choice: EpsilonChoice | None = None    # how ε was set
    warnings: list[str] = field(default_factory=list)   # label-free, for the log and summary


def reference_distance(source: NDArray, own_val: NDArray, solver: Solver) -> float:
    """``W(train_c, val_c)`` as client ``c`` computes it (on equal-size clouds)."""
    p, q = equal_size(np.asarray(source), np.asarray(own_val), solver.seed)
    return wasserstein(p, q, solver.metric, solver.solver, solver.num_itermax, solver.reg)


def excess_matrix(members: Sequence[int], pairs: Mapping[tuple[int, int], PairClouds],
                  epsilon: float, solver: Solver = Solver(), lazy: bool = True
                  ) -> tuple[NDArray[np.float64], NDArray[np.float64], int]:
    """``W``, ``excess`` and the number of OT solves for the ordered pairs in ``pairs``.

    Parameters
    ----------
    members : sequence of int
        Client ids; row/column ``i`` of the matrices is ``members[i]``.
    pairs : mapping ``(c, o) -> PairClouds``
        A missing ordered pair stays NaN (not measured: no edge).
    epsilon : float
        ε of the AND rule (only used by ``lazy`` to skip second directions).
    lazy : bool
        Skip ``(o, c)`` once ``(c, o)`` failed (``excess ≥ ε`` or not measured), and any
        direction whose lower bound already gives ``excess ≥ ε``.

    Returns
    -------
    W, excess : ndarray (n, n)
    solves : int
        Exact OT problems solved (a direction decided by its lower bound is not counted).
    """
    index, w, ref, wanted = _layout(members, pairs)
    if lazy:
        first = [(c, o) for c, o in wanted if index[c] < index[o]]
        later = [(c, o) for c, o in wanted if index[c] > index[o]]
    else:
        first, later = wanted, []
    limit = ref + epsilon if lazy else None  # W ≥ limit fails the test: no exact W needed
    solves = _solve(first, pairs, index, w, solver, limit)
    if later:
        passed = w - ref < epsilon         # NaN compares False: an unmeasured pair fails
        later = [(c, o) for c, o in later if passed[index[o], index[c]]]
        solves += _solve(later, pairs, index, w, solver, limit)
    excess = w - ref
    np.fill_diagonal(excess, 0.0)
    _fill_references(w, ref)
    return w, excess, solves


def _solve(todo: list[tuple[int, int]], pairs: Mapping[tuple[int, int], PairClouds],
           index: Mapping[int, int], w: NDArray, solver: Solver, limit: NDArray | None) -> int:
    """Solve ``todo`` into ``w``; a direction whose lower bound reached ``limit`` (a matrix
    like ``w``; None or NaN: solve) stays NaN. Returns the number of exact solves."""
    at = [None if limit is None else float(limit[index[c], index[o]]) for c, o in todo]
    limits = [v if v is not None and np.isfinite(v) else None for v in at]
    values = solver.many([(pairs[k].source, pairs[k].target) for k in todo], limits)
    for (c, o), v in zip(todo, values):
        w[index[c], index[o]] = v
    return int(np.sum(np.isfinite(values)))


def auto_excess(members: Sequence[int], pairs: Mapping[tuple[int, int], PairClouds],
                solver: Solver = Solver(), lazy: bool = True
                ) -> tuple[NDArray[np.float64], NDArray[np.float64], int, EpsilonChoice]:
    """:func:`excess_matrix` with ε read from the excesses (``emdcfl.epsilon="auto"``).

    ``lazy`` (exact solver): the dual lower bound of every direction, then the exact solves
    :func:`~fedclust.emdcfl.cluster.auto_epsilon` asks for, until it can choose; the other
    directions stay NaN. Otherwise every direction is solved.

    Returns
    -------
    W, excess : ndarray (n, n)
    solves : int
    choice : EpsilonChoice
    """
    index, w, ref, wanted = _layout(members, pairs)
    n = len(members)
    off = ~np.eye(n, dtype=bool)
    scale = float(np.median(ref[off & np.isfinite(ref)])) if np.isfinite(ref[off]).any() \
        else float("nan")
    low = np.full((n, n), np.nan)
    exact = np.zeros((n, n), dtype=bool)
    solves = 0
    if lazy and solver.solver == "emd":
        bound = solver.bounds([(pairs[k].source, pairs[k].target) for k in wanted])
        for (c, o), v in zip(wanted, bound):
            low[index[c], index[o]] = v - ref[index[c], index[o]]
        todo = []
    else:
        todo = wanted
    while True:
        solves += _solve(todo, pairs, index, w, solver, None)
        for c, o in todo:
            i, j = index[c], index[o]
            low[i, j], exact[i, j] = w[i, j] - ref[i, j], True
        choice, need = auto_epsilon(low, exact, scale)
        if choice is not None:
            break
        todo = [(c, o) for c, o in wanted if need[index[c], index[o]]]
    excess = np.where(exact, w - ref, np.nan)
    np.fill_diagonal(excess, 0.0)
    _fill_references(w, ref)
    return w, excess, solves, choice


def _layout(members: Sequence[int], pairs: Mapping[tuple[int, int], PairClouds]
            ) -> tuple[dict[int, int], NDArray, NDArray, list[tuple[int, int]]]:
    """Row of each member, ``W`` (all NaN), the references, and the ordered pairs to solve."""
    index = {n: i for i, n in enumerate(members)}
    n = len(members)
    w = np.full((n, n), np.nan)
    ref = np.full((n, n), np.nan)
    wanted = [(c, o) for (c, o) in pairs if c != o and c in index and o in index]
    for c, o in wanted:
        ref[index[c], index[o]] = float(pairs[(c, o)].reference)
    return index, w, ref, wanted


def _fill_references(w: NDArray, ref: NDArray) -> None:
    """``W``'s diagonal: each client's mean reference."""
    rows = [r[np.isfinite(r)] for r in ref]
    np.fill_diagonal(w, [r.mean() if len(r) else np.nan for r in rows])


def cluster_clients(members: Sequence[int], pairs: Mapping[tuple[int, int], PairClouds],
                    epsilon: float | str, solver: Solver = Solver(), lazy: bool = True
                    ) -> Clustering:
    """The whole clustering step: :func:`excess_matrix` (:func:`auto_excess` for
    ``epsilon="auto"``), the AND rule, neighbourhoods; with label-free warnings when ε could
    not be read from the excesses or more than half the clients are left alone."""
    t0 = time.perf_counter()
    if epsilon == AUTO:
        w, excess, solves, choice = auto_excess(members, pairs, solver, lazy)
    else:
        w, excess, solves = excess_matrix(members, pairs, float(epsilon), solver, lazy)
        choice = EpsilonChoice(float(epsilon), "given")
    adjacency = threshold_adjacency(excess, choice.epsilon)
    labels = neighbourhood_clusters(adjacency)
    wanted = sum(1 for c, o in pairs if c != o and c in members and o in members)
    warnings = [choice.warning] if choice.warning else []
    alone = int(np.sum(np.bincount(labels) == 1)) if len(labels) else 0
    if alone > SINGLETON_SHARE * len(labels):
        warnings.append(
            f"the clustering left {alone} of {len(labels)} clients alone (singleton "
            f"clusters: each trains only on its own data); ε = "
            + (f"{choice.epsilon:.4g}" if choice.epsilon is not None else "none")
            + f" ({choice.rule}). If the clients should share models, their excesses "
            f"W(train_c, val_o) - W(train_c, val_c) lie above ε: emd_excess.npy holds them")
    return Clustering(list(members), w, excess, adjacency, labels, solves, wanted - solves,
                      time.perf_counter() - t0, choice=choice, warnings=warnings)
