"""CLI: ``python -m fedclust.experiments <table> DIR...`` (tables: see ``TABLES``)."""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from fedclust import fcm
from fedclust.data.tabular import load_dataset
from fedclust.fcm.keys import FCMSettings
from fedclust.fedfcm.keys import FedFCMSettings
from fedclust.metrics import format_ci, matched_center_distance
from fedclust.results import read_history

PAPER_004 = {  # Table 1: ARI(gamma) and ||V_fed - V_sum||_F for gamma = .25 .5 .75 1
    "xclara": ([0.99269, 0.99279, 0.99289, 0.99289], [0.00893, 0.00545, 0.00250, 0.0]),
    "s-set1": ([0.90418, 0.90384, 0.89645, 0.89728], [0.11640, 0.09915, 0.04865, 0.0]),
    "pendigits": ([0.42051, 0.42115, 0.42291, 0.42468], [0.11147, 0.08261, 0.03018, 0.0]),
    "waveform": ([0.24243, 0.24366, 0.24445, 0.24359], [0.03233, 0.01877, 0.02049, 0.0]),
}
PAPER_003_T1 = {"central": [0.8707, 0.5687, 0.4869, 0.4348, 0.5440, 0.6707, 0.5680],
                "kmeans": [0.8179, 0.6055, 0.4951, 0.4289, 0.6202, 0.5072, 0.6221],
                "fedavg": [1.0047, 0.9143, 1.1683, 2.9158, 1.5063, 0.9248, 1.2115]}
PAPER_003_LOCAL = {  # Tables 1-2: local clients 1-3, K = 2..5
    "kmeans": [[0.6426, 0.6437, 0.6381], [0.7289, 0.6991, 0.7704], [1.0637, 1.0706, 1.1248],
               [0.9260, 0.8927, 0.9496]],
    "fedavg": [[1.0356, 0.8620, 0.9685], [0.8880, 0.8370, 0.8647], [1.1924, 0.9221, 1.1662],
               [2.8867, 2.4132, 2.9538]]}
PAPER_004_GAMMAS = (0.25, 0.5, 0.75, 1.0)
PAPER_003_T3 = {"kmeans": {1: 92.9, 2: 91.4, 5: 88.0, 10: 87.2},
                "fedavg": {2: 90.4, 5: 89.5, 10: 88.9}}


def stored(cls: type[FCMSettings] | type[FedFCMSettings], config: dict[str, Any]
           ) -> Any:
    """The settings of a stored run's ``config`` (keys added since it ran: their defaults)."""
    from fedclust.config import defaults

    return cls.from_config({**defaults(), **config})


def summaries(dirs: list[str]) -> list[tuple[Path, dict[str, Any]]]:
    out = []
    for d in dirs:
        for path in sorted(Path(d).rglob("summary.json")):
            out.append((path.parent, json.loads(path.read_text())))
    if not out:
        raise SystemExit(f"no summary.json under {dirs}")
    return out


def fcm_table1(dirs: list[str]) -> str:
    """Paper 004 Table 1 with the centralized reference from the same initial centers."""
    rows: dict[tuple[str, float], dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    pooled: dict[str, np.ndarray] = {}
    for job, s in summaries(dirs):
        cfg = s["config"]
        st = stored(FCMSettings, cfg)
        name = cfg["dataset"]
        if name not in pooled:
            x = load_dataset(cfg).x
            lo, hi = x.min(0), x.max(0)
            pooled[name] = (x - lo) / np.where(hi > lo, hi - lo, 1.0)
        init = np.load(job / "initial_centers.npy")
        central = fcm.fcm_from_centers(pooled[name], init, st.m, st.epsilon,
                                       st.max_rounds).centers
        fed = np.load(job / "centers.npy")
        r = rows[(name, st.fraction)]
        r["ari"].append(s["metrics"]["eval_ari"])
        r["dist"].append(matched_center_distance(fed, central))
        r["rounds"].append(s["metrics"]["rounds"])
    gammas = sorted({g for _, g in rows})
    lines = ["| dataset | γ | ARI (ours, mean ± 95% CI) | ARI (paper) | ‖V_fed − V_sum‖_F (ours) "
             "| (paper) | rounds | seeds |", "|---|---|---|---|---|---|---|---|"]
    for name in PAPER_004:
        for g in gammas:
            r = rows.get((name, g))
            if not r:
                continue
            pa, pd = PAPER_004[name]
            gi = PAPER_004_GAMMAS.index(g) if g in PAPER_004_GAMMAS else None
            paper = [f"{pa[gi]:.5f}", f"{pd[gi]:.5f}"] if gi is not None else ["—", "—"]
            lines.append(f"| {name} | {g} | {format_ci(r['ari'], 5)} | {paper[0]} | "
                         f"{format_ci(r['dist'], 5)} | {paper[1]} | {np.mean(r['rounds']):.1f} | "
                         f"{len(r['ari'])} |")
    return "\n".join(lines)


def central_index(cfg: dict[str, Any], ks: list[int], seeds: int = 10) -> list[float]:
    """Non-federated fuzzy DB on the pooled data (FCM from k-means++, best of ``seeds``)."""
    from fedclust.fcm.validity import fuzzy_db

    x = load_dataset(cfg).x
    st = stored(FedFCMSettings, cfg)
    out = []
    for k in ks:
        fits = [fcm.FuzzyCMeans(k, m=st.m, tol=1e-6, max_iter=300, init="k-means++",
                                random_state=r).fit(x) for r in range(seeds)]
        best = min(fits, key=lambda f: fcm.objective(x, f.cluster_centers_, st.m))
        out.append(fuzzy_db(x, best.cluster_centers_, st.m, st.p, st.q))
    return out


def _counts(values: list[int]) -> dict[int, int]:
    keys, counts = np.unique(values, return_counts=True)
    return {int(k): int(c) for k, c in zip(keys, counts)}


def fedfcm_table1(dirs: list[str], plot: str = "") -> str:
    """Paper 003 Tables 1-2: index per K, federated (ours vs paper), central and per client."""
    by_avg: dict[str, list[dict[str, Any]]] = defaultdict(list)
    cfg0 = None
    for _, s in summaries(dirs):
        by_avg[stored(FedFCMSettings, s["config"]).averaging].append(s["metrics"])
        cfg0 = s["config"]
    ks0 = next(iter(by_avg.values()))[0]["ks"]
    central = central_index(cfg0, ks0)
    out = ["central (ours, pooled data, FCM best of 10 k-means++ starts): "
           + ", ".join(f"K={k}: {v:.4f}" for k, v in zip(ks0, central))
           + f" → argmin K = {ks0[int(np.argmin(central))]}\n"]
    for avg, runs in sorted(by_avg.items(), reverse=True):
        ks = runs[0]["ks"]
        fed = np.array([r["index"] for r in runs])
        local = np.array([[v for v in r["local_index"].values()] for r in runs], dtype=float)
        best = [int(r["best_k"]) for r in runs]
        lbest = [int(k) for r in runs for k in r["local_best_k"].values()]
        out.append(f"**{avg} averaging** ({len(runs)} seeds): federated argmin K = "
                   f"{_counts(best)}; clients' local argmin K = {_counts(lbest)}\n")
        out.append("| K | federated (ours) | federated (paper) | central (ours) | central (paper) "
                   "| local client 1 (ours / paper) "
                   "| local client 2 (ours / paper) | local client 3 (ours / paper) |")
        out.append("|---|---|---|---|---|---|---|---|")
        paper_local = PAPER_003_LOCAL[avg]
        for i, k in enumerate(ks):
            loc = [(f"{np.nanmean(local[:, c, i]):.4f}" if np.isfinite(local[:, c, i]).any()
                    else "—") + (f" / {paper_local[k - 2][c]:.4f}"
                                 if 2 <= k < 2 + len(paper_local) and c < 3 else "")
                   for c in range(local.shape[1])]
            out.append(f"| {k} | {format_ci(list(fed[:, i]), 4)} | "
                       f"{PAPER_003_T1[avg][i]:.4f} | {central[i]:.4f} | "
                       f"{PAPER_003_T1['central'][i]:.4f} | " + " | ".join(loc) + " |")
        out.append("")
        if plot:
            from fedclust.plots import plot_index_vs_k

            names = ["1", "2", "3"]
            plot_index_vs_k(Path(f"{plot}_{avg}.png"), ks, fed.mean(0), central,
                            {n: np.nanmean(local[:, c], axis=0) for c, n in enumerate(names)},
                            title=f"Motivational example, {avg} averaging ({len(runs)} seeds)")
    return "\n".join(out)


def fedfcm_table3(dirs: list[str], threshold: float = 1.3) -> str:
    """Paper 003 Table 3: detection rate of K = 2 over runs with FedFuzzDB < threshold."""
    hits: dict[tuple[str, int], list[bool]] = defaultdict(list)
    seen: dict[tuple[str, int], int] = defaultdict(int)
    by_dim: dict[tuple[int, int], list[bool]] = defaultdict(list)
    for _, s in summaries(dirs):
        cfg, m = s["config"], s["metrics"]
        averaging = stored(FedFCMSettings, cfg).averaging
        key = (averaging, cfg["num-clients"])
        seen[key] += 1
        if m["fedfuzzdb"][str(m["best_k"])] < threshold:
            hits[key].append(m["best_k"] == 2)
            if averaging == "kmeans":
                by_dim[(cfg["g2.dim"], cfg["num-clients"])].append(m["best_k"] == 2)
    lines = [f"| averaging | clients | correct K (ours) | (paper) | runs with index < {threshold} "
             f"| runs |", "|---|---|---|---|---|---|"]
    for (avg, p) in sorted(seen):
        if p == 1 and avg == "fedavg":
            continue   # one client: both averagings are the same central FCM
        h = hits[(avg, p)]
        paper = PAPER_003_T3.get(avg, {}).get(p)
        label = "central" if p == 1 else str(p)
        lines.append(f"| {avg if p > 1 else '—'} | {label} | {100 * np.mean(h):.1f}% | "
                     f"{'' if paper is None else f'{paper}%'} | {len(h)} | {seen[(avg, p)]} |")
    dims = sorted({d for d, _ in by_dim})
    clients = sorted({p for _, p in by_dim})
    lines += ["", "k-means averaging, correct K by dimension D (paper Figure 3; runs with index "
              f"< {threshold}):", "", "| D | " + " | ".join(
                  "central" if p == 1 else f"P={p}" for p in clients) + " |",
              "|---|" + "---|" * len(clients)]
    for d in dims:
        cells = [f"{100 * np.mean(by_dim[(d, p)]):.0f}% ({len(by_dim[(d, p)])})"
                 if by_dim[(d, p)] else "—" for p in clients]
        lines.append(f"| {d} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def fedfcm_bank(dirs: list[str], plot: str = "") -> str:
    """Paper 003 §3.2.3: FedFuzzDB vs K on bank marketing (11 job clients; 1 client = central)."""
    lines = ["| run | clients | K range | FedFuzzDB per K | argmin | elbow |",
             "|---|---|---|---|---|---|"]
    fed, central, local = [], None, None
    for job, s in summaries(dirs):
        m = s["metrics"]
        lines.append(f"| {job.name} (seed {s['seed']}) | {s['num_clients']} | "
                     f"{m['ks'][0]}..{m['ks'][-1]} | "
                     + ", ".join(f"{v:.3f}" for v in m["index"])
                     + f" | {m['best_k']} | {m['elbow_k']} |")
        if s["num_clients"] == 1:
            central = m["index"]
        else:
            fed.append(m["index"])
            local = local or m.get("local_index")
    if plot and fed:
        from fedclust.plots import plot_index_vs_k

        ks = summaries(dirs)[0][1]["metrics"]["ks"]
        plot_index_vs_k(Path(f"{plot}.png"), ks, np.mean(fed, axis=0), central, local,
                        title=f"Bank marketing by job (federated: mean of {len(fed)} seeds)")
    return "\n".join(lines)


RUN_ONLY_KEYS = ("seed", "output-dir")   # differ between the seeds of one setting


def config_groups(runs: list[tuple[Path, dict[str, Any]]]
                  ) -> list[tuple[dict[str, Any], list[tuple[Path, dict[str, Any]]]]]:
    """Runs grouped by their run config without ``seed``/``output-dir`` (one setting each).

    Returns ``(differing, runs)`` per group in first-seen order, where ``differing`` holds the
    group's values of the keys that are not equal across all groups (its label).
    """
    groups: dict[str, list[tuple[Path, dict[str, Any]]]] = {}
    configs: dict[str, dict[str, Any]] = {}
    for job, s in runs:
        cfg = {k: v for k, v in s.get("config", {}).items() if k not in RUN_ONLY_KEYS}
        key = json.dumps(cfg, sort_keys=True, default=str)
        groups.setdefault(key, []).append((job, s))
        configs[key] = cfg
    names = sorted({k for c in configs.values() for k in c})
    varying = [k for k in names if len({json.dumps(c.get(k), default=str)
                                        for c in configs.values()}) > 1]
    return [({k: configs[key].get(k) for k in varying}, members)
            for key, members in groups.items()]


def fedcref_figure4(dirs: list[str], plot: str = "") -> str:
    """Paper 000 Figure 4 across seeds, one figure per setting.

    Every run under ``dirs`` is grouped by its run config minus seed and output dir (a Hydra
    multirun numbers its job folders, so one sweep folder mixes settings); per group, a table
    of the final metrics per run and, with ``--plot PREFIX``, the mean ± 95% CI per iteration
    (iteration 0 = the start, from each summary) in ``PREFIX.png`` (one group) or
    ``PREFIX_<i>.png`` (group i, as numbered in the output).
    """
    from fedclust.fedcref.plots import start_record

    groups = config_groups(summaries(dirs))
    out = []
    for i, (label, runs) in enumerate(groups, start=1):
        name = ", ".join(f"{k}={v}" for k, v in label.items()) or "all runs"
        lines = [f"**setting {i}**: {name} ({len(runs)} runs)", ""] if len(groups) > 1 else []
        lines += ["| run | seed | iterations | communities | isolated start → end | wrong % "
                  "| ACC start → end |", "|---|---|---|---|---|---|---|"]
        histories, starts, global_k = [], [], None
        for job, s in runs:
            m = s["metrics"]
            history = read_history(job / "history.jsonl")
            histories.append(history)
            starts.append(start_record(m, history))
            global_k = m.get("eval_global_k", global_k)
            lines.append(f"| {job.parent.name}/{job.name} | {s['seed']} | {m['iterations']} | "
                         f"{m['communities']} | {m['isolated_start']} → {m['isolated_end']} | "
                         f"{_num(m.get('eval_wrong_associations_pct'), 1)} | "
                         f"{_num(m.get('eval_acc_start'), 3)} → "
                         f"{_num(m.get('eval_acc_end'), 3)} |")
        if plot:
            from fedclust.fedcref.plots import figure4

            path = Path(f"{plot}.png" if len(groups) == 1 else f"{plot}_{i}.png")
            figure4(path, histories, global_k=global_k, starts=starts,
                    title=f"FedCRef, {name}: mean ± 95% CI over {len(histories)} runs")
            lines += ["", f"figure: {path}"]
        out.append("\n".join(lines))
    return "\n\n".join(out)


def _num(value: Any, nd: int) -> str:
    return "nan" if value is None else f"{float(value):.{nd}f}"


TABLES = {"fcm-table1": fcm_table1, "fedfcm-table1": fedfcm_table1,
          "fedfcm-table3": fedfcm_table3, "fedfcm-bank": fedfcm_bank,
          "fedcref-figure4": fedcref_figure4}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("table", choices=sorted(TABLES))
    parser.add_argument("dirs", nargs="+")
    parser.add_argument("--plot", default="", help="PNG path prefix for tables that draw one")
    args = parser.parse_args()
    fn = TABLES[args.table]
    print(fn(args.dirs, plot=args.plot) if args.plot else fn(args.dirs))


if __name__ == "__main__":
    main()
