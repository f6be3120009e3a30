"""Exact federated FCM with SecAgg+ on the real Deployment Engine (3 SuperNodes, loopback).

One secure round costs 4 round trips (set-up, key shares, masked vectors, unmasking), so the
job is a single FCM round; its centers must equal the plain in-process run to 1e-9.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from server_app.deploy import LoopbackDeployment, write_partitions
from tests.fake_grid import run_server

pytestmark = pytest.mark.slow


def test_secure_aggregation_on_the_deployment_engine(tmp_path):
    cfg = {"method": "exact-fcm", "num-clients": 3, "seed": 7, "fcm.max-rounds": 1,
           "timeout": 300.0, "plots": False}
    data = write_partitions(cfg, tmp_path / "data")
    out = tmp_path / "secure"
    with LoopbackDeployment([{"data-path": str(p), "allow-evaluation": True} for p in data],
                            workdir=tmp_path / "flwr") as dep:
        res = dep.run({**cfg, "dataset": "local", "fcm.secure-aggregation": True,
                       "output-dir": str(out)}, timeout=900)
        assert res.ok, f"{res.status}\n{res.log[-3000:]}\n{dep.logs()}"
        assert "Secure aggregation completed" in res.log
    run_server({**cfg, "output-dir": str(tmp_path / "plain")})
    np.testing.assert_allclose(np.load(out / "centers.npy"),
                               np.load(tmp_path / "plain" / "centers.npy"), atol=1e-9, rtol=0)
    history = [json.loads(x) for x in (out / "history.jsonl").read_text().splitlines()]
    assert history[0]["contributed"] == 3 and history[0]["dropped_nodes"] == {}
    secure, plain = (json.loads((d / "summary.json").read_text())["metrics"]
                     for d in (out, tmp_path / "plain"))
    # J and the evaluation tables were summed with SecAgg+ too (final phase)
    assert secure["objective"] == pytest.approx(plain["objective"], rel=1e-9)
    assert secure["eval_ari"] == pytest.approx(plain["eval_ari"], abs=1e-12)
