"""Paper 003 Table 3 without Flower: FedFCM jobs run by the method's own loop
(:func:`fedclust.fedfcm.loop.run`) over in-memory clients (:mod:`fedclust.fedfcm.inmemory`).

One job here is one in-process Flower FedFCM job without the messages: the same loop, the
same client steps (:mod:`fedclust.fedfcm.client`), the same partition
(``client_apps/data.simulated_partition``: client ``l`` holds partition ``l`` of
``make_partition(partition.kind, ds, P, seed, ...)``), in the same order and with the same
seeds; ``tests/fedfcm/test_fedfcm_table3_fast.py`` checks that it equals the Flower run.

Jobs whose local FCM input is identical (round 1 of the k-means and federated-averaging jobs of
one data set, seed and P) reuse the memoised local step, which is a pure function.

Each job writes ``OUT/<averaging>/D<dim>-s<sigma>-P<clients>-seed<seed>/summary.json`` in the
layout of ``RunRecorder.finish`` (so ``python -m fedclust.experiments fedfcm-table3 OUT/...``
reads it unchanged) and one line to ``OUT/jobs.jsonl``. Existing summaries are skipped
(resume).

Usage::

    # the grid (defaults: every D in 2..256 that exists, sigma 10..100, P 1/2/5/10, seeds 0..19)
    python bench/fedfcm_table3_fast.py --out runs/fedfcm_table3_fast
    # reproduce stored Flower jobs (compares best_k and every FedFuzzDB value)
    python bench/fedfcm_table3_fast.py --check runs/fedfcm_table3_kmeans/0 ...
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fedclust.config import validate, without_foreign_defaults  # noqa: E402
from fedclust.data.partition import make_partition  # noqa: E402
from fedclust.data.tabular import Dataset, load_dataset  # noqa: E402
from fedclust.fcm.phases import Replies, Scaling  # noqa: E402
from fedclust.fedfcm import inmemory, local_step, loop  # noqa: E402
from fedclust.fedfcm.keys import FedFCMSettings  # noqa: E402
from fedclust.results import MemoryRecord  # noqa: E402

DIMS = (2, 4, 8, 16, 32, 64, 128, 256)
SIGMAS = tuple(range(10, 101, 10))
CLIENTS = (1, 2, 5, 10)

# The run-config overrides of conf/experiment/fedfcm_table3.yaml (+ method/dataset/partition).
BASE_RUN_CONFIG = {"method": "fedfcm", "dataset": "g2", "partition.kind": "iid",
                   "scaling": "minmax", "plots": False,
                   "fedfcm.k-min": 2, "fedfcm.k-max": 6, "fedfcm.local-index": False}


def run_config(dim: int, sigma: int, clients: int, seed: int, averaging: str, data_dir: str,
               output_dir: str) -> dict[str, Any]:
    return validate({**BASE_RUN_CONFIG, "g2.dim": dim, "g2.sigma": sigma,
                     "num-clients": clients, "seed": seed, "fedfcm.averaging": averaging,
                     "data-dir": data_dir, "output-dir": output_dir})


class LocalStepCache:
    """Memo of ``local_step`` by (client data key, centers bytes): exact reuse only."""

    def __init__(self) -> None:
        self.store: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}
        self.hits = self.calls = 0

    def step(self, key: tuple, x: np.ndarray, centers: np.ndarray, s: FedFCMSettings
             ) -> tuple[np.ndarray, np.ndarray]:
        self.calls += 1
        full = (key, centers.shape, centers.tobytes())
        got = self.store.get(full)
        if got is None:
            c, support, _ = local_step(x, centers, s.m, s.local_tol, s.local_max_iter)
            got = self.store[full] = (c, support)
        else:
            self.hits += 1
        return got

    def clear(self) -> None:
        self.store.clear()


class CachedClients(inmemory.InMemoryClients):
    """In-memory FedFCM clients whose local step goes through a :class:`LocalStepCache` (the
    step is a pure function of the client's rows and the global centers)."""

    def __init__(self, xs: list[np.ndarray], s: FedFCMSettings, ys: list[np.ndarray],
                 cache: LocalStepCache, data_key: tuple) -> None:
        super().__init__(xs, s, ys)
        self.cache, self.data_key = cache, data_key

    def local(self, rnd: int, centers: dict[int, np.ndarray], sc: Scaling
              ) -> Replies[loop.LocalCenters]:
        out: Replies[loop.LocalCenters] = Replies()
        for i in self.ids:
            if self._silent(i):
                out.withheld.append(i)
                continue
            x = self.scaled(i, sc)
            out.got[i] = {k: self.cache.step((*self.data_key, i, k), x, centers[k], self.s)
                          for k in sorted(centers)}
        return out


def fedfcm_job(ds: Dataset, cfg: dict[str, Any], cache: LocalStepCache | None = None
               ) -> dict[str, Any]:
    """The metrics of the FedFCM run for run config ``cfg``: the method's loop over in-memory
    clients holding the run's partitions."""
    n_clients, seed = int(cfg["num-clients"]), int(cfg["seed"])
    idx = make_partition(cfg["partition.kind"], ds, n_clients, seed,
                         float(cfg["partition.alpha"]), cfg["partition.column"])
    s = FedFCMSettings.from_config(cfg)
    data_key = (ds.name, cfg["partition.kind"], n_clients, seed, s.scaling)
    clients = CachedClients([ds.x[i] for i in idx], s, [ds.y[i] for i in idx],
                            cache or LocalStepCache(), data_key)
    return loop.run(clients, s, MemoryRecord())


def summary_of(cfg: dict[str, Any], metrics: dict[str, Any], seconds: float) -> dict[str, Any]:
    """``RunRecorder.finish`` layout."""
    from fedclust.results import to_jsonable

    return to_jsonable({"method": cfg["method"], "dataset": cfg["dataset"], "seed": cfg["seed"],
                        "num_clients": cfg["num-clients"], "config": cfg,
                        "wall_time_s": round(seconds, 4), "metrics": metrics,
                        "engine": "bench/fedfcm_table3_fast.py"})


def compare(stored: dict[str, Any], got: dict[str, Any]) -> float:
    """Max relative FedFuzzDB difference; raises if best_k or the K set differ."""
    from fedclust.results import to_jsonable

    a, b = stored["metrics"]["fedfuzzdb"], to_jsonable(got["fedfuzzdb"])
    if set(a) != set(b):
        raise AssertionError(f"K sets differ: {sorted(a)} vs {sorted(b)}")
    if stored["metrics"]["best_k"] != got["best_k"]:
        raise AssertionError(f"best_k {stored['metrics']['best_k']} vs {got['best_k']}")
    worst = 0.0
    for k in a:
        if isinstance(a[k], float) and isinstance(b[k], float):
            worst = max(worst, abs(a[k] - b[k]) / max(abs(a[k]), 1e-300))
        elif a[k] != b[k]:          # "inf" / None (NaN) as written by to_jsonable
            raise AssertionError(f"FedFuzzDB K={k}: {a[k]!r} vs {b[k]!r}")
    return worst


def check(dirs: list[str], tol: float) -> int:
    worst, bad = 0.0, 0
    datasets: dict[tuple, Dataset] = {}
    for d in dirs:
        stored = json.loads((Path(d) / "summary.json").read_text())
        # summaries written before keys of other methods were refused may carry the dataset
        # file's fcm.n-clusters: dropped as a sweep drops it now
        cfg = validate(without_foreign_defaults(stored["config"]))
        key = (cfg["g2.dim"], cfg["g2.sigma"])
        if key not in datasets:
            datasets[key] = load_dataset(cfg)
        t0 = time.perf_counter()
        got = fedfcm_job(datasets[key], cfg)
        dt = time.perf_counter() - t0
        try:
            rel = compare(stored, got)
            ok = rel <= tol and stored["metrics"]["rounds"] == got["rounds"]
        except AssertionError as exc:
            rel, ok = float("inf"), False
            print(f"  {exc}")
        worst = max(worst, rel)
        bad += not ok
        print(f"{'OK ' if ok else 'BAD'} {d}: {cfg['fedfcm.averaging']} D={cfg['g2.dim']} "
              f"sigma={cfg['g2.sigma']} P={cfg['num-clients']} seed={cfg['seed']} "
              f"best_k={got['best_k']} (stored {stored['metrics']['best_k']}) "
              f"max rel diff {rel:.2e} | flower {stored['wall_time_s']:.2f}s, here {dt:.3f}s",
              flush=True)
    print(f"{len(dirs) - bad}/{len(dirs)} jobs reproduced; max relative FedFuzzDB diff {worst:.3e}")
    return 1 if bad else 0


def available_dims(data_dir: str, dims: list[int], sigmas: list[int]) -> list[int]:
    root = Path(data_dir) / "clustering" / "g2"
    return [d for d in dims if all((root / f"g2-{d}-{s}.csv.gz").exists() for s in sigmas)]


def grid(args: argparse.Namespace) -> int:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    dims = available_dims(args.data_dir, args.dims, args.sigmas)
    missing = sorted(set(args.dims) - set(dims))
    if missing:
        print(f"no complete G2 sets for D = {missing}: skipped", flush=True)
    jobs = []   # ordered by D so that an interrupted run misses the largest D
    for d in dims:
        for s in args.sigmas:
            for seed in args.seeds:
                for p in args.clients:
                    for avg in args.averaging:
                        if avg == "fedavg" and p == 1:
                            continue   # one client: both averagings are the same central FCM
                        jobs.append((d, s, seed, p, avg))
    n = len(jobs)
    print(f"{n} jobs: D={dims} sigma={args.sigmas} seeds={args.seeds[0]}..{args.seeds[-1]} "
          f"P={args.clients} averaging={args.averaging} -> {out}", flush=True)
    def job_dir_of(d: int, s: int, seed: int, p: int, avg: str) -> Path:
        return out / avg / f"D{d}-s{s}-P{p}-seed{seed}"

    pending = sum(not (job_dir_of(*j) / "summary.json").exists() for j in jobs)
    if pending < n:
        print(f"{n - pending} jobs already done (summary.json exists): skipped", flush=True)
    t_start = time.perf_counter()
    done_here = 0
    cache = LocalStepCache()
    ds, ds_key = None, None
    with open(out / "jobs.jsonl", "a") as log:
        for i, (d, s, seed, p, avg) in enumerate(jobs, 1):
            job_dir = job_dir_of(d, s, seed, p, avg)
            if (job_dir / "summary.json").exists():
                continue
            cfg = run_config(d, s, p, seed, avg, args.data_dir, str(job_dir))
            if ds_key != (d, s):
                ds, ds_key = load_dataset(cfg), (d, s)
                cache.clear()
            t0 = time.perf_counter()
            metrics = fedfcm_job(ds, cfg, cache)
            dt = time.perf_counter() - t0
            job_dir.mkdir(parents=True, exist_ok=True)
            summary = summary_of(cfg, metrics, dt)
            (job_dir / "summary.json").write_text(json.dumps(summary, indent=2))
            log.write(json.dumps({"job": str(job_dir.relative_to(out)), "seconds": round(dt, 4),
                                  "config": {k: cfg[k] for k in (
                                      "fedfcm.averaging", "num-clients", "g2.dim", "g2.sigma",
                                      "seed")},
                                  "metrics": {"best_k": metrics["best_k"],
                                              "fedfuzzdb": metrics["fedfuzzdb"],
                                              "rounds": metrics["rounds"]}}) + "\n")
            log.flush()
            done_here += 1
            el = time.perf_counter() - t_start
            if done_here == 1 or i % args.every == 0 or i == n:
                eta = el / done_here * (pending - done_here)
                print(f"job {i}/{n} D={d} sigma={s} seed={seed} P={p} {avg}: best_k="
                      f"{metrics['best_k']} {dt:.3f}s | elapsed {el:.0f}s | ETA {eta:.0f}s | "
                      f"local-step cache {cache.hits}/{cache.calls}", flush=True)
    print(f"done: {done_here} jobs in {time.perf_counter() - t_start:.0f}s", flush=True)
    return 0


def ints(text: str) -> list[int]:
    out: list[int] = []
    for part in text.split(","):
        if ".." in part:     # a..b or a..b:step (inclusive)
            a, _, rest = part.partition("..")
            b, _, step = rest.partition(":")
            out += list(range(int(a), int(b) + 1, int(step or 1)))
        else:
            out.append(int(part))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="runs/fedfcm_table3_fast")
    ap.add_argument("--data-dir", default=os.environ.get("FEDCLUST_DATA_DIR", ""))
    ap.add_argument("--dims", type=ints, default=list(DIMS))
    ap.add_argument("--sigmas", type=ints, default=list(SIGMAS))
    ap.add_argument("--clients", type=ints, default=list(CLIENTS))
    ap.add_argument("--seeds", type=ints, default=list(range(20)), help="e.g. 0..19")
    ap.add_argument("--averaging", type=lambda t: t.split(","), default=["kmeans", "fedavg"])
    ap.add_argument("--every", type=int, default=50, help="print progress every N jobs")
    ap.add_argument("--check", nargs="+", metavar="JOB_DIR",
                    help="recompute stored Flower jobs and compare (no grid run)")
    ap.add_argument("--tol", type=float, default=1e-9, help="relative tolerance for --check")
    args = ap.parse_args()
    if args.check:
        return check(args.check, args.tol)
    return grid(args)


if __name__ == "__main__":
    sys.exit(main())
