"""The Hydra launcher: composes run configs, shows job i/n, writes one result dir per job."""

import json
import subprocess
import sys

import numpy as np
import pytest

from fedclust.config import ConfigError
from server_app.sweep import engine_name, flatten, total_jobs


def test_flatten_turns_nested_hydra_config_into_dotted_run_config():
    assert flatten({"fcm": {"m": 2.0, "max-rounds": 3}, "seed": 1, "x": None}) == {
        "fcm.m": 2.0, "fcm.max-rounds": 3, "seed": 1}


def test_total_jobs_counts_the_sweep():
    assert total_jobs(["app.seed=0,1,2", "method=fedfcm", "app.fcm.m=1.5,2"], {}) == 6
    assert total_jobs(["engine=inprocess"], {"app.seed": "range(4)", "dataset": "a,b"}) == 8


def test_multirun_inprocess_sweep(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "server_app.sweep", "-m", "engine=inprocess", "method=fedfcm",
         "app.seed=0,1", "app.fedfcm.k-max=3", "app.plots=false",
         f"hydra.sweep.dir={tmp_path}"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "job 2/2" in out.stdout
    seeds = sorted(json.loads(p.read_text())["seed"] for p in tmp_path.glob("*/summary.json"))
    assert seeds == [0, 1]


def test_bad_override_fails_before_running(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "server_app.sweep", "engine=inprocess", "app.fcm.m=0.5",
         f"hydra.run.dir={tmp_path}"], capture_output=True, text=True, timeout=300)
    assert out.returncode != 0
    assert "fcm.m" in out.stderr and "Allowed" in out.stderr
    assert not list(tmp_path.rglob("summary.json"))


def test_command_line_replaces_the_experiments_sweep_params_in_the_count():
    params = {"app.seed": "range(3)", "app.g2.dim": "2,4,8"}
    assert total_jobs(["app.seed=0", "app.g2.dim=2,4"], params) == 2


@pytest.mark.slow
def test_jobs_run_in_process_by_default(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "server_app.sweep", "-m", "app.seed=3", "app.num-clients=3",
         "app.fcm.max-rounds=2", "app.plots=false", f"hydra.sweep.dir={tmp_path}"],
        capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "job 1/1 (inprocess)" in out.stdout
    summary = json.loads((tmp_path / "0" / "summary.json").read_text())
    assert summary["seed"] == 3 and summary["num_clients"] == 3


def test_engine_names():
    assert engine_name("inprocess") == "inprocess"
    assert engine_name("flower") == engine_name("flwr") == "flower"
    with pytest.raises(ConfigError, match="Allowed: inprocess, flower"):
        engine_name("ray")


def _sweep(tmp_path, engine: list[str]) -> dict[int, dict]:
    out = subprocess.run(
        [sys.executable, "-m", "server_app.sweep", "-m", *engine, "method=exact-fcm",
         "app.seed=0,1", "app.num-clients=3", "app.plots=false", "app.evaluate=true",
         f"hydra.sweep.dir={tmp_path}"], capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "job 2/2" in out.stdout
    return {json.loads((d / "summary.json").read_text())["seed"]: {
        "summary": json.loads((d / "summary.json").read_text()),
        "centers": np.load(d / "centers.npy")} for d in tmp_path.iterdir() if d.is_dir()
        and (d / "summary.json").exists()}


@pytest.mark.slow
@pytest.mark.exclusive("ray")
def test_the_in_process_and_the_simulation_engine_give_the_same_numbers(tmp_path):
    """A small sweep (exact FCM, 2 jobs) by default (in-process) and with engine=flower:
    every metric the same (floats to 1e-9: the server adds the nodes' sums by node id, and the
    engines give the nodes different ids, so the order of the terms differs), the centers too;
    only times and node ids may differ."""
    inproc = _sweep(tmp_path / "inprocess", [])
    flower = _sweep(tmp_path / "flower", ["engine=flower"])
    assert sorted(inproc) == sorted(flower) == [0, 1]
    for seed in (0, 1):
        a, b = inproc[seed]["summary"]["metrics"], flower[seed]["summary"]["metrics"]
        assert set(a) == set(b)
        for key, value in a.items():
            if key.endswith("_s") or key.startswith("bytes_"):
                continue      # times; bytes count the results folder's name
            if isinstance(value, float):
                assert b[key] == pytest.approx(value, rel=1e-9, abs=1e-12), key
            else:
                assert b[key] == value, key
        assert a["rounds"] > 1 and 0 < a["eval_ari"] <= 1
        np.testing.assert_allclose(flower[seed]["centers"], inproc[seed]["centers"], atol=1e-9)
