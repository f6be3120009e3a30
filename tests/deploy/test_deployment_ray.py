"""A simulation on an *existing* Ray cluster through Flower's Simulation Engine.

flwr 1.41/1.42's simulation backend calls ``ray.init(**init_args)`` without an address, and the
``--federation-config`` keys only cover ``init-args-num-cpus/num-gpus/logging-level/
log-to-driver`` — there is no address key. ``ray.init()`` without an address joins the cluster
named by ``RAY_ADDRESS``, so exporting ``RAY_ADDRESS`` in the environment of the process that
launches ``flwr-simulation`` (the SuperLink, or its SuperExec) makes the Simulation Engine run
on that cluster. This test starts a private 1-CPU Ray head on a free port (never ``ray stop``,
which would stop every Ray instance on the machine), runs a small job, checks that the job's
driver is ``flwr-simulation`` *on that cluster*, and that the result equals the in-process run.

Every port the head opens is chosen free (GCS, Ray client server, node manager, object
manager, dashboard agent HTTP/gRPC, runtime-env agent, metrics export), and the dashboard is
off, so parallel CI jobs or a user's own Ray on the same machine do not clash with it (worker
processes use Ray's default worker port range, where Ray itself skips ports in use).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest

from server_app.engine import SimulationSuperLink, free_ports
from tests.fake_grid import run_server

RAY = str(Path(sys.executable).parent / "ray")   # the venv's CLI, also when not on PATH

pytestmark = [pytest.mark.slow, pytest.mark.exclusive("ray")]


# `ray start` flags of every port the head listens on (ray 2.55; `ray start --help`).
PORT_FLAGS = ("--port", "--ray-client-server-port", "--node-manager-port",
              "--object-manager-port", "--dashboard-agent-listen-port",
              "--dashboard-agent-grpc-port", "--runtime-env-agent-port", "--metrics-export-port")


def _ray_head(ports: list[int], temp_dir: str) -> subprocess.Popen[bytes]:
    port_args = [a for flag, port in zip(PORT_FLAGS, ports, strict=True)
                 for a in (flag, str(port))]
    return subprocess.Popen(
        [RAY, "start", "--head", "--block", *port_args, "--num-cpus", "1",
         "--include-dashboard=false", "--disable-usage-stats", "--temp-dir", temp_dir],
        stdout=open(os.path.join(temp_dir, "head.log"), "wb"), stderr=subprocess.STDOUT,
        start_new_session=True)


def test_simulation_runs_on_an_existing_ray_cluster(tmp_path):
    ray = pytest.importorskip("ray")
    ports = free_ports(len(PORT_FLAGS))
    temp_dir = tempfile.mkdtemp(prefix="ray", dir="/tmp")   # short: Ray's socket paths
    head = _ray_head(ports, temp_dir)
    address = f"127.0.0.1:{ports[0]}"
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            if subprocess.run([RAY, "status", "--address", address],
                              capture_output=True).returncode == 0:
                break
            assert head.poll() is None, open(os.path.join(temp_dir, "head.log")).read()
            time.sleep(1)
        cfg = {"method": "exact-fcm", "num-clients": 2, "seed": 1, "fcm.max-rounds": 2,
               "fcm.epsilon": 0.0, "plots": False}
        link = SimulationSuperLink(tmp_path / "flwr")
        link.env["RAY_ADDRESS"] = address          # inherited by flwr-simulation
        with link:
            res = link.run({**cfg, "output-dir": str(tmp_path / "ray")}, num_supernodes=2)
        assert res.ok, f"{res.status}\n{res.log[-3000:]}"
        ray.init(address=address, logging_level="ERROR")
        try:
            from ray._private import state

            drivers = [str(j.get("Entrypoint", "")) for j in state.jobs()]
        finally:
            ray.shutdown()
        assert any("flwr-simulation" in d for d in drivers), drivers
        run_server({**cfg, "output-dir": str(tmp_path / "ref")})
        np.testing.assert_allclose(np.load(tmp_path / "ray" / "centers.npy"),
                                   np.load(tmp_path / "ref" / "centers.npy"), atol=1e-9)
    finally:
        try:
            os.killpg(head.pid, signal.SIGTERM)
            head.wait(30)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            os.killpg(head.pid, signal.SIGKILL)
        shutil.rmtree(temp_dir, ignore_errors=True)
