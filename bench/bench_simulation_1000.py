"""Simulation at the clients' cost: exact FCM through ``fedclust.simulate`` (in-process engine)
with many clients, per federated round and end to end, over centralized FCM iterations on the
pooled rows.

    python bench/bench_simulation_1000.py [--clients 1000 --rows 200 --rounds 15]
    python bench/bench_simulation_1000.py --sizes 1000x200 10000x20   # cost against size

A federated round of exact FCM does, on all clients together, the same arithmetic as one
centralized FCM iteration on the pooled rows (every client's local sums, then one center
update). The ratio of the two wall times is what the simulation costs beyond that work:
messages, records, checks, bookkeeping. Both are measured in the same run, with fedclust's
own FCM kernel (:func:`fedclust.fcm.local_sums` and :func:`fedclust.fcm.update_centers`).

The federated run has ``fcm.epsilon = 0``, so exactly ``--rounds`` rounds run; a round's wall
time is the time between two consecutive ``history.jsonl`` records (``elapsed_s``), so it
holds everything the server and the clients do in a round, and not the start (scaling phase)
nor the final phase. **End to end** is the whole ``fedclust.simulate`` call (handing the
clients their arrays, the scaling phase, the rounds, every client writing its results, the
run's one sync, taking the clients' labels back: from memory while each ``assignments.csv`` is
the file just written, :func:`fedclust.results.recall_written`) over ``--rounds`` centralized
iterations (after a warm-up run of 4 clients, so that imports are not counted).
The centralized iteration is timed ``--central-repeats`` times before and after the federated
run (a busy machine drifts); the medians are compared.

``--sizes`` runs several systems one after the other (each against its own centralized
iteration) and prints the cost per client and round: at equal total rows (1,000 × 200 and
10,000 × 20) a cost that grows linearly with the clients shows as a flat per-client cost.

``--per-message`` also runs each system with every message answered on its own (the
in-process engine without its batched handlers, as the Flower engines serve messages) and
prints the CPU time the batched sums save, in the same run.

On a shared machine the wall times depend on the other work: the load average is printed, and
so is the same ratio in CPU time of this process (``time.process_time``, all its threads; a
round's CPU time is taken between two of the run's per-round progress lines), which other
work changes much less.
"""

from __future__ import annotations

import argparse
import contextlib
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


@contextlib.contextmanager
def one_message_at_a_time():
    """The in-process engine without its batched handlers while inside."""
    import client_apps.app  # noqa: F401  (registers the handlers)
    from client_apps import base

    saved = dict(base.BATCHED)
    base.BATCHED.clear()
    try:
        yield
    finally:
        base.BATCHED.update(saved)


def measure(clients: int, rows: int, a: argparse.Namespace) -> dict[str, float]:
    """One system: its rounds, its whole ``simulate`` call and the centralized reference."""
    xs = clients_data(clients, rows, a.features, a.clusters, a.seed)
    pooled = np.vstack(xs)
    m = 2.0
    clock = RoundClock()
    log = logging.getLogger("fedclust")   # the run's progress lines come here, not to stderr
    log.addHandler(clock)
    log.setLevel(logging.INFO)
    log.propagate = False
    try:
        with tempfile.TemporaryDirectory(prefix="fedclust-bench-") as tmp:
            # warm-up of the kernel's thread pool and BLAS, outside every timing
            central_iteration_seconds(pooled, pooled[:a.clusters], m, 2)
            central, central_cpu = central_iteration_seconds(pooled, pooled[:a.clusters], m,
                                                             a.central_repeats)
            t0, c0 = time.perf_counter(), time.process_time()
            res = fedclust.simulate("exact-fcm", xs, n_clusters=a.clusters, m=m, epsilon=0.0,
                                    max_rounds=a.rounds, seed=a.seed,
                                    output_dir=Path(tmp) / "run", run_config={"plots": False})
            wall, cpu = time.perf_counter() - t0, time.process_time() - c0
            shift = res.arrays["scaling_shift"].numpy()
            scale = res.arrays["scaling_scale"].numpy()
            scaled = (pooled - shift) / scale
            start = res.arrays["initial_centers"].numpy()
            more, more_cpu = central_iteration_seconds(scaled, start, m, a.central_repeats)
            central, central_cpu = central + more, central_cpu + more_cpu
            elapsed = [h["elapsed_s"] for h in res.history]
            assert len(res.labels) == clients and sum(map(len, res.labels)) == len(pooled)
    finally:
        log.removeHandler(clock)
    assert res.summary["metrics"]["rounds"] == a.rounds, res.summary["metrics"]
    assert len(clock.cpu) == a.rounds, len(clock.cpu)
    rounds, rounds_cpu = np.diff(elapsed), np.diff(clock.cpu)
    return {"round": float(np.median(rounds)), "round_min": float(rounds.min()),
            "round_max": float(rounds.max()), "round_cpu": float(np.median(rounds_cpu)),
            "iteration": float(np.median(central)), "iteration_min": float(min(central)),
            "iteration_max": float(max(central)), "iteration_cpu": float(np.median(central_cpu)),
            "wall": wall, "cpu": cpu}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", type=int, default=1000)
    ap.add_argument("--rows", type=int, default=200, help="rows per client")
    ap.add_argument("--sizes", nargs="*", default=[], metavar="CLIENTSxROWS",
                    help="several systems, e.g. 1000x200 10000x20 (instead of --clients/--rows)")
    ap.add_argument("--features", type=int, default=2)
    ap.add_argument("--clusters", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--central-repeats", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--per-message", action="store_true",
                    help="also run every system one message at a time (no batched handler)")
    a = ap.parse_args()
    if a.rounds < 2:
        ap.error("--rounds must be at least 2 (a round's time is between two records)")
    try:
        sizes = ([tuple(int(v) for v in s.lower().split("x")) for s in a.sizes] if a.sizes
                 else [(a.clients, a.rows)])
    except ValueError:
        ap.error("--sizes takes CLIENTSxROWS values, e.g. 1000x200")
    # imports and first-call caches: once per process, outside every timing
    warm = argparse.Namespace(**{**vars(a), "rounds": 2, "central_repeats": 1})
    measure(4, 20, warm)
    load_before = os.getloadavg()
    results = [(c, r, measure(c, r, a)) for c, r in sizes]
    single = []
    if a.per_message:
        with one_message_at_a_time():
            single = [measure(c, r, a) for c, r in sizes]
    load_after = os.getloadavg()
    for clients, rows, x in results:
        n = a.rounds
        print(f"exact FCM, {clients} clients x {rows} rows ({clients * rows:,} rows, "
              f"{a.features} features, {a.clusters} clusters), {n} rounds, "
              f"fedclust.simulate (in-process engine)")
        print(f"federated round        median {x['round'] * 1000:9.1f} ms "
              f"(min {x['round_min'] * 1000:.1f}, max {x['round_max'] * 1000:.1f})")
        print(f"centralized iteration  median {x['iteration'] * 1000:9.2f} ms "
              f"(min {x['iteration_min'] * 1000:.2f}, max {x['iteration_max'] * 1000:.2f}) "
              f"on the pooled rows")
        print(f"ratio round / iteration       {x['round'] / x['iteration']:9.1f}x   (wall time)")
        print(f"CPU time: round {x['round_cpu'] * 1000:.1f} ms, iteration "
              f"{x['iteration_cpu'] * 1000:.2f} ms, ratio "
              f"{x['round_cpu'] / x['iteration_cpu']:.1f}x")
        print(f"end to end: simulate {x['wall']:.2f} s / ({n} x iteration "
              f"{n * x['iteration']:.3f} s) = {x['wall'] / (n * x['iteration']):.1f}x   "
              f"(CPU {x['cpu']:.2f} s / {n * x['iteration_cpu']:.3f} s = "
              f"{x['cpu'] / (n * x['iteration_cpu']):.1f}x)")
    for (clients, rows, x), y in zip(results, single):
        print(f"{clients} x {rows}, one message at a time: simulate {y['wall']:.2f} s "
              f"(CPU {y['cpu']:.2f} s), round CPU {y['round_cpu'] * 1000:.1f} ms; batched / "
              f"one at a time: CPU end to end {x['cpu'] / y['cpu']:.2f}, round CPU "
              f"{x['round_cpu'] / y['round_cpu']:.2f}")
    if len(results) > 1:
        print("| clients | rows each | simulate s (CPU s) | per client: simulate µs (CPU µs) | "
              "per client and round: round µs (CPU µs) | end to end / iterations |")
        print("|---|---|---|---|---|---|")
        for clients, rows, x in results:
            print(f"| {clients:,} | {rows} | {x['wall']:.2f} ({x['cpu']:.2f}) | "
                  f"{x['wall'] / clients * 1e6:.0f} ({x['cpu'] / clients * 1e6:.0f}) | "
                  f"{x['round'] / clients * 1e6:.1f} ({x['round_cpu'] / clients * 1e6:.1f}) | "
                  f"{x['wall'] / (a.rounds * x['iteration']):.1f}x |")
    print(f"load average (1, 5, 15 min) before {load_before[0]:.2f} {load_before[1]:.2f} "
          f"{load_before[2]:.2f}, after {load_after[0]:.2f} {load_after[1]:.2f} "
          f"{load_after[2]:.2f}; {os.cpu_count()} CPUs")


if __name__ == "__main__":
    main()
