"""Backdoor MNIST: the EMD excess between colour sets after round 0, for one configuration.

A small stand-in for the round 0 + clustering step of an EMD-CFL run (no Flower, no keys):
``k`` clients per set (set = client % 3, as in the real federation) train the shared initial
model for ``--epochs``; then for every ordered pair ``(c, o)`` the excess
``W(train_c, val_o) − W(train_c, val_c)`` is computed under ``c``'s model with one random
projection and subsample per pair, as in the protocol. Prints, per ordered pair of sets, the
min / mean / max excess, the same under the AND rule (max of both directions), and the
clustering (identical neighbourhoods) at several ε. Used to find what separates the two
uniform colours::

    taskset -c 1 python bench/bench_emdcfl_backdoor_gap.py --data-dir "$FEDCLUST_DATA_DIR" \\
        --per-set 4
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np


def main(argv: list[str] | None = None) -> int:
    import torch

    from fedclust.emdcfl import data as D
    from fedclust.emdcfl import model as M
    from fedclust.emdcfl.cluster import neighbourhood_clusters, threshold_adjacency
    from fedclust.emdcfl.distance import wasserstein
    from fedclust.emdcfl.privacy import projection_matrix, subsample
    from fedclust.metrics import adjusted_rand

    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data-dir", default="")
    p.add_argument("--per-set", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--samples", type=int, default=5420)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--conv1", type=int, default=8)
    p.add_argument("--conv2", type=int, default=16)
    p.add_argument("--metric", default="cosine")
    p.add_argument("--proj-ratio", type=float, default=0.9)
    p.add_argument("--max-samples", type=int, default=512)
    p.add_argument("--colours", choices=["ours", "wide", "authors"], default="wide",
                   help="emdcfl.backdoor-colours: authors = the notebook's green (0.26, 0.63, "
                        "0.4), purple (149, 52, 235)/255 and summer(y/39) shades; wide (alias "
                        "ours) = summer(0.5), summer(y/9), (0.5, 0, 0.5)")
    p.add_argument("--norm", choices=["rgb", "grey"], default="rgb",
                   help="rgb: per-channel ImageNet mean/std (fedclust.emdcfl.model.to_tensor, "
                        "the authors' CMNIST transform); grey: the MNIST mean/std on every "
                        "channel (the code before this probe)")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    if args.norm == "grey":
        def to_tensor(x: np.ndarray) -> torch.Tensor:
            t = torch.from_numpy(np.ascontiguousarray(x)).float().div_(255.0)
            t = t.unsqueeze(1) if t.ndim == 3 else t.permute(0, 3, 1, 2).contiguous()
            return t.sub_(0.1307).div_(0.3081)
        M.to_tensor = to_tensor
    t0 = time.perf_counter()
    n = 3 * args.per_set
    spec = M.ModelSpec(in_channels=3, size=28, c1=args.conv1, c2=args.conv2)
    init = M.init_weights(spec, args.seed)
    splits = [D.client_split("backdoor-mnist", "max", i, 30, args.samples, 250, 0.1,
                             args.seed, args.data_dir,
                             "authors" if args.colours == "authors" else "wide")
              for i in range(n)]
    models, accs = [], []
    for i, s in enumerate(splits):
        w, _ = M.train_local(spec, init, s.x_train, s.y_train, args.epochs, args.lr,
                             args.batch_size, seed=1000 * args.seed + i)
        models.append(w)
        accs.append(M.evaluate(spec, w, s.x_test, s.y_test)[1])
    t_train = time.perf_counter() - t0
    rng = np.random.default_rng(args.seed)
    e_train = [M.embed(spec, models[c], splits[c].x_train) for c in range(n)]
    excess = np.zeros((n, n))
    for c in range(n):
        vals = M.embed_many(spec, [models[c]], splits[c].x_val)[0]
        for o in range(n):
            if o == c:
                continue
            R = projection_matrix(rng, spec.embed_dim, args.proj_ratio)
            tgt = M.embed(spec, models[c], splits[o].x_val)
            src, t_o, t_c = (e[subsample(rng, len(e), args.max_samples)] @ R
                             for e in (e_train[c], tgt, vals))
            excess[c, o] = (wasserstein(src, t_o, args.metric)
                            - wasserstein(src, t_c, args.metric))
    setid = np.arange(n) % 3
    off = ~np.eye(n, dtype=bool)
    sym = np.maximum(excess, excess.T)
    print(f"config {json.dumps(vars(args))}")
    print("test acc of round-0 models per set: "
          + ", ".join(f"{a}: {np.mean([x for x, s in zip(accs, setid) if s == a]):.3f}"
                      for a in range(3)) + f"; train {t_train:.0f} s")
    names = {0: "green", 1: "shaded", 2: "purple"}
    within = sym[(setid[:, None] == setid[None]) & off]
    print(f"within-set: directed max {excess[(setid[:, None] == setid[None]) & off].max():.4f},"
          f" AND max {within.max():.4f}")
    for a in range(3):
        for b in range(3):
            if a == b:
                continue
            m = (setid[:, None] == a) & (setid[None] == b)
            print(f"  {names[a]:>6} model -> {names[b]:<6} val: excess min {excess[m].min():+.4f}"
                  f" mean {excess[m].mean():+.4f} max {excess[m].max():+.4f}")
    for a, b in ((0, 1), (0, 2), (1, 2)):
        m = (setid[:, None] == a) & (setid[None] == b)
        print(f"  AND {names[a]}-{names[b]}: min {sym[m].min():.4f}")
    bmin = min(sym[(setid[:, None] == a) & (setid[None] == b)].min()
               for a, b in ((0, 1), (0, 2), (1, 2)))
    print(f"  SUMMARY within AND max {within.max():.4f} between AND min {bmin:.4f} "
          f"ratio {bmin / max(within.max(), 1e-9):.2f}")
    res = []
    for eps in (0.03, 0.05, 0.08, 0.1, 0.15):
        lab = neighbourhood_clusters(threshold_adjacency(excess, eps))
        res.append(f"eps {eps:g}: {len(set(lab.tolist()))} cl ARI {adjusted_rand(setid, lab):.2f}")
    print("  " + " | ".join(res) + f"  [{time.perf_counter() - t0:.0f} s]", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
