"""Paper 000 Table 2 baseline: centralized DEC on the pooled data of a FedCRef system, with K
chosen by the silhouette score on a 2-D t-SNE; reports ACC (Hungarian) and K found.

    python bench/fedcref_central_dec.py --set dataset=mnist data-dir=$FEDCLUST_DATA_DIR \\
        fedcref.split=all num-clients=25 --seed 0 --k 5-15
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--set", nargs="*", default=[])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--k", default="5-15")
    ap.add_argument("--pretrain-epochs", type=int, default=50)
    ap.add_argument("--maxiter", type=int, default=2000)
    ap.add_argument("--tsne-samples", type=int, default=5000)
    ap.add_argument("--hidden", default="500,500,2000,10")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (shared machine: 1)")
    a = ap.parse_args()
    import torch

    from fedclust.config import validate
    from fedclust.fedcref.client import build_system, client_data
    from fedclust.fedcref.dec import CentralizedDEC
    from fedclust.fedcref.refine import label_agreement

    torch.set_num_threads(a.threads)
    cfg = validate({"method": "fedcref", "seed": a.seed,
                    **dict(p.split("=", 1) for p in a.set)})
    system, _ = build_system(cfg)
    parts = [client_data(cfg, i) for i in range(len(system))]
    x = np.concatenate([p[0] for p in parts])
    y = np.concatenate([p[1] for p in parts])
    x, uniq = np.unique(x, axis=0, return_index=True)   # overlap: pool each sample once
    y = y[uniq]
    lo, hi = (int(v) for v in a.k.split("-"))
    t0 = time.perf_counter()
    est = CentralizedDEC(k_range=tuple(range(lo, hi + 1)), tsne_samples=a.tsne_samples,
                         dec_options={"pretrain_epochs": a.pretrain_epochs,
                                      "maxiter": a.maxiter,
                                      "hidden": tuple(int(v) for v in a.hidden.split(","))},
                         random_state=a.seed).fit(x)
    out = {"samples": len(x), "global_k": int(np.unique(y).size), "k_found": est.n_clusters_,
           "acc": label_agreement(y, est.labels_), "silhouette": est.scores_,
           "acc_by_k": {k: label_agreement(y, lab) for k, lab in est.labels_by_k_.items()},
           "seconds": time.perf_counter() - t0}
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
