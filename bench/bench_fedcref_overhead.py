"""FedCRef: wall time of one small run with the former per-message handling against today's,
in the same process (the reference is measured in the same run; the ratio is printed).

Former handling (reconstructed here by patching the ClientApp module): every message hashed
the client's samples (SHA-256) for its identity key, because the 4-entry data cache thrashes
when one process serves more clients than that, and every message read and wrote the error
cache of received models. Today: the key is computed once and kept in ``context.state``; the
error cache is read and written only by the association phase. ``--reuse`` adds
``fedcref.reuse-communities=true`` to today's run (a community whose members' data did not
change keeps its model).

    python bench/bench_fedcref_overhead.py            # MNIST from $FEDCLUST_DATA_DIR, 10 clients
    python bench/bench_fedcref_overhead.py --reuse --set num-clients=12

Prints the phase split (wall seconds per phase, client compute, and the overhead = phase wall
minus client compute: messages, records, node state) of both runs, the ACC each reached, and
after/before for the wall time and for the overhead.
"""

from __future__ import annotations

import json
import os
import tempfile
import time

from _common import pairs, parser

PHASES = ("local_training", "cross_evaluation", "community_training", "refinement")


def _former(handlers) -> dict:
    """Patch the ClientApp module back to the former per-message handling; return the
    originals."""
    from fedclust.fedcref import client as core

    saved = {k: getattr(handlers, k) for k in ("node_key", "_load_state", "_save_state")}
    handlers.node_key = lambda context, x: core.client_key(x)
    handlers._load_state = lambda context, with_cache=False: saved["_load_state"](context, True)
    handlers._save_state = lambda context, st, with_cache=False: saved["_save_state"](
        context, st, True)
    return saved


def _run(cfg: dict) -> tuple[float, dict]:
    from server_app.inprocess import run_server

    out = tempfile.mkdtemp(prefix="fedcref-bench-")
    t0 = time.perf_counter()
    summary, _ = run_server({**cfg, "output-dir": out})
    return time.perf_counter() - t0, summary["metrics"]


def _overhead(m: dict) -> float:
    """Phase wall time not spent in the clients' reported compute: messages, records, state."""
    return sum(m["seconds"].get(p, 0.0) - m["client_seconds"].get(p, 0.0) for p in PHASES)


def _split(wall: float, m: dict) -> str:
    parts = [f"{p} {m['seconds'].get(p, 0.0):.1f}s (client {m['client_seconds'].get(p, 0.0):.1f}s)"
             for p in PHASES]
    return f"wall {wall:.1f}s: " + ", ".join(parts) + f"; overhead {_overhead(m):.2f}s"


def main() -> None:
    ap = parser(overrides=True)
    ap.add_argument("--reuse", action="store_true", help="today's run with reuse-communities")
    a = ap.parse_args()
    import client_apps.fedcref_handlers as handlers
    from fedclust.config import validate

    extra = pairs(a.set)
    cfg = {"method": "fedcref", "dataset": "mnist", "fedcref.split": "all",
           "data-dir": os.environ.get("FEDCLUST_DATA_DIR", "data"), "num-clients": 10,
           "fedcref.samples-per-cluster": 100, "seed": 100, "fedcref.max-iterations": 4,
           "plots": False, "fedcref.assoc-rule": "eq2", **extra}   # the measured rule
    validate(dict(cfg))
    saved = _former(handlers)
    try:
        before_wall, before = _run(cfg)
    finally:
        for k, v in saved.items():
            setattr(handlers, k, v)
    after_wall, after = _run({**cfg, **({"fedcref.reuse-communities": True} if a.reuse
                                        else {})})
    print("config", json.dumps({k: v for k, v in cfg.items() if k != "data-dir"}))
    print("former :", _split(before_wall, before), f"ACC {before.get('eval_acc_end')}")
    print("today  :", _split(after_wall, after), f"ACC {after.get('eval_acc_end')}")
    print(f"after/before wall = {after_wall / before_wall:.3f}, "
          f"overhead = {_overhead(after) / _overhead(before):.3f}")


if __name__ == "__main__":
    main()
