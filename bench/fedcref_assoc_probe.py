"""Association probe (eq. 2, the ratio or the calibrated test) on image clusters, without Flower.

Trains the cluster autoencoders of the first ``--clients`` clients of the 25-client system of
``--dataset`` on dirty clusters (``--dirtiness``), then reports for same-class and
different-class cluster pairs the one-direction acceptance rate, the mutual (both directions)
rate and the distribution of the test's statistic (eq. 2: the 75th percentile of the
normalised error gap; ratio: the quantile of the held-out log error ratio; calibrated: that quantile
divided by the one of the client's closest other cluster model); and, with
``--graph``, the iteration-1 graph (edges, wrong edges, communities, isolated) with all pairs
vs best match per client. ``--theta`` / ``--alpha`` take several values: the autoencoders are
trained once and every (θ, α) pair — or, with ``--rule ratio``, every ``--epsilon``, with
``calibrated`` every ``--lam`` — is evaluated on the same errors (one JSON line each)::

    python bench/fedcref_assoc_probe.py --clients 12 --dirtiness 0.0 \\
        --set fedcref.ae-init=torch fedcref.batch-size=64
    python bench/fedcref_assoc_probe.py --dataset fashion-mnist --clients 25 --graph \\
        --theta 0.05 0.1 0.15 0.2 --alpha 0.75 0.9
    python bench/fedcref_assoc_probe.py --rule ratio --epsilon 0.1 0.2 0.3 --seed 100 --graph
    python bench/fedcref_assoc_probe.py --rule calibrated --lam 0.3 0.5 0.7 --seed 100 --graph
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--clients", type=int, default=12)
    ap.add_argument("--dirtiness", type=float, default=0.3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--data-dir", default=os.environ.get("FEDCLUST_DATA_DIR", "data"))
    ap.add_argument("--dataset", default="mnist")
    ap.add_argument("--theta", type=float, nargs="*", default=None,
                    help="θ values to evaluate (default: the config's fedcref.theta)")
    ap.add_argument("--alpha", type=float, nargs="*", default=None,
                    help="α values to evaluate (default: the config's fedcref.alpha)")
    ap.add_argument("--rule", default="eq2", choices=("eq2", "ratio", "calibrated"),
                    help="association test (fedcref.assoc-rule); 'ratio' reads --epsilon, "
                    "'calibrated' --lam")
    ap.add_argument("--epsilon", type=float, nargs="*", default=None,
                    help="ε values of the ratio test (default: the config's fedcref.epsilon)")
    ap.add_argument("--lam", type=float, nargs="*", default=None,
                    help="λ values of the calibrated test (default: the config's "
                    "fedcref.lambda)")
    ap.add_argument("--graph", action="store_true")
    ap.add_argument("--set", nargs="*", default=[])
    args = ap.parse_args()

    import torch

    from fedclust.config import validate
    from fedclust.fedcref import autoencoder as ae
    from fedclust.fedcref import client as core
    from fedclust.fedcref.association import log_ratio_quantile, normalized_gap
    from fedclust.fedcref.keys import ClientSettings
    from fedclust.fedcref.system import dirty_clustering

    torch.set_num_threads(1)
    extra = dict(p.split("=", 1) for p in args.set)
    cfg = validate({"method": "fedcref", "dataset": args.dataset, "data-dir": args.data_dir,
                    "fedcref.split": "all", "num-clients": 25, "seed": args.seed,
                    "fedcref.assoc-rule": args.rule, **extra})
    settings = ClientSettings.from_config(cfg)
    n = args.clients
    sts, xs, ys = [], [], []
    t0 = time.perf_counter()
    for i in range(n):
        x, y = core.client_data(cfg, i)
        st = core.ClientState(labels=dirty_clustering(y, args.dirtiness, i),
                              k=len(np.unique(y)))
        core.train_local(st, x, settings, i)
        sts.append(st), xs.append(x), ys.append(y)
    out: dict = {"config": extra, "clients": n, "dirtiness": args.dirtiness,
                 "train_s": round(time.perf_counter() - t0, 1)}
    owner = [(i, int(q)) for i in range(n) for q in sts[i].model_clusters]
    row = {o: r for r, o in enumerate(owner)}
    models = ae.concat([s.models for s in sts])
    errs = [ae.errors(models, xs[i]) for i in range(n)]
    hist = {(i, q): np.bincount(ys[i][sts[i].labels == q], minlength=10) for i, q in owner}
    major = {k: int(np.argmax(h)) for k, h in hist.items()}
    gaps = {}
    for i, q in owner:
        mask = sts[i].labels == q
        own = errs[i][row[(i, q)]][mask]
        for j, p in owner:
            if j != i:
                gaps[(i, q, j, p)] = normalized_gap(own, errs[i][row[(j, p)]][mask])
    q75 = {k: float(np.quantile(d, 0.75)) for k, d in gaps.items()}
    ratio: dict[tuple, float] = {}     # ratio test statistic per ordered pair
    anchor: dict[tuple, float] = {}    # calibrated test: s_d of the client's other clusters
    if args.rule in ("ratio", "calibrated"):
        for i, q in owner:
            mask = (sts[i].labels == q) & sts[i].held_out
            own = errs[i][row[(i, q)]][mask]
            for j, p in owner:
                if j != i:
                    ratio[(i, q, j, p)] = float(log_ratio_quantile(
                        own, errs[i][row[(j, p)]][mask], cfg["fedcref.ratio-quantile"]))
            others = [row[(i, int(r))] for r in sts[i].model_clusters if int(r) != q]
            anchor[(i, q)] = float(log_ratio_quantile(own, errs[i][others][:, mask],
                                                      cfg["fedcref.ratio-quantile"]).min()
                                   ) if others else float("nan")
    base = out
    if args.rule == "ratio":
        grid = [(None, None, eps) for eps in args.epsilon or [cfg["fedcref.epsilon"]]]
    elif args.rule == "calibrated":
        grid = [(None, None, ("lam", lam)) for lam in args.lam or [cfg["fedcref.lambda"]]]
    else:
        grid = [(theta, alpha, None) for theta in args.theta or [cfg["fedcref.theta"]]
                for alpha in args.alpha or [cfg["fedcref.alpha"]]]
    for theta, alpha, eps in grid:
        if eps is None:
            ok = {k: float((d <= theta).mean()) >= alpha for k, d in gaps.items()}
            stat = q75
            params = {"theta": theta, "alpha": alpha}
        elif isinstance(eps, tuple):
            lam = eps[1]
            ok = {k: r <= lam * anchor[k[:2]] for k, r in ratio.items()}   # NaN anchor: False
            stat = {k: r / anchor[k[:2]] for k, r in ratio.items()
                    if np.isfinite(anchor[k[:2]]) and anchor[k[:2]] > 0}
            params = {"lambda": lam}
            eps = None
        else:
            ok = {k: r <= eps for k, r in ratio.items()}
            stat = ratio
            params = {"epsilon": eps}
        out = {**base, "dataset": args.dataset, "rule": args.rule, **params}
        for name, same in (("same_class", True), ("different_class", False)):
            keys = [k for k in stat if (major[k[:2]] == major[k[2:]]) == same]
            out[name] = {
                "pairs": len(keys),
                "accept_one_direction": round(float(np.mean([ok[k] for k in keys])), 3),
                "accept_mutual": round(float(np.mean([ok[k] and ok[k[2:] + k[:2]]
                                                      for k in keys])), 3),
                "statistic_percentiles_5_25_50_75_95": np.percentile(
                    [stat[k] for k in keys], [5, 25, 50, 75, 95]).round(3).tolist()}
        if args.graph:
            c = {**cfg, "fedcref.theta": theta or cfg["fedcref.theta"],
                 "fedcref.alpha": alpha or cfg["fedcref.alpha"],
                 "fedcref.epsilon": cfg["fedcref.epsilon"] if eps is None else eps,
                 "fedcref.lambda": params.get("lambda", cfg["fedcref.lambda"])}
            for mode in ("all_pairs", "best_per_client"):
                out[mode] = _graph(sts, xs, owner, row, errs, major, hist, c,
                                   per_client=mode == "best_per_client")
        print(json.dumps(out), flush=True)


def _graph(sts, xs, owner, row, errs, major, hist, cfg, per_client) -> dict:
    """The iteration-1 cluster graph from every client's accept matrix."""
    from fedclust.fedcref.association import accept_matrix, communities, mutual_edges
    from fedclust.fedcref.evaluation import wrong_associations

    accept = {}
    for i in range(len(sts)):
        fk = [r for r, (j, _) in enumerate(owner) if j != i]
        groups = np.array([owner[r][0] for r in fk]) if per_client else None
        own = np.full((sts[i].k, len(xs[i])), np.nan, np.float32)
        own[sts[i].model_clusters] = errs[i][[row[(i, int(q))] for q in sts[i].model_clusters]]
        acc = accept_matrix(sts[i].labels, own, errs[i][fk], cfg["fedcref.theta"],
                            cfg["fedcref.alpha"], cfg["fedcref.min-cluster-size"], groups,
                            cfg["fedcref.assoc-rule"], cfg["fedcref.epsilon"],
                            cfg["fedcref.ratio-quantile"], sts[i].held_out,
                            cfg["fedcref.lambda"])
        for q in range(sts[i].k):
            accept[(i, q)] = {owner[fk[c]] for c in np.flatnonzero(acc[q])}
    edges = mutual_edges(accept)
    comms, iso = communities(owner, edges)
    return {"edges": len(edges), "wrong_edges": sum(major[a] != major[b] for a, b in edges),
            "communities": len(comms), "isolated": len(iso),
            "wrong_pct": round(wrong_associations(comms, hist)[2], 1)}


if __name__ == "__main__":
    main()
