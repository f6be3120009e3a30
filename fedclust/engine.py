"""Drive Flower's engines from Python: a private simulation SuperLink and ``flwr run``.

Used by the ``fedclust-sweep`` launcher (``engine=flwr``) and by the smoke tests. A private
SuperLink on a free port (with its own ``FLWR_HOME``) avoids the machine-wide managed one, and
the run status is read with ``flwr ls`` because ``flwr run --stream`` exits 0 on failed runs.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

APP_DIR = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def flwr_env(flwr_home: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(FLWR_HOME=str(flwr_home), FLWR_TELEMETRY_ENABLED="0",
               FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION="1", PYTHONUNBUFFERED="1")
    bindir = str(Path(sys.executable).parent)
    env["PATH"] = bindir + os.pathsep + env.get("PATH", "")
    return env


def toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    return json.dumps(str(value))


@dataclass
class RunOutcome:
    run_id: int | None
    status: str
    seconds: float
    log: str
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.status == "finished:completed"


class SimulationSuperLink:
    """A private ``flower-superlink --simulation`` on 127.0.0.1 (context manager)."""

    def __init__(self, workdir: Path | None = None, port: int | None = None) -> None:
        self._tmp = None if workdir else tempfile.mkdtemp(prefix="fedclust-flwr-")
        self.home = Path(workdir or self._tmp)
        self.home.mkdir(parents=True, exist_ok=True)
        self.port = port or free_port()
        self.env = flwr_env(self.home)
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> SimulationSuperLink:
        (self.home / "config.toml").write_text(
            "[superlink]\ndefault = \"sim\"\n\n[superlink.sim]\n"
            f"address = \"127.0.0.1:{self.port}\"\ninsecure = true\n")
        self.logfile = open(self.home / "superlink.log", "wb")
        self.proc = subprocess.Popen(
            ["flower-superlink", "--insecure", "--simulation",
             "--disable-runtime-dependency-installation", "--host", "127.0.0.1",
             "--port", str(self.port), "--database", str(self.home / "state.db")],
            env=self.env, stdout=self.logfile, stderr=subprocess.STDOUT,
            start_new_session=True)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", self.port)) == 0:
                    return self
            if self.proc.poll() is not None:
                raise RuntimeError(f"flower-superlink exited: {(self.home / 'superlink.log')}")
            time.sleep(0.3)
        raise RuntimeError("flower-superlink did not open its port within 60 s")

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, 15)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, 9)
        self.logfile.close()
        if self._tmp:
            shutil.rmtree(self._tmp, ignore_errors=True)

    def run(self, run_config: dict[str, Any], num_supernodes: int, timeout: float = 1800,
            app_dir: Path = APP_DIR, connection: str = "sim") -> RunOutcome:
        return flwr_run(run_config, self.env, connection, app_dir, timeout,
                        federation_config={"num-supernodes": num_supernodes,
                                           "client-resources-num-cpus": 1})


def flwr_run(run_config: dict[str, Any], env: dict[str, str], connection: str, app_dir: Path,
             timeout: float = 1800, federation_config: dict[str, Any] | None = None) -> RunOutcome:
    """Submit a run with ``flwr run``, wait until it finishes, return its status and log."""
    t0 = time.perf_counter()
    with tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False) as fh:
        for k, v in run_config.items():
            fh.write(f"{json.dumps(k)} = {toml_value(v)}\n")
        cfg_path = fh.name
    cmd = ["flwr", "run", str(app_dir), connection, "--format", "json", "--run-config", cfg_path]
    if federation_config:
        cmd += ["--federation-config",
                " ".join(f"{k}={toml_value(v)}" for k, v in federation_config.items())]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    os.unlink(cfg_path)
    text = out.stdout
    if out.returncode != 0 or "{" not in text:
        return RunOutcome(None, "submit-failed", time.perf_counter() - t0,
                          out.stdout + out.stderr)
    run_id = int(json.loads(text[text.index("{"):])["run-id"])
    return wait_for_run(run_id, env, connection, timeout, t0)


def wait_for_run(run_id: int, env: dict[str, str], connection: str, timeout: float = 1800,
                 t0: float | None = None, poll: float = 2.0) -> RunOutcome:
    """Poll ``flwr ls --run-id`` until the run is finished; return its status and log."""
    t0 = time.perf_counter() if t0 is None else t0
    status, info = "unknown", {}
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ls = subprocess.run(["flwr", "ls", connection, "--run-id", str(run_id), "--format",
                             "json"], env=env, capture_output=True, text=True, timeout=120)
        try:
            payload = json.loads(ls.stdout[ls.stdout.index("{"):])
            info = payload.get("runs", [{}])[0]
            status = str(info.get("status", "unknown"))
        except (ValueError, IndexError):
            pass
        if status.startswith("finished"):
            break
        time.sleep(poll)
    log = subprocess.run(["flwr", "log", str(run_id), connection, "--show"], env=env,
                         capture_output=True, text=True, timeout=120)
    return RunOutcome(run_id, status, time.perf_counter() - t0, log.stdout + log.stderr, info)
