"""FedCRef traffic per client per iteration, two settings on the same system in one run.

Runs FedCRef twice through the in-process grid (the real ServerApp and ClientApp) on one
simulated system and prints, for each, the bytes a client sends and receives per iteration
(``bytes_per_client_iter`` of summary.json: every message payload of the run, divided by the
clients and the iterations), the final ACC, the ratio of the two traffic figures, and the
same figure per phase (``bytes_per_client_iter_by_phase``)::

    python bench/bench_fedcref_traffic.py --data-dir $FEDCLUST_DATA_DIR --seed 100

The reference is the earlier default (the ratio test, the paper's refinement, float32
weights, no graph cuts, links in every iteration, 15 FedAvg rounds of 3 local epochs per
community); the candidate is the current default (the run-config defaults).
``--set`` adds run-config overrides to both; ``--reference`` / ``--candidate`` to one.
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

from _common import pairs, parser

PREVIOUS = ["fedcref.assoc-rule=ratio", "fedcref.refine=paper", "fedcref.wire=float32",
            "fedcref.cannot-link=false", "fedcref.bridge-cut=0", "fedcref.new-links=every",
            "fedcref.fl-rounds=15", "fedcref.fl-local-epochs=3"]


def run(cfg: dict[str, str]) -> dict:
    from server_app.inprocess import run_server

    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        summary, _ = run_server({**cfg, "output-dir": str(Path(tmp) / "run")})
        m = summary["metrics"]
        return {"bytes_per_client_iter": m["bytes_per_client_iter"],
                "by_phase": {k: round(v) for k, v in
                             m["bytes_per_client_iter_by_phase"].items()},
                "iterations": m["iterations"], "acc_end": m.get("eval_acc_end"),
                "communities": m["communities"], "wall_s": round(time.perf_counter() - t0, 1)}


def main() -> None:
    ap = parser(__doc__, first_line=True, data_dir=True, dataset="mnist", clients=10,
                samples_per_cluster=150, seed=100, overrides=True)
    ap.add_argument("--reference", nargs="*", default=PREVIOUS)
    ap.add_argument("--candidate", nargs="*", default=[])
    args = ap.parse_args()
    base = {"method": "fedcref", "dataset": args.dataset, "data-dir": args.data_dir,
            "fedcref.split": "all", "num-clients": args.clients, "seed": args.seed,
            "fedcref.samples-per-cluster": args.samples_per_cluster, "plots": False,
            **pairs(args.set)}
    ref = run({**base, **pairs(args.reference)})
    new = run({**base, **pairs(args.candidate)})
    print(json.dumps({"reference": {"set": args.reference, **ref},
                      "candidate": {"set": args.candidate, **new}}, indent=1))
    print(f"bytes per client per iteration: reference {ref['bytes_per_client_iter'] / 1e6:.1f} "
          f"MB, candidate {new['bytes_per_client_iter'] / 1e6:.1f} MB, "
          f"{ref['bytes_per_client_iter'] / new['bytes_per_client_iter']:.2f}x less; ACC "
          f"{ref['acc_end']:.3f} -> {new['acc_end']:.3f}")
    for phase in sorted(set(ref["by_phase"]) | set(new["by_phase"])):
        r, c = ref["by_phase"].get(phase, 0) / 1e6, new["by_phase"].get(phase, 0) / 1e6
        print(f"  {phase}: reference {r:.1f} MB, candidate {c:.1f} MB"
              + (f", {r / c:.2f}x less" if c > 0 else ""))


if __name__ == "__main__":
    main()
