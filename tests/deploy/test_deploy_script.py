"""``fedclust deploy processes`` (``scripts/deploy_local.sh``): the docker/compose.yml topology
as plain processes, end to end.

The script starts a SuperLink (``--isolation process``), a ServerApp SuperExec, a Fleet gateway
(the only address the SuperNodes dial) and, per node, a SuperNode + a ClientApp SuperExec,
submits one run, checks its *status* and tears everything
down. ``--demo`` writes the 3 blob partitions of ``server_app.deploy.write_partitions`` (seed 0);
``--tls`` adds TLS and SuperNode authentication with keys from ``docker/make_certs.sh`` and
``docker/make_node_key.sh``. The tiny job (1 FCM round = 3 round trips) must finish with
``finished:completed`` and give the same centers and objective as the in-process run of the
same config (exact FCM is deterministic: 1e-9).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
JOB = {"method": "exact-fcm", "num-clients": 3, "seed": 0, "fcm.max-rounds": 1, "plots": False}


@pytest.mark.parametrize("tls", [False, True], ids=["insecure", "tls-auth"])
def test_deploy_local_script_matches_inprocess(tmp_path, tls):
    out = tmp_path / "run"
    env = {**os.environ, "FEDCLUST_OUT": str(out), "FLWR_TELEMETRY_ENABLED": "0",
           "FEDCLUST_NODES_TIMEOUT": "120", "FEDCLUST_RUN_TIMEOUT": "300"}
    cmd = [sys.executable, "-m", "fedclust.cli", "deploy", "processes", "--demo",
           *(["--tls"] * tls),
           "--", "fcm.max-rounds=1", "seed=0", "plots=false"]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        log, _ = proc.communicate(timeout=480)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)          # the script's trap tears its processes down
        log, _ = proc.communicate(timeout=30)
        pytest.fail(f"deploy_local.sh did not finish in 480 s:\n{log[-3000:]}")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, log[-4000:]
    assert re.search(r"run \d+: finished:completed in \d+ s", log), log[-3000:]
    assert ("TLS + SuperNode auth" if tls else "(insecure)") in log, log[:2000]
    m = re.search(r"stopped (\d+) process groups", log)
    assert m and int(m.group(1)) == 3 + 2 * 3, log[-1500:]   # link, exec, gateway, 3 x 2
    summary = json.loads((out / "summary.json").read_text())
    assert summary["metrics"]["rounds"] == 1 and summary["metrics"]["dropped_nodes"] == []

    from server_app.inprocess import run_server

    ref, _ = run_server({**JOB, "output-dir": str(tmp_path / "ref")})
    np.testing.assert_allclose(np.load(out / "centers.npy"),
                               np.load(tmp_path / "ref" / "centers.npy"), rtol=0, atol=1e-9)
    assert summary["metrics"]["objective"] == pytest.approx(ref["metrics"]["objective"],
                                                            rel=1e-9)
