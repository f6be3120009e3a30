"""The server aggregates replies in a fixed order (by node id): the same inputs give the same
bits whatever order the nodes answer in.

Floating-point sums depend on the order of their terms, so a server that added replies in
arrival order would give results that depend on which node answered first (a re-sent message,
a slow node). Each method runs twice on the in-process grid: once with the replies in the
order the messages were sent, once with every phase's replies shuffled; the arrays the run
wrote and its metrics must be identical bit for bit (here the order of the arithmetic is
fixed by the rule under test, so a bit-for-bit comparison is the point).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest

from client_apps.app import app as client_app
from server_app.app import run_method
from server_app.inprocess import InProcessGrid

SMALL = {
    "exact": {"method": "exact-fcm", "fcm.max-rounds": 4, "fcm.epsilon": 0.0},
    "incremental": {"method": "exact-fcm", "fcm.max-rounds": 4, "fcm.epsilon": 0.0,
                    "fcm.incremental": True},
    "fedfcm": {"method": "fedfcm", "fedfcm.k-max": 3, "fedfcm.max-rounds": 3},
    "fedavg": {"method": "fedfcm", "fedfcm.k-max": 3, "fedfcm.max-rounds": 3,
               "fedfcm.averaging": "fedavg"},
    "emdcfl": {"method": "emdcfl", "dataset": "rotdigits", "emdcfl.samples": 20,
               "emdcfl.test-samples": 10, "emdcfl.rounds": 2, "emdcfl.conv1": 4,
               "emdcfl.conv2": 4, "emdcfl.embed-dim": 8, "emdcfl.max-samples": 16,
               "emdcfl.workers": 1},
    "fedcref": {"method": "fedcref", "fedcref.max-iterations": 1, "fedcref.fl-rounds": 2,
                "fedcref.ae-epochs": 2, "fedcref.ae-hidden": "16,8",
                "fedcref.samples-per-cluster": 10},
}
# values that measure the machine, not the run
TIMES = ("_s", "seconds", "elapsed", "share_of_run")


class ShuffledGrid(InProcessGrid):
    """Replies of every exchange in a shuffled order (seeded)."""

    def __init__(self, *args, order_seed: int = 0, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.rng = random.Random(order_seed)

    def send_and_receive(self, messages, *, timeout=None):
        replies = list(super().send_and_receive(messages, timeout=timeout))
        self.rng.shuffle(replies)
        return replies


def _strip(value):
    if isinstance(value, dict):
        return {k: _strip(v) for k, v in value.items()
                if not k.endswith(TIMES) and "seconds" not in k}
    if isinstance(value, list):
        return [_strip(v) for v in value]
    return value


def _run(grid_cls, cfg: dict, out: Path, **kwargs) -> tuple[dict, dict[str, np.ndarray]]:
    cfg = {"num-clients": 4, "seed": 3, "plots": False, **cfg, "output-dir": str(out)}
    summary = run_method(grid_cls(client_app, 4, cfg, **kwargs), cfg)
    history = [json.loads(line) for line in (out / "history.jsonl").read_text().splitlines()]
    summary = {**summary, "history": history}
    return summary, {p.name: np.load(p) for p in sorted(out.glob("*.npy"))}


@pytest.mark.parametrize("method", list(SMALL))
def test_the_result_does_not_depend_on_the_order_of_the_replies(tmp_path, method):
    ref, ref_arrays = _run(InProcessGrid, SMALL[method], tmp_path / "sent-order")
    for seed in (1, 2):
        got, arrays = _run(ShuffledGrid, SMALL[method], tmp_path / f"shuffled-{seed}",
                           order_seed=seed)
        assert _strip(got["metrics"]) == _strip(ref["metrics"])
        assert _strip(got["history"]) == _strip(ref["history"])
        assert sorted(arrays) == sorted(ref_arrays)
        for name, arr in arrays.items():
            assert arr.tobytes() == ref_arrays[name].tobytes(), name
