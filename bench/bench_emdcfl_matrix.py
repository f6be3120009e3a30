"""EMD-CFL's EMD matrix: the former server computation against the current one, in one run.

Before (the former code): the server solved ``2·n(n−1)`` exact OT problems with the network
simplex (``ot.emd2``): every ordered pair ``W(train_c, val_o)`` and every reference
``W(train_c, val_c)`` from ``c``'s own-model validation clouds, all directions.
After: each client solves its ``n−1`` references (assignment solver, equal sizes) and sends
scalars; the server solves the ordered pairs with the assignment solver, skips a pair's
second direction once the first failed ε (lazy AND) and any direction whose dual lower bound
already fails ε.

Clouds are synthetic with the paper's shapes (512 points per cloud, d = 115 = 0.9·128, cosine
cost) in 4 groups, so the AND rule has pairs to skip; the clusters of both paths are checked
to be equal. One process each (``--workers`` to change); the ratio is what to compare.

Run: python bench/bench_emdcfl_matrix.py [--clients 12] [--points 512] [--workers 1]
"""

from __future__ import annotations

import time

import numpy as np
from _common import parser as bench_parser


def clouds(clients: int, groups: int, points: int, dim: int, seed: int = 0):
    """Per ordered pair the three clouds a run produces, from group Gaussians (>0, cosine)."""
    rng = np.random.default_rng(seed)
    means = np.abs(rng.normal(size=(groups, dim))) * 1.5
    group = [c % groups for c in range(clients)]

    def draw(g: int) -> np.ndarray:
        return (np.abs(rng.normal(size=(points, dim))) + means[g]).astype(np.float32)

    out = {}
    for c in range(clients):
        for o in range(clients):
            if c != o:
                out[(c, o)] = (draw(group[c]), draw(group[o]), draw(group[c]))  # src, tgt, own
    return out, group


def before(pairs, clients: int, eps: float, workers: int) -> tuple[np.ndarray, float]:
    """The former server path: 2 n(n-1) network-simplex solves, full matrix."""
    import ot

    from fedclust.emdcfl.cluster import neighbourhood_clusters, threshold_adjacency

    def emd2(p: np.ndarray, q: np.ndarray) -> float:
        p, q = p.astype(np.float64), q.astype(np.float64)
        m = np.nan_to_num(ot.dist(p, q, metric="cosine"), nan=1.0)
        return float(ot.emd2(np.full(len(p), 1 / len(p)), np.full(len(q), 1 / len(q)), m,
                             numItermax=1_000_000))

    t0 = time.perf_counter()
    keys = sorted(pairs)
    jobs = [(pairs[k][0], pairs[k][1]) for k in keys] + [(pairs[k][0], pairs[k][2])
                                                        for k in keys]
    if workers > 1:
        from joblib import Parallel, delayed

        values = Parallel(n_jobs=workers)(delayed(emd2)(p, q) for p, q in jobs)
    else:
        values = [emd2(p, q) for p, q in jobs]
    excess = np.zeros((clients, clients))
    for i, (c, o) in enumerate(keys):
        excess[c, o] = values[i] - values[len(keys) + i]
    labels = neighbourhood_clusters(threshold_adjacency(excess, eps))
    return labels, time.perf_counter() - t0


def after(pairs, clients: int, eps: float, workers: int
          ) -> tuple[np.ndarray, float, float, int, int]:
    """Client references (timed apart) + the server's lazy, assignment-solver matrix."""
    from fedclust.emdcfl.excess import PairClouds, Solver, cluster_clients, reference_distance

    solver = Solver(metric="cosine", workers=workers)
    t0 = time.perf_counter()
    refs = {k: reference_distance(src, own, Solver(metric="cosine"))
            for k, (src, _, own) in pairs.items()}
    client_s = time.perf_counter() - t0
    inputs = {k: PairClouds(src, tgt, refs[k]) for k, (src, tgt, _) in pairs.items()}
    found = cluster_clients(list(range(clients)), inputs, eps, solver, lazy=True)
    return found.labels, found.seconds, client_s, found.solves, found.skipped


def main() -> None:
    parser = bench_parser(clients=12)
    parser.add_argument("--groups", type=int, default=4)
    parser.add_argument("--points", type=int, default=512)
    parser.add_argument("--dim", type=int, default=115)
    parser.add_argument("--epsilon", type=float, default=0.05)
    parser.add_argument("--workers", type=int, default=1)
    args = parser.parse_args()
    pairs, group = clouds(args.clients, args.groups, args.points, args.dim)
    warm = dict([next(iter(pairs.items()))])             # imports (POT: seconds) off the clock
    before(warm, args.clients, args.epsilon, 1)
    after(warm, args.clients, args.epsilon, 1)
    old_labels, old_s = before(pairs, args.clients, args.epsilon, args.workers)
    new_labels, new_s, client_s, solves, skipped = after(pairs, args.clients, args.epsilon,
                                                         args.workers)
    n = args.clients
    print(f"config: {n} clients in {args.groups} groups, {args.points} points per cloud, "
          f"d={args.dim}, cosine, eps={args.epsilon}, {args.workers} worker(s)")
    print(f"same clusters: {np.array_equal(old_labels, new_labels)} "
          f"({len(set(new_labels.tolist()))} clusters; groups {args.groups})")
    print(f"before: server {2 * n * (n - 1)} network-simplex solves: {old_s:.2f} s")
    print(f"after:  server {solves} assignment solves ({skipped} directions decided without "
          "a solve: lazy AND or lower bound): "
          f"{new_s:.2f} s; clients' references {n * (n - 1)} solves: {client_s:.2f} s in total, "
          f"{client_s / n:.2f} s per client (in parallel on the clients)")
    print(f"server EMD-matrix time after/before: {new_s / old_s:.3f} "
          f"({old_s / new_s:.1f}x faster); all solves (server + every client) after/before: "
          f"{(new_s + client_s) / old_s:.3f}")


if __name__ == "__main__":
    main()
