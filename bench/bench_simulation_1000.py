"""Simulation at the clients' cost: exact FCM through ``fedclust.simulate`` (in-process engine)
with many clients, per federated round, over one centralized FCM iteration on the pooled rows.

    python bench/bench_simulation_1000.py [--clients 1000 --rows 200 --rounds 10]

A federated round of exact FCM does, on all clients together, the same arithmetic as one
centralized FCM iteration on the pooled rows (every client's local sums, then one center
update). The ratio of the two wall times is what the simulation costs beyond that work:
messages, records, checks, bookkeeping. Both are measured in the same run, with fedclust's
own FCM kernel (:func:`fedclust.fcm.local_sums` and :func:`fedclust.fcm.update_centers`).

The federated run has ``fcm.epsilon = 0``, so exactly ``--rounds`` rounds run; a round's wall
time is the time between two consecutive ``history.jsonl`` records (``elapsed_s``), so it
holds everything the server and the clients do in a round, and not the start (scaling phase)
nor the final phase. The centralized iteration is timed ``--central-repeats`` times before and
after the federated run (a busy machine drifts); the medians are compared.

On a shared machine the wall times depend on the other work: the load average is printed, and
so is the same ratio in CPU time of this process (``time.process_time``, all its threads; a
round's CPU time is taken between two of the run's per-round progress lines), which other
work changes much less.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import fedclust  # noqa: E402
from fedclust import fcm  # noqa: E402


def clients_data(clients: int, rows: int, features: int, clusters: int, seed: int
                 ) -> list[np.ndarray]:
    """``clients`` arrays of ``rows`` × ``features`` from ``clusters`` Gaussian blobs, shuffled."""
    from sklearn.datasets import make_blobs

    x, _ = make_blobs(clients * rows, n_features=features, centers=clusters,
                      center_box=(-10, 10), random_state=seed)
    return list(x.reshape(clients, rows, features))


def central_iteration_seconds(x: np.ndarray, centers: np.ndarray, m: float, repeats: int
                              ) -> tuple[list[float], list[float]]:
    """Wall and CPU times of one centralized FCM iteration (local sums over all rows, center
    update), ``repeats`` times."""
    wall, cpu = [], []
    v = centers
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        u, ws = fcm.local_sums(x, v, m)
        v = fcm.update_centers(u, ws, v)
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    return wall, cpu


class RoundClock(logging.Handler):
    """Takes this process's CPU time at every per-round progress line of the run."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.cpu: list[float] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage().startswith("exact-fcm round "):
            self.cpu.append(time.process_time())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", type=int, default=1000)
    ap.add_argument("--rows", type=int, default=200, help="rows per client")
    ap.add_argument("--features", type=int, default=2)
    ap.add_argument("--clusters", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--central-repeats", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    if a.rounds < 2:
        ap.error("--rounds must be at least 2 (a round's time is between two records)")
    load_before = os.getloadavg()
    xs = clients_data(a.clients, a.rows, a.features, a.clusters, a.seed)
    pooled = np.vstack(xs)
    m = 2.0
    clock = RoundClock()
    log = logging.getLogger("fedclust")   # the run's progress lines come here, not to stderr
    log.addHandler(clock)
    log.setLevel(logging.INFO)
    log.propagate = False
    with tempfile.TemporaryDirectory(prefix="fedclust-bench-") as tmp:
        # warm-up of the kernel's thread pool and BLAS, outside every timing
        central_iteration_seconds(pooled, pooled[:a.clusters], m, 2)
        central, central_cpu = central_iteration_seconds(pooled, pooled[:a.clusters], m,
                                                         a.central_repeats)
        t0 = time.perf_counter()
        res = fedclust.simulate("exact-fcm", xs, n_clusters=a.clusters, m=m, epsilon=0.0,
                                max_rounds=a.rounds, seed=a.seed, output_dir=Path(tmp) / "run",
                                run_config={"plots": False})
        wall = time.perf_counter() - t0
        shift = res.arrays["scaling_shift"].numpy()
        scale = res.arrays["scaling_scale"].numpy()
        scaled = (pooled - shift) / scale
        start = res.arrays["initial_centers"].numpy()
        more, more_cpu = central_iteration_seconds(scaled, start, m, a.central_repeats)
        central, central_cpu = central + more, central_cpu + more_cpu
        elapsed = [h["elapsed_s"] for h in res.history]
    load_after = os.getloadavg()
    assert res.summary["metrics"]["rounds"] == a.rounds, res.summary["metrics"]
    assert len(clock.cpu) == a.rounds, len(clock.cpu)
    rounds, rounds_cpu = np.diff(elapsed), np.diff(clock.cpu)
    per_round, per_iter = float(np.median(rounds)), float(np.median(central))
    cpu_round, cpu_iter = float(np.median(rounds_cpu)), float(np.median(central_cpu))
    print(f"exact FCM, {a.clients} clients x {a.rows} rows ({a.clients * a.rows:,} rows, "
          f"{a.features} features, {a.clusters} clusters), {a.rounds} rounds, "
          f"fedclust.simulate (in-process engine)")
    print(f"federated round        median {per_round * 1000:9.1f} ms "
          f"(min {rounds.min() * 1000:.1f}, max {rounds.max() * 1000:.1f}; "
          f"whole simulate {wall:.1f} s)")
    print(f"centralized iteration  median {per_iter * 1000:9.2f} ms "
          f"(min {min(central) * 1000:.2f}, max {max(central) * 1000:.2f}) on the pooled rows")
    print(f"ratio round / iteration       {per_round / per_iter:9.1f}x   (wall time)")
    print(f"CPU time: round {cpu_round * 1000:.1f} ms, iteration {cpu_iter * 1000:.2f} ms, "
          f"ratio {cpu_round / cpu_iter:.1f}x")
    print(f"load average (1, 5, 15 min) before {load_before[0]:.2f} {load_before[1]:.2f} "
          f"{load_before[2]:.2f}, after {load_after[0]:.2f} {load_after[1]:.2f} "
          f"{load_after[2]:.2f}; {os.cpu_count()} CPUs")


if __name__ == "__main__":
    main()
