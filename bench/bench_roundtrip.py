"""Seconds per server↔client round trip on Flower's Deployment Engine (loopback).

Starts a SuperLink + N SuperNodes (``fedclust.deploy.LoopbackDeployment``), runs exact FCM for
R rounds with ``fcm.epsilon=0`` (so exactly R + 2 round trips: scaling, R sum rounds, final) —
or, with ``--method fedfcm``, FedFCM with K = 2..4 in every message and ``fedfcm.tol=0``
(R + 2 round trips: scaling, R local rounds, FedFuzzDB) — and reads each round's wall time
from ``history.jsonl``. References measured in the same run:
the same job on the in-process grid (no engine: pure compute + message building), and the
cold start of one ClientApp process (``python -c "import client_apps.app"``), which every
deployment message pays because each message runs in a fresh process.

    python bench/bench_roundtrip.py [--nodes 3] [--rounds 4] [--tls] [--secure]
                                    [--method exact-fcm|fedfcm]

Prints one line per round and a summary; the load average is printed too, because on a shared
2-core machine the ClientApp start-up (imports) dominates and scales with the load.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fedclust.deploy import LoopbackDeployment, write_partitions  # noqa: E402


def cold_import_seconds(module: str = "client_apps.app", repeat: int = 2) -> float:
    root = Path(__file__).resolve().parents[1]
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", f"import {module}"], cwd=root, check=True)
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--tls", action="store_true", help="TLS + SuperNode authentication")
    ap.add_argument("--secure", action="store_true",
                    help="exact FCM with SecAgg+ sums (4 trips per round and for the final phase)")
    ap.add_argument("--method", choices=("exact-fcm", "fedfcm"), default="exact-fcm")
    args = ap.parse_args()
    if args.secure and args.method != "exact-fcm":
        ap.error("--secure applies to --method exact-fcm only")
    os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
    cfg = {"method": args.method, "num-clients": args.nodes, "seed": 0, "plots": False,
           "timeout": 600.0}
    if args.method == "exact-fcm":
        cfg.update({"fcm.max-rounds": args.rounds, "fcm.epsilon": 0.0,
                    "fcm.secure-aggregation": args.secure})
    else:
        cfg.update({"fedfcm.k-min": 2, "fedfcm.k-max": 4, "fedfcm.max-rounds": args.rounds,
                    "fedfcm.tol": 0.0})
    work = Path(tempfile.mkdtemp(prefix="bench-rt-"))
    print(f"load average before: {os.getloadavg()}")
    cold = cold_import_seconds()
    print(f"reference: cold ClientApp import (python -c 'import client_apps.app') {cold:.2f} s")
    from server_app.inprocess import run_server

    run_server({**cfg, "output-dir": str(work / "warmup")})  # imports, caches
    t0 = time.perf_counter()
    run_server({**cfg, "output-dir": str(work / "inprocess")})
    inproc = (time.perf_counter() - t0) / (args.rounds + 2)
    print(f"reference: in-process grid {inproc * 1000:.1f} ms per round trip")
    data = write_partitions(cfg, work / "data")
    with LoopbackDeployment([{"data-path": str(p)} for p in data], tls=args.tls,
                            auth=args.tls, workdir=work / "flwr") as dep:
        res = dep.run({**cfg, "dataset": "local", "output-dir": str(work / "deploy")})
    if not res.ok:
        print(res.log[-3000:])
        print(f"run failed: {res.status}")
        return 1
    history = [json.loads(x) for x in (work / "deploy" / "history.jsonl").read_text()
               .splitlines()]
    per_round = [h["seconds"] for h in history]
    for h in history:
        print(f"round {h['round']}: {h['seconds']:.2f} s "
              f"({h.get('contributed', h.get('replies'))} clients)")
    med = statistics.median(per_round)
    trips = 4 if args.secure else 1
    total_trips = args.rounds + 2 + ((args.rounds + 1) * 3 if args.secure else 0)
    print(f"deployment {args.method} ({'TLS+auth' if args.tls else 'insecure'}, {args.nodes} "
          f"SuperNodes{', SecAgg+' if args.secure else ''}): median {med:.2f} s per round = "
          f"{med / trips:.2f} s per round trip; whole run {res.seconds:.1f} s "
          f"({total_trips} round trips)")
    print(f"ratio deployment / in-process per round trip: {med / trips / inproc:.0f}x; "
          f"round trip / cold ClientApp import: {med / trips / cold:.2f}")
    print(f"load average after: {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
