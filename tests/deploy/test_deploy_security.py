"""Who can start a run, and key material that is never lost or exposed.

- The Fleet gateway (``python -m server_app.deploy fleet-gateway``) forwards only
  ``POST /v1/fleet/<call>`` and exactly one request per upstream connection; the Control and
  Runtime APIs, other methods, odd paths and smuggling attempts are refused (fast, in process).
- On a loopback deployment with TLS, SuperNode authentication and the gateway, a party holding
  only ``ca.crt`` and the Fleet address cannot start or list runs, while the SuperNode works
  through the same address; the SuperLink's own port listens on 127.0.0.1 only (slow).
- ``docker/compose.yml`` publishes the SuperLink's port on the host's loopback only and keeps the
  SuperNodes off the SuperLink's network.
- ``docker/make_certs.sh``, ``docker/make_node_key.sh`` and ``python -m server_app.deploy certs``
  never replace an existing CA or node key without ``--force`` and create private keys with
  mode 0600 from the start.
- ``scripts/deploy_local.sh --keep`` stops, with every process it started, on SIGTERM (slow).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import socket
import ssl
import stat
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

from server_app.deploy import make_credentials
from server_app.fleet_gateway import FleetGateway, Refused, fleet_request_head

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"
FLEET_HEAD = (b"POST /v1/fleet/pull-messages HTTP/1.1\r\nHost: x:9092\r\n"
              b"Content-Type: application/protobuf\r\nContent-Length: 5")


# ---------------------------------------------------------------------------------------------
# The gateway's request filter


def test_a_fleet_call_passes_with_one_request_per_connection():
    head, length = fleet_request_head(FLEET_HEAD + b"\r\nConnection: keep-alive\r\nKeep-Alive: 5")
    assert length == 5
    lines = head.split(b"\r\n")
    assert lines[0] == b"POST /v1/fleet/pull-messages HTTP/1.1"
    assert b"Connection: close" in lines and b"Connection: keep-alive" not in lines
    assert not any(line.lower().startswith(b"keep-alive") for line in lines)
    assert head.endswith(b"\r\n\r\n")


@pytest.mark.parametrize("first_line", [
    b"POST /v1/control/start-run HTTP/1.1",
    b"POST /v1/control/list-runs HTTP/1.1",
    b"POST /v1/runtime/pull-task-input HTTP/1.1",
    b"POST /v1/runtime/acquire-task HTTP/1.1",
    b"POST /responses HTTP/1.1",
    b"GET /v1/fleet/pull-messages HTTP/1.1",
    b"POST /v1/fleet/../control/start-run HTTP/1.1",
    b"POST /v1/fleet/%2e%2e/control/start-run HTTP/1.1",
    b"POST /v1/fleet//control/start-run HTTP/1.1",
    b"POST /v1/fleet/pull-messages?x=/v1/control HTTP/1.1",
    b"POST http://superlink:9093/v1/control/start-run HTTP/1.1",
    b"POST /v1/fleet/pull-messages HTTP/1.0",
    b"POST /V1/FLEET/pull-messages HTTP/1.1",
    b"POST /docs HTTP/1.1",
], ids=lambda b: b.decode())
def test_anything_but_the_fleet_api_is_refused(first_line):
    with pytest.raises(Refused) as exc:
        fleet_request_head(first_line + b"\r\nContent-Length: 0")
    assert exc.value.status.startswith("403")


@pytest.mark.parametrize("extra, status", [
    (b"\r\nTransfer-Encoding: chunked", "411"),
    (b"\r\nContent-Length: 7", "400"),                   # two lengths
    (b"\r\n folded: header", "400"),                     # obs-fold
    (b"\r\nno colon here", "400"),
    (b"\r\nX-A: a\nTransfer-Encoding: chunked", "400"),     # bare LF hides a header
    (b"\r\nX-A: a\rb", "400"),
    (b"\r\nX-A: a\0b", "400"),
], ids=["chunked", "two-lengths", "obs-fold", "no-colon", "bare-lf", "bare-cr", "nul"])
def test_ambiguous_bodies_and_headers_are_refused(extra, status):
    with pytest.raises(Refused) as exc:
        fleet_request_head(FLEET_HEAD + extra)
    assert exc.value.status.startswith(status)


def test_a_body_without_length_is_refused():
    with pytest.raises(Refused) as exc:
        fleet_request_head(b"POST /v1/fleet/pull-messages HTTP/1.1\r\nHost: x")
    assert exc.value.status.startswith("411")


def test_gateway_forwards_exactly_one_fleet_request_and_refuses_control():
    """In process, plain HTTP: a fake SuperLink records every byte the gateway sends it."""
    received: list[bytes] = []

    async def upstream(reader, writer):
        data = await reader.read(1 << 16)
        await asyncio.sleep(0.2)                  # anything smuggled would arrive by now
        try:
            data += await asyncio.wait_for(reader.read(1 << 16), 0.3)
        except asyncio.TimeoutError:
            pass
        received.append(data)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
        await writer.drain()
        writer.close()

    async def ask(port: int, payload: bytes) -> bytes:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(payload)
        await writer.drain()
        reply = await asyncio.wait_for(reader.read(), 10)
        writer.close()
        return reply

    async def scenario() -> tuple[bytes, bytes]:
        up = await asyncio.start_server(upstream, "127.0.0.1", 0)
        up_port = up.sockets[0].getsockname()[1]
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            gw_port = s.getsockname()[1]
        ready = asyncio.Event()
        gw = FleetGateway(("127.0.0.1", gw_port), ("127.0.0.1", up_port))
        task = asyncio.create_task(gw.serve(ready))
        await asyncio.wait_for(ready.wait(), 10)
        smuggled = b"POST /v1/control/start-run HTTP/1.1\r\nContent-Length: 0\r\n\r\n"
        fleet = await ask(gw_port, FLEET_HEAD + b"\r\n\r\nhello" + smuggled)
        control = await ask(gw_port, b"POST /v1/control/start-run HTTP/1.1\r\n"
                                     b"Content-Length: 0\r\n\r\n")
        huge = await ask(gw_port, FLEET_HEAD + b"\r\nX-Pad: " + b"a" * 20000 + b"\r\n\r\nhello")
        task.cancel()
        up.close()
        return fleet, control, huge

    fleet, control, huge = asyncio.run(scenario())
    assert huge.startswith(b"HTTP/1.1 431")
    assert fleet.endswith(b"\r\n\r\nok") and fleet.startswith(b"HTTP/1.1 200")
    assert control.startswith(b"HTTP/1.1 403 Forbidden") and b"Fleet API" in control
    assert len(received) == 1                     # the control request never reached upstream
    head, body = received[0].split(b"\r\n\r\n", 1)
    assert head.startswith(b"POST /v1/fleet/pull-messages HTTP/1.1")
    assert b"Connection: close" in head.split(b"\r\n")
    assert body == b"hello"                       # nothing behind the declared body


# ---------------------------------------------------------------------------------------------
# docker/compose.yml: who reaches which port


def test_compose_keeps_the_control_api_on_the_operators_side():
    services = yaml.safe_load((DOCKER / "compose.yml").read_text())["services"]
    assert services["superlink"]["ports"] == ["127.0.0.1:9093:9093"]
    published = {name: svc.get("ports", []) for name, svc in services.items()}
    assert {n for n, p in published.items() if p} == {"superlink", "fleet-gateway"}
    assert published["fleet-gateway"] == ["9092:9092"]
    gate = services["fleet-gateway"]
    assert "--superlink=superlink:9093" in gate["command"]
    assert sorted(v.split(":")[0] for v in gate["volumes"]) == [
        "./certs/ca.crt", "./certs/server.key", "./certs/server.pem"]
    assert set(services["superlink"]["networks"]) == {"operator"}
    nodes = [n for n in services if n.startswith("supernode-")]
    assert nodes
    for name in nodes:
        i = name.split("-")[1]
        svc = services[name]
        assert "--superlink=fleet-gateway:9092" in svc["command"], name
        assert set(svc["networks"]) == {"fleet", f"node-{i}"}, name
        assert set(services[f"superexec-clientapp-{i}"]["networks"]) == {f"node-{i}"}
    networks = yaml.safe_load((DOCKER / "compose.yml").read_text())["networks"]
    assert all(networks[f"node-{n.split('-')[1]}"]["internal"] for n in nodes)


# ---------------------------------------------------------------------------------------------
# Key material: never replaced without --force, private keys 0600 from the start

needs_tools = pytest.mark.skipif(not (shutil.which("openssl") and shutil.which("ssh-keygen")),
                                 reason="openssl / ssh-keygen not installed")


def _umask_shims(tmp_path: Path) -> tuple[dict[str, str], Path]:
    """PATH shims for openssl and ssh-keygen that record the umask they were started with."""
    shims, record = tmp_path / "shims", tmp_path / "umasks.txt"
    shims.mkdir()
    for tool in ("openssl", "ssh-keygen"):
        real = shutil.which(tool)
        (shims / tool).write_text(f'#!/bin/sh\necho "{tool} $(umask)" >> "{record}"\n'
                                  f'exec "{real}" "$@"\n')
        (shims / tool).chmod(0o755)
    return {**os.environ, "PATH": f"{shims}:{os.environ['PATH']}"}, record


@needs_tools
def test_make_certs_never_replaces_a_ca_without_force(tmp_path):
    env, record = _umask_shims(tmp_path)
    certs = tmp_path / "certs"

    def make(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["bash", str(DOCKER / "make_certs.sh"), *args], env=env,
                              capture_output=True, text=True)

    assert make(str(certs), "1").returncode == 0
    first = {p.name: p.read_bytes() for p in certs.iterdir()}
    node_key = (tmp_path / "nodes" / "client-0" / "client_credentials").read_bytes()
    again = make(str(certs), "1")
    assert again.returncode != 0 and "--force" in again.stderr and "ca.key" in again.stderr
    assert {p.name: p.read_bytes() for p in certs.iterdir()} == first
    assert (tmp_path / "nodes" / "client-0" / "client_credentials").read_bytes() == node_key
    assert make("--force", str(certs), "1").returncode == 0
    assert (certs / "ca.key").read_bytes() != first["ca.key"]
    assert (tmp_path / "nodes" / "client-0" / "client_credentials").read_bytes() != node_key
    for key in (certs / "ca.key", certs / "server.key",
                tmp_path / "nodes" / "client-0" / "client_credentials"):
        assert stat.S_IMODE(key.stat().st_mode) == 0o600, key
    assert stat.S_IMODE((certs / "ca.crt").stat().st_mode) == 0o644
    umasks = record.read_text().split("\n")
    assert umasks[0] and all(line.endswith("0077") for line in umasks if line), umasks


@needs_tools
def test_make_node_key_never_replaces_a_key_without_force(tmp_path):
    env, record = _umask_shims(tmp_path)
    dev = tmp_path / "dev"

    def make(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["bash", str(DOCKER / "make_node_key.sh"), *args], env=env,
                              capture_output=True, text=True)

    assert make(str(dev)).returncode == 0
    key = (dev / "client_credentials").read_bytes()
    refused = make(str(dev))
    assert refused.returncode != 0 and "--force" in refused.stderr
    assert (dev / "client_credentials").read_bytes() == key
    (dev / "client_credentials").unlink()         # a lone .pub is a registered key too
    assert make(str(dev)).returncode != 0
    assert make(str(dev), "--force").returncode == 0
    assert stat.S_IMODE((dev / "client_credentials").stat().st_mode) == 0o600
    assert stat.S_IMODE((dev / "client_credentials.pub").stat().st_mode) == 0o644
    assert all(line == "ssh-keygen 0077" for line in record.read_text().splitlines())


def test_python_certs_create_keys_0600_and_never_replace_them(tmp_path, monkeypatch):
    def no_chmod(*_a, **_k):
        raise AssertionError("keys must be created 0600, not narrowed afterwards")

    monkeypatch.setattr(os, "chmod", no_chmod)
    monkeypatch.setattr(Path, "chmod", no_chmod)
    old = os.umask(0)                             # a careless umask must not matter
    try:
        creds = make_credentials(tmp_path / "certs", 2)
    finally:
        os.umask(old)
    for key in (tmp_path / "certs" / "ca.key", creds.server_key, *creds.node_keys):
        assert stat.S_IMODE(key.stat().st_mode) == 0o600, key
    before = {p: p.read_bytes() for p in (tmp_path / "certs" / "ca.key", *creds.node_keys)}
    with pytest.raises(FileExistsError, match="force"):
        make_credentials(tmp_path / "certs", 2)
    assert all(p.read_bytes() == data for p, data in before.items())
    monkeypatch.undo()
    out = subprocess.run([sys.executable, "-m", "server_app.deploy", "certs",
                          str(tmp_path / "certs"), "--nodes", "2"],
                         capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 2 and "refusing to replace" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr
    assert all(p.read_bytes() == data for p, data in before.items())
    out = subprocess.run([sys.executable, "-m", "server_app.deploy", "certs",
                          str(tmp_path / "certs"), "--nodes", "2", "--force"],
                         capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert all(p.read_bytes() != data for p, data in before.items())


# ---------------------------------------------------------------------------------------------
# Loopback: a party with ca.crt and the Fleet address cannot start a run


def _listening_addresses(port: int) -> set[str]:
    """Local addresses with a TCP socket in LISTEN state on ``port`` (IPv4 and IPv6)."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            local, state = row.split()[1], row.split()[3]
            addr, hexport = local.split(":")
            if state == "0A" and int(hexport, 16) == port:
                raw = bytes.fromhex(addr)
                if len(raw) == 4:
                    found.add(socket.inet_ntop(socket.AF_INET, raw[::-1]))
                else:
                    words = b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4))
                    found.add(socket.inet_ntop(socket.AF_INET6, words))
    return found


def _post(address: str, path: str, ca: Path) -> int:
    """HTTP status of an empty protobuf POST to ``path`` over TLS checked against ``ca``."""
    host, port = address.rsplit(":", 1)
    ctx = ssl.create_default_context(cafile=str(ca))
    with socket.create_connection((host, int(port)), timeout=30) as raw, \
            ctx.wrap_socket(raw, server_hostname=host) as conn:
        conn.sendall(f"POST {path} HTTP/1.1\r\nHost: {address}\r\nContent-Type: "
                     f"application/protobuf\r\nContent-Length: 0\r\n\r\n".encode())
        return int(conn.recv(4096).split(b" ", 2)[1])


@pytest.mark.slow
def test_a_party_with_ca_and_fleet_address_cannot_start_a_run(tmp_path):
    from server_app.deploy import LoopbackDeployment

    np.savez(tmp_path / "c0.npz", x=np.random.default_rng(0).random((40, 2)))
    t0 = time.monotonic()
    with LoopbackDeployment([{"data-path": str(tmp_path / "c0.npz")}], tls=True, auth=True,
                            fleet_gateway=True, workdir=tmp_path / "home") as dep:
        assert dep.fleet_address != dep.address
        assert all(n.node_id is not None for n in dep.nodes)   # online through the gateway
        # the outsider: only the public CA certificate and the address the nodes dial
        home = tmp_path / "outsider"
        home.mkdir()
        (home / "config.toml").write_text(
            f'[superlink]\ndefault = "x"\n\n[superlink.x]\naddress = "{dep.fleet_address}"\n'
            f'root-certificates = "{dep.creds.ca_cert}"\n')
        env = {**dep.env, "FLWR_HOME": str(home)}
        ls = subprocess.run(["flwr", "ls", "x", "--format", "json"], env=env, cwd=home,
                            capture_output=True, text=True, timeout=60)
        payload = json.loads(ls.stdout[ls.stdout.index("{"):])
        assert payload["success"] is False and "403" in payload["error-message"], ls.stdout
        for path in ("/v1/control/start-run", "/v1/control/list-runs",
                     "/v1/control/register-node", "/v1/runtime/acquire-task",
                     "/v1/runtime/pull-task-input"):
            assert _post(dep.fleet_address, path, dep.creds.ca_cert) == 403, path
        assert _post(dep.fleet_address, "/v1/fleet/pull-messages", dep.creds.ca_cert) != 403
        # the operator's own port: loopback only, and no run was created by the attempts
        assert _listening_addresses(dep.port) == {"127.0.0.1"}
        runs = dep.flwr(["ls", "deploy", "--format", "json"])
        assert json.loads(runs.stdout[runs.stdout.index("{"):])["runs"] == [], runs.stdout
        gateway_log = (dep.home / "fleet-gateway.log").read_text()
        assert "refused b'POST /v1/control/list-runs" in gateway_log
    assert dep.gateway is not None and dep.gateway.poll() is not None
    assert dep.superlink is not None and dep.superlink.poll() is not None
    assert all(not n.alive for n in dep.nodes)
    print(f"security loopback: {time.monotonic() - t0:.1f} s")


# ---------------------------------------------------------------------------------------------
# deploy_local.sh --keep stops on SIGTERM


def _processes_with_env(key: str, value: str) -> list[int]:
    needle = f"{key}={value}".encode()
    pids = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit() and int(proc.name) != os.getpid():
            try:
                if needle in (proc / "environ").read_bytes().split(b"\0"):
                    pids.append(int(proc.name))
            except OSError:
                pass
    return pids


@pytest.mark.slow
def test_deploy_local_keep_stops_everything_on_sigterm(tmp_path):
    env = {**os.environ, "FLWR_TELEMETRY_ENABLED": "0", "FEDCLUST_OUT": str(tmp_path / "run"),
           "FEDCLUST_NODES_TIMEOUT": "120", "FEDCLUST_RUN_TIMEOUT": "240"}
    # a run config the ServerApp refuses: the run ends at once, then --keep holds everything
    cmd = [sys.executable, "-m", "fedclust.cli", "deploy", "processes", "--demo", "--keep", "--",
           'method="no-such-method"']
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    lines: list[str] = []
    home = None
    try:
        deadline = time.monotonic() + 400
        for line in proc.stdout:                  # type: ignore[union-attr]
            lines.append(line)
            if "FLWR_HOME=" in line:
                home = line.rsplit("FLWR_HOME=", 1)[1].strip()
            if "kept running" in line or time.monotonic() > deadline:
                break
        assert any("kept running" in line for line in lines), "".join(lines)[-3000:]
        assert home and _processes_with_env("FLWR_HOME", home)
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)          # the script only, not its process group
        rest, _ = proc.communicate(timeout=60)
        took = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        if home:
            for pid in _processes_with_env("FLWR_HOME", home):
                os.kill(pid, signal.SIGKILL)
    assert proc.returncode == 143, rest[-2000:]
    assert "stopped 9 process groups" in rest, rest[-2000:]
    assert took < 30, took
    # the last processes may take a moment to exit after the script returns: wait for them
    # (up to 30 s) rather than a fixed pause
    deadline = time.monotonic() + 30
    while _processes_with_env("FLWR_HOME", home) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _processes_with_env("FLWR_HOME", home) == []


def test_up_refuses_overrides_swallowed_by_data():
    out = subprocess.run([sys.executable, "-m", "server_app.deploy", "up", "--tls", "--data",
                          "c0.npz", "fcm.max-rounds=1"], capture_output=True, text=True, cwd=ROOT,
                         timeout=60)
    assert out.returncode == 2 and "before --data" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr
