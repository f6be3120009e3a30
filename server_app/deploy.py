"""A loopback Flower deployment (SuperLink + SuperNodes as real processes) for tests and scripts.

Starts ``flower-superlink`` and N ``flower-supernode`` processes on 127.0.0.1 with free ports
(the SuperLink's port is checked to be held by *its* process group, else it is restarted on a
new port: another program that grabbed the port first would otherwise receive our runs),
either insecure or with TLS (a throw-away CA + server certificate) and SuperNode
authentication (an EC key pair per node, registered with ``flwr supernode register``), waits
until every node reports its SuperNode ID, submits runs with ``flwr run`` and reads their
status with ``flwr ls`` (the exit code of ``flwr run`` says nothing about the run). Every
process runs in its own process group and is torn down on exit, even on failure.

Flower 1.41 serves the Fleet, Control (no login) and Runtime APIs on the SuperLink's one port,
so the production shape keeps that port on the operator's side and lets the SuperNodes reach
only a :class:`FleetGateway`, which forwards nothing but the Fleet API (``fleet_gateway=True``;
``up --tls``; ``scripts/deploy_local.sh``; ``docker/compose.yml``).

Command line::

    fedclust deploy certs DIR [--nodes 3] [--force]   # TLS certs + node keys
    fedclust deploy fleet-gateway --listen 0.0.0.0:9092 --superlink 127.0.0.1:9093 \
        --certfile server.pem --keyfile server.key --ca-file ca.crt
    fedclust deploy up --data c0.npz c1.npz c2.npz [--tls] [--workdir DIR] \
        method=exact-fcm fcm.max-rounds=5                       # start, run once, tear down
    fedclust deploy processes [--tls] [--keep] (--demo | DATA ...) [-- key=value ...]
        # docker/compose.yml's topology as plain processes (scripts/deploy_local.sh)
"""

from __future__ import annotations

import argparse
import datetime as dt
import ipaddress
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from server_app.engine import (
    APP_DIR,
    PortClash,
    RunOutcome,
    TornDown,
    flwr_env,
    flwr_run,
    free_port,
    stop_group,
    toml_value,
    wait_for_listener,
    wait_for_run,
)
from server_app.engine import log_tail as _tail
from server_app.fleet_gateway import FleetGateway, host_port

CONNECTION = "deploy"


# ----------------------------------------------------------------------------------------------
# Certificates and keys

@dataclass
class Credentials:
    """Paths of the TLS material and SuperNode keys made by :func:`make_credentials`."""

    ca_cert: Path
    server_cert: Path
    server_key: Path
    node_keys: list[Path] = field(default_factory=list)      # OpenSSH EC private keys
    node_pubkeys: list[Path] = field(default_factory=list)   # OpenSSH EC public keys


DEFAULT_HOSTS = ("127.0.0.1", "localhost", "superlink", "fleet-gateway")


def _write_private(path: Path, data: bytes) -> None:
    """Create ``path`` with mode 0600 from its first byte (``O_EXCL``: never an old file)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)


def make_credentials(directory: Path, num_nodes: int = 0,
                     hosts: Sequence[str] = DEFAULT_HOSTS,
                     days: int = 30, force: bool = False) -> Credentials:
    """Self-signed CA, a SuperLink certificate for ``hosts`` (SANs), and node key pairs.

    Same layout as ``docker/make_certs.sh DIR N`` (openssl) + ``docker/make_node_key.sh``
    (ssh-keygen), made with the ``cryptography`` package so it works where those tools are
    missing: CA and SuperLink files in ``directory``, node ``i``'s key pair in
    ``directory/../nodes/client-<i>/client_credentials[.pub]`` (on real devices each node makes
    its own; here, for loopback tests and one-host demos, they are made side by side).

    Private keys are created with mode 0600 (never readable by others, not even briefly).
    Existing files are not replaced unless ``force`` (a new CA must be handed to every node; a
    new node key must be registered again): :class:`FileExistsError` names them.
    """
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec, rsa
    from cryptography.x509.oid import NameOID

    node_dirs = [directory.parent / "nodes" / f"client-{i}" for i in range(num_nodes)]
    targets = [directory / n for n in ("ca.key", "ca.crt", "server.key", "server.pem")]
    targets += [d / n for d in node_dirs for n in ("client_credentials",
                                                   "client_credentials.pub")]
    existing = [t for t in targets if t.exists() or t.is_symlink()]
    if existing and not force:
        raise FileExistsError(
            "refusing to replace existing key material: " + ", ".join(map(str, existing))
            + ". Every node trusts the CA and the SuperLink knows each registered node key; "
            "keep them. Fix: pass another folder, or force=True (command line: --force) to "
            "make new ones (then hand out the new ca.crt and register the new node keys).")
    for t in existing:
        t.unlink()
    directory.mkdir(parents=True, exist_ok=True)
    now = dt.datetime.now(dt.timezone.utc)

    def _name(cn: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])

    def _write_key(path: Path, key: Any) -> None:
        _write_private(path, key.private_bytes(serialization.Encoding.PEM,
                                               serialization.PrivateFormat.TraditionalOpenSSL,
                                               serialization.NoEncryption()))

    ca_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    ca_cert = (x509.CertificateBuilder().subject_name(_name("fedclust test CA"))
               .issuer_name(_name("fedclust test CA")).public_key(ca_key.public_key())
               .serial_number(x509.random_serial_number())
               .not_valid_before(now - dt.timedelta(minutes=5))
               .not_valid_after(now + dt.timedelta(days=days))
               .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
               .sign(ca_key, hashes.SHA256()))
    srv_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    sans: list[x509.GeneralName] = []
    for h in hosts:
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(h)))
        except ValueError:
            sans.append(x509.DNSName(h))
    srv_cert = (x509.CertificateBuilder().subject_name(_name(hosts[0]))
                .issuer_name(ca_cert.subject).public_key(srv_key.public_key())
                .serial_number(x509.random_serial_number())
                .not_valid_before(now - dt.timedelta(minutes=5))
                .not_valid_after(now + dt.timedelta(days=days))
                .add_extension(x509.SubjectAlternativeName(sans), critical=False)
                .sign(ca_key, hashes.SHA256()))
    creds = Credentials(directory / "ca.crt", directory / "server.pem", directory / "server.key")
    creds.ca_cert.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    creds.server_cert.write_bytes(srv_cert.public_bytes(serialization.Encoding.PEM))
    _write_key(directory / "ca.key", ca_key)
    _write_key(creds.server_key, srv_key)
    for node_dir in node_dirs:
        key = ec.generate_private_key(ec.SECP384R1())
        node_dir.mkdir(parents=True, exist_ok=True)
        priv, pub = node_dir / "client_credentials", node_dir / "client_credentials.pub"
        _write_private(priv, key.private_bytes(serialization.Encoding.PEM,
                                               serialization.PrivateFormat.OpenSSH,
                                               serialization.NoEncryption()))
        pub.write_bytes(key.public_key().public_bytes(serialization.Encoding.OpenSSH,
                                                      serialization.PublicFormat.OpenSSH))
        creds.node_keys.append(priv)
        creds.node_pubkeys.append(pub)
    return creds


@dataclass
class Node:
    """One SuperNode process."""

    index: int
    port: int
    node_config: dict[str, Any]
    proc: subprocess.Popen[bytes]
    log_path: Path
    node_id: int | None = None

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None


def node_config_arg(cfg: Mapping[str, Any]) -> str:
    """``--node-config`` string: space separated ``key=value`` with TOML-typed values."""
    return " ".join(f"{k}={toml_value(v)}" for k, v in cfg.items())


class LoopbackDeployment(TornDown):
    """SuperLink + SuperNodes on 127.0.0.1 (context manager).

    Parameters
    ----------
    node_configs : list of mapping
        One ``--node-config`` per SuperNode (e.g. ``{"data-path": "/abs/c0.npz"}``).
    tls : bool
        TLS on the SuperLink (self-made CA); the CLI and the SuperNodes verify it.
    auth : bool
        SuperNode authentication: the SuperLink only accepts registered node keys
        (requires ``tls``).
    workdir : path, optional
        Keeps ``FLWR_HOME``, logs, certificates there (default: a temp dir, removed on exit).
    fleet_gateway : bool
        The production shape: the SuperNodes dial a :class:`FleetGateway` (its own port) that
        forwards only the Fleet API, never the SuperLink's port, which also serves the Control
        and Runtime APIs (:attr:`fleet_address` is what the nodes dial).
    isolation : str
        ``subprocess`` (each SuperNode spawns its ClientApp processes) — the process-isolation
        topology with separate SuperExecs is what ``docker/compose.yml`` uses.
    """

    def __init__(self, node_configs: Sequence[Mapping[str, Any]], tls: bool = False,
                 auth: bool = False, workdir: Path | None = None,
                 extra_env: Mapping[str, str] | None = None,
                 fleet_gateway: bool = False) -> None:
        if auth and not tls:
            raise ValueError("SuperNode authentication requires TLS (set tls=True)")
        self.node_configs = [dict(c) for c in node_configs]
        self.tls, self.auth = tls, auth
        self._tmp = None if workdir else tempfile.mkdtemp(prefix="fedclust-deploy-")
        self.home = Path(workdir or self._tmp).resolve()
        self.home.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.env = flwr_env(self.home)
        self.env.update(extra_env or {})
        self.superlink: subprocess.Popen[bytes] | None = None
        self.fleet_gateway = fleet_gateway
        self.gateway: subprocess.Popen[bytes] | None = None
        self.gateway_port: int | None = None
        self.nodes: list[Node] = []
        self.creds: Credentials | None = None
        self._logs: list[Any] = []

    # -- lifecycle (``with``: start, then close on exit, failure or SIGTERM; see TornDown) ----
    @property
    def address(self) -> str:
        """The SuperLink's own port: Fleet, Control and Runtime API (the operator's side)."""
        return f"127.0.0.1:{self.port}"

    @property
    def fleet_address(self) -> str:
        """What the SuperNodes dial: the Fleet gateway if there is one, else the SuperLink."""
        return f"127.0.0.1:{self.gateway_port}" if self.gateway_port else self.address

    def _popen(self, cmd: list[str], log: Path) -> subprocess.Popen[bytes]:
        fh = open(log, "wb")
        self._logs.append(fh)
        return subprocess.Popen(cmd, env=self.env, stdout=fh, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)

    def start(self, node_timeout: float = 90.0) -> None:
        if self.tls:
            self.creds = make_credentials(self.home / "certs", len(self.node_configs),
                                          force=True)     # throw-away material of this home
        self._start_superlink()
        if self.fleet_gateway:
            self._start_gateway()
        if self.auth:
            assert self.creds is not None
            for pub in self.creds.node_pubkeys:
                out = self.flwr(["supernode", "register", str(pub), CONNECTION])
                if out.returncode != 0:
                    raise RuntimeError(f"flwr supernode register failed: {out.stdout}"
                                       f"{out.stderr}")
        for i in range(len(self.node_configs)):
            self.nodes.append(self._start_node(i))
        self.wait_for_nodes(node_timeout)

    def _start_superlink(self, attempts: int = 3) -> None:
        """Start the SuperLink; make sure *it* listens on the port (not another program that
        took the free port first), else retry on a new port."""
        log = self.home / "superlink.log"
        for attempt in range(attempts):
            conn = f"[superlink]\ndefault = \"{CONNECTION}\"\n\n[superlink.{CONNECTION}]\n" \
                   f"address = \"{self.address}\"\n"
            conn += (f"root-certificates = \"{self.creds.ca_cert}\"\n" if self.creds
                     else "insecure = true\n")
            (self.home / "config.toml").write_text(conn)
            # state in memory (Flower's default): this SuperLink lives for its runs only, and
            # a file database answers HTTP 500 when a lock waits over 5 s on a loaded machine
            cmd = ["flower-superlink", "--host", "127.0.0.1", "--port", str(self.port),
                   "--disable-runtime-dependency-installation"]
            if self.creds:
                cmd += ["--ssl-ca-certfile", str(self.creds.ca_cert), "--ssl-certfile",
                        str(self.creds.server_cert), "--ssl-keyfile", str(self.creds.server_key)]
            else:
                cmd += ["--insecure"]
            if self.auth:
                cmd += ["--enable-supernode-auth"]
            self.superlink = self._popen(cmd, log)
            try:
                wait_for_listener(self.port, self.superlink, log, 60)
            except PortClash as exc:
                stop_group(self.superlink)
                if attempt == attempts - 1:
                    raise PortClash(f"SuperLink: {attempts} ports in a row were taken by other "
                                    f"processes; last: {exc}") from exc
                print(f"fedclust deploy: port {self.port} was taken by another process; "
                      f"retrying the SuperLink on a new port", file=sys.stderr, flush=True)
                self.port = free_port()
                continue
            if self.superlink.poll() is not None:      # belt and braces: ours must be alive
                raise RuntimeError(f"flower-superlink exited ({self.superlink.returncode}) after "
                                   f"its port opened; log:\n{_tail(log)}")
            return

    def _start_gateway(self) -> None:
        log = self.home / "fleet-gateway.log"
        for attempt in range(3):
            self.gateway_port = free_port()
            cmd = [sys.executable, "-m", "server_app.deploy", "fleet-gateway", "--listen",
                   self.fleet_address, "--superlink", self.address]
            if self.creds:
                cmd += ["--certfile", str(self.creds.server_cert), "--keyfile",
                        str(self.creds.server_key), "--ca-file", str(self.creds.ca_cert)]
            self.gateway = self._popen(cmd, log)
            try:
                wait_for_listener(self.gateway_port, self.gateway, log, 60)
                return
            except PortClash:
                stop_group(self.gateway)
                if attempt == 2:
                    raise

    def _start_node(self, i: int) -> Node:
        port = free_port()
        cmd = ["flower-supernode", "--superlink", self.fleet_address, "--host", "127.0.0.1",
               "--port", str(port), "--node-config", node_config_arg(self.node_configs[i])]
        if self.creds:
            cmd += ["--root-certificates", str(self.creds.ca_cert)]
        else:
            cmd += ["--insecure"]
        if self.auth:
            assert self.creds is not None
            cmd += ["--auth-supernode-private-key", str(self.creds.node_keys[i])]
        log = self.home / f"supernode-{i}.log"
        return Node(i, port, self.node_configs[i], self._popen(cmd, log), log)

    def wait_for_nodes(self, timeout: float) -> list[int]:
        """Wait until every SuperNode logged its ID and the SuperLink lists it online."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for node in self.nodes:
                if node.node_id is None:
                    m = re.search(r"SuperNode ID: (\d+)", _tail(node.log_path, 10**6))
                    if m:
                        node.node_id = int(m.group(1))
                    elif not node.alive:
                        raise RuntimeError(f"SuperNode {node.index} exited:\n"
                                           f"{_tail(node.log_path)}")
            if all(n.node_id is not None for n in self.nodes):
                online = self.online_node_ids()
                if all(n.node_id in online for n in self.nodes):
                    return sorted(online)
            time.sleep(0.5)
        raise RuntimeError("SuperNodes did not come online: " + "\n".join(
            f"--- node {n.index}\n{_tail(n.log_path, 1500)}" for n in self.nodes))

    def online_node_ids(self) -> set[int]:
        out = self.flwr(["supernode", "ls", CONNECTION, "--format", "json"])
        try:
            payload = json.loads(out.stdout[out.stdout.index("{"):])
        except ValueError:
            return set()
        return {int(n["node-id"]) for n in payload.get("nodes", [])
                if n.get("status") == "online"}

    def flwr(self, args: list[str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["flwr", *args], env=self.env, capture_output=True, text=True,
                              timeout=timeout, cwd=self.home)

    def close(self) -> None:
        """Stop every process group (idempotent)."""
        for node in self.nodes:
            stop_group(node.proc)
        stop_group(self.gateway)
        stop_group(self.superlink)
        for fh in self._logs:
            fh.close()
        self._logs.clear()
        if self._tmp:
            shutil.rmtree(self._tmp, ignore_errors=True)

    # -- runs and faults -----------------------------------------------------------------------
    def run(self, run_config: Mapping[str, Any], timeout: float = 900,
            app_dir: Path = APP_DIR) -> RunOutcome:
        """``flwr run`` the app on this deployment and wait for the run's final status."""
        return flwr_run(dict(run_config), self.env, CONNECTION, app_dir, timeout)

    def submit(self, run_config: Mapping[str, Any], app_dir: Path = APP_DIR) -> int:
        """Submit without waiting; return the run id."""
        with tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False) as fh:
            for k, v in run_config.items():
                fh.write(f"{json.dumps(k)} = {toml_value(v)}\n")
        try:
            out = self.flwr(["run", str(app_dir), CONNECTION, "--format", "json",
                             "--run-config", fh.name], timeout=300)
        finally:
            os.unlink(fh.name)
        if out.returncode != 0 or "{" not in out.stdout:
            raise RuntimeError(f"flwr run failed to submit: {out.stdout}{out.stderr}")
        return int(json.loads(out.stdout[out.stdout.index("{"):])["run-id"])

    def status(self, run_id: int) -> str:
        """The run's status string from ``flwr ls`` (``"unknown"`` if it cannot be read)."""
        ls = self.flwr(["ls", CONNECTION, "--run-id", str(run_id), "--format", "json"])
        try:
            return str(json.loads(ls.stdout[ls.stdout.index("{"):])["runs"][0]["status"])
        except (ValueError, IndexError, KeyError):
            return "unknown"

    def wait(self, run_id: int, timeout: float = 900, t0: float | None = None) -> RunOutcome:
        """Poll ``flwr ls --run-id`` until the run is finished; return status and log."""
        return wait_for_run(run_id, self.env, CONNECTION, timeout, t0, poll=1.0)

    def kill_node(self, index: int, sig: int = signal.SIGTERM) -> int | None:
        """Send ``sig`` to SuperNode ``index`` and its ClientApp children; return its node id."""
        node = self.nodes[index]
        try:
            os.killpg(node.proc.pid, sig)
        except ProcessLookupError:
            pass
        try:
            node.proc.wait(30)
        except subprocess.TimeoutExpired:     # a SIGTERM goodbye stuck on a loaded machine
            os.killpg(node.proc.pid, signal.SIGKILL)
            node.proc.wait(30)
        return node.node_id

    def logs(self) -> str:
        parts = [f"--- superlink\n{_tail(self.home / 'superlink.log')}"]
        if self.gateway is not None:
            parts.append(f"--- fleet gateway\n{_tail(self.home / 'fleet-gateway.log', 2000)}")
        parts += [f"--- supernode {n.index} ({n.node_id})\n{_tail(n.log_path, 2000)}"
                  for n in self.nodes]
        return "\n".join(parts)


def write_partitions(run_config: Mapping[str, Any], directory: Path) -> list[Path]:
    """Write each simulation partition of ``run_config`` to its own ``c<i>.npz`` (x, y).

    A SuperNode pointed at ``c<i>.npz`` (``--node-config 'data-path="…/c<i>.npz"'``) owns exactly
    the rows simulation partition ``i`` holds, so a deployment and a simulation of the same seed
    can be compared (tests, ``scripts/deploy_local.sh``).
    """
    import numpy as np

    from fedclust.config import validate
    from fedclust.data.partition import make_partition
    from fedclust.data.tabular import load_dataset

    cfg = validate(dict(run_config))
    ds = load_dataset(cfg)
    parts = make_partition(cfg["partition.kind"], ds, cfg["num-clients"], int(cfg["seed"]),
                           float(cfg["partition.alpha"]), cfg["partition.column"], options=cfg)
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for i, idx in enumerate(parts):
        path = directory / f"c{i}.npz"
        np.savez(path, x=ds.x[idx], y=ds.y[idx])
        paths.append(path.resolve())
    return paths


# ----------------------------------------------------------------------------------------------
# Command line

def _node_count(text: str) -> int:
    if not text.strip().isdigit():
        raise argparse.ArgumentTypeError(f"expected a whole number of nodes >= 0, got {text!r}")
    return int(text)


def _parse_overrides(items: Sequence[str]) -> dict[str, Any]:
    """``key=value`` words as ``flwr run --run-config`` reads them (TOML values), or a
    :class:`~fedclust.config.ConfigError` naming the word, what is allowed and the fix."""
    import tomllib

    from fedclust.config import ConfigError

    out: dict[str, Any] = {}
    keys = [item.partition("=")[0].strip() for item in items]
    twice = sorted({k for k in keys if keys.count(k) > 1})
    if twice:
        raise ConfigError(f"run-config override(s) {', '.join(map(repr, twice))} given more than "
                          f"once. Allowed: each key once. Fix: remove the duplicate")
    for item in items:
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise ConfigError(f"run-config override {item!r} is not key=value. Allowed: "
                              f"key=value words (TOML values, strings in double quotes). Fix: "
                              f"e.g. fcm.n-clusters=3 dataset=\"local\"")
        try:
            out.update(tomllib.loads(f"{json.dumps(key.strip())} = {value}"))
        except tomllib.TOMLDecodeError:   # a bare word: the key's schema judges it
            out[key.strip()] = value
    return out


def preflight_up(run_cfg: dict[str, Any], data: Sequence[str], label_column: str) -> None:
    """``fedclust deploy up`` before any process starts: the run config as the ServerApp
    validates it, and every node's data file read once with the node loader (they are on this
    machine): readable, one width, rows (and distinct rows) enough for the clusters."""
    from fedclust.data.sites import SiteFilesError, check_tables
    from strategies.run import check_run_config

    cfg = check_run_config(dict(run_cfg))
    missing = [p for p in data if not Path(p).exists()]
    if missing:
        raise SiteFilesError(f"--data names {len(missing)} file(s) that do not exist: "
                             f"{', '.join(map(repr, missing[:5]))}. Allowed: one existing data "
                             f"file (csv, tsv, npz, npy, or an image folder) per SuperNode. "
                             f"Fix: check the paths")
    # each file read by the door its node uses (EMD-CFL: an .npz of image splits)
    check_tables(cfg, [Path(p) for p in data], "", label_column, "the --data files")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="fedclust deploy", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("certs", help="make a CA, a SuperLink certificate and node keys")
    c.add_argument("directory", type=Path)
    c.add_argument("--nodes", type=_node_count, default=3,
                   help="how many SuperNode key pairs to make (0 or more)")
    c.add_argument("--host", action="append", default=None,
                   help="SAN of the SuperLink certificate (repeatable)")
    c.add_argument("--force", action="store_true",
                   help="replace an existing CA / node keys (hand out the new ca.crt and "
                        "register the new keys afterwards)")
    g = sub.add_parser("fleet-gateway", help="serve only the Fleet API of a SuperLink on a "
                                             "network address (run next to the SuperLink)")
    g.add_argument("--listen", type=host_port, required=True,
                   help="HOST:PORT the SuperNodes dial, e.g. 0.0.0.0:9092")
    g.add_argument("--superlink", type=host_port, required=True,
                   help="HOST:PORT of the SuperLink, bound where only the operator reaches it")
    g.add_argument("--certfile", type=Path, help="TLS certificate (the SuperLink's server.pem)")
    g.add_argument("--keyfile", type=Path, help="its private key (server.key)")
    g.add_argument("--ca-file", type=Path, help="CA that signed the SuperLink's certificate")
    u = sub.add_parser("up", help="start a loopback deployment, run once, tear down")
    u.add_argument("--data", nargs="+", required=True, help="one data file per SuperNode")
    u.add_argument("--tls", action="store_true",
                   help="TLS + SuperNode authentication; the nodes dial a Fleet gateway, not "
                        "the SuperLink's own port")
    u.add_argument("--workdir", type=Path, default=None)
    u.add_argument("--keep", action="store_true", help="keep running until Ctrl-C after the run")
    u.add_argument("--label-column", default="",
                   help="node config 'label-column' of every node (a csv/tsv column that is "
                        "not a feature; evaluation only)")
    u.add_argument("overrides", nargs="*", help="run-config key=value (TOML values)")
    sub.add_parser("processes", add_help=False,
                   help="docker/compose.yml's topology as plain processes (process isolation, "
                        "SuperExecs, the Fleet gateway), one run, teardown: [--tls] [--keep] "
                        "(--demo | DATA ...) [-- key=value ...]")
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["processes"]:
        return _run_processes(argv[1:])
    args = parser.parse_args(argv)
    if args.cmd == "fleet-gateway":
        return _run_gateway(parser, args)
    if args.cmd == "certs":
        try:
            creds = make_credentials(args.directory, args.nodes,
                                     (*DEFAULT_HOSTS, *(args.host or ())), force=args.force)
        except FileExistsError as exc:
            print(f"fedclust deploy certs: {exc}", file=sys.stderr)
            return 2
        except OSError as exc:      # a folder that cannot be created or written
            print(f"fedclust deploy certs: cannot write {str(args.directory)!r} "
                  f"({type(exc).__name__}: {exc.strerror or exc}). Fix: pass a folder this "
                  f"user may create and write", file=sys.stderr)
            return 2
        print(f"CA {creds.ca_cert}\nSuperLink cert {creds.server_cert} key {creds.server_key}")
        for k in creds.node_keys:
            print(f"SuperNode key {k} (+ .pub)")
        return 0
    misplaced = [d for d in args.data if "=" in d and not Path(d).exists()]
    if misplaced:
        parser.error(f"up: {misplaced} look like run-config overrides, not data files: --data "
                     f"takes every word after it. Put overrides before --data, e.g. "
                     f"'up fcm.max-rounds=1 --data c0.npz c1.npz'")
    from fedclust.errors import BadInputError

    try:
        overrides = _parse_overrides(args.overrides)
        run_cfg = {"dataset": "local", "num-clients": len(args.data), **overrides}
        preflight_up(run_cfg, args.data, args.label_column)
    except BadInputError as exc:
        print(f"fedclust deploy up: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    label = {"label-column": args.label_column} if args.label_column else {}
    configs = [{"data-path": str(Path(p).resolve()), **label} for p in args.data]
    with LoopbackDeployment(configs, tls=args.tls, auth=args.tls, workdir=args.workdir,
                            fleet_gateway=args.tls) as dep:
        print(f"SuperLink {dep.address} ({'TLS + node auth' if args.tls else 'insecure'}), "
              f"Fleet API for the nodes at {dep.fleet_address}, "
              f"FLWR_HOME={dep.home}; nodes: {[n.node_id for n in dep.nodes]}", flush=True)
        outcome = dep.run(run_cfg)
        print(outcome.log[-4000:])
        print(f"run {outcome.run_id}: {outcome.status} in {outcome.seconds:.1f}s", flush=True)
        if args.keep:
            print("deployment kept alive; Ctrl-C to stop", flush=True)
            try:
                while True:
                    time.sleep(3600)
            except KeyboardInterrupt:
                pass
        return 0 if outcome.ok else 1


PROCESSES_SCRIPT = APP_DIR / "scripts" / "deploy_local.sh"


def _run_processes(args: list[str]) -> int:
    """``fedclust deploy processes …``: the compose topology as processes, run by
    ``scripts/deploy_local.sh`` of fedclust's source folder (its options are the script's)."""
    if not PROCESSES_SCRIPT.is_file():
        print(f"fedclust deploy processes: {PROCESSES_SCRIPT} is missing: it runs from "
              f"fedclust's source folder (a clone of the repository), not from an installed "
              f"wheel. Fix: run it in the repository, or use fedclust deploy up", file=sys.stderr)
        return 2
    if args[:1] in (["-h"], ["--help"]):
        lines = PROCESSES_SCRIPT.read_text().splitlines()[1:]
        print("\n".join(line[2:] for line in lines[:next(i for i, line in enumerate(lines)
                                                         if not line.startswith("#"))]))
        return 0
    # the script takes this process's place: Ctrl-C and SIGTERM reach its teardown directly
    sys.stdout.flush()
    sys.stderr.flush()
    os.execvp("bash", ["bash", str(PROCESSES_SCRIPT), *args])
    return 1    # pragma: no cover - execvp does not return


def _run_gateway(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    import asyncio

    if bool(args.certfile) != bool(args.keyfile):
        parser.error("fleet-gateway: give both --certfile and --keyfile (TLS) or neither")
    gateway = FleetGateway(args.listen, args.superlink, args.certfile, args.keyfile,
                           args.ca_file)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        asyncio.run(gateway.serve())
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
