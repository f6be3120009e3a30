"""The evidence behind EMD-CFL's automatic ε (``emdcfl.epsilon="auto"``): excess matrices of
round-0 clusterings, cached, and how the rule of :func:`fedclust.emdcfl.cluster.auto_epsilon`
reads them.

    # one system per call: round 0, the embeddings, the excess of every direction that may lie
    # below 3x the median reference (the dual bound screens the rest), cached as .npz
    python bench/emdcfl_epsilon_tuning.py collect --system max --seed 100 \\
        --data-dir "$FEDCLUST_DATA_DIR" --cache runs/eps-cache
    # every cached system, and its first 20, 12 and 8 clients (the same data and models: a
    # smaller system): the rule's outcome, and the clearness of the true gap (between the
    # largest same-group and the smallest different-group pair excess) and of the clearest other
    python bench/emdcfl_epsilon_tuning.py margins --cache runs/eps-cache --sizes 0 20 12 8

Systems are the ``cpu`` presets of ``server_app.emdcfl_experiments``: ``max``, ``two``,
``min`` (Rotated MNIST), ``fmnist`` (Rotated Fashion-MNIST ``max``), ``backdoor`` (Backdoor
MNIST, ``cpu-backdoor``). The ground-truth groups are used here only to score the rule, never
by it. The rule's constants were chosen on the tuning seeds 100-104 only.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SYSTEMS = {
    "max": ("cpu", {"dataset": "rotmnist", "emdcfl.rotation": "max"}),
    "two": ("cpu", {"dataset": "rotmnist", "emdcfl.rotation": "two"}),
    "min": ("cpu", {"dataset": "rotmnist", "emdcfl.rotation": "min"}),
    "fmnist": ("cpu", {"dataset": "rotfmnist", "emdcfl.rotation": "max"}),
    "backdoor": ("cpu-backdoor", {"dataset": "backdoor-mnist"}),
}
LIMIT = 3.0     # directions whose excess may lie below LIMIT x the median reference are solved


def collect(system: str, seed: int, data_dir: str, cache: Path) -> Path:
    """Round 0, the embedding exchange and the excess matrix of one system, over in-memory
    clients (the same client steps as a simulated Flower run)."""
    from fedclust.config import validate
    from fedclust.emdcfl import inmemory
    from fedclust.emdcfl.distance import cost_matrix, dual_lower_bound, equal_size
    from fedclust.emdcfl.keys import EMDCFLSettings
    from fedclust.emdcfl.loop import pair_inputs
    from fedclust.emdcfl.model import init_weights
    from server_app.emdcfl_experiments import PRESETS

    path = cache / f"{system}-s{seed}.npz"
    if path.exists():
        return path
    preset, over = SYSTEMS[system]
    cfg = {"method": "emdcfl", **PRESETS[preset], **over, "seed": seed, "data-dir": data_dir,
           "evaluate": True, "plots": False, "emdcfl.workers": 1}
    s = EMDCFLSettings.from_config(validate(cfg))
    n = cfg["num-clients"]
    t0 = time.perf_counter()
    clients = inmemory.InMemoryClients.simulated(s, n)
    init = init_weights(s.spec, s.seed)
    trained = clients.train(0, {i: init for i in range(n)}, True)
    t1 = time.perf_counter()
    clouds = clients.embed(0, list(range(n)), trained.models, trained.pubs)
    t2 = time.perf_counter()
    pairs = pair_inputs(clouds.replies, list(range(n)))
    w, ref, lb = (np.full((n, n), np.nan) for _ in range(3))
    for (c, o), pc in pairs.items():
        ref[c, o] = pc.reference
    limit = LIMIT * np.nanmedian(ref)
    from scipy.optimize import linear_sum_assignment

    for (c, o), pc in pairs.items():
        p, q = equal_size(np.asarray(pc.source), np.asarray(pc.target), s.seed)
        m = cost_matrix(p, q, s.metric)
        lb[c, o] = dual_lower_bound(m)
        if lb[c, o] - ref[c, o] < limit:
            rows, cols = linear_sum_assignment(m)
            w[c, o] = m[rows, cols].sum() / len(p)
    cache.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(path, w=w, ref=ref, lb=lb,
                        truth=np.array([int(d.cluster) for d in clients.data]),
                        sets=np.array([int(d.set_id) for d in clients.data]),
                        settings=json.dumps(cfg),
                        seconds=np.array([t1 - t0, t2 - t1, time.perf_counter() - t2]))
    return path


def load(path: Path, n: int = 0) -> tuple[np.ndarray, np.ndarray, float, np.ndarray]:
    """Directed excesses (exact where solved, the dual bound's lower bound elsewhere), which are
    exact, the median reference and the truth of the first ``n`` clients (0: all)."""
    d = np.load(path)
    w, ref, lb, truth = d["w"], d["ref"], d["lb"], d["truth"]
    if n:
        w, ref, lb, truth = w[:n, :n], ref[:n, :n], lb[:n, :n], truth[:n]
    off = ~np.eye(len(truth), dtype=bool)
    exact = np.isfinite(w) & off
    low = np.where(exact, w - ref, lb - ref)
    np.fill_diagonal(low, np.nan)
    return low, exact, float(np.median(ref[off])), truth


def margins(cache: Path, sizes: list[int]) -> None:
    """Per system: the rule's outcome and ARI, and the clearness of the true gap and of the
    clearest other admissible gap (:func:`fedclust.emdcfl.cluster._clearest_gap`)."""
    from fedclust.emdcfl import cluster
    from fedclust.metrics import adjusted_rand

    print("| system | clients | rule | ε | ε / s | ARI | clusters | true gap | clearest other |")
    print("|---|---|---|---|---|---|---|---|---|")
    worst_true, best_other = np.inf, -np.inf
    for path in sorted(cache.glob("*.npz")):
        for n in sizes:
            low, exact, scale, truth = load(path, n)
            choice, need = cluster.auto_epsilon(low, exact, scale)
            if choice is None:
                raise SystemExit(f"{path}: the rule asks for directions the cache lacks")
            labels = cluster.neighbourhood_clusters(
                cluster.threshold_adjacency(np.where(exact, low, np.nan), choice.epsilon))
            ari = adjusted_rand(truth, labels)
            true_c, other_c = _true_and_other(low, truth, scale)
            if np.isfinite(true_c):
                worst_true = min(worst_true, true_c)
            best_other = max(best_other, other_c)
            eps = "none" if choice.epsilon is None else f"{choice.epsilon:.4f}"
            rel = "" if choice.epsilon is None else f"{choice.epsilon / scale:.2f}"
            print(f"| {path.stem} | {len(truth)} | {choice.rule} | {eps} | {rel} | {ari:.2f} | "
                  f"{len(set(labels.tolist()))} | {true_c:.2f} | {other_c:.2f} |")
    print(f"\nsmallest clearness of a true gap {worst_true:.2f}; largest of any other gap "
          f"{best_other:.2f}; the rule needs {cluster.AUTO_CLEAR:g}")


def _true_and_other(low: np.ndarray, truth: np.ndarray, scale: float) -> tuple[float, float]:
    """Clearness of the true gap (between the largest same-group and the smallest
    different-group pair excess; NaN when there is none) and of the clearest other gap."""
    from fedclust.emdcfl import cluster

    n = len(truth)
    iu, ju = np.triu_indices(n, 1)
    a, b = low[iu, ju], low[ju, iu]
    x = np.maximum(a, b)
    order = np.argsort(x, kind="stable")
    x, a, b, same = x[order], a[order], b[order], (truth[iu] == truth[ju])[order]
    cap = cluster.AUTO_CAP * scale
    k = int(np.sum(x < cap))
    clear = cluster.gap_clearness(x[:k], a[:k], b[:k], cap if k < len(x) else None, scale)
    true = np.nan
    if same.any() and (~same).any() and x[~same].min() > x[same].max():
        i = int(np.sum(x <= x[same].max())) - 1
        if i < len(clear):
            true = float(clear[i])
            clear = np.delete(clear, i)
    return true, float(clear.max()) if len(clear) else -np.inf


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("command", choices=["collect", "margins"])
    ap.add_argument("--system", choices=list(SYSTEMS), default="max")
    ap.add_argument("--seed", type=int, default=100)
    ap.add_argument("--data-dir", default="")
    ap.add_argument("--cache", default="runs/eps-cache")
    ap.add_argument("--sizes", nargs="+", type=int, default=[0, 20, 12, 8],
                    help="margins: the first n clients of each system (0: all)")
    a = ap.parse_args(argv)
    if a.command == "collect":
        print(collect(a.system, a.seed, a.data_dir, Path(a.cache)))
    else:
        margins(Path(a.cache), a.sizes)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
