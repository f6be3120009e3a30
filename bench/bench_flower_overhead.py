"""Flower overhead: exact FCM, 20 clients — seconds per round on the Simulation Engine vs the
same ServerApp + ClientApp called in-process.

    python bench/bench_flower_overhead.py [--clients 20 --rounds 10]

Both runs use the same seed and data (blobs, 20 clients); the epsilon is 0 so that exactly
``--rounds`` rounds run. Per-round seconds are read from each run's history.jsonl (the first
round of the engine includes starting Ray, so it is reported separately).
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import numpy as np
from _common import parser, ratio

from server_app.engine import SimulationSuperLink
from server_app.inprocess import run_server


def per_round(out: Path) -> list[float]:
    return [json.loads(line)["seconds"] for line in (out / "history.jsonl").read_text().split("\n")
            if line.strip()]


def main() -> None:
    ap = parser(clients=20)
    ap.add_argument("--rounds", type=int, default=10)
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="fedclust-bench-"))
    cfg = {"method": "exact-fcm", "num-clients": a.clients, "fcm.epsilon": 0.0,
           "fcm.max-rounds": a.rounds, "blobs.n-samples": 20_000, "plots": False}
    # the in-process reference runs before and after the engine (a busy machine drifts)
    run_server({**cfg, "output-dir": str(tmp / "inprocess-1")})
    with SimulationSuperLink() as link:
        res = link.run({**cfg, "output-dir": str(tmp / "engine")}, num_supernodes=a.clients)
    assert res.ok, res.log[-3000:]
    run_server({**cfg, "output-dir": str(tmp / "inprocess-2")})
    inproc = per_round(tmp / "inprocess-1") + per_round(tmp / "inprocess-2")
    engine = per_round(tmp / "engine")
    s_in, s_en = float(np.median(inproc)), float(np.median(engine[1:]))
    print(f"exact FCM, {a.clients} clients, {a.rounds} rounds, 20,000 points")
    print(f"in-process grid      median {s_in * 1000:8.1f} ms/round")
    print(f"Simulation Engine    median {s_en * 1000:8.1f} ms/round (first round, incl. Ray "
          f"start: {engine[0]:.1f} s; whole flwr run {res.seconds:.1f} s)")
    print(f"ratio engine / in-process   {ratio(s_en, s_in, 1):>8}x")


if __name__ == "__main__":
    main()
