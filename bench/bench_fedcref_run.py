"""Benchmark one full FedCRef run: wall time, peak memory, and the split between local
training, cross-evaluation, community training, refinement and Flower/message overhead.

    python bench/bench_fedcref_run.py --set dataset=mnist data-dir=$FEDCLUST_DATA_DIR \\
        fedcref.split=all num-clients=25 fedcref.dirtiness=0.3            # in-process grid
    python bench/bench_fedcref_run.py --summary /tmp/fcexp/mnist-d0.3/seed0  # report a run

The overhead of a phase is its wall time minus the compute time the clients reported for it
(serialisation, record building, message passing; with the in-process grid clients run one
after the other, so the two are directly comparable).
"""

from __future__ import annotations

import json
import resource
from pathlib import Path

from _common import pairs, parser, seconds

PHASES = ("local_training", "cross_evaluation", "community_training", "refinement")


def report(summary: dict, wall: float | None = None, peak_gib: float | None = None) -> str:
    m = summary["metrics"]
    wall = wall if wall is not None else summary["wall_time_s"]
    lines = [f"wall {wall:.0f}s" + (f", peak RSS {peak_gib:.2f} GiB" if peak_gib else "")
             + f", iterations {m['iterations']} ({m['stop_reason']})"]
    total_client = 0.0
    for p in PHASES:
        w = m["seconds"].get(p, 0.0)
        c = m["client_seconds"].get(p, 0.0)
        total_client += c
        lines.append(f"  {p:20s} wall {w:8.1f}s  client compute {c:8.1f}s  "
                     f"overhead {w - c:7.1f}s ({100 * w / wall:4.1f}% of wall)")
    lines.append(f"  server-side rest     {wall - sum(m['seconds'].values()):8.1f}s "
                 "(graph, FedAvg, metrics, plots)")
    lines.append(f"  bytes sent {m['bytes_sent'] / 2**20:.0f} MiB, received "
                 f"{m['bytes_received'] / 2**20:.0f} MiB")
    return "\n".join(lines)


def main() -> None:
    ap = parser(overrides=True, out="/tmp/fedcref-bench")
    ap.add_argument("--summary")
    a = ap.parse_args()
    if a.summary:
        d = Path(a.summary)
        bench = json.loads((d / "bench.json").read_text()) if (d / "bench.json").exists() else {}
        print(report(json.loads((d / "summary.json").read_text()), bench.get("wall_s"),
                     bench.get("peak_rss_gib")))
        return
    from server_app.inprocess import run_server

    cfg = {"method": "fedcref", "output-dir": a.out}
    cfg.update(pairs(a.set))
    wall, (summary, _) = seconds(lambda: run_server(cfg))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    print(report(summary, wall, peak))


if __name__ == "__main__":
    main()
