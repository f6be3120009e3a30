"""Iteration-1 evidence of FedCRef's association tests, cached per system (no Flower).

Builds the simulated system of ``--dataset`` (``--clients`` × ``--samples-per-cluster``,
dirty start), trains every client's cluster autoencoders as the run's first local phase does
(the same client step, :func:`fedclust.fedcref.client.train_local`, with the held-out share),
and saves, per client, the reconstruction errors of *every* cluster model of the system on
the client's samples, its start labels, its held-out mask and (evaluation only) its true
classes. Association tests are then compared on these errors without retraining
(:mod:`bench.fedcref_pairs_eval`)::

    python bench/fedcref_pairs_cache.py --dataset mnist --clients 10 --samples-per-cluster 60 \\
        --seed 100 --out runs/pairs
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")


def cache_path(out: Path, dataset: str, clients: int, spc: int, seed: int,
               dirtiness: float) -> Path:
    return out / f"{dataset}-n{clients}-s{spc}-d{dirtiness}-seed{seed}.npz"


def build(dataset: str, clients: int, spc: int, seed: int, dirtiness: float, data_dir: str,
          out: Path, extra: dict[str, str] | None = None) -> Path:
    import torch

    from fedclust.config import validate
    from fedclust.fedcref import autoencoder as ae
    from fedclust.fedcref import client as core
    from fedclust.fedcref.initial import Dirty, initial_clustering
    from fedclust.fedcref.keys import ClientSettings

    path = cache_path(out, dataset, clients, spc, seed, dirtiness)
    if path.exists():
        return path
    torch.set_num_threads(1)
    cfg = validate({"method": "fedcref", "dataset": dataset, "data-dir": data_dir,
                    "fedcref.split": "all", "num-clients": clients, "seed": seed,
                    "fedcref.samples-per-cluster": spc, "fedcref.dirtiness": dirtiness,
                    "output-dir": "unused", **(extra or {})})
    settings = ClientSettings.from_config(cfg)
    t0 = time.perf_counter()
    sts, xs, ys = [], [], []
    phase = core.derive_seed(seed, 1, 1)
    for i in range(clients):
        x, y = core.client_data(cfg, i)
        key = core.client_key(x)
        start = initial_clustering(Dirty(dirtiness), x, int(np.unique(y).size), y_true=y,
                                   random_state=core.derive_seed(seed, key, 0))
        st = core.ClientState(labels=start, k=int(np.unique(y).size))
        core.train_local(st, x, settings, core.derive_seed(phase, key))
        sts.append(st), xs.append(x), ys.append(y)
    owner = np.array([(i, int(q)) for i in range(clients) for q in sts[i].model_clusters],
                     dtype=np.int64).reshape(-1, 2)
    models = ae.concat([s.models for s in sts])
    arrays: dict[str, np.ndarray] = {"owner": owner}
    for i in range(clients):
        arrays[f"err{i}"] = ae.errors(models, xs[i]).astype(np.float32)
        arrays[f"labels{i}"] = sts[i].labels
        arrays[f"held{i}"] = (sts[i].held_out if sts[i].held_out is not None
                              else np.zeros(len(xs[i]), bool))
        arrays[f"y{i}"] = ys[i]
    out.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp.npz")
    np.savez_compressed(tmp, **arrays, seconds=time.perf_counter() - t0)
    os.replace(tmp, path)
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dataset", default="mnist")
    ap.add_argument("--clients", type=int, nargs="+", default=[10])
    ap.add_argument("--samples-per-cluster", type=int, nargs="+", default=[60])
    ap.add_argument("--seed", type=int, nargs="+", default=[100])
    ap.add_argument("--dirtiness", type=float, default=0.3)
    ap.add_argument("--data-dir", default=os.environ.get("FEDCLUST_DATA_DIR", "data"))
    ap.add_argument("--out", default="runs/pairs")
    ap.add_argument("--set", nargs="*", default=[])
    args = ap.parse_args()
    extra = dict(p.split("=", 1) for p in args.set)
    for n in args.clients:
        for s in args.samples_per_cluster:
            for seed in args.seed:
                t0 = time.perf_counter()
                try:
                    p = build(args.dataset, n, s, seed, args.dirtiness, args.data_dir,
                              Path(args.out), extra)
                except Exception as exc:      # a system that does not fit this seed
                    print(f"{args.dataset} n{n} s{s} seed{seed}: {exc}", flush=True)
                    continue
                print(f"{p} {time.perf_counter() - t0:.0f}s", flush=True)


if __name__ == "__main__":
    main()
