"""Exact federated FCM under partial participation: paper 004's rule against the incremental
rule (``fcm.incremental``) on label-skewed Dirichlet partitions of paper 004's Table 1 sets.

Every job is the method's loop (:func:`fedclust.fcm.loop.run`) over in-memory clients
(:mod:`fedclust.fcm.inmemory`) for the run config ``dataset=<name> num-clients=20
partition.kind=dirichlet partition.alpha=<α> seed=<s> fcm.fraction=<γ> fcm.epsilon=<ε>
fcm.max-rounds=<T> fcm.incremental=<rule> fcm.privacy-guard=false evaluate=false`` (federated
MinMax scaling = the pooled one, initial centers and participants from ``default_rng(seed)``):
what the ServerApp runs, without the messages. The reference is
centralized FCM (:func:`fedclust.fcm.fcm_from_centers`) from the same initial centers with the
same ε and T; ``‖T(V) − V‖_F`` (one centralized update from the final centers) is 0 at any
fixed point of centralized FCM; "= central" counts the runs within 1e-4 of the centralized
centers. Labels are used for the ARI only.

Usage::

    FEDCLUST_DATA_DIR=/path/to/data python bench/fcm_incremental_table.py --seeds 0-4
    python bench/fcm_incremental_table.py --seeds 100-104 --max-rounds 300,1000,3000  # tuning

Nothing of the algorithms is tuned; the tuning seeds only pick ``--max-rounds``: the smallest
value at which centralized FCM and the incremental rule converge on every tuning job.
"""

from __future__ import annotations

import argparse
import math
import os
import time
from collections import defaultdict

import numpy as np

from fedclust import fcm
from fedclust.config import validate
from fedclust.data import partition
from fedclust.data.tabular import load_dataset
from fedclust.fcm import inmemory, loop
from fedclust.fcm.keys import FCMSettings
from fedclust.metrics import adjusted_rand, format_ci
from fedclust.results import MemoryRecord

DATASETS = {"xclara": 3, "s-set1": 15, "pendigits": 10, "waveform": 3}   # C = classes
GAMMAS = (0.25, 0.5, 1.0)
SAME = 1e-4   # ‖V − V_central‖_F below this: the centralized answer (not another fixed point)


def seeds_arg(text: str) -> list[int]:
    """``"0-4"`` or ``"0,3,7"``."""
    if "-" in text:
        lo, hi = text.split("-")
        return list(range(int(lo), int(hi) + 1))
    return [int(s) for s in text.split(",")]


def scaled(name: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The dataset MinMax-scaled as the federated scaling phase does (pooled min/max), its
    labels and its raw rows."""
    ds = load_dataset(validate({"dataset": name, "data-dir": os.environ["FEDCLUST_DATA_DIR"]}))
    lo, hi = ds.x.min(0), ds.x.max(0)
    return (ds.x - lo) / np.where(hi > lo, hi - lo, 1.0), ds.y, ds.x


def matched(a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
    """``(‖A − B_π‖_F, max_c ‖a_c − b_π(c)‖)`` for the permutation π minimising the first."""
    from scipy.optimize import linear_sum_assignment

    cost = ((a[:, None, :] - b[None, :, :]) ** 2).sum(-1)
    rows, cols = linear_sum_assignment(cost)
    return float(np.sqrt(cost[rows, cols].sum())), float(np.sqrt(cost[rows, cols].max()))


def job(x: np.ndarray, y: np.ndarray, raw: np.ndarray, c: int, seed: int, alpha: float,
        clients: int, eps: float, max_rounds: int) -> list[dict]:
    """Every (γ, rule) of one dataset and seed, and the centralized reference."""
    parts = partition.dirichlet(y, clients, alpha, seed)
    f = x.shape[1]
    rows = []
    init_rng = np.random.default_rng(seed)
    init = fcm.random_centers(np.zeros(f), np.ones(f), c, init_rng)
    central = fcm.fcm_from_centers(x, init, 2.0, eps, max_rounds)
    rows.append({"rule": "centralized", "gamma": math.nan, "converged": central.converged,
                 "rounds": central.n_iter, "dist": 0.0, "maxdist": 0.0,
                 "residual": residual(x, central.centers),
                 "ari": adjusted_rand(y, _labels(x, central.centers))})
    for gamma in GAMMAS:
        for inc in (False, True):
            if gamma == 1.0 and inc:
                continue   # with γ = 1 both rules are the same computation
            s = FCMSettings.from_config(validate({
                "fcm.n-clusters": c, "fcm.fraction": gamma, "fcm.epsilon": eps,
                "fcm.max-rounds": max_rounds, "fcm.incremental": inc, "seed": seed,
                "fcm.privacy-guard": False, "evaluate": False}))
            record = MemoryRecord()
            res = loop.run(inmemory.InMemoryClients([raw[p] for p in parts], s), s, record)
            centers = record.arrays["centers"]
            dist, maxdist = matched(centers, central.centers)
            rows.append({"rule": "incremental" if inc else "paper", "gamma": gamma,
                         "converged": res["converged"], "rounds": res["rounds"], "dist": dist,
                         "maxdist": maxdist, "residual": residual(x, centers),
                         "ari": adjusted_rand(y, _labels(x, centers))})
    return rows


def residual(x: np.ndarray, centers: np.ndarray) -> float:
    """``‖T(V) − V‖_F`` with ``T`` the centralized FCM update on the pooled rows: 0 exactly at
    a fixed point of centralized FCM (possibly another one than from the same init)."""
    return float(np.linalg.norm(fcm.update_centers(*fcm.local_sums(x, centers), centers)
                                - centers))


def _labels(x: np.ndarray, centers: np.ndarray) -> np.ndarray:
    return fcm.squared_distances(x, centers).argmin(1)


def table(results: dict[tuple[str, str, float], list[dict]]) -> str:
    lines = ["| dataset | γ | rule | max_c ‖v_c − v_c^central‖ | ‖V − V_central‖_F | "
             "‖T(V) − V‖_F | = central | ARI | rounds | converged |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for (name, rule, gamma), rs in results.items():
        g = "—" if math.isnan(gamma) else f"{gamma:g}"
        n = len(rs)
        cells = [name, g, rule, _fmt([r["maxdist"] for r in rs]), _fmt([r["dist"] for r in rs]),
                 _fmt([r["residual"] for r in rs]), f"{sum(r['dist'] < SAME for r in rs)}/{n}",
                 format_ci([r["ari"] for r in rs], 4), f"{np.mean([r['rounds'] for r in rs]):.0f}",
                 f"{sum(r['converged'] for r in rs)}/{n}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _fmt(values: list[float]) -> str:
    """Distances: mean and max over seeds in scientific notation (they span many decades)."""
    return f"{np.mean(values):.1e} (max {np.max(values):.1e})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", default="0-4", help="report seeds 0-4; tuning seeds 100-104")
    ap.add_argument("--datasets", default=",".join(DATASETS))
    ap.add_argument("--alpha", type=float, default=0.3, help="Dirichlet label skew (<= 0.5)")
    ap.add_argument("--clients", type=int, default=20)
    ap.add_argument("--epsilon", type=float, default=1e-6)
    ap.add_argument("--max-rounds", default="1000",
                    help="one value, or several (tuning: the smallest that converges)")
    args = ap.parse_args()
    seeds = seeds_arg(args.seeds)
    for max_rounds in [int(t) for t in args.max_rounds.split(",")]:
        start = time.perf_counter()
        results: dict[tuple[str, str, float], list[dict]] = defaultdict(list)
        for name in args.datasets.split(","):
            x, y, raw = scaled(name)
            for seed in seeds:
                for r in job(x, y, raw, DATASETS[name], seed, args.alpha, args.clients,
                             args.epsilon, max_rounds):
                    results[(name, r["rule"], r["gamma"])].append(r)
        print(f"\nseeds {args.seeds}, alpha {args.alpha}, {args.clients} clients, "
              f"epsilon {args.epsilon:g}, max-rounds {max_rounds} "
              f"({time.perf_counter() - start:.0f} s)\n")
        print(table(results))


if __name__ == "__main__":
    main()
