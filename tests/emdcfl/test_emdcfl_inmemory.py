"""EMD-CFL's loop over in-memory clients (fedclust/emdcfl/inmemory.py) against the same loop
over Flower messages (the in-process grid and the real ClientApp): same clusters, accuracies
and ARI."""

import json

import numpy as np
import pytest

from fedclust.config import validate
from fedclust.emdcfl import inmemory, loop
from fedclust.emdcfl.keys import EMDCFLSettings
from fedclust.results import MemoryRecord
from server_app.inprocess import run_server

SMALL = {"method": "emdcfl", "dataset": "rotdigits", "num-clients": 8, "emdcfl.rounds": 2,
         "emdcfl.local-epochs": 2, "emdcfl.lr": 0.05, "emdcfl.conv1": 4, "emdcfl.conv2": 8,
         "emdcfl.embed-dim": 16, "emdcfl.samples": 100, "emdcfl.test-samples": 30,
         "emdcfl.max-samples": 48, "emdcfl.workers": 1, "evaluate": True, "plots": False,
         "seed": 1}
SAME = ("num_clusters", "clusters", "eval_acc_mean", "eval_acc_worst", "eval_ari",
        "eval_truth", "eval_acc_per_client", "eval_coverage", "algorithm", "dropped_nodes")


@pytest.mark.parametrize("extra", [{}, {"emdcfl.clients-per-round": 5, "emdcfl.rounds": 3},
                                   {"emdcfl.algorithm": "ifca"},
                                   {"emdcfl.algorithm": "pacfl"}],
                         ids=["emdcfl", "emdcfl-partial", "ifca", "pacfl"])
def test_in_memory_clients_give_the_flower_run(tmp_path, extra):
    cfg = {**SMALL, **extra}
    flower, _ = run_server({**cfg, "output-dir": str(tmp_path / "flower")})
    s = EMDCFLSettings.from_config(validate(cfg))
    record = MemoryRecord()
    mine = loop.run(inmemory.InMemoryClients.simulated(s, cfg["num-clients"]), s, record)
    mine = json.loads(json.dumps(mine, default=str))     # NaN and tuples as summary.json has them
    got = {k: mine[k] for k in SAME}
    want = {k: flower["metrics"][k] for k in SAME}
    assert got == want
    assert len(record.history) == cfg["emdcfl.rounds"]
    if s.algorithm == "emdcfl":
        # the same distances, solved from the same projected clouds
        np.testing.assert_array_equal(record.arrays["emd_matrix"],
                                      np.load(tmp_path / "flower" / "emd_matrix.npy"))
