"""EMD-CFL distance costs, as ratios measured in one run (machine noise cancels).

- exact ``ot.emd2`` per pair at the paper's sizes (512 source points, val-sized target,
  d = 115 = 0.9·128) vs computing the cost matrix alone (the floor);
- Sinkhorn (reg 0.1, the paper's App. E.2) vs exact;
- the pairwise matrix with 2 worker processes vs 1 (the server-side parallelism).

Run: python bench/bench_emdcfl_emd.py [--pairs 40] [--target 543]
"""

from __future__ import annotations

import numpy as np
from _common import mean_seconds as timed
from _common import parser as bench_parser


def main() -> None:
    import ot

    from fedclust.emdcfl.distance import pairwise_wasserstein, wasserstein

    parser = bench_parser()
    parser.add_argument("--pairs", type=int, default=40)
    parser.add_argument("--target", type=int, default=512, help="target cloud size (val set)")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    d = 115
    pairs = [(np.abs(rng.normal(size=(512, d))), np.abs(rng.normal(size=(args.target, d)) + 0.1))
             for _ in range(args.pairs)]

    p, q = pairs[0]
    wasserstein(p, q)                                     # warm-up (imports)
    t_cost = timed(lambda: ot.dist(p, q, metric="cosine"), 5)
    t_emd = timed(lambda: wasserstein(p, q, "cosine"), 5)
    t_sk = timed(lambda: wasserstein(p, q, "cosine", solver="sinkhorn", reg=0.1), 5)
    exact, approx = wasserstein(p, q, "cosine"), wasserstein(p, q, "cosine", "sinkhorn", reg=0.1)
    t1 = timed(lambda: pairwise_wasserstein(pairs, "cosine", workers=1))
    pairwise_wasserstein(pairs[:4], "cosine", workers=2)    # start the worker pool
    t2 = timed(lambda: pairwise_wasserstein(pairs, "cosine", workers=2))
    print(f"one pair 512 x {args.target}, d={d}: cost matrix {1e3 * t_cost:.1f} ms, "
          f"exact emd2 {1e3 * t_emd:.1f} ms ({t_emd / t_cost:.1f}x the cost matrix)")
    print(f"sinkhorn reg=0.1: {1e3 * t_sk:.1f} ms = {t_sk / t_emd:.2f}x exact; "
          f"value {approx:.4f} vs exact {exact:.4f} (rel. err {abs(approx - exact) / exact:.1%})")
    print(f"{args.pairs} pairs: 1 process {t1:.2f} s, 2 processes {t2:.2f} s "
          f"(speed-up {t1 / t2:.2f}x)")
    n = 40
    print(f"extrapolated 40-client matrix ({2 * n * (n - 1)} solves incl. references): "
          f"{2 * n * (n - 1) * t1 / args.pairs:.0f} s on 1 process, "
          f"{2 * n * (n - 1) * t2 / args.pairs:.0f} s on 2")


if __name__ == "__main__":
    main()
