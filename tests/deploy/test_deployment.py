"""The real app on Flower's Deployment Engine: SuperLink + 3 SuperNodes on loopback.

Each SuperNode owns its own data file (``data-path`` = one simulation partition written to an
.npz), the run uses ``dataset="local"``; the result must equal the Simulation Engine run of the
same seed (insecure test) or the in-process run (TLS test; the in-process grid equals the
Simulation Engine, see ``tests/engine/test_flwr_smoke_fcm.py``): exact FCM the same centers to 1e-9.
Run status is read with ``flwr ls`` (``flwr run`` exits 0 on failed runs). Ports are free ports
chosen at start; every process is torn down in ``LoopbackDeployment.__exit__`` even when an
assertion fails.

A deployment round trip costs ~6 s idle (3-s polling + one fresh ClientApp process per
message), so jobs are tiny: exact FCM with 2 rounds (4 round trips), FedFCM K∈{2,3} with one
round (3 round trips).
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from server_app.deploy import LoopbackDeployment, write_partitions
from tests.exclusive import exclusive
from tests.fake_grid import run_server

pytestmark = pytest.mark.slow

BASE = {"num-clients": 3, "seed": 5, "timeout": 120.0, "plots": False}
JOBS: dict[str, dict[str, Any]] = {
    "exact-fcm": {"method": "exact-fcm", "fcm.max-rounds": 2, "fcm.epsilon": 0.0},
    "fedfcm": {"method": "fedfcm", "fedfcm.k-min": 2, "fedfcm.k-max": 3,
               "fedfcm.max-rounds": 1},
}


def read_run(out: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    summary = json.loads((out / "summary.json").read_text())
    history = [json.loads(line) for line in (out / "history.jsonl").read_text().splitlines()
               if line.strip()]
    return summary, history


def assert_same_result(dep_out: Path, ref_out: Path, method: str) -> None:
    """A deployment run and the in-process run of the same seed give the same result."""
    a, _ = read_run(dep_out)
    b, _ = read_run(ref_out)
    np.testing.assert_allclose(np.load(dep_out / "centers.npy"), np.load(ref_out / "centers.npy"),
                               atol=1e-9, rtol=0)
    ma, mb = a["metrics"], b["metrics"]
    assert a["dataset"] == "local" and a["seed"] == b["seed"] and a["num_clients"] == 3
    if method == "exact-fcm":
        assert ma["rounds"] == mb["rounds"]
        assert abs(ma["objective"] - mb["objective"]) <= 1e-9 * max(1.0, abs(mb["objective"]))
        assert ma["eval_ari"] == pytest.approx(mb["eval_ari"], abs=1e-12)
    elif method == "fedfcm":
        assert ma["best_k"] == mb["best_k"]
        for k, v in mb["fedfuzzdb"].items():
            assert abs(ma["fedfuzzdb"][k] - v) <= 1e-9 * max(1.0, abs(v))
    assert ma["dropped_nodes"] == [] and mb["dropped_nodes"] == []


def reference_runs(tmp_path: Path, engine: str) -> dict[str, Path]:
    """The same jobs with the shared dataset, in-process or on Flower's Simulation Engine."""
    outs = {name: tmp_path / f"{name}-ref-{engine}" for name in JOBS}
    if engine == "inprocess":
        for name, job in JOBS.items():
            run_server({**BASE, **job, "output-dir": str(outs[name])})
        return outs
    from server_app.engine import SimulationSuperLink

    with exclusive("ray"), SimulationSuperLink(workdir=tmp_path / "sim") as link:
        for name, job in JOBS.items():
            res = link.run({**BASE, **job, "output-dir": str(outs[name])},
                           num_supernodes=BASE["num-clients"])
            assert res.ok, f"{name} (simulation): {res.status}\n{res.log[-3000:]}"
    return outs


def assert_owner_results(folder: Path, data_path: Path, run_out: Path, m: float) -> None:
    """A node's own results equal applying the run's final centers to that node's rows."""
    from fedclust import fcm
    from fedclust.data import scaling
    from fedclust.data.local import load_local_table

    x, _ = load_local_table(str(data_path))
    centers = np.load(run_out / "centers.npy")
    u = fcm.memberships(scaling.apply(x, np.load(run_out / "scaling_shift.npy"),
                                      np.load(run_out / "scaling_scale.npy")), centers, m)
    table = np.loadtxt(folder / "assignments.csv", delimiter=",", skiprows=1, ndmin=2)
    assert (folder / "result.json").is_file()
    np.testing.assert_array_equal(table[:, 0], np.arange(len(x)))
    np.testing.assert_array_equal(table[:, 1], np.argmax(u, axis=1))
    np.testing.assert_allclose(table[:, 2:], u, atol=1e-12)
    np.testing.assert_allclose(np.loadtxt(folder / "centers.csv", delimiter=",", skiprows=1),
                               np.load(run_out / "centers_unscaled.npy"), atol=1e-9)


def run_methods_on_deployment(tmp_path: Path, tls: bool, reference: str) -> None:
    data = write_partitions({**BASE, "method": "exact-fcm"}, tmp_path / "data")
    # nodes 0 and 1 share one results folder (each gets <run-id>/<its file's stem>/ there);
    # node 2 gets fedclust-results/ next to its data
    nodes = [{"data-path": str(p), "allow-evaluation": True,
              **({"output-dir": str(tmp_path / "owner0")} if i < 2 else {})}
             for i, p in enumerate(data)]
    refs = reference_runs(tmp_path, reference)
    with LoopbackDeployment(nodes, tls=tls, auth=tls, workdir=tmp_path / "flwr") as dep:
        assert len({n.node_id for n in dep.nodes}) == 3
        for name, job in JOBS.items():
            out = tmp_path / f"{name}-deploy"
            res = dep.run({**BASE, **job, "dataset": "local", "output-dir": str(out)}, timeout=600)
            assert res.ok, f"{name}: run {res.run_id} {res.status}\n{res.log[-3000:]}\n{dep.logs()}"
            assert_same_result(out, refs[name], name)
            for i, path in enumerate(data):
                folder = (tmp_path / "owner0" / str(res.run_id) / path.stem if i < 2
                          else path.parent / "fedclust-results" / path.name / str(res.run_id))
                assert_owner_results(folder, path, out, 2.0)
            shared = tmp_path / "owner0" / str(res.run_id)
            assert sorted(p.name for p in shared.iterdir()) == [data[0].stem, data[1].stem]
            assert not (out / "clients").exists()   # nothing of a node's rows on the server
    log = (tmp_path / "flwr" / "superlink.log").read_text(errors="replace")
    # flwr warns loudly when TLS or SuperNode authentication is off
    assert ("Starting insecure HTTP server" in log) is (not tls)
    assert ("SuperNode authentication is disabled" in log) is (not tls)


def test_deployment_insecure_matches_simulation(tmp_path):
    # reference: the same jobs on Flower's Simulation Engine (3 SuperNodes)
    run_methods_on_deployment(tmp_path, tls=False, reference="simulation")


def test_deployment_tls_and_supernode_auth_matches_inprocess(tmp_path):
    # reference: the in-process grid (equal to the Simulation Engine,
    # tests/engine/test_flwr_smoke_fcm)
    run_methods_on_deployment(tmp_path, tls=True, reference="inprocess")


def test_unregistered_supernode_is_refused_with_auth(tmp_path):
    """With SuperNode authentication a node whose key was not registered never joins.

    The test cannot pass for the wrong reason: in the same window a *registered* control node,
    started at the same moment with the same flags, must come online (so the SuperLink is
    reachable and accepts authenticated nodes), and the stranger must be refused by the
    SuperLink's activation check (its log says so and it exits with an error), not fail for
    some other reason.
    """
    from server_app.deploy import CONNECTION, make_credentials

    data = write_partitions({**BASE, "method": "exact-fcm", "num-clients": 1}, tmp_path / "d")
    with LoopbackDeployment([{"data-path": str(data[0])}], tls=True, auth=True,
                            workdir=tmp_path / "flwr") as dep:
        extra = make_credentials(tmp_path / "extra", 2)   # [0] stranger, [1] control
        reg = dep.flwr(["supernode", "register", str(extra.node_pubkeys[1]), CONNECTION])
        assert reg.returncode == 0, reg.stdout + reg.stderr
        dep.creds.node_keys += [extra.node_keys[0], extra.node_keys[1]]
        dep.node_configs += [{"data-path": str(data[0])}, {"data-path": str(data[0])}]
        stranger, control = dep._start_node(1), dep._start_node(2)
        dep.nodes += [stranger, control]
        deadline = time.monotonic() + 120
        online: set[int] = set()
        while time.monotonic() < deadline:
            text = stranger.log_path.read_text(errors="replace")
            m = re.search(r"SuperNode ID: (\d+)", control.log_path.read_text(errors="replace"))
            online = dep.online_node_ids()
            if m:
                control.node_id = int(m.group(1))
            if (control.node_id in online and not stranger.alive
                    and "Failed to activate SuperNode" in text):
                break
            assert control.alive, f"control node exited:\n{dep.logs()}"
            time.sleep(1)
        text = stranger.log_path.read_text(errors="replace")
        assert control.node_id is not None and control.node_id in online, dep.logs()
        assert "Failed to initialize the connection to the SuperLink" in text, text[-3000:]
        assert "Failed to activate SuperNode" in text, text[-3000:]
        assert not stranger.alive and stranger.proc.returncode != 0, text[-3000:]
        assert re.search(r"SuperNode ID: \d+", text) is None, text[-3000:]
        assert online == {dep.nodes[0].node_id, control.node_id}
