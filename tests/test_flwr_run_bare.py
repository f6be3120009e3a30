"""`flwr run .` as a new user types it: no flags, a fresh FLWR_HOME and HOME, Flower's default
simulation federation (2 SuperNodes), then every method's embedded default with only
`--run-config 'method="…"'`. The run status is read with `flwr ls` (`flwr run --stream` exits 0
even when a run fails), and each run's summary.json is checked."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LOCAL_SUPERLINK_PORTS = (39091, 39092, 39093)   # what a bare `flwr run .` starts on


def _port_busy(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def _stop_processes_mentioning(text: str) -> None:
    """Stop what `flwr run .` left running (its local SuperLink) for this FLWR_HOME only."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if text in cmdline:
            try:
                os.kill(int(proc.name), signal.SIGTERM)
            except OSError:
                pass


@pytest.mark.slow
def test_bare_flwr_run_and_every_method_default(tmp_path):
    busy = [p for p in LOCAL_SUPERLINK_PORTS if _port_busy(p)]
    assert not busy, (f"ports {busy} are taken: another local SuperLink is running; stop it "
                      f"(a bare `flwr run .` starts one on 39091-39093)")
    home = tmp_path / "home"
    home.mkdir()
    flwr_home = home / ".flwr"
    env = {**os.environ, "HOME": str(home), "FLWR_HOME": str(flwr_home),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
           "FLWR_TELEMETRY_ENABLED": "0", "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1"}
    commands = [["flwr", "run", "."]] + [
        ["flwr", "run", ".", "--run-config", f'method="{m}"']
        for m in ("fedfcm", "fedcref", "emdcfl")]
    try:
        seconds = []
        for cmd in commands:
            t0 = time.perf_counter()
            out = subprocess.run(cmd + ["--stream"], cwd=ROOT, env=env, capture_output=True,
                                 text=True, timeout=420)
            seconds.append(time.perf_counter() - t0)
            assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
        ls = subprocess.run(["flwr", "ls", "--format", "json"], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=120)
        runs = json.loads(ls.stdout[ls.stdout.index("{"):])["runs"]
    finally:
        _stop_processes_mentioning(str(flwr_home))
    assert len(runs) == len(commands)
    assert {r["status"] for r in runs} == {"finished:completed"}, runs
    summaries = sorted((home / "fedclust-runs").glob("*/*/summary.json"))
    methods = sorted(json.loads(p.read_text())["method"] for p in summaries)
    assert methods == ["emdcfl", "exact-fcm", "fedcref", "fedfcm"]
    for path in summaries:
        summary = json.loads(path.read_text())
        assert summary["num_clients"] == 2                  # Flower's default federation
        assert summary["config"]["num-clients"] == 2
        if summary["method"] in ("exact-fcm", "fedfcm"):    # each data owner got its rows back
            for i in range(2):
                assert (path.parent / "clients" / str(i) / "result.json").is_file()
    assert max(seconds) < 400, seconds
