"""bench/fedcref_assoc_probe.py: one AE training, one JSON line per (θ, α), any dataset."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _probe(*args: str) -> list[dict]:
    """The probe's JSON rows for 3 digits clients (2 autoencoder epochs) and ``args``."""
    cmd = [sys.executable, str(ROOT / "bench" / "fedcref_assoc_probe.py"), "--dataset", "digits",
           "--clients", "3", "--graph", *args, "--set", "num-clients=5", "fedcref.ae-epochs=2"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=300).stdout
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def test_probe_grid_on_digits() -> None:
    rows = _probe("--theta", "0.1", "0.2", "--alpha", "0.75", "0.9")
    assert [(r["theta"], r["alpha"]) for r in rows] == [(0.1, 0.75), (0.1, 0.9), (0.2, 0.75),
                                                         (0.2, 0.9)]
    assert all(r["dataset"] == "digits" for r in rows)
    # acceptance can only grow with θ and shrink with α
    acc = {(r["theta"], r["alpha"]): r["same_class"]["accept_one_direction"] for r in rows}
    assert acc[(0.1, 0.75)] <= acc[(0.2, 0.75)] and acc[(0.2, 0.9)] <= acc[(0.2, 0.75)]
    assert all(r["best_per_client"]["edges"] <= r["all_pairs"]["edges"] for r in rows)


def test_probe_ratio_rule_on_digits() -> None:
    rows = _probe("--rule", "ratio", "--epsilon", "0.1", "0.5")
    assert [(r["rule"], r["epsilon"]) for r in rows] == [("ratio", 0.1), ("ratio", 0.5)]
    acc = [r["same_class"]["accept_one_direction"] for r in rows]
    assert acc[0] <= acc[1]            # a larger ε accepts no fewer pairs
    assert rows[0]["all_pairs"]["edges"] <= rows[1]["all_pairs"]["edges"]


def test_probe_calibrated_rule_on_digits() -> None:
    rows = _probe("--rule", "calibrated", "--lam", "0.2", "0.8")
    assert [(r["rule"], r["lambda"]) for r in rows] == [("calibrated", 0.2), ("calibrated", 0.8)]
    acc = [r["different_class"]["accept_one_direction"] for r in rows]
    assert acc[0] <= acc[1]            # a larger λ accepts no fewer pairs
    assert rows[0]["all_pairs"]["edges"] <= rows[1]["all_pairs"]["edges"]
