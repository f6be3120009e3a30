"""Key handling of the Docker / plain-process deployment: every container and process gets only
the secrets it needs, node keys are made per node, and no key or data folder can be committed.

- ``docker/compose.yml``: the SuperLink mounts exactly ``ca.crt``, ``server.pem``,
  ``server.key`` (+ its state folder); nothing mounts ``ca.key``; SuperNode ``i`` mounts
  ``ca.crt`` and *its own* private key only; no service mounts a whole key folder.
- ``docker/make_certs.sh`` makes no SuperNode key unless asked (demo), and then one folder per
  node; ``docker/make_node_key.sh`` makes the EC P-384 OpenSSH pair a device keeps.
- ``.gitignore`` covers the folders that hold keys, data, state and results.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"


def _volumes(service: dict) -> list[tuple[str, str]]:
    out = []
    for v in service.get("volumes", []):
        host, container = v.split(":")[:2]
        out.append((host, container))
    return out


def test_compose_mounts_only_the_needed_secrets():
    compose = yaml.safe_load((DOCKER / "compose.yml").read_text())
    services = compose["services"]
    link = _volumes(services["superlink"])
    assert sorted(h for h, _ in link) == ["./certs/ca.crt", "./certs/server.key",
                                          "./certs/server.pem", "./state"]
    nodes = [name for name in services if name.startswith("supernode-")]
    assert len(nodes) == 3
    for name in nodes:
        i = name.split("-")[1]
        mounts = sorted(h for h, _ in _volumes(services[name]))
        assert mounts == ["./certs/ca.crt", f"./nodes/client-{i}/client_credentials"], name
        assert "--auth-supernode-private-key=/certs/client_credentials" in services[name][
            "command"]
    for name, svc in services.items():
        for host, _ in _volumes(svc):
            assert host not in ("./certs", "./nodes") and not host.endswith("ca.key"), \
                f"{name} mounts {host}"
            assert "client_credentials" not in host or host.startswith("./nodes/client-"), host


@pytest.mark.skipif(not (shutil.which("openssl") and shutil.which("ssh-keygen")),
                    reason="openssl / ssh-keygen not installed")
def test_make_certs_makes_no_node_keys_unless_asked(tmp_path):
    subprocess.run(["bash", str(DOCKER / "make_certs.sh"), str(tmp_path / "certs")],
                   check=True, capture_output=True)
    assert sorted(p.name for p in (tmp_path / "certs").iterdir()) == [
        "ca.crt", "ca.key", "server.key", "server.pem"]
    assert not (tmp_path / "nodes").exists()
    assert (tmp_path / "certs" / "server.key").stat().st_mode & 0o077 == 0
    subprocess.run(["bash", str(DOCKER / "make_node_key.sh"), str(tmp_path / "dev")],
                   check=True, capture_output=True)
    priv, pub = tmp_path / "dev" / "client_credentials", tmp_path / "dev" / "client_credentials.pub"
    assert priv.stat().st_mode & 0o077 == 0
    assert pub.read_text().startswith("ecdsa-sha2-nistp384 ")
    subprocess.run(["bash", str(DOCKER / "make_certs.sh"), str(tmp_path / "demo" / "certs"),
                    "2"], check=True, capture_output=True)
    assert sorted(p.name for p in (tmp_path / "demo" / "nodes").iterdir()) == [
        "client-0", "client-1"]
    assert not list((tmp_path / "demo" / "certs").glob("client_credentials*"))


def test_python_credentials_use_the_same_layout(tmp_path):
    from server_app.deploy import make_credentials

    creds = make_credentials(tmp_path / "certs", 2)
    assert creds.node_keys == [tmp_path / "nodes" / f"client-{i}" / "client_credentials"
                               for i in range(2)]
    assert not list((tmp_path / "certs").glob("client_credentials*"))
    assert creds.node_pubkeys[0].read_text().startswith("ecdsa-sha2-nistp384 ")


def test_gitignore_covers_keys_data_state_and_results():
    ignored = set((ROOT / ".gitignore").read_text().split())
    for folder in ("certs", "nodes", "data", "state", "runs"):
        assert f"docker/{folder}/" in ignored, folder
