"""FedCRef and EMD-CFL on the Deployment Engine (3-4 SuperNodes on loopback), insecure and with
TLS + SuperNode authentication.

Each SuperNode reads its own .npz (the simulation partition written out by the method's own
client loader), the run uses ``dataset="local"``; status is read with ``flwr ls``; the
deterministic outcome (counts, choices, and scalar metrics) must equal the in-process run.
Jobs are the smallest meaningful ones (one FedCRef iteration, two EMD-CFL rounds).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from flwr.app import Context, RecordDict

from fedclust.config import validate
from server_app.deploy import LoopbackDeployment
from tests.fake_grid import run_server

pytestmark = pytest.mark.slow

FEDCREF = {"method": "fedcref", "dataset": "digits", "num-clients": 3, "seed": 0,
           "fedcref.split": "all", "fedcref.fl-rounds": 2, "fedcref.fl-local-epochs": 1,
           "fedcref.batch-size": 16, "fedcref.ae-epochs": 5, "fedcref.ae-patience": 0,
           "fedcref.max-iterations": 1, "fedcref.k-max": 3, "fedcref.samples-per-cluster": 30,
           "fedcref.init": "dirty", "plots": False, "timeout": 300.0}
# A given ε: the automatic one reads the excesses, which a deployment's secret projections
# change from run to run (below); on this system of barely trained models they sit at the
# edge of its "all alike" rule, and a clustering that flips is no engine difference.
EMDCFL = {"method": "emdcfl", "dataset": "rotdigits", "emdcfl.rotation": "two",
          "num-clients": 4, "emdcfl.samples": 120, "emdcfl.test-samples": 30,
          "emdcfl.rounds": 2, "emdcfl.local-epochs": 1, "emdcfl.conv1": 4, "emdcfl.conv2": 8,
          "emdcfl.embed-dim": 16, "emdcfl.workers": 1, "emdcfl.epsilon": 0.1, "seed": 0,
          "plots": False, "timeout": 300.0}


def _ctx(i: int, n: int, cfg: dict) -> Context:
    return Context(run_id=1, node_id=1000 + i, node_config={"partition-id": i,
                   "num-partitions": n}, state=RecordDict(), run_config=cfg)


def fedcref_files(cfg: dict, directory: Path) -> list[dict[str, Any]]:
    from client_apps.fedcref_handlers import _data

    full = validate(cfg)
    nodes = []
    directory.mkdir(parents=True, exist_ok=True)
    for i in range(full["num-clients"]):
        x, y, k = _data(_ctx(i, full["num-clients"], cfg), {**full, "evaluate": True})
        np.savez(directory / f"c{i}.npz", x=x, y=y)
        nodes.append({"data-path": str(directory / f"c{i}.npz"), "num-clusters": int(k),
                      "allow-evaluation": True})
    return nodes


def emdcfl_files(cfg: dict, directory: Path) -> list[dict[str, Any]]:
    from client_apps.emdcfl_handlers import client_data

    full = validate(cfg)
    nodes = []
    directory.mkdir(parents=True, exist_ok=True)
    for i in range(full["num-clients"]):
        s = client_data(_ctx(i, full["num-clients"], cfg), full)
        np.savez(directory / f"c{i}.npz", x_train=s.x_train, y_train=s.y_train, x_val=s.x_val,
                 y_val=s.y_val, x_test=s.x_test, y_test=s.y_test, cluster=s.cluster)
        nodes.append({"data-path": str(directory / f"c{i}.npz"), "allow-evaluation": True})
    return nodes


# Metrics that may legitimately differ between engines, per method. FedCRef: none (it seeds
# every client stream from the client's own data key, not from engine node ids). EMD-CFL: a
# deployed node draws its X25519 key from the OS, so each pair's secret projection, the
# excess values and what the run reads from them (the cap of the automatic ε and the median
# reference) differ from a simulation's, whose keys come from the run seed; with a given ε
# the clusters, the models and every accuracy do not.
PROCESS_DEPENDENT: dict[str, tuple[str, ...]] = {"emdcfl": ("epsilon", "reference_median")}


def _comparable(metrics: dict[str, Any], method: str = "") -> dict[str, Any]:
    skip = ("seconds", "bytes", "time", "traffic", "share", *PROCESS_DEPENDENT.get(method, ()))
    return {k: v for k, v in metrics.items() if not any(s in k for s in skip)
            and not k.endswith("_s")
            and isinstance(v, (bool, int, float, str))}


# One transport each (the FCM deployment tests run both): FedCRef insecure, EMD-CFL with TLS and
# SuperNode authentication.
@pytest.mark.parametrize(("cfg", "files", "tls"), [(FEDCREF, fedcref_files, False),
                                                   (EMDCFL, emdcfl_files, True)],
                         ids=["fedcref-insecure", "emdcfl-tls-auth"])
def test_method_on_the_deployment_engine(tmp_path, cfg, files, tls):
    nodes = files(cfg, tmp_path / "data")
    out = tmp_path / "deploy"
    with LoopbackDeployment(nodes, tls=tls, auth=tls, workdir=tmp_path / "flwr") as dep:
        # EMD-CFL keeps its dataset name in deployment: it fixes the model's input shape; the
        # nodes still read only their own data-path.
        dataset = "local" if cfg["method"] == "fedcref" else cfg["dataset"]
        res = dep.run({**cfg, "dataset": dataset, "output-dir": str(out)}, timeout=1500)
        assert res.ok, f"run {res.run_id}: {res.status}\n{res.log[-3000:]}\n{dep.logs()}"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["metrics"]["dropped_nodes"] == []
    ref, _ = run_server({**cfg, "output-dir": str(tmp_path / "ref")})
    a = _comparable(summary["metrics"], cfg["method"])
    b = _comparable(ref["metrics"], cfg["method"])
    assert a.keys() == b.keys()
    for k, v in b.items():
        if isinstance(v, float):
            assert a[k] == pytest.approx(v, rel=1e-6, abs=1e-9, nan_ok=True), k
        else:
            assert a[k] == v, k
