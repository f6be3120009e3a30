"""A Strategy object owns its run: ``start()`` returns the run it built in memory (and still
writes the files), and the ServerApp's run config is validated once."""

from __future__ import annotations

import numpy as np
import pytest

from client_apps.app import app as client_app
from server_app.inprocess import InProcessGrid
from strategies.methods import ExactFCM, FedFCM, RunResult, from_run_config

BLOBS = {"dataset": "blobs", "num-clients": 3, "seed": 1, "plots": False}


@pytest.mark.parametrize("strategy", [ExactFCM(n_clusters=3, fraction=0.7),
                                      ExactFCM(n_clusters=3, secure_aggregation=True),
                                      FedFCM(k_max=4)], ids=["exact", "secure", "fedfcm"])
def test_start_returns_the_run_it_built_not_a_copy_read_back(tmp_path, monkeypatch, strategy):
    cfg = {**BLOBS, "output-dir": str(tmp_path)}

    def no_reading(*args, **kwargs):
        raise AssertionError("start() read the run back from its folder")

    monkeypatch.setattr(RunResult, "from_dir", no_reading)
    grid = InProcessGrid(client_app, 3, {**cfg, **strategy.run_config()})
    result = strategy.start(grid, run_config=dict(cfg))
    monkeypatch.undo()
    stored = RunResult.from_dir(tmp_path)       # what the files say
    assert result.summary == stored.summary
    assert result.history == stored.history
    assert result.run_dir == stored.run_dir == tmp_path.resolve()
    assert list(result.arrays) == list(stored.arrays)
    for name in stored.arrays:
        np.testing.assert_array_equal(result.arrays[name].numpy(), stored.arrays[name].numpy())
    assert result.centers is not None and result.centers.shape[1] == 2


def test_the_serverapp_path_validates_the_run_config_once(tmp_path, monkeypatch):
    import fedclust.config
    import strategies.run

    calls = []
    real = fedclust.config.validate

    def counting(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(fedclust.config, "validate", counting)
    monkeypatch.setattr(strategies.run, "validate", counting)
    cfg = {**BLOBS, "method": "exact-fcm", "fcm.n-clusters": 3, "output-dir": str(tmp_path)}
    strategy, rest = from_run_config(cfg)          # what the ServerApp's main does
    strategy.start(InProcessGrid(client_app, 3, cfg), run_config=rest)
    assert len(calls) == 1
    # another run config than the one validated is validated again
    strategy.start(InProcessGrid(client_app, 3, cfg),
                   run_config={**rest, "output-dir": str(tmp_path / "b")})
    assert len(calls) == 2


@pytest.mark.parametrize("run_config", [
    {"method": "exact-fcm", "fcm.n-clusters": 3, "scaling": "standard", "seed": 4},
    {"method": "fedfcm", "fedfcm.k-max": 4, "dataset": "iris"},
    {"dataset": "iris"},
])
def test_what_start_runs_validates_to_what_from_run_config_validated(run_config):
    """The run config ``start`` runs (the method's parameters at their given or default
    values) is what ``from_run_config`` validated, so ``start`` need not validate it again."""
    from fedclust.config import validate

    strategy, rest = from_run_config(run_config)
    runs, validated = strategy._validated
    assert runs == strategy.full_run_config(run_config=rest)
    assert validate(runs) == validated == validate(run_config)
