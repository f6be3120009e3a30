"""Drive Flower's engines from Python: a private simulation SuperLink and ``flwr run``.

Used by the ``fedclust-sweep`` launcher (``engine=flower``) and by the smoke tests. A private
SuperLink on a free port (with its own ``FLWR_HOME``) avoids the machine-wide managed one, and
the run status is read with ``flwr ls`` because ``flwr run --stream`` exits 0 on failed runs.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

from fedclust.errors import FedclustError

APP_DIR = Path(__file__).resolve().parents[1]


def free_ports(n: int) -> list[int]:
    """``n`` distinct free TCP ports on 127.0.0.1 (all sockets held open while choosing)."""
    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(n)]
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [int(s.getsockname()[1]) for s in socks]


def free_port() -> int:
    return free_ports(1)[0]


# ----------------------------------------------------------------------------------------------
# Processes: logs, listening ports, teardown on SIGTERM

def log_tail(path: Path, n: int = 4000) -> str:
    try:
        return path.read_text(errors="replace")[-n:]
    except OSError:
        return ""


class PortClash(FedclustError, RuntimeError):
    """Another process holds the port a server was started on."""


def _listening_inodes(port: int) -> set[str]:
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if len(f) > 9 and f[3] == "0A" and int(f[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(f[9])
    return inodes


def port_owned_by_group(port: int, pgid: int) -> bool | None:
    """Whether a process of process group ``pgid`` listens on ``port`` (``None``: cannot tell,
    i.e. no ``/proc``)."""
    if not Path("/proc/net/tcp").exists():
        return None
    wanted = {f"socket:[{i}]" for i in _listening_inodes(port)}
    if not wanted:
        return False
    for proc_dir in Path("/proc").iterdir():
        if not proc_dir.name.isdigit():
            continue
        try:
            stat = (proc_dir / "stat").read_text()
            if int(stat.rsplit(")", 1)[1].split()[2]) != pgid:
                continue
            for fd in (proc_dir / "fd").iterdir():
                if os.readlink(fd) in wanted:
                    return True
        except (OSError, ValueError, IndexError):
            continue
    return False


def wait_for_listener(port: int, proc: subprocess.Popen[bytes], log: Path,
                      timeout: float) -> None:
    """Wait until ``proc`` (or its process group) listens on 127.0.0.1:``port``.

    An open port is not enough: if another program already holds it, our server fails to bind
    and exits, while a client connecting to the port would silently talk to the other program.
    Raises :class:`PortClash` in that case, ``RuntimeError`` if ``proc`` exits otherwise or the
    port is not open by ``timeout``.
    """
    deadline = time.monotonic() + timeout
    foreign = False
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            text = log_tail(log)
            if foreign or "address already in use" in text.lower():
                raise PortClash(f"port {port} is held by another process; our server exited "
                                f"({proc.returncode}); log:\n{text}")
            raise RuntimeError(f"process exited ({proc.returncode}); log:\n{text}")
        with socket.socket() as s:
            is_open = s.connect_ex(("127.0.0.1", port)) == 0
        if is_open:
            owned = port_owned_by_group(port, proc.pid)
            if owned:
                return
            if owned is None:              # no /proc: at least make sure we are still alive
                time.sleep(2.0)
                if proc.poll() is None:
                    return
            foreign = True                 # someone else's listener; ours will fail to bind
        time.sleep(0.2)
    if foreign:
        raise PortClash(f"port {port} is held by another process and ours never listened on "
                        f"it within {timeout:.0f}s; log:\n{log_tail(log)}")
    raise RuntimeError(f"port {port} not open after {timeout:.0f}s; log:\n{log_tail(log)}")


def _raise_exit(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)


def arm_teardown(close: Callable[[], None]) -> Any:
    """Make ``close`` run on SIGTERM (CI cancellation, ``timeout``) and at interpreter exit.

    SIGTERM becomes ``SystemExit`` (so ``with``/``finally`` blocks run) when no other handler
    is installed and we are on the main thread. Returns the previous handler for
    :func:`disarm_teardown`.
    """
    old = None
    if threading.current_thread() is threading.main_thread():
        if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
            old = signal.signal(signal.SIGTERM, _raise_exit)
    atexit.register(close)
    return old


def disarm_teardown(close: Callable[[], None], old_handler: Any) -> None:
    atexit.unregister(close)
    if old_handler is not None:
        signal.signal(signal.SIGTERM, old_handler)


class TornDown:
    """Context-manager base: ``start()`` on enter, ``close()`` on exit, on failure while
    starting, on SIGTERM (turned into ``SystemExit``) and at interpreter exit."""

    _old_handler: Any = None

    def start(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        self._old_handler = arm_teardown(self.close)
        try:
            self.start()
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
        disarm_teardown(self.close, self._old_handler)
        self._old_handler = None


def _stat(pid: int | str) -> tuple[int, int] | None:
    """(parent pid, start time) of a process from ``/proc``, None if it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return int(fields[1]), int(fields[19])
    except (OSError, IndexError, ValueError):
        return None


def descendants(pid: int) -> dict[int, int]:
    """Live descendants of ``pid`` with their start times (from ``/proc``; empty without it).

    Flower starts some children in their own session (e.g. the SuperLink's SuperExec), which a
    signal to our process group does not reach.
    """
    info = {int(p.name): st for p in Path("/proc").glob("[0-9]*") if (st := _stat(p.name))}
    out: dict[int, int] = {}
    frontier = {pid}
    while frontier:
        kids = {c: st[1] for c, st in info.items() if st[0] in frontier and c not in out}
        out.update(kids)
        frontier = set(kids)
    return out


def _kill_all(family: dict[int, int], sig: int) -> None:
    """Signal the processes of ``family`` that are still the same processes (start time)."""
    for pid, started in family.items():
        st = _stat(pid)
        if st is not None and st[1] == started:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)


def stop_group(proc: subprocess.Popen[bytes] | None, grace: float = 10.0) -> None:
    """SIGTERM the process group and every descendant (also those in other sessions), then
    SIGKILL whatever is left after ``grace`` seconds."""
    if proc is None:
        return
    family = descendants(proc.pid)
    _kill_all(family, signal.SIGTERM)
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        _kill_all(family, signal.SIGKILL)
        return
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)   # children (ClientApp processes) too
    except ProcessLookupError:
        pass
    _kill_all(family, signal.SIGKILL)
    try:
        proc.wait(5)
    except subprocess.TimeoutExpired:
        pass


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


class SimulationSuperLink(TornDown):
    """A private ``flower-superlink --simulation`` on 127.0.0.1 (context manager).

    Its state is kept in memory (Flower's default): it lives for its runs only. SIGTERM to
    the Python process is turned into a clean teardown (as in
    :class:`server_app.deploy.LoopbackDeployment`); a port taken by another program between
    choosing and binding it is detected and a new port is tried.
    """

    def __init__(self, workdir: Path | None = None, port: int | None = None) -> None:
        self._tmp = None if workdir else tempfile.mkdtemp(prefix="fedclust-flwr-")
        self.home = Path(workdir or self._tmp)
        self.home.mkdir(parents=True, exist_ok=True)
        self._fixed_port = port is not None
        self.port = port or free_port()
        self.env = flwr_env(self.home)
        self.proc: subprocess.Popen[bytes] | None = None
        self.logfile: Any = None

    def start(self, attempts: int = 3) -> None:
        log = self.home / "superlink.log"
        for attempt in range(attempts):
            (self.home / "config.toml").write_text(
                "[superlink]\ndefault = \"sim\"\n\n[superlink.sim]\n"
                f"address = \"127.0.0.1:{self.port}\"\ninsecure = true\n")
            self.logfile = open(log, "wb")
            self.proc = subprocess.Popen(
                ["flower-superlink", "--insecure", "--simulation",
                 "--disable-runtime-dependency-installation", "--host", "127.0.0.1",
                 "--port", str(self.port)],
                env=self.env, stdout=self.logfile, stderr=subprocess.STDOUT,
                start_new_session=True)
            try:
                wait_for_listener(self.port, self.proc, log, 60)
                return
            except PortClash:
                self._stop()
                if self._fixed_port or attempt == attempts - 1:
                    raise
                self.port = free_port()

    def _stop(self) -> None:
        stop_group(self.proc)
        self.proc = None
        if self.logfile is not None:
            self.logfile.close()
            self.logfile = None

    def close(self) -> None:
        """Stop the SuperLink's process group and remove a temporary home (idempotent)."""
        self._stop()
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
                 t0: float | None = None, poll: float = 2.0, max_poll: float = 10.0
                 ) -> RunOutcome:
    """Poll ``flwr ls --run-id`` until the run is finished; return its status and log.

    Each ``flwr ls`` is a fresh Python process that costs about 2 s of CPU, so the wait between
    two polls grows from ``poll`` by half each time, up to ``max_poll``: a short run is seen
    finished within seconds, and watching a long one does not take a core from the run."""
    t0 = time.perf_counter() if t0 is None else t0
    status, info = "unknown", {}
    deadline = time.monotonic() + timeout
    wait = poll
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
        time.sleep(max(0.0, min(wait, deadline - time.monotonic())))
        wait = min(max_poll, wait * 1.5)
    log = subprocess.run(["flwr", "log", str(run_id), connection, "--show"], env=env,
                         capture_output=True, text=True, timeout=120)
    return RunOutcome(run_id, status, time.perf_counter() - t0, log.stdout + log.stderr, info)
