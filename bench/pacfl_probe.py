"""PACFL's one-shot clustering on the simulated EMD-CFL datasets, without training.

PACFL clusters from raw data before any training, so its ARI needs no run: this builds every
client's class subspaces exactly as the ``pacfl`` baseline's clients do (validation images,
model normalisation, 3 singular vectors per class), prints the within- and between-group
angle ranges, the ARI over a threshold grid (to choose the threshold on a held-out seed, tuned
to the true split as the EMD-CFL paper tunes every threshold baseline) and the ARI at a given
threshold on reported seeds.

Run: python bench/pacfl_probe.py --dataset rotmnist --rotation max --seeds 100 \
        --data-dir "$FEDCLUST_DATA_DIR" [--threshold 10 --report-seeds 0 1 2]
"""

from __future__ import annotations

import argparse

import numpy as np


def angles_of(dataset: str, rotation: str, clients: int, samples: int, seed: int,
              data_dir: str, palette: str, basis: int) -> tuple[np.ndarray, np.ndarray]:
    from fedclust.emdcfl.data import client_split
    from fedclust.emdcfl.model import to_tensor
    from fedclust.emdcfl.pacfl import angle_matrix, class_subspaces

    subspaces, truth = [], []
    for c in range(clients):
        d = client_split(dataset, rotation, c, clients, samples, 1, 0.1, seed, data_dir, palette)
        subspaces.append(class_subspaces(to_tensor(d.x_val).numpy(), d.y_val, basis))
        truth.append(d.cluster)
    return angle_matrix(subspaces), np.array(truth)


def main() -> None:
    from fedclust.emdcfl.pacfl import pacfl_clusters
    from fedclust.metrics import adjusted_rand

    p = argparse.ArgumentParser()
    p.add_argument("--dataset", default="rotmnist")
    p.add_argument("--rotation", default="max")
    p.add_argument("--clients", type=int, default=40)
    p.add_argument("--samples", type=int, default=5420)
    p.add_argument("--palette", default="wide")
    p.add_argument("--basis", type=int, default=3)
    p.add_argument("--seeds", type=int, nargs="*", default=[100])
    p.add_argument("--threshold", type=float, default=None)
    p.add_argument("--report-seeds", type=int, nargs="*", default=[])
    p.add_argument("--data-dir", default="")
    args = p.parse_args()
    grid = [0.5, 1, 2, 3, 4, 5, 6, 8, 10, 12, 15, 20, 25, 30, 40, 50, 60]
    for seed in args.seeds:
        a, truth = angles_of(args.dataset, args.rotation, args.clients, args.samples, seed,
                             args.data_dir, args.palette, args.basis)
        same = truth[:, None] == truth[None, :]
        off = ~np.eye(len(a), dtype=bool)
        print(f"seed {seed}: within-group angle {a[same & off].min():.2f}.."
              f"{a[same & off].max():.2f} deg, between-group {a[~same].min():.2f}.."
              f"{a[~same].max():.2f} deg")
        print("  threshold -> clusters, ARI: " + ", ".join(
            f"{t:g}: {len(set(pacfl_clusters(a, t).tolist()))}, "
            f"{adjusted_rand(truth, pacfl_clusters(a, t)):.2f}" for t in grid))
    for seed in args.report_seeds:
        a, truth = angles_of(args.dataset, args.rotation, args.clients, args.samples, seed,
                             args.data_dir, args.palette, args.basis)
        lab = pacfl_clusters(a, args.threshold)
        print(f"report seed {seed}, threshold {args.threshold:g}: {len(set(lab.tolist()))} "
              f"clusters, ARI {adjusted_rand(truth, lab):.2f}")


if __name__ == "__main__":
    main()
