"""The user docs send users to ``fedclust …`` commands only: ``fedclust examples``,
``fedclust config``, ``fedclust report --table`` (the papers' tables, EMD-CFL's among them),
``fedclust sweep -m experiment=emdcfl_*`` (the presets of the former EMD-CFL launcher) and
``fedclust deploy processes``."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from fedclust.cli import main

ROOT = Path(__file__).resolve().parents[2]
USER_DOCS = [ROOT / "README.md", ROOT / "docker" / "README.md",
             *sorted((ROOT / "docs").glob("*.md"))]
OLD = re.compile(r"python3? -m (server_app|fedclust|strategies|client_apps)\b|deploy_local\.sh")


def test_user_docs_name_only_fedclust_commands():
    found = [f"{p.relative_to(ROOT)}:{i + 1}: {line.strip()}" for p in USER_DOCS
             for i, line in enumerate(p.read_text().splitlines()) if OLD.search(line)]
    assert found == []
    hints = [(ROOT / "fedclust" / "config.py").read_text(),
             (ROOT / "conf" / "config.yaml").read_text(),
             *(p.read_text() for p in (ROOT / "conf" / "experiment").glob("*.yaml"))]
    assert not any(OLD.search(text) for text in hints)      # check's own hints, the configs


def test_examples_and_config(tmp_path, capsys):
    assert main(["examples", "sites", str(tmp_path / "sites")]) == 0
    assert sorted(p.name for p in (tmp_path / "sites").iterdir()) == [
        "site0.csv", "site1.csv", "site2.csv", "site3.csv"]
    assert main(["config", "list"]) == 0
    out = capsys.readouterr().out
    assert "tracker-uri" in out and "fcm.n-clusters" in out
    assert main(["config", "check"]) == 0          # pyproject.toml and conf/ in step


def test_report_table_of_emdcfl_and_its_epsilon_sweep(tmp_path, capsys):
    metrics = {"eval_acc_mean": 0.9, "eval_acc_worst": 0.8, "eval_ari": 1.0, "num_clusters": 2}
    for seed in (0, 1):          # two runs of a sweep folder, as fedclust sweep -m writes them
        job = tmp_path / "sweep" / str(seed)
        job.mkdir(parents=True)
        (job / "summary.json").write_text(json.dumps({
            "method": "emdcfl", "wall_time_s": 5.0, "metrics": metrics,
            "config": {"dataset": "rotdigits", "seed": seed, "num-clients": 4,
                       "emdcfl.algorithm": "oracle"}}))
    assert main(["report", "--table", "emdcfl", str(tmp_path / "sweep")]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if "| oracle |" in line)
    assert "| rotdigits | max | 4 |" in row and "| 0,1 | 90.00 ± 0.00 |" in row
    run = tmp_path / "run"
    run.mkdir()
    np.save(run / "emd_excess.npy", np.array([[0.0, 0.1, 2.0], [0.1, 0.0, 2.0],
                                              [2.0, 2.0, 0.0]]))
    (run / "summary.json").write_text(json.dumps({"metrics": {"eval_truth": [0, 0, 1]},
                                                  "config": {"emdcfl.epsilon": 1.0}}))
    assert main(["report", "--table", "emdcfl-eps", str(run), "--eps", "0.05", "0.5"]) == 0
    rows = [r for r in capsys.readouterr().out.splitlines() if r.startswith("| 0")]
    assert rows == ["| 0.05 | 3 | 0.000 |", "| 0.5 | 2 | 1.000 |"]


def test_report_table_refusals_are_one_line(tmp_path, capsys):
    assert main(["report", "--table", "fcm-table1", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("fedclust report --table: no summary.json") and "\n" not in err
    with pytest.raises(SystemExit):
        main(["report", "--table", "no-such-table", str(tmp_path)])


@pytest.mark.parametrize(("preset", "experiment", "extra"), [
    ("cpu", "emdcfl_table1", {"dataset": "rotmnist", "emdcfl.rotation": "max"}),
    ("cpu", "emdcfl_table1_fmnist", {"dataset": "rotfmnist"}),
    ("cpu-backdoor", "emdcfl_table3", {"dataset": "backdoor-mnist"}),
    ("paper", "emdcfl_table1_paper", {"dataset": "rotmnist"}),
])
def test_the_emdcfl_presets_are_the_sweep_experiments(preset, experiment, extra):
    """docs/emdcfl.md's commands run the presets as sweep experiments: same run configs."""
    from hydra import compose, initialize_config_dir

    from fedclust.config import validate
    from server_app.emdcfl_experiments import PRESETS
    from server_app.sweep import CONF_DIR, job_run_config

    with initialize_config_dir(CONF_DIR, version_base=None):
        cfg = compose("config", [f"experiment={experiment}", "app.output-dir="])
    sweep = validate(job_run_config(cfg.app, set()))
    tool = validate({"method": "emdcfl", **PRESETS[preset], **extra,
                     "data-dir": sweep["data-dir"]})
    assert sweep == {**tool, "output-dir": sweep["output-dir"]}


def test_deploy_processes_runs_the_compose_twin_script(monkeypatch):
    from server_app import deploy

    calls = []
    monkeypatch.setattr(deploy.os, "execvp", lambda prog, args: calls.append(args))
    deploy.main(["processes", "--demo", "--", "fcm.max-rounds=1"])
    assert calls == [["bash", str(ROOT / "scripts" / "deploy_local.sh"), "--demo", "--",
                      "fcm.max-rounds=1"]]
    monkeypatch.setattr(deploy, "PROCESSES_SCRIPT", ROOT / "no-such-script.sh")
    assert deploy.main(["processes", "--demo"]) == 2


def test_report_help_names_every_paper_table(capsys):
    """``fedclust report --help`` leads to ``--table`` and names every table it takes."""
    from fedclust.experiments.__main__ import TABLES

    with pytest.raises(SystemExit):
        main(["report", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "fedclust report --table NAME FOLDER" in text
    for name in [*TABLES, "emdcfl", "emdcfl-eps"]:
        assert f" {name}," in text or f" {name}." in text, name
