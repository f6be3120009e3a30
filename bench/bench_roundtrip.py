"""Seconds per server↔client round trip on Flower's Deployment Engine (loopback).

Starts a SuperLink + N SuperNodes (``server_app.deploy.LoopbackDeployment``), runs exact FCM for
R rounds with ``fcm.epsilon=0`` (so exactly R + 2 round trips: scaling, R sum rounds, final) —
or, with ``--method fedfcm``, FedFCM with K = 2..4 in every message and ``fedfcm.tol=0``
(R + 2 round trips: scaling, R local rounds, FedFuzzDB) — and reads each round's wall time
from ``history.jsonl``. References measured in the same run:
the same job on the in-process grid (no engine: pure compute + message building), and the
cold start of one ClientApp process (``python -c "import client_apps.app"``), which every
deployment message pays because each message runs in a fresh process.

    python bench/bench_roundtrip.py [--nodes 3] [--rounds 4] [--tls] [--secure]
                                    [--method exact-fcm|fedfcm] [--repeat 2]

Prints one line per round and a summary; the load average is printed too, because on a shared
2-core machine the ClientApp start-up (imports) dominates and scales with the load.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from _common import ROOT, parser, seconds

from server_app.deploy import LoopbackDeployment, write_partitions


def cold_import_seconds(module: str = "client_apps.app", repeat: int = 2) -> float:
    return min(seconds(lambda: subprocess.run([sys.executable, "-c", f"import {module}"],
                                              cwd=ROOT, check=True))[0]
               for _ in range(repeat))


NOOP_PYPROJECT = """[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "noopapp"
version = "1.0.0"
dependencies = []

[tool.hatch.build.targets.wheel]
packages = ["."]

[tool.flwr.app]
publisher = "bench"

[tool.flwr.app.components]
serverapp = "noop_app:server"
clientapp = "noop_app:client"

[tool.flwr.app.config]
trips = 6
out = ""
"""

NOOP_APP = '''"""A Flower app that only makes round trips (the reference of bench_roundtrip.py)."""
import json
import time

from flwr.app import Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp

server = ServerApp()
client = ClientApp()


@client.query("noop")
def noop(msg: Message, context: Context) -> Message:
    return Message(RecordDict({"metrics": MetricRecord({"ok": 1})}), reply_to=msg)


@server.main()
def main(grid: Grid, context: Context) -> None:
    nodes = list(grid.get_node_ids())
    seconds = []
    for _ in range(int(context.run_config["trips"])):
        t0 = time.perf_counter()
        msgs = [Message(RecordDict(), dst_node_id=n, message_type="query.noop") for n in nodes]
        replies = list(grid.send_and_receive(msgs, timeout=600))
        assert len(replies) == len(nodes) and not any(r.has_error() for r in replies)
        seconds.append(time.perf_counter() - t0)
    with open(str(context.run_config["out"]), "w") as fh:
        json.dump(seconds, fh)
'''


def noop_app(folder: Path) -> Path:
    """Write the no-op Flower app into ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "pyproject.toml").write_text(NOOP_PYPROJECT)
    (folder / "noop_app.py").write_text(NOOP_APP)
    return folder


def main() -> int:
    ap = parser(__doc__, raw=True)
    ap.add_argument("--nodes", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--tls", action="store_true", help="TLS + SuperNode authentication")
    ap.add_argument("--secure", action="store_true",
                    help="exact FCM with SecAgg+ sums (4 trips per round and for the final phase)")
    ap.add_argument("--method", choices=("exact-fcm", "fedfcm"), default="exact-fcm")
    ap.add_argument("--repeat", type=int, default=2,
                    help="fedclust and no-op runs, alternating, on one deployment")
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
    inproc = seconds(lambda: run_server({**cfg, "output-dir": str(work / "inprocess")}))[0]
    inproc /= args.rounds + 2
    print(f"reference: in-process grid {inproc * 1000:.1f} ms per round trip")
    data = write_partitions(cfg, work / "data")
    trips_per_run = args.rounds + 2 + ((args.rounds + 1) * 3 if args.secure else 0)
    app = noop_app(work / "noop")
    runs, noops, rounds = [], [], []
    with LoopbackDeployment([{"data-path": str(p)} for p in data], tls=args.tls,
                            auth=args.tls, workdir=work / "flwr") as dep:
        for i in range(args.repeat):
            out = work / f"deploy{i}"
            res = dep.run({**cfg, "dataset": "local", "output-dir": str(out)})
            if not res.ok:
                print(res.log[-3000:])
                print(f"run failed: {res.status}")
                return 1
            runs.append(json.loads((out / "summary.json").read_text())["wall_time_s"]
                        / trips_per_run)
            # the same measure as the no-op app's: seconds of each FCM round's round trip
            rounds.extend(json.loads(x)["seconds"] for x in
                          (out / "history.jsonl").read_text().splitlines())
            noop_out = work / f"noop{i}.json"
            res = dep.run({"trips": trips_per_run, "out": str(noop_out)}, app_dir=app)
            if not res.ok:
                print(res.log[-3000:])
                print(f"no-op run failed: {res.status}")
                return 1
            noops.append(statistics.median(json.loads(noop_out.read_text())))
            print(f"pair {i}: fedclust {runs[-1]:.2f} s per round trip (whole run / "
                  f"{trips_per_run}), no-op app {noops[-1]:.2f} s (median)")
    history = [json.loads(x) for x in (work / "deploy0" / "history.jsonl").read_text()
               .splitlines()]
    for h in history:
        print(f"round {h['round']}: {h['seconds']:.2f} s "
              f"({h.get('contributed', h.get('replies'))} clients)")
    fed, ref = statistics.median(runs), statistics.median(noops)
    print(f"deployment {args.method} ({'TLS+auth' if args.tls else 'insecure'}, {args.nodes} "
          f"SuperNodes{', SecAgg+' if args.secure else ''}): {fed:.2f} s per round trip "
          f"({trips_per_run} round trips per run, median of {args.repeat} runs)")
    print(f"no-op Flower app, same deployment: {ref:.2f} s per round trip")
    print(f"ratio fedclust / no-op app per round trip: {fed / ref:.2f} (whole run, with "
          f"start-up and result files, / round trips)")
    per_round = statistics.median(rounds)
    print(f"median FCM round trip {per_round:.2f} s over {len(rounds)} rounds; ratio to the no-op "
          f"app's median round trip: {per_round / ref:.2f}")
    print(f"ratio deployment / in-process per round trip: {fed / inproc:.0f}x; "
          f"round trip / cold ClientApp import: {fed / cold:.2f}")
    print(f"load average after: {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
