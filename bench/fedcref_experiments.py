"""Driver for the FedCRef experiments (paper 000 Tables 1–8) through the in-process grid.

Runs the real ServerApp/ClientApp (``server_app.inprocess.run_server``) once per seed and
records wall time and peak memory (ru_maxrss) next to each run's summary.json::

    python bench/fedcref_experiments.py --name mnist-d0.3 --seeds 0 1 2 \\
        --set dataset=mnist data-dir=$FEDCLUST_DATA_DIR fedcref.dirtiness=0.3

    python bench/fedcref_experiments.py --table runs/fedcref   # markdown table of all runs
    python bench/fedcref_experiments.py --table runs/fedcref --paired mnist-ratio mnist-local
        # ACC end of the first minus the second, seed by seed, on the seeds both ran
    python bench/fedcref_experiments.py --grid runs/grid
        # one row per system: experiments named <system>-default, -local, -perfect
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")


def _parse(pairs: list[str]) -> dict[str, str]:
    out = {}
    for p in pairs:
        k, _, v = p.partition("=")
        out[k] = v
    return out


def run(name: str, seeds: list[int], overrides: dict[str, str], out_root: Path) -> None:
    from server_app.inprocess import run_server

    for seed in seeds:
        out = out_root / name / f"seed{seed}"
        if (out / "summary.json").exists():
            print(f"skip {out} (done)")
            continue
        cfg = {"method": "fedcref", "seed": seed, "output-dir": str(out), "num-clients": 25,
               **overrides}
        t0 = time.perf_counter()
        summary, _ = run_server(cfg)
        wall = time.perf_counter() - t0
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 ** 2
        (out / "bench.json").write_text(json.dumps({"wall_s": wall, "peak_rss_gib": peak}))
        m = summary["metrics"]
        print(f"{name} seed {seed}: {wall:.0f}s peak {peak:.2f} GiB acc "
              f"{m.get('eval_acc_start')} -> {m.get('eval_acc_end')} comm {m['communities']} "
              f"wrong {m.get('eval_wrong_associations_pct')}", flush=True)


def _max_wrong_pct(history: Path) -> float:
    """Largest per-iteration wrong-association share of a run (NaN without a history)."""
    from fedclust.results import read_history

    if not history.exists():
        return float("nan")
    vals = [v for h in read_history(history)
            if (v := h.get("eval_wrong_associations_pct")) is not None]
    return max(vals) if vals else float("nan")


def table(root: Path) -> str:
    """Mean ± 95% CI per experiment, then one line per seed.

    "isolated start" is the paper's convention (every cluster before any association, Σ K_i);
    "after it. 1" is the count after the first association.
    """
    from fedclust.metrics import format_ci, mean_ci

    rows = ["| experiment | runs | ACC start | ACC end | communities | ideal | wrong ass. % | "
            "wrong ass. % max over it. | isolated start → after it. 1 → end | iterations | "
            "wall s |", "|" + "---|" * 11]
    seeds = ["| experiment | seed | ACC start → end | communities | wrong ass. % (max over it.) | "
             "isolated start → it. 1 → end | iterations | stop | wall s |", "|" + "---|" * 9]
    for exp in sorted(p for p in root.iterdir() if p.is_dir()):
        runs = sorted(p.parent for p in exp.glob("seed*/summary.json"))
        if not runs:
            continue
        ms = [json.loads((r / "summary.json").read_text())["metrics"] for r in runs]
        walls = [json.loads((r / "bench.json").read_text())["wall_s"]
                 if (r / "bench.json").exists() else float("nan") for r in runs]
        worst = [_max_wrong_pct(r / "history.jsonl") for r in runs]

        def f(key: str, nd: int = 3, ms=ms) -> str:
            return format_ci([x.get(key) if x.get(key) is not None else float("nan")
                              for x in ms], nd)

        rows.append(f"| {exp.name} | {len(ms)} | {f('eval_acc_start')} | {f('eval_acc_end')} | "
                    f"{f('communities', 1)} | {f('eval_ideal_communities', 1)} | "
                    f"{f('eval_wrong_associations_pct', 1)} | {format_ci(worst, 1)} | "
                    f"{f('isolated_start', 1)} → "
                    f"{f('isolated_first', 1)} → {f('isolated_end', 1)} | "
                    f"{f('iterations', 1)} | {mean_ci(walls)[0]:.0f} |")
        for r, m, w, top in zip(runs, ms, walls, worst, strict=True):
            nan = float("nan")
            seeds.append(f"| {exp.name} | {r.name[4:]} | {m.get('eval_acc_start', nan):.3f} → "
                         f"{m.get('eval_acc_end', nan):.3f} | {m.get('communities')} | "
                         f"{m.get('eval_wrong_associations_pct', nan):.1f} ({top:.1f}) | "
                         f"{m.get('isolated_start')} → {m.get('isolated_first')} → "
                         f"{m.get('isolated_end')} | {m.get('iterations')} | "
                         f"{m.get('stop_reason')} | {w:.0f} |")
    return "\n".join(rows) + "\n\n" + "\n".join(seeds)


def paired(root: Path, a: str, b: str) -> str:
    """ACC end of experiment ``a`` minus ``b`` on the seeds both finished: mean ± 95% CI."""
    from fedclust.metrics import format_ci

    def acc(name: str) -> dict[str, float]:
        return {p.parent.name: json.loads(p.read_text())["metrics"]["eval_acc_end"]
                for p in (root / name).glob("seed*/summary.json")}

    ea, eb = acc(a), acc(b)
    seeds = sorted(set(ea) & set(eb), key=lambda s: int(s[4:]))
    diffs = [ea[s] - eb[s] for s in seeds]
    per_seed = " / ".join(f"{d:+.3f}" for d in diffs)
    return (f"{a} − {b}: {format_ci(diffs)} over seeds {', '.join(s[4:] for s in seeds)} "
            f"({per_seed})")


def _runs(root: Path, name: str) -> dict[int, Path]:
    return {int(p.parent.name[4:]): p.parent for p in (root / name).glob("seed*/summary.json")}


def grid(root: Path) -> str:
    """The no-harm table: per system (experiments ``<system>-default``, ``-local`` and
    ``-perfect``), the default's final ACC per seed, its paired difference to local-only, the
    wrong-association share among the links of the run's final models (the last iteration's
    communities) and, for the history, the largest in any iteration, the traffic per client
    per iteration, and the perfect-association gain.

    ``default − local ≥ −0.01`` on every seed and ``final wrong ≤ 5 %`` are the no-harm
    criteria; where perfect associations gain ≥ 0.05 over local-only, the default should
    gain at least half of that on average.
    """
    from fedclust.metrics import mean_ci

    def order(system: str) -> tuple:
        return tuple(int(t[1:]) if t[:1] in "ns" and t[1:].isdigit() else t
                     for t in system.split("-"))

    systems = sorted({p.name.rsplit("-", 1)[0] for p in root.iterdir()
                      if p.is_dir() and p.name.endswith("-default")}, key=order)
    rows = ["| system | seeds | default ACC end (per seed) | local-only | default − local "
            "(min) | wrong ass. % of the final links (per seed) | wrong ass. % max in any it. "
            "(per seed) | MB per client per iteration | perfect | half of the perfect gain "
            "reached |", "|" + "---|" * 10]

    def metrics(run: Path) -> dict:
        return json.loads((run / "summary.json").read_text())["metrics"]

    def acc(run: Path) -> float:
        return metrics(run)["eval_acc_end"]

    for system in systems:
        d, lo, pf = (_runs(root, f"{system}-{arm}") for arm in ("default", "local", "perfect"))
        seeds = sorted(set(d) & set(lo))
        if not seeds:
            continue
        a = [acc(d[s]) for s in seeds]
        b = [acc(lo[s]) for s in seeds]
        gain = [x - y for x, y in zip(a, b, strict=True)]
        worst = [_max_wrong_pct(d[s] / "history.jsonl") for s in seeds]
        final = [metrics(d[s]).get("eval_wrong_associations_pct") or 0.0 for s in seeds]
        traffic = mean_ci([metrics(d[s])["bytes_per_client_iter"] / 1e6 for s in seeds])[0]
        ps = [s for s in seeds if s in pf]
        if ps:
            pgain = mean_ci([acc(pf[s]) - acc(lo[s]) for s in ps])[0]
            dgain = mean_ci([acc(d[s]) - acc(lo[s]) for s in ps])[0]
            perfect = f"{mean_ci([acc(pf[s]) for s in ps])[0]:.3f} ({len(ps)} seeds)"
            half = ("n/a (perfect gains < 0.05)" if pgain < 0.05 else
                    f"{'yes' if dgain >= pgain / 2 else 'no'}: {dgain:+.3f} of {pgain:+.3f}")
        else:
            perfect, half = "not run", "–"
        rows.append(
            f"| {system} | {', '.join(map(str, seeds))} | {mean_ci(a)[0]:.3f} "
            f"({' / '.join(f'{x:.3f}' for x in a)}) | {mean_ci(b)[0]:.3f} | "
            f"{mean_ci(gain)[0]:+.3f} ({min(gain):+.3f}) | {max(final):.1f} "
            f"({' / '.join(f'{w:.1f}' for w in final)}) | {max(worst):.1f} "
            f"({' / '.join(f'{w:.1f}' for w in worst)}) | {traffic:.1f} | {perfect} | {half} |")
    return "\n".join(rows)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--name")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--set", nargs="*", default=[])
    ap.add_argument("--out", default=str(ROOT / "runs" / "fedcref"))
    ap.add_argument("--table")
    ap.add_argument("--paired", nargs=2, metavar=("A", "B"))
    ap.add_argument("--grid")
    args = ap.parse_args()
    if args.grid:
        print(grid(Path(args.grid)))
        return
    if args.table:
        print(paired(Path(args.table), *args.paired) if args.paired else table(Path(args.table)))
        return
    run(args.name, args.seeds, _parse(args.set), Path(args.out))


if __name__ == "__main__":
    main()
