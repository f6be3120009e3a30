"""The README's Python blocks (and docs/datasets.md's, its Flower Datasets examples), run as
written on the README's own data (the site files of ``fedclust examples sites sites``, the quick
start's step 2), each in a fresh interpreter with a fresh HOME and no network; a block that
defines a ServerApp (``app``) has its ``main`` run against fedclust's ClientApp on one
in-process node per site file. And the quick start runs twice as written: its step 2 (a results
folder named in the run config) and step 5 (a prediction file) are accepted the second time."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.api.test_readme_quickstart import quickstart_block

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
BLOCKS = re.findall(r"```python\n(.*?)```", README, re.S)
PAGES = [ROOT / "README.md", ROOT / "docs" / "datasets.md"]
RUN = [(page.name, i, code) for page in PAGES
       for i, code in enumerate(re.findall(r"```python\n(.*?)```", page.read_text(), re.S))]

HARNESS = textwrap.dedent('''
    import json, runpy, sys
    from pathlib import Path

    ns = runpy.run_path(sys.argv[1], run_name="__main__")
    out = {}
    res = ns.get("res")
    if res is not None and ns.get("sites") is not None:
        # the README's own example: eval_ari is scikit-learn's ARI of every site's rows
        import numpy as np
        from sklearn.metrics import adjusted_rand_score
        truth = np.concatenate([s["diagnosis"].to_numpy() for s in ns["sites"]])
        pred = np.concatenate([np.asarray(lab) for lab in res.labels])
        out["eval_ari"] = res.metrics["eval_ari"]
        out["sklearn_ari"] = adjusted_rand_score(truth, pred)
    from flwr.serverapp import ServerApp
    if isinstance(ns.get("app"), ServerApp):
        # a ServerApp: its main against fedclust's ClientApp, one node per site file
        from flwr.app import Context, RecordDict
        from client_apps.app import app as client_app
        from server_app.inprocess import InProcessGrid
        files = sorted(Path("sites").glob("site*.csv"))
        nodes = [{"data-path": str(f.resolve()), "label-column": "diagnosis",
                  "allow-evaluation": True} for f in files]
        grid = InProcessGrid(client_app, len(nodes), {}, node_configs=nodes)
        ns["main"](grid, Context(run_id=1, node_id=0, node_config={}, state=RecordDict(),
                                 run_config={}))
        out["serverapp"] = "ran"
    print("HARNESS " + json.dumps(out))
''')


def test_the_readme_has_python_blocks():
    assert len(BLOCKS) >= 2       # simulate on DataFrames, a ServerApp
    assert any("FederatedDataset" in code for _, _, code in RUN)


@pytest.fixture(scope="module")
def readme_data(tmp_path_factory) -> tuple[Path, dict]:
    """The README's own data, made by the README's own command (quick start step 2)."""
    work = tmp_path_factory.mktemp("readme")
    (work / "home").mkdir()
    env = {**os.environ, "HOME": str(work / "home"), "HF_HUB_OFFLINE": "1",
           "HF_DATASETS_OFFLINE": "1", "HF_HOME": str(work / "home" / "hf"),
           "MPLBACKEND": "Agg", "PYTHONPATH": str(ROOT)}
    line = next(x for x in quickstart_block().splitlines() if x.startswith("fedclust examples"))
    done = subprocess.run([sys.executable, "-m", "fedclust.cli", *shlex.split(line)[1:]],
                          cwd=work, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return work, env


@pytest.mark.parametrize(("page", "index", "code"), RUN,
                         ids=[f"{page}-{i}" for page, i, _ in RUN])
def test_readme_python_block_runs_as_written(readme_data, page, index, code):
    work, env = readme_data
    block = work / f"{page}-{index}.py"
    block.write_text(code)
    (work / "harness.py").write_text(HARNESS)
    done = subprocess.run([sys.executable, str(work / "harness.py"), str(block)], cwd=work,
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, (code, done.stderr[-4000:])
    result = json.loads(done.stdout.rsplit("HARNESS ", 1)[1])
    if "eval_ari" in result:
        assert result["eval_ari"] == pytest.approx(result["sklearn_ari"], abs=1e-12)
        assert result["eval_ari"] > 0.5
    assert "LocalDataError" not in done.stderr and "Traceback" not in done.stderr


def quickstart_step2_run_config(folder: Path) -> dict:
    """Step 2's ``--run-config`` text from the README, with ``$PWD`` = ``folder``."""
    from fedclust.cli import parse_run_config

    block = quickstart_block().replace("\\\n", " ")
    text = re.search(r'--run-config\s+"((?:[^"\\]|\\.)*)"', block).group(1)
    return parse_run_config(text.replace('\\"', '"').replace("$PWD", str(folder)))


def test_the_quick_start_runs_twice_as_written(readme_data, monkeypatch, capsys):
    """Step 2 names its results folder (``output-dir="$PWD/run"``) and step 5 its prediction
    file: run as written a second time, each is accepted (and replaces only what fedclust
    wrote)."""
    from fedclust.cli import main as fedclust_main
    from server_app.inprocess import run_server

    work, _ = readme_data
    monkeypatch.chdir(work)
    cfg = quickstart_step2_run_config(work)
    assert cfg["output-dir"] == str(work / "run") and cfg["dataset"] == "files"
    first, _ = run_server(cfg, num_nodes=4)           # the ServerApp's checks and loop
    second, _ = run_server(cfg, num_nodes=4)
    assert first["metrics"]["eval_ari"] == second["metrics"]["eval_ari"]
    predict = next(x for x in quickstart_block().splitlines()
                   if x.startswith("fedclust predict"))
    args = shlex.split(predict.split("#")[0])[1:]
    assert fedclust_main(args) == 0
    assert fedclust_main(args) == 0, capsys.readouterr().err
    assert (work / "site0-predicted.csv").read_text().startswith("row,cluster,u0")
