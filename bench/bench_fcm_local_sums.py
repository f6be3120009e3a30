"""FCM local-sums step vs one scikit-learn KMeans (Lloyd) iteration on the same data.

    python bench/bench_fcm_local_sums.py [--n 100000 --d 16 --c 10 --repeats 15]

Prints the median time of each and their ratio (target: local sums <= 2x one Lloyd iteration,
float64). Both are measured in this run, so the ratio is meaningful on a noisy machine.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from sklearn.cluster import KMeans

from fedclust.fcm import local_sums


def one_shot_local_sums(x: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The same maths without chunking (fresh (n, C) temporaries) — the naive numpy version."""
    d2 = np.maximum((x * x).sum(1)[:, None] - 2 * x @ v.T + (v * v).sum(1)[None], 1e-300)
    u = 1.0 / d2
    u /= u.sum(1, keepdims=True)
    w = u * u
    return w.sum(0), w.T @ x


def median_ms(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1000 * float(np.median(times))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--d", type=int, default=16)
    ap.add_argument("--c", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=15)
    a = ap.parse_args()
    rng = np.random.default_rng(0)
    x = rng.normal(size=(a.n, a.d))
    v = x[rng.choice(a.n, a.c, replace=False)].copy()
    fcm_ms = median_ms(lambda: local_sums(x, v, 2.0), a.repeats)
    naive_ms = median_ms(lambda: one_shot_local_sums(x, v), a.repeats)
    # one Lloyd iteration = (fit with 21 iterations − fit with 1) / 20: removes sklearn's
    # per-fit setup (validation, copies, thread pools) from the reference
    def lloyd(iters: int) -> float:
        return median_ms(lambda: KMeans(a.c, init=v, n_init=1, max_iter=iters, tol=0.0,
                                        algorithm="lloyd").fit(x), max(3, a.repeats // 3))

    lloyd_ms = (lloyd(21) - lloyd(1)) / 20
    print(f"data {a.n} x {a.d}, C = {a.c}, float64, median of {a.repeats}")
    print(f"fedclust local_sums (blocked)   {fcm_ms:8.2f} ms")
    print(f"naive one-shot numpy            {naive_ms:8.2f} ms")
    print(f"sklearn KMeans, 1 Lloyd iter    {lloyd_ms:8.2f} ms")
    print(f"ratio local_sums / Lloyd iter   {fcm_ms / lloyd_ms:8.2f}x  (target <= 2x)")
    print(f"ratio naive / local_sums        {naive_ms / fcm_ms:8.2f}x")


if __name__ == "__main__":
    main()
