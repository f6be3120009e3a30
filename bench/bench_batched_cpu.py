"""The ``cpu`` preset's EMD-CFL round through the in-process engine, answered one message at a
time (the engine before batched handlers) and a phase at a time (the batched handlers, what
``fedclust-sweep`` and ``fedclust.simulate`` now use), in the same run: wall seconds of each
and their ratio, with the same clusters and accuracies checked.

    python bench/bench_batched_cpu.py --data-dir "$FEDCLUST_DATA_DIR"            # 40 clients
    python bench/bench_batched_cpu.py --data-dir "$FEDCLUST_DATA_DIR" --clients 8 --samples 1000

``--stacked`` also times the Flower-free loop with the stacked layout on the CPU
(``Batching(stack=True)``, the GPU's layout) against the per-client kernels.
"""

from __future__ import annotations

import tempfile
import time

from _common import parser

#: the cpu preset (server_app.emdcfl_experiments.CPU, conf/experiment/emdcfl_table1.yaml)
CPU = {"method": "emdcfl", "dataset": "rotmnist", "num-clients": 40, "emdcfl.rotation": "max",
       "emdcfl.samples": 5420, "emdcfl.test-samples": 250, "emdcfl.val-fraction": 0.1,
       "emdcfl.local-epochs": 2, "emdcfl.lr": 0.05, "emdcfl.batch-size": 32,
       "emdcfl.conv1": 8, "emdcfl.conv2": 16, "emdcfl.embed-dim": 128, "emdcfl.epsilon": 0.1,
       "emdcfl.workers": 1, "emdcfl.proj-ratio": 0.9, "emdcfl.metric": "cosine",
       "emdcfl.max-samples": 512, "evaluate": True, "plots": False, "seed": 0}
SAME = ("clusters", "eval_acc_mean", "eval_acc_per_client", "eval_ari")


def engine_round(cfg: dict, batch: bool) -> tuple[float, float, dict]:
    """(wall seconds, CPU seconds of this process, metrics) of one run."""
    from server_app.inprocess import run_server

    with tempfile.TemporaryDirectory(prefix="fedclust-bench-") as tmp:
        t0, c0 = time.perf_counter(), time.process_time()
        summary, _ = run_server({**cfg, "output-dir": tmp}, batch=batch)
        return time.perf_counter() - t0, time.process_time() - c0, summary["metrics"]


def loop_round(cfg: dict, stack: bool) -> tuple[float, dict]:
    from fedclust.config import validate
    from fedclust.emdcfl import batched, loop
    from fedclust.emdcfl.keys import EMDCFLSettings
    from fedclust.results import MemoryRecord

    s = EMDCFLSettings.from_config(validate(cfg))
    clients = batched.BatchedClients.simulated(s, cfg["num-clients"],
                                               batched.Batching(stack=stack))
    t0 = time.perf_counter()
    m = loop.run(clients, s, MemoryRecord())
    return time.perf_counter() - t0, m


def main() -> None:
    ap = parser(__doc__.split("\n\n")[0], data_dir="required", clients=40)
    ap.add_argument("--samples", type=int, default=5420)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--stacked", action="store_true")
    a = ap.parse_args()
    cfg = {**CPU, "data-dir": a.data_dir, "num-clients": a.clients, "emdcfl.samples": a.samples,
           "emdcfl.rounds": a.rounds}
    engine_round({**cfg, "num-clients": 4, "emdcfl.samples": 200}, True)      # imports, data
    ref_s, ref_c, ref = engine_round(cfg, batch=False)
    new_s, new_c, new = engine_round(cfg, batch=True)
    same = all(ref[k] == new[k] for k in SAME)
    print(f"cpu preset, {a.clients} clients x {a.samples} images, {a.rounds} round(s), "
          "in-process engine, one CPU thread (wall / CPU seconds):")
    print(f"  one message at a time   {ref_s:8.1f} / {ref_c:8.1f} s  (training "
          f"{ref['training_s']:.1f}, clustering {ref['clustering_s']:.1f})")
    print(f"  a phase at a time       {new_s:8.1f} / {new_c:8.1f} s  (training "
          f"{new['training_s']:.1f}, clustering {new['clustering_s']:.1f})")
    print(f"  ratio                   {new_s / ref_s:8.3f} / {new_c / ref_c:8.3f}    "
          f"(same clusters and accuracies: {same})")
    if a.stacked:
        per_s, per = loop_round(cfg, stack=False)
        st_s, st = loop_round(cfg, stack=True)
        print("  Flower-free loop, per-client kernels "
              f"{per_s:8.1f} s, stacked {st_s:8.1f} s, ratio {st_s / per_s:.3f} "
              f"(ARI {per['eval_ari']:.3f} / {st['eval_ari']:.3f}, ACC "
              f"{per['eval_acc_mean']:.4f} / {st['eval_acc_mean']:.4f})")


if __name__ == "__main__":
    main()
