"""The FCM pass against one scikit-learn KMeans (Lloyd) iteration on the same data.

    python bench/bench_fcm_local_sums.py [--n 100000 --d 16 --c 10 --repeats 20]

Prints, for float64 data (N × D) and C clusters, the median time of

* ``fcm.local_sums`` (paper 004's LocalSums: one exact-FCM client round),
* one iteration of ``FuzzyCMeans.fit`` (``max_iter`` 21 minus 1, divided by 20, so the fit's
  setup and final pass cancel as in the reference),
* ``fcm.memberships`` and ``fcm.objective``,
* the naive one-shot numpy formula (fresh (N, C) temporaries),
* one Lloyd iteration of ``sklearn.cluster.KMeans`` (fit with 21 iterations minus fit with 1,
  divided by 20),

and the ratios to the Lloyd iteration (target: local sums and a fit iteration <= 2x). Every
number is measured in this run, so the ratios hold on a noisy machine. ``--n 1000000`` also
reports the peak memory the pass allocates (tracemalloc), which stays bounded by the blocks.
"""

from __future__ import annotations

import tracemalloc

import numpy as np
from _common import median_ms, parser
from sklearn.cluster import KMeans

from fedclust import fcm


def one_shot_local_sums(x: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The same maths without blocks (fresh (n, C) temporaries): the naive numpy version."""
    d2 = np.maximum((x * x).sum(1)[:, None] - 2 * x @ v.T + (v * v).sum(1)[None], 1e-300)
    u = 1.0 / d2
    u /= u.sum(1, keepdims=True)
    w = u * u
    return w.sum(0), w.T @ x


def per_iteration(fit, repeats: int) -> float:
    """(fit with 21 iterations − fit with 1) / 20, in ms."""
    return (median_ms(lambda: fit(21), repeats, warmup=True)
            - median_ms(lambda: fit(1), repeats, warmup=True)) / 20


def main() -> None:
    ap = parser(repeats=20)
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--d", type=int, default=16)
    ap.add_argument("--c", type=int, default=10)
    ap.add_argument("--m", type=float, default=2.0)
    a = ap.parse_args()
    rng = np.random.default_rng(0)
    x = rng.normal(size=(a.n, a.d))
    v = x[rng.choice(a.n, a.c, replace=False)].copy()
    few = max(3, a.repeats // 3)
    sums_ms = median_ms(lambda: fcm.local_sums(x, v, a.m), a.repeats, warmup=True)
    memb_ms = median_ms(lambda: fcm.memberships(x, v, a.m), a.repeats, warmup=True)
    obj_ms = median_ms(lambda: fcm.objective(x, v, a.m), a.repeats, warmup=True)
    naive_ms = (median_ms(lambda: one_shot_local_sums(x, v), a.repeats, warmup=True)
                if a.m == 2 else None)
    fit_ms = per_iteration(lambda it: fcm.FuzzyCMeans(a.c, m=a.m, init=v, max_iter=it, tol=0.0)
                           .fit(x), few)
    lloyd_ms = per_iteration(lambda it: KMeans(a.c, init=v, n_init=1, max_iter=it, tol=0.0,
                                               algorithm="lloyd").fit(x), few)
    tracemalloc.start()
    fcm.local_sums(x, v, a.m)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    print(f"data {a.n} x {a.d} ({x.nbytes / 1e6:.1f} MB), C = {a.c}, m = {a.m:g}, float64, "
          f"median of {a.repeats}")
    print(f"fcm.local_sums                  {sums_ms:8.2f} ms   {sums_ms / lloyd_ms:5.2f}x Lloyd")
    print(f"FuzzyCMeans.fit, per iteration  {fit_ms:8.2f} ms   {fit_ms / lloyd_ms:5.2f}x Lloyd")
    print(f"fcm.memberships                 {memb_ms:8.2f} ms   {memb_ms / lloyd_ms:5.2f}x Lloyd")
    print(f"fcm.objective                   {obj_ms:8.2f} ms   {obj_ms / lloyd_ms:5.2f}x Lloyd")
    if naive_ms is not None:
        print(f"naive one-shot numpy sums       {naive_ms:8.2f} ms   "
              f"{naive_ms / lloyd_ms:5.2f}x Lloyd")
    print(f"sklearn KMeans, 1 Lloyd iter    {lloyd_ms:8.2f} ms")
    print(f"peak memory allocated by local_sums: {peak / 1e6:.2f} MB "
          f"(an (N, C) array is {a.n * a.c * 8 / 1e6:.1f} MB)")


if __name__ == "__main__":
    main()
