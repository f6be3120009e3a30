"""The real app through `flwr run` on Flower's Simulation Engine (private SuperLink).

Checks the run *status* (flwr run exits 0 on failed runs), the results contract, and that the
simulation engine gives the same centers as the in-process grid for the same seed.
"""

import json

import numpy as np
import pytest

from server_app.engine import SimulationSuperLink
from tests.fake_grid import run_server

pytestmark = [pytest.mark.slow, pytest.mark.exclusive("ray")]


def test_exact_fcm_and_fedfcm_run_on_the_simulation_engine(tmp_path):
    jobs = {
        "exact-fcm": {"method": "exact-fcm", "num-clients": 4, "seed": 5},
        "fedfcm": {"method": "fedfcm", "num-clients": 3, "fedfcm.k-min": 2,
                   "fedfcm.k-max": 4, "seed": 5},
    }
    with SimulationSuperLink() as link:
        for name, cfg in jobs.items():
            out = tmp_path / name
            res = link.run({**cfg, "output-dir": str(out)}, num_supernodes=cfg["num-clients"])
            assert res.ok, f"{name}: {res.status}\n{res.log[-3000:]}"
            summary = json.loads((out / "summary.json").read_text())
            assert set(summary) >= {"method", "dataset", "seed", "num_clients", "config",
                                    "wall_time_s", "metrics"}
            assert summary["config"]["method"] == name and summary["seed"] == 5
            assert (out / "history.jsonl").read_text().strip()
            ref = tmp_path / f"{name}-inprocess"
            run_server({**cfg, "output-dir": str(ref)})
            np.testing.assert_allclose(np.load(out / "centers.npy"), np.load(ref / "centers.npy"),
                                       atol=1e-9)
    assert (tmp_path / "exact-fcm" / "shift.png").stat().st_size > 1000
    assert (tmp_path / "fedfcm" / "index_vs_k.png").stat().st_size > 1000
