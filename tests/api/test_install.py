"""A proportionate install: the core dependencies run exact FCM and FedFCM without torch, POT or
networkx; FedCRef and EMD-CFL come with the ``nn`` extra (version ranges, no exact pin), and a
method whose extra is missing fails at once with the ``pip install`` line to type. The Docker
images name the flwr that ``pyproject.toml`` allows and the tests run."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from importlib.metadata import version
from pathlib import Path

import pytest

try:
    import tomllib
except ImportError:     # pragma: no cover - Python 3.10
    import tomli as tomllib
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "ot", "networkx")
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())

# Makes torch, POT (ot) and networkx look uninstalled, as on a core install: finding or
# importing them raises ModuleNotFoundError, which is what Python does for a missing package.
BLOCK = textwrap.dedent("""
    import sys

    class _NoExtra:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in ("torch", "ot", "networkx"):
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None

    sys.meta_path.insert(0, _NoExtra())
""")


def python(code: str, block: bool = False, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", (BLOCK if block else "") + textwrap.dedent(code)],
                          capture_output=True, text=True, timeout=300, cwd=ROOT, **kwargs)


def test_the_core_dependencies_hold_no_torch_pot_or_networkx():
    core = {Requirement(r).name.lower() for r in PYPROJECT["project"]["dependencies"]}
    assert not core & {"torch", "pot", "networkx"}
    assert {"numpy", "scipy", "scikit-learn", "flwr"} <= core
    flwr = next(Requirement(r) for r in PYPROJECT["project"]["dependencies"]
                if Requirement(r).name == "flwr")
    assert "simulation" in flwr.extras                  # `flwr run .` needs Ray


def test_the_nn_extra_gives_version_ranges_not_pins():
    extras = PYPROJECT["project"]["optional-dependencies"]
    nn = {Requirement(r).name.lower(): Requirement(r) for r in extras["nn"]}
    assert set(nn) == {"torch", "pot", "networkx"}
    for req in nn.values():
        assert not any(s.operator in ("==", "===") for s in req.specifier), req
        assert any(s.operator == "<" for s in req.specifier), req      # an upper bound
    assert version("torch").split("+")[0] in nn["torch"].specifier     # CI's torch fits
    assert "nn" in extras["all"][0] and "fedclust[all]" in extras["test"]


def test_setup_installs_cpu_torch_then_every_extra():
    setup = (ROOT / "scripts" / "setup.sh").read_text()
    assert setup.index("torch==") < setup.index('-e ".[test]"')


def test_docker_images_and_pyproject_name_the_same_flwr():
    flwr = next(Requirement(r) for r in PYPROJECT["project"]["dependencies"]
                if Requirement(r).name == "flwr")
    found = set()
    for path in (ROOT / "docker").glob("*"):
        found |= set(re.findall(r"FLWR_VERSION[=:]\s*\"?(\d+\.\d+\.\d+)", path.read_text()))
    assert len(found) == 1, found                       # every image the same flwr
    (docker,) = found
    assert docker in flwr.specifier                      # allowed by pyproject.toml
    assert docker == version("flwr")                     # the flwr the tests run


def test_exact_fcm_and_the_default_job_import_no_heavy_package():
    """``simulate("exact-fcm")`` and the default job (the ServerApp and ClientApp modules that
    ``flwr run .`` loads, run on the default run config) leave torch, POT and networkx
    unimported."""
    out = python("""
        import json, sys
        import numpy as np
        import fedclust
        x = np.random.default_rng(0).normal(size=(80, 2))
        fedclust.simulate("exact-fcm", [x[:40], x[40:]], n_clusters=2)
        import client_apps.app, server_app.app           # what flwr run loads
        from server_app.inprocess import run_server
        run_server({"method": "exact-fcm"}, num_nodes=2)  # the default job's code
        run_server({"method": "fedfcm", "fedfcm.k-max": 3}, num_nodes=2)
        heavy = sorted({m.split(".")[0] for m in sys.modules} & {"torch", "ot", "networkx"})
        print(json.dumps(heavy))
    """)
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


def test_exact_fcm_runs_where_the_nn_extra_is_missing():
    out = python("""
        import numpy as np, fedclust
        x = np.random.default_rng(0).normal(size=(80, 2))
        res = fedclust.simulate("exact-fcm", [x[:40], x[40:]], n_clusters=2)
        print(res.metrics["converged"])
    """, block=True)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == "True"


@pytest.mark.parametrize("call", [
    "from strategies.methods import FedCRef; FedCRef()",
    "import numpy as np, fedclust; fedclust.simulate('emdcfl', [np.zeros((9, 28, 28))] * 2, "
    "[np.zeros(9)] * 2)",
    "from strategies.run import check_run_config; check_run_config({'method': 'fedcref'})",
])
def test_fedcref_and_emdcfl_without_the_extra_say_what_to_install(call):
    out = python(f"""
        from fedclust.config import MissingExtraError
        try:
            {call}
        except MissingExtraError as exc:
            print("REFUSED", exc)
    """, block=True)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "REFUSED" in out.stdout, out.stdout
    assert "pip install 'fedclust[nn]'" in out.stdout
    assert "torch" in out.stdout


def test_fedclust_check_names_the_install_line():
    out = subprocess.run([sys.executable, "-c", BLOCK + "import sys\nfrom fedclust.cli import "
                          "main\nsys.exit(main(['check', '--run-config', 'method=\"emdcfl\"']))"],
                         capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 2
    assert "method='emdcfl' needs torch, POT (import ot)" in out.stderr
    assert "pip install 'fedclust[nn]'" in out.stderr


def test_a_node_without_the_extra_answers_with_the_install_line():
    """A node whose handler meets a missing package of the extra replies with a public error
    that names it and the pip line (not a bare ModuleNotFoundError 'see this node's log')."""
    from flwr.app import Message, RecordDict
    from flwr.supercore.task_identity import TaskIdentity

    from client_apps.base import error_mod

    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1   # as the grid

    def handler(msg, context):
        raise ModuleNotFoundError("No module named 'torch'", name="torch")

    msg = Message(RecordDict(), dst_node_id=1, message_type="train.fedcref_local")
    reply = error_mod(msg, None, handler)
    assert reply.has_error()
    reason = reply.error.reason
    assert reason.startswith("MissingExtraError: method='fedcref' on this node needs torch")
    assert "pip install 'fedclust[nn]'" in reason


@pytest.mark.slow
@pytest.mark.exclusive("ray")
def test_the_default_flwr_run_job_needs_no_heavy_package(tmp_path):
    """The default job through Flower's Simulation Engine (``flwr run``) with torch, POT and
    networkx made uninstalled in every process the SuperLink starts: it completes, and no
    fedclust module asked for them."""
    from server_app.engine import SimulationSuperLink

    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(BLOCK.replace(
        "            if name.split",
        "            if name.split(\".\")[0] in (\"torch\", \"ot\", \"networkx\"):\n"
        "                import traceback\n"
        "                stack = ''.join(traceback.format_stack())\n"
        "                if 'fedclust' in stack or 'client_apps' in stack or 'strategies' "
        "in stack:\n"
        f"                    open({str(tmp_path / 'asked.txt')!r}, 'a').write(name + '\\n')\n"
        "            if name.split"))
    link = SimulationSuperLink(tmp_path / "flwr")
    link.env["PYTHONPATH"] = str(hook)       # every process the SuperLink starts
    with link:
        outcome = link.run({"output-dir": str(tmp_path / "run")}, num_supernodes=2)
    assert outcome.ok, outcome.log[-4000:]
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["method"] == "exact-fcm"
    assert not (tmp_path / "asked.txt").exists(), (tmp_path / "asked.txt").read_text()
