"""EMD-CFL through `flwr run` on Flower's Simulation Engine (private SuperLink)."""

import pytest

from tests.flwr_smoke import run_flwr

pytestmark = pytest.mark.slow


def test_emdcfl_runs_under_flwr_run(tmp_path):
    cfg = {"method": "emdcfl", "dataset": "rotdigits", "num-clients": 4,
           "emdcfl.samples": 60, "emdcfl.test-samples": 20, "emdcfl.rounds": 2,
           "emdcfl.conv1": 4, "emdcfl.conv2": 8, "emdcfl.embed-dim": 16, "emdcfl.workers": 1,
           "output-dir": str(tmp_path)}
    outcome, summary = run_flwr(cfg, num_supernodes=4)
    assert outcome.ok, f"{outcome.status}\n{outcome.log[-3000:]}"
    assert summary is not None and summary["config"]["method"] == "emdcfl"
    m = summary["metrics"]
    assert 1 <= m["num_clusters"] <= 4 and len(m["clusters"]) == 4
    assert m["bytes_sent"] > 0 and 0.0 <= m["eval_acc_mean"] <= 1.0
    assert (tmp_path / "emd_matrix.npy").exists() and (tmp_path / "emd_heatmap.png").exists()
