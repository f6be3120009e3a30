"""bench/fedcref_assoc_probe.py: one AE training, one JSON line per (θ, α), any dataset."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_probe_grid_on_digits() -> None:
    cmd = [sys.executable, str(ROOT / "bench" / "fedcref_assoc_probe.py"), "--dataset", "digits",
           "--clients", "3", "--graph", "--theta", "0.1", "0.2", "--alpha", "0.75", "0.9",
           "--set", "num-clients=5", "fedcref.ae-epochs=2"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=300).stdout
    rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert [(r["theta"], r["alpha"]) for r in rows] == [(0.1, 0.75), (0.1, 0.9), (0.2, 0.75),
                                                         (0.2, 0.9)]
    assert all(r["dataset"] == "digits" for r in rows)
    # acceptance can only grow with θ and shrink with α
    acc = {(r["theta"], r["alpha"]): r["same_class"]["accept_one_direction"] for r in rows}
    assert acc[(0.1, 0.75)] <= acc[(0.2, 0.75)] and acc[(0.2, 0.9)] <= acc[(0.2, 0.75)]
    assert all(r["best_per_client"]["edges"] <= r["all_pairs"]["edges"] for r in rows)


def test_probe_preference_rule_on_digits() -> None:
    cmd = [sys.executable, str(ROOT / "bench" / "fedcref_assoc_probe.py"), "--dataset", "digits",
           "--clients", "3", "--graph", "--rule", "eq2-preference", "--beta", "0.3", "0.6",
           "--set", "num-clients=5", "fedcref.ae-epochs=2"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=300).stdout
    rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert [(r["rule"], r["beta"]) for r in rows] == [("eq2-preference", 0.3),
                                                      ("eq2-preference", 0.6)]
    assert all(r["theta"] == 0.2 and r["alpha"] == 0.75 for r in rows)
    acc = [r["same_class"]["accept_one_direction"] for r in rows]
    assert acc[1] <= acc[0]            # a larger β accepts no more pairs
    assert rows[1]["best_per_client"]["edges"] <= rows[0]["best_per_client"]["edges"]
