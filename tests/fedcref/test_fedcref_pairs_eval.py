"""bench/fedcref_pairs_eval.py --parts on a planted cache: which part of the confident test
passes which pairs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]


def _planted_cache(path: Path, lag: float) -> None:
    """3 clients × 2 clusters (classes 0 and 1), 200 samples each. A model explains its own
    class (log error ~ 0) and not the other (+1.1); client 0's class-0 model trails the
    other class-0 models by ``lag`` in log error on every sample."""
    rng = np.random.default_rng(0)
    owner = [(i, q) for i in range(3) for q in range(2)]
    arrays: dict[str, np.ndarray] = {"owner": np.array(owner, dtype=np.int64)}
    for i in range(3):
        y = np.repeat([0, 1], 200)
        held = np.zeros(400, dtype=bool)
        held[rng.choice(400, 80, replace=False)] = True
        err = np.empty((len(owner), 400), dtype=np.float32)
        for r, (j, q) in enumerate(owner):
            log_e = np.where(y == q, 0.0, 1.1) + rng.normal(0, 0.02, 400)
            if (j, q) == (0, 0) and i != 0:
                log_e = log_e + lag
            err[r] = np.exp(log_e)
        arrays.update({f"err{i}": err, f"labels{i}": y, f"held{i}": held, f"y{i}": y})
    np.savez(path, **arrays)


def _parts(cache: Path, growth: float) -> dict:
    cmd = [sys.executable, str(ROOT / "bench" / "fedcref_pairs_eval.py"), str(cache), "--parts",
           "--tests", f"confident:epsilon=0.3,beta=0.02,delta=0.1,delta_growth={growth}"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=300).stdout
    return json.loads(out.splitlines()[0])


def test_parts_show_the_best_margin_rejecting_a_lagging_same_class_model(tmp_path) -> None:
    cache = tmp_path / "planted.npz"
    _planted_cache(cache, lag=0.15)
    rows = _parts(cache, 0.0)
    # same class: 2 foreign models per cluster, 6 clusters; the 2 clusters of class 0 that
    # see client 0's lagging model reject it on the best-margin part only
    assert rows["same"] == {"pairs": 12, "own": 1.0, "best": round(10 / 12, 4),
                            "others": 1.0, "all": round(10 / 12, 4)}
    assert rows["different"]["pairs"] == 12 and rows["different"]["all"] == 0.0
    assert rows["different"]["own"] == 0.0 and rows["different"]["best"] == 0.0
    # with growth, 200 samples widen the margin to 0.1 * (200/60)^0.3 = 0.14 < 0.15: still out;
    # at γ = 0.5 it is 0.18 and the lagging model passes
    assert _parts(cache, 0.3)["same"]["best"] == round(10 / 12, 4)
    assert _parts(cache, 0.5)["same"]["all"] == 1.0


def test_parts_by_class_split_the_same_class_pairs_and_sum_over_caches(tmp_path) -> None:
    a, b = tmp_path / "a.npz", tmp_path / "b.npz"
    _planted_cache(a, lag=0.15)
    _planted_cache(b, lag=0.0)
    cmd = [sys.executable, str(ROOT / "bench" / "fedcref_pairs_eval.py"), str(a), str(b),
           "--parts", "--by-class", "--tests", "confident:epsilon=0.3,beta=0.02,delta=0.1"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=300).stdout
    first, second, total = (json.loads(line) for line in out.splitlines())
    # only class 0 holds the lagging model: its 6 same-class pairs lose 2 on the best margin
    assert first["same:0"] == {"pairs": 6, "own": 1.0, "best": round(4 / 6, 4),
                               "others": 1.0, "all": round(4 / 6, 4)}
    assert first["same:1"]["all"] == 1.0 and second["same:0"]["all"] == 1.0
    assert "different:0" not in first
    # the last line sums the pairs of both caches
    assert total["system"] == "all"
    assert total["same"] == {"pairs": 24, "own": 1.0, "best": round(22 / 24, 4),
                             "others": 1.0, "all": round(22 / 24, 4)}
    assert total["same:0"]["pairs"] == 12 and total["same:0"]["all"] == round(10 / 12, 4)
