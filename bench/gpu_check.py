"""GPU check of the batched simulation: one EMD-CFL round at the paper preset's sizes and a
FedCRef 25 × 500 MNIST run on a CUDA device, FedCRef also on the CPU of the same machine.

Flower-free (fedclust's core only): it needs torch, numpy, scipy, scikit-learn and networkx;
POT only for unequal-size EMD clouds (the paper round's are all equal) and ``cryptography``
not at all (the simulated keys fall back to plain-Python X25519).

What it runs, in order, each part guarded (an error is recorded and the next part runs) and
the whole within ``--budget`` seconds (a part that would not fit is skipped; FedCRef runs stop
at a phase boundary when their time is up); the results go to ``--out`` (JSON) after every
part, and a compact table ends the output:

1. ``env``: torch, CUDA, the card, CPU cores, POT and cryptography.
2. ``steps``: seconds per stacked EMD-CFL training step at the paper shape (40 clients × 64
   images, the 64/128 CNN) for each convolution layout and precision, and the local-training
   time of a round they project (× the round's steps).
3. ``emdcfl``: the paper preset's round (``conf/experiment/emdcfl_table1_paper.yaml``:
   Rotated MNIST max, 40 clients × 5,420 images, 10 local epochs, batch 64, lr 0.01, ε auto:
   read from the round's own excesses)
   through the Flower-free loop with :class:`fedclust.emdcfl.batched.BatchedClients`: local
   training, embedding (forward passes, pair projections, the clients' reference EMDs), the
   server's EMD matrix, evaluation; ARI and test accuracy. Precision ``--precision``.
4. ``fedcref_gpu``: FedCRef on MNIST, 25 clients × 500 samples per cluster (the method's
   defaults, dirty start), up to ``--fedcref-iterations`` iterations or ``--gpu-seconds``,
   clients batched on the device.
5. ``fedcref_cpu``: the same system on the CPU (torch threads = ``--cpu-threads``, every
   client's training merged into one computation: the fastest CPU layout with many cores),
   for at most ``--cpu-seconds``; the ratio is taken over the phases both runs completed.
6. ``emdcfl_fp32``: the same EMD-CFL round with TF32 off, the accuracy reference for TF32.
7. ``emdcfl_bf16``: the round with bf16 autocast, when the step benchmark shows bf16 faster.

    python bench/gpu_check.py --data-dir data --device cuda --out runs/gpu_check.json
    python bench/gpu_check.py --data-dir "$FEDCLUST_DATA_DIR" --device cpu --tiny \\
        --out /tmp/gpu_check.json                      # every code path, small, on the CPU
    python bench/gpu_check.py --data-dir "$FEDCLUST_DATA_DIR" --device cpu --local-epochs 1 \\
        --skip steps fedcref_gpu fedcref_cpu emdcfl_fp32 emdcfl_bf16 --budget 9000 \\
        --out /tmp/round0_cpu.json     # the paper round on the CPU, 1 local epoch instead of 10

``--data-dir`` holds ``mnist/mnist-train.npz`` and ``mnist/mnist-test.npz``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
import traceback
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

#: the paper preset's EMD-CFL keys (conf/experiment/emdcfl_table1_paper.yaml)
PAPER = {"dataset": "rotmnist", "num-clients": 40, "emdcfl.rotation": "max",
         "emdcfl.samples": 5420, "emdcfl.test-samples": 250, "emdcfl.val-fraction": 0.1,
         "emdcfl.local-epochs": 10, "emdcfl.lr": 0.01, "emdcfl.batch-size": 64,
         "emdcfl.conv1": 64, "emdcfl.conv2": 128, "emdcfl.embed-dim": 128,
         "emdcfl.epsilon": "auto", "emdcfl.proj-ratio": 0.9, "emdcfl.metric": "cosine",
         "emdcfl.max-samples": 512}
TINY_EMDCFL = {"num-clients": 8, "emdcfl.samples": 400, "emdcfl.test-samples": 60,
               "emdcfl.val-fraction": 0.2, "emdcfl.local-epochs": 1, "emdcfl.conv1": 8,
               "emdcfl.conv2": 16, "emdcfl.embed-dim": 32, "emdcfl.max-samples": 64,
               "emdcfl.batch-size": 16, "emdcfl.lr": 0.05}
TINY_FEDCREF = {"num-clients": 5, "fedcref.samples-per-cluster": 40, "fedcref.ae-epochs": 4,
                "fedcref.fl-rounds": 2, "fedcref.fl-local-epochs": 1,
                "fedcref.ae-hidden": "32,16,8"}


class OutOfTime(Exception):
    """The part's time is up (raised between FedCRef phases)."""


class Check:
    """The results so far, written to ``out`` after every part, and the time budget."""

    def __init__(self, out: Path | None, budget: float) -> None:
        self.out, self.t0, self.budget = out, time.perf_counter(), budget
        self.results: dict[str, Any] = {"parts": {}, "skipped": {}, "errors": {}}

    def left(self) -> float:
        return self.budget - (time.perf_counter() - self.t0)

    def save(self) -> None:
        self.results["elapsed_s"] = round(time.perf_counter() - self.t0, 2)
        if self.out is not None:
            self.out.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.out.with_suffix(".tmp")
            tmp.write_text(json.dumps(self.results, indent=1, default=str))
            tmp.replace(self.out)

    def part(self, name: str, fn: Any, *args: Any, need: float = 0.0) -> Any:
        """Run ``fn(*args)`` as part ``name`` if ``need`` seconds are left; record its result
        or its error; save."""
        if self.left() < need:
            self.results["skipped"][name] = (f"needs ~{need:.0f} s, {self.left():.0f} s of the "
                                             "budget left")
            print(f"[gpu_check] skip {name}: {self.results['skipped'][name]}", flush=True)
            self.save()
            return None
        print(f"[gpu_check] {name} ({self.left():.0f} s of the budget left)", flush=True)
        t0 = time.perf_counter()
        try:
            out = fn(*args)
        except Exception as exc:
            self.results["errors"][name] = "".join(traceback.format_exception(exc))[-3000:]
            print(f"[gpu_check] {name} FAILED: {exc!r}", flush=True)
            out = None
        if out is not None:
            out["part_s"] = round(time.perf_counter() - t0, 2)
            self.results["parts"][name] = out
        self.save()
        return out


# --------------------------------------------------------------------------------- parts

def env(device: str) -> dict[str, Any]:
    import numpy as np
    import scipy
    import torch

    out: dict[str, Any] = {"python": platform.python_version(), "torch": torch.__version__,
                           "numpy": np.__version__, "scipy": scipy.__version__,
                           "cpu_count": os.cpu_count(), "device": device,
                           "cuda_available": torch.cuda.is_available(),
                           "cuda_build": torch.version.cuda}
    try:
        out["cpu_affinity"] = len(os.sched_getaffinity(0))
    except AttributeError:
        pass
    if device.startswith("cuda"):
        props = torch.cuda.get_device_properties(0)
        out.update({"card": torch.cuda.get_device_name(0),
                    "capability": f"{props.major}.{props.minor}",
                    "card_memory_gib": round(props.total_memory / 2**30, 1)})
        torch.zeros(1, device=device)                    # the CUDA context, outside timings
    for name in ("ot", "cryptography", "sklearn", "networkx"):
        try:
            module = __import__(name)
            out[name] = getattr(module, "__version__", "present")
        except ImportError:
            out[name] = None
    return out


def steps(a: argparse.Namespace, cfg: dict[str, Any]) -> dict[str, Any]:
    """Seconds per stacked training step for each layout and precision."""
    from fedclust.emdcfl.batched import FORWARD, time_step
    from fedclust.emdcfl.keys import EMDCFLSettings

    s = EMDCFLSettings.from_config(_emdcfl_config(a, cfg))
    n, big = s_clients(cfg), s.batch_size
    train = round(s.samples * (1 - s.val_fraction))
    per_round = s.local_epochs * (train // big)
    out: dict[str, Any] = {"clients": n, "batch": big, "steps_per_round": per_round,
                           "step_ms": {}, "projected_train_s": {}}
    variants = [(c, p) for p in ("tf32", "bf16") for c in FORWARD] + [("grouped", "fp32")]
    for conv, precision in variants:
        key = f"{conv}/{precision}"
        try:
            sec = time_step(s.spec, n, big, a.device, conv, precision, a.bench_steps)
        except Exception as exc:                  # a layout without kernels here: say so
            out["step_ms"][key] = f"failed: {exc!r}"[:300]
            continue
        out["step_ms"][key] = round(1e3 * sec, 3)
        out["projected_train_s"][key] = round(sec * per_round, 2)
        print(f"    {key:14s} {1e3 * sec:9.2f} ms/step -> {sec * per_round:7.1f} s per round",
              flush=True)
    return out


def s_clients(cfg: dict[str, Any]) -> int:
    return int(cfg["num-clients"])


def _emdcfl_config(a: argparse.Namespace, cfg: dict[str, Any]
                   ) -> dict[str, Any]:
    from fedclust.config import validate

    return validate({"method": "emdcfl", "data-dir": a.data_dir, "seed": a.seed,
                     "evaluate": True, "plots": False, **cfg, "emdcfl.rounds": 1,
                     "emdcfl.device": "cuda" if a.device.startswith("cuda") else "cpu",
                     "emdcfl.workers": a.workers})


def emdcfl_round(a: argparse.Namespace, cfg: dict[str, Any], precision: str
                 ) -> dict[str, Any]:
    """One round of EMD-CFL (local training, clustering) and the final evaluation."""
    from fedclust.emdcfl import batched, client, loop
    from fedclust.emdcfl.keys import EMDCFLSettings
    from fedclust.results import MemoryRecord

    s = EMDCFLSettings.from_config(_emdcfl_config(a, cfg))
    t0 = time.perf_counter()
    data = [client.simulated_split(s, i, s_clients(cfg)) for i in range(s_clients(cfg))]
    data_s = time.perf_counter() - t0
    clients = batched.BatchedClients(s, data, batched.Batching(conv=a.conv,
                                                               precision=precision))
    record = MemoryRecord()
    m = loop.run(clients, s, record)
    sec = clients.seconds
    h = record.history[0] if record.history else {}
    embed = sec["embed"] + sec["project"] + sec["reference"]
    return {"precision": precision, "clients": len(data), "data_s": round(data_s, 2),
            "train_s": round(sec["train"], 2), "embed_s": round(embed, 2),
            "embed_forward_s": round(sec["embed"], 2),
            "embed_pairs_s": round(sec["project"], 2),
            "embed_reference_s": round(sec["reference"], 2),
            "emd_s": round(m.get("emd_s", float("nan")), 2),
            "embed_plus_emd_s": round(embed + m.get("emd_s", float("nan")), 2),
            "clustering_s": round(m["clustering_s"], 2), "evaluate_s": round(sec["evaluate"], 2),
            "round_s": round(m["total_s"], 2), "ari": m.get("eval_ari"),
            "acc_mean": m.get("eval_acc_mean"), "acc_worst": m.get("eval_acc_worst"),
            "acc_per_client": m.get("eval_acc_per_client"),
            "num_clusters": m.get("num_clusters"), "clusters": m.get("clusters"),
            "epsilon": m.get("epsilon"), "epsilon_rule": m.get("epsilon_rule"),
            "epsilon_gap": m.get("epsilon_gap"),
            "epsilon_gap_clearness": m.get("epsilon_gap_clearness"),
            "warnings": m.get("warnings"),
            "train_loss": h.get("train_loss"), "emd_solves": h.get("emd_solves"),
            "emd_skipped": h.get("emd_skipped"), "workers": s.workers,
            "conv": sorted(set(batched._CHOSEN.values())) or [a.conv]}


def fedcref_system(a: argparse.Namespace, extra: dict[str, Any]) -> dict[str, Any]:
    """The simulated FedCRef system: every client's samples, classes and dirty start (as a
    simulated node builds them)."""
    import numpy as np

    from fedclust.fedcref import client as core
    from fedclust.fedcref.initial import Dirty, initial_clustering

    cfg = _fedcref_config(a, extra, "cpu")
    t0 = time.perf_counter()
    xs, ys, starts = [], [], []
    for i in range(cfg["num-clients"]):
        x, y = core.client_data(cfg, i)
        k = int(np.unique(y).size)
        starts.append(initial_clustering(
            Dirty(cfg["fedcref.dirtiness"]), x, k, y_true=y,
            random_state=core.derive_seed(cfg["seed"], core.client_key(x), 0)))
        xs.append(x)
        ys.append(y)
    return {"xs": xs, "ys": ys, "starts": starts, "data_s": time.perf_counter() - t0,
            "samples": int(sum(len(x) for x in xs)),
            "clusters": int(sum(int(s.max()) + 1 for s in starts))}


def _fedcref_config(a: argparse.Namespace, extra: dict[str, Any], device: str
                    ) -> dict[str, Any]:
    from fedclust.config import validate

    return validate({"method": "fedcref", "dataset": "mnist", "data-dir": a.data_dir,
                     "seed": a.seed, "evaluate": True, "plots": False, "num-clients": 25,
                     "fedcref.samples-per-cluster": 500, "fedcref.split": "all",
                     "fedcref.max-iterations": a.fedcref_iterations, **extra,
                     "fedcref.device": device})


PHASES = ("local", "associate", "community_round", "refine")


def fedcref_run(a: argparse.Namespace, extra: dict[str, Any], system: dict[str, Any],
                device: str, threads: int, stack: bool | None, seconds: float
                ) -> dict[str, Any]:
    """FedCRef on ``device`` until it stops, ``--fedcref-iterations`` or ``seconds`` (checked
    after every phase). Phase seconds are listed per iteration."""
    import torch

    from fedclust.fedcref import algorithm
    from fedclust.fedcref.batched import BatchedClients

    cfg = _fedcref_config(a, extra, device)
    clients = BatchedClients(system["xs"], system["starts"], cfg, ys=system["ys"],
                             stack=stack)
    torch.set_num_threads(threads)        # after the clients (which set fedcref.torch-threads)
    log: list[dict[str, float]] = [{}]
    deadline = time.perf_counter() + seconds
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)

    def timed(name: str, fn: Any) -> Any:
        def call(t: int, *args: Any, **kwargs: Any) -> Any:
            while len(log) < t:
                log.append({})
            t0 = time.perf_counter()
            out = fn(t, *args, **kwargs)
            sync()
            log[t - 1][name] = log[t - 1].get(name, 0.0) + time.perf_counter() - t0
            if time.perf_counter() > deadline:
                raise OutOfTime(f"{seconds:.0f} s spent, stopped after {name} of "
                                f"iteration {t}")
            return out
        return call

    for name in PHASES:
        setattr(clients, name, timed(name, getattr(clients, name)))
    history: list[dict[str, Any]] = []
    t0 = time.perf_counter()
    stopped = None
    try:
        out = algorithm.run(clients, algorithm.Settings.from_config(cfg),
                            on_iteration=history.append)
        summary = out.summary
    except OutOfTime as exc:
        stopped, summary = str(exc), {}
    total = time.perf_counter() - t0
    return {"device": device, "torch_threads": threads, "merged": clients.stacked,
            "total_s": round(total, 2), "iterations": len(history),
            "stopped_early": stopped, "stop_reason": summary.get("stop_reason"),
            "phase_s": [{k: round(v, 3) for k, v in it.items()} for it in log if it],
            "communities": [h.get("communities") for h in history],
            "isolated": [h.get("isolated") for h in history],
            "eval_acc": [h.get("eval_acc") for h in history],
            "eval_acc_end": summary.get("eval_acc_end"), "clients": clients.n,
            "samples": system["samples"], "start_clusters": system["clusters"]}


def ratio(gpu: dict[str, Any], cpu: dict[str, Any]) -> dict[str, Any]:
    """CPU seconds over GPU seconds of the phases both runs completed."""
    done_g, done_c = gpu["phase_s"], cpu["phase_s"]
    g = c = 0.0
    phases = 0
    for it_g, it_c in zip(done_g, done_c, strict=False):
        for name in PHASES:
            if name in it_g and name in it_c:
                g += it_g[name]
                c += it_c[name]
                phases += 1
    return {"phases_compared": phases, "gpu_s": round(g, 2), "cpu_s": round(c, 2),
            "speedup": round(c / g, 2) if g > 0 else None,
            "gpu_iterations": gpu["iterations"], "cpu_iterations": cpu["iterations"]}


# --------------------------------------------------------------------------------- table

def table(r: dict[str, Any]) -> str:
    p, e = r["parts"], r.get("parts", {}).get("env", {})
    lines = [f"== fedclust GPU check: {e.get('card', e.get('device', '?'))}, torch "
             f"{e.get('torch', '?')}, {e.get('cpu_count', '?')} CPU cores, "
             f"{r.get('elapsed_s', 0):.0f} s =="]
    if "steps" in p:
        st = p["steps"]
        best = {k: v for k, v in st["projected_train_s"].items()}
        lines.append(f"stacked step ({st['clients']} clients x {st['batch']}), projected local "
                     f"training of a round ({st['steps_per_round']} steps):")
        lines += [f"  {k:14s} {st['step_ms'][k]:>9} ms  {v:7.1f} s" for k, v in best.items()]
    for name in ("emdcfl", "emdcfl_fp32", "emdcfl_bf16"):
        if name not in p:
            continue
        x = p[name]
        lines.append(f"EMD-CFL round ({x['clients']} clients, precision {x['precision']}, conv "
                     f"{','.join(x['conv'])}, {x['workers']} EMD workers):")
        lines.append(f"  local training   {x['train_s']:8.2f} s   (target <= 10 s)")
        lines.append(f"  embedding        {x['embed_s']:8.2f} s   (forward {x['embed_forward_s']},"
                     f" pairs {x['embed_pairs_s']}, references {x['embed_reference_s']})")
        lines.append(f"  EMD (server)     {x['emd_s']:8.2f} s   ({x['emd_solves']} solves, "
                     f"{x['emd_skipped']} skipped)")
        lines.append(f"  embedding + EMD  {x['embed_plus_emd_s']:8.2f} s   (target <= 15 s)")
        lines.append(f"  evaluation       {x['evaluate_s']:8.2f} s;  round {x['round_s']:.2f} s")
        lines.append(f"  ARI {x['ari']:.3f}  ACC mean {x['acc_mean']:.4f} worst "
                     f"{x['acc_worst']:.4f}  clusters {x['num_clusters']}")
        lines.append(f"  epsilon {x.get('epsilon')} ({x.get('epsilon_rule')}, gap "
                     f"{x.get('epsilon_gap')}, clearness {x.get('epsilon_gap_clearness')})"
                     + "".join(f"\n  WARNING {w}" for w in x.get("warnings") or []))
    if "emdcfl" in p and "emdcfl_fp32" in p:
        a, b = p["emdcfl"], p["emdcfl_fp32"]
        lines.append(f"  {a['precision']} vs fp32: |dACC mean| "
                     f"{abs(a['acc_mean'] - b['acc_mean']):.4f}, same clusters "
                     f"{a['clusters'] == b['clusters']}")
    for name in ("fedcref_gpu", "fedcref_cpu"):
        if name in p:
            x = p[name]
            per = [round(sum(it.values()), 2) for it in x["phase_s"]]
            lines.append(f"FedCRef {x['clients']} clients ({x['samples']} samples) on "
                         f"{x['device']} ({x['torch_threads']} threads, merged {x['merged']}):"
                         f" {x['total_s']:.1f} s, {x['iterations']} iterations, s/iteration "
                         f"{per}, communities {x['communities']}, ACC {x['eval_acc']}"
                         + (f" [stopped: {x['stopped_early']}]" if x["stopped_early"] else ""))
    if "fedcref_ratio" in r:
        x = r["fedcref_ratio"]
        lines.append(f"FedCRef CPU/GPU over {x['phases_compared']} phases: {x['cpu_s']} s / "
                     f"{x['gpu_s']} s = {x['speedup']}x   (target >= 5x)")
    for name, why in r["skipped"].items():
        lines.append(f"skipped {name}: {why}")
    for name, err in r["errors"].items():
        lines.append(f"ERROR in {name}: {err.strip().splitlines()[-1]}")
    return "\n".join(lines)


# --------------------------------------------------------------------------------- main

def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data-dir", required=True, help="folder with mnist/mnist-*.npz")
    ap.add_argument("--device", default="cuda", help="cuda (default) or cpu")
    ap.add_argument("--out", type=Path, help="JSON of the results (written after every part)")
    ap.add_argument("--budget", type=float, default=480.0, help="seconds for everything")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1,
                    help="EMD worker processes (default: every core)")
    ap.add_argument("--cpu-threads", type=int, default=os.cpu_count() or 1,
                    help="torch threads of the FedCRef CPU run")
    ap.add_argument("--gpu-seconds", type=float, default=120.0,
                    help="at most this long for the FedCRef run on --device")
    ap.add_argument("--cpu-seconds", type=float, default=150.0,
                    help="at most this long for the FedCRef CPU run")
    ap.add_argument("--precision", default="tf32", choices=("tf32", "fp32", "bf16"))
    ap.add_argument("--conv", default="auto", choices=("auto", "grouped", "unfold", "loop"))
    ap.add_argument("--bench-steps", type=int, default=10, help="timed steps per layout")
    ap.add_argument("--fedcref-iterations", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--skip", nargs="*", default=[], help="parts to leave out")
    ap.add_argument("--tiny", action="store_true", help="small sizes (a CPU smoke test)")
    ap.add_argument("--local-epochs", type=int, default=0,
                    help="local epochs of the EMD-CFL round (0: the preset's 10); fewer for "
                         "a CPU round-0 check at the paper's sizes")
    a = ap.parse_args()

    import torch

    if a.device.startswith("cuda") and not torch.cuda.is_available():
        print(f"[gpu_check] --device {a.device}: torch {torch.__version__} sees no CUDA "
              f"device (CUDA build {torch.version.cuda}); run with --device cpu for a CPU "
              "check", file=sys.stderr)
        if a.out is not None:
            a.out.parent.mkdir(parents=True, exist_ok=True)
            a.out.write_text(json.dumps({"error": "no CUDA device", "torch": torch.__version__}))
        return 2
    emd_cfg = {**PAPER, **(TINY_EMDCFL if a.tiny else {})}
    if a.local_epochs:
        emd_cfg["emdcfl.local-epochs"] = a.local_epochs
    fc_extra = TINY_FEDCREF if a.tiny else {}
    check = Check(a.out, a.budget)
    check.results["args"] = {k: str(v) for k, v in vars(a).items()}
    check.part("env", env, a.device)
    todo = [p for p in ("steps", "emdcfl", "fedcref_gpu", "fedcref_cpu", "emdcfl_fp32",
                        "emdcfl_bf16") if p not in a.skip]
    if "steps" in todo:
        check.part("steps", steps, a, emd_cfg, need=5)
    main_round = None
    if "emdcfl" in todo:
        main_round = check.part("emdcfl", emdcfl_round, a, emd_cfg, a.precision, need=20)
    system = None
    if "fedcref_gpu" in todo or "fedcref_cpu" in todo:
        system = check.part("fedcref_system", fedcref_system, a, fc_extra, need=10)
        if system is not None:      # the arrays stay out of the JSON
            check.results["parts"]["fedcref_system"] = {
                k: v for k, v in system.items() if k not in ("xs", "ys", "starts")}
    gpu = cpu = None
    if system is not None and "fedcref_gpu" in todo:
        gpu = check.part("fedcref_gpu", fedcref_run, a, fc_extra, system, a.device,
                         os.cpu_count() or 1, None,
                         min(a.gpu_seconds, max(check.left() - 60, 10)), need=20)
    if system is not None and "fedcref_cpu" in todo:
        cpu = check.part("fedcref_cpu", fedcref_run, a, fc_extra, system, "cpu",
                         a.cpu_threads, True, min(a.cpu_seconds, max(check.left() - 40, 10)),
                         need=20)
    if gpu is not None and cpu is not None:
        check.results["fedcref_ratio"] = ratio(gpu, cpu)
        check.save()
    if "emdcfl_fp32" in todo and a.precision != "fp32":
        need = 3 * main_round["train_s"] + main_round["round_s"] if main_round else 60
        check.part("emdcfl_fp32", emdcfl_round, a, emd_cfg, "fp32", need=need)
    if "emdcfl_bf16" in todo and a.precision != "bf16":
        ms = (check.results["parts"].get("steps") or {}).get("step_ms", {})
        fast = [k for k, v in ms.items() if k.endswith("/bf16") and isinstance(v, float)]
        base = [v for k, v in ms.items() if k.endswith(f"/{a.precision}")
                and isinstance(v, float)]
        if fast and base and min(ms[k] for k in fast) < 0.77 * min(base):
            need = main_round["round_s"] if main_round else 60
            check.part("emdcfl_bf16", emdcfl_round, a, emd_cfg, "bf16", need=need)
        else:
            check.results["skipped"]["emdcfl_bf16"] = "bf16 steps not 1.3x faster"
            check.save()
    print(table(check.results), flush=True)
    return 1 if check.results["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
