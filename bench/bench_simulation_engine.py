"""Benchmark one full run on Flower's Simulation Engine: wall time, peak memory, phase split.

The run goes through ``flwr run`` against a private ``flower-superlink --simulation`` (Ray
backend, one CPU per ClientApp), exactly as ``fedclust-sweep engine=flower`` runs it. With
``--inprocess-reference`` the same config then runs through the in-process grid (the same
ServerApp loop and ClientApp handlers, no engine) and the ratio of the two wall times is printed.

    python bench/bench_simulation_engine.py --supernodes 25 --set method=fedcref \\
        dataset=mnist data-dir=$FEDCLUST_DATA_DIR fedcref.split=all num-clients=25 \\
        fedcref.dirtiness=0.3 --inprocess-reference

Peak memory is read machine-wide (``MemTotal - MemAvailable`` from ``/proc/meminfo`` every
0.5 s, minus the value before the SuperLink starts): the engine spreads the run over the
SuperLink, the ServerApp process and Ray workers, which do not share one process tree. Run it
on an otherwise idle machine. It also prints where the memory sits at the peak: private
(anonymous) RSS summed over the ServerApp, the ClientApp actors, the SuperLink and Ray's own
services, and the machine's shared memory (Ray's object store), each with its own peak.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

from _common import pairs, parser, ratio, seconds


def meminfo() -> dict[str, int]:
    info = {}
    for line in Path("/proc/meminfo").read_text().splitlines():
        name, value = line.split(":", 1)
        info[name] = int(value.split()[0]) * 1024
    return info


def used_bytes() -> int:
    info = meminfo()
    return info["MemTotal"] - info["MemAvailable"]


# (command-line pattern, label); first match wins. In simulation the ServerApp runs inside the
# flwr-simulation process; flwr-serverapp is the deployment process.
PROCESS_KINDS = (("flwr-simulation", "serverapp + simulation engine"),
                 ("flwr-serverapp", "serverapp"), ("ClientAppActor", "clientapp actors"),
                 ("superlink", "superlink"), ("ray", "ray services"))


def process_memory(skip: set[int]) -> dict[str, int]:
    """Private (anonymous) RSS in bytes summed per kind of Flower/Ray process."""
    out = {kind: 0 for _, kind in PROCESS_KINDS}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) in skip:
            continue
        try:
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            status = (proc / "status").read_text()
        except OSError:
            continue
        kind = next((k for pattern, k in PROCESS_KINDS if pattern in cmd), None)
        if kind is None:
            continue
        for line in status.splitlines():
            if line.startswith("RssAnon:"):
                out[kind] += int(line.split()[1]) * 1024
    return out


class PeakMemory:
    """Sample machine-wide used memory in a background thread; ``peak`` is above the baseline.

    ``parts`` holds the per-kind breakdown (``process_memory``, plus shared memory above its
    value before the run) at the sample with the highest machine-wide use, ``part_peaks``
    each kind's own peak over the run.
    """

    def __init__(self, interval: float = 0.5) -> None:
        self.interval = interval
        self.baseline = used_bytes()
        self.skip = {int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()}
        self.shm0 = meminfo()["Shmem"]      # shared memory in use before the run
        self.peak = 0
        self.parts: dict[str, int] = {}
        self.part_peaks: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.is_set():
            info = meminfo()
            used = info["MemTotal"] - info["MemAvailable"] - self.baseline
            parts = process_memory(self.skip)
            # Ray's object store lives in /dev/shm: shared, so counted once, machine-wide
            parts["shared memory (machine)"] = info["Shmem"] - self.shm0
            for k, v in parts.items():
                self.part_peaks[k] = max(self.part_peaks.get(k, 0), v)
            if used >= self.peak:
                self.peak, self.parts = used, parts
            self._stop.wait(self.interval)

    def report(self) -> str:
        gib = 2**30
        return "; ".join(f"{k} {self.parts.get(k, 0) / gib:.2f} (own peak {v / gib:.2f})"
                         for k, v in self.part_peaks.items()) + " GiB"

    def __enter__(self) -> PeakMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def simulate(cfg: dict, nodes: int):
    """A SuperLink started, the run, the SuperLink stopped (what the wall time covers)."""
    from server_app.engine import SimulationSuperLink

    with SimulationSuperLink() as link:
        return link.run(cfg, num_supernodes=nodes, timeout=7200)


def main() -> None:
    ap = parser(__doc__.split("\n\n")[0], overrides=True)
    ap.add_argument("--supernodes", type=int, default=0, help="default: num-clients")
    ap.add_argument("--out", default="/tmp/fedclust-bench-sim")
    ap.add_argument("--inprocess-reference", action="store_true")
    a = ap.parse_args()

    from fedclust.config import validate

    raw = pairs(a.set)
    cfg = validate({**raw, "output-dir": str(Path(a.out) / "simulation")})
    nodes = a.supernodes or int(cfg["num-clients"])
    with PeakMemory() as mem:
        wall, outcome = seconds(lambda: simulate(cfg, nodes))
    if not outcome.ok:
        raise SystemExit(f"flwr run ended {outcome.status}:\n{outcome.log[-4000:]}")
    summary = json.loads((Path(cfg["output-dir"]) / "summary.json").read_text())
    print(f"simulation engine: {nodes} supernodes, wall {wall:.0f}s (SuperLink start to run "
          f"finished), run wall_time_s {summary['wall_time_s']:.0f}s, peak memory "
          f"{mem.peak / 2**30:.2f} GiB above idle")
    print(f"at the peak, private RSS by process kind: {mem.report()}")
    if summary["method"] == "fedcref":
        from bench.bench_fedcref_run import report

        print(report(summary, summary["wall_time_s"]))
    if a.inprocess_reference:
        from server_app.inprocess import run_server

        ref_cfg = {**cfg, "output-dir": str(Path(a.out) / "inprocess")}
        with PeakMemory() as ref_mem:
            ref_wall, (ref, _) = seconds(lambda: run_server(ref_cfg, num_nodes=nodes))
        print(f"in-process grid: wall {ref_wall:.0f}s, peak memory "
              f"{ref_mem.peak / 2**30:.2f} GiB above idle; simulation engine / in-process = "
              f"{ratio(wall, ref_wall)}x")
        same = {k: (summary["metrics"].get(k), ref["metrics"].get(k))
                for k in ("eval_acc_end", "communities", "eval_ari", "iterations")
                if k in summary["metrics"]}
        print(f"same result on both engines: {same}")


if __name__ == "__main__":
    main()
