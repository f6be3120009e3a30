"""Run-config ``tracker``: real MLflow stores (SQLite in a temporary folder, named by
``MLFLOW_TRACKING_URI``) and real TensorBoard event files, read back and compared with the
run's own ``history.jsonl`` and ``summary.json``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import fedclust
from fedclust.config import ConfigError, validate
from fedclust.results import RunRecorder, read_history

mlflow = pytest.importorskip("mlflow", reason="pip install 'fedclust[mlflow]'")
ROOT = Path(__file__).resolve().parents[2]


def blobs(seed: int = 0, labels: bool = False):
    rng = np.random.default_rng(seed)
    centers = np.array([[0.0, 0.0], [4.0, 4.0], [0.0, 5.0]])
    ys = [rng.integers(0, 3, 50) for _ in range(3)]
    xs = [centers[y] + rng.normal(0, 0.4, (50, 2)) for y in ys]
    return (xs, ys) if labels else xs


@pytest.fixture
def store(tmp_path, monkeypatch) -> str:
    """An MLflow SQLite store in tmp_path (artifacts beside it: the working directory)."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.chdir(tmp_path)
    return uri


def only_run(uri: str):
    client = mlflow.MlflowClient(uri)
    experiment = client.get_experiment_by_name("fedclust")
    (run,) = client.search_runs([experiment.experiment_id])
    return client, run


def test_mlflow_gets_the_run_config_the_per_round_history_and_the_artifacts(store, tmp_path):
    xs, ys = blobs(labels=True)
    res = fedclust.simulate("exact-fcm", xs, labels=ys, n_clusters=3, max_rounds=6,
                            output_dir=tmp_path / "run", run_config={"tracker": "mlflow"})
    client, run = only_run(store)
    assert run.info.status == "FINISHED" and run.info.run_name == "run"
    params = run.data.params
    assert params["method"] == "exact-fcm" and params["fcm.n-clusters"] == "3"
    assert params["fcm.max-rounds"] == "6" and params["tracker"] == "mlflow"
    assert not any(k.startswith(("fedcref.", "emdcfl.", "fedfcm.")) for k in params)
    history = read_history(res.run_dir / "history.jsonl")
    shift = client.get_metric_history(run.info.run_id, "shift")
    assert [(m.step, m.value) for m in shift] == [(r["round"], r["shift"]) for r in history]
    assert run.data.metrics["eval_ari"] == pytest.approx(res.metrics["eval_ari"])
    assert run.data.metrics["objective"] == pytest.approx(res.metrics["objective"])
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"summary.json", "history.jsonl", "shift.png"} <= artifacts
    local = client.download_artifacts(run.info.run_id, "summary.json", str(tmp_path))
    assert json.loads(Path(local).read_text()) == res.summary


def test_hydra_app_tracker_mlflow_leaves_params_and_round_metrics_in_the_store(tmp_path):
    uri = f"sqlite:///{tmp_path / 'store.db'}"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "FLWR_TELEMETRY_ENABLED": "0",
           "MLFLOW_TRACKING_URI": uri}
    done = subprocess.run(
        [sys.executable, "-m", "fedclust.cli", "sweep", "-m", "engine=inprocess",
         "method=fedfcm", "app.seed=0,1", "app.fedfcm.k-max=3", "app.num-clients=3",
         "app.plots=false", "app.tracker=mlflow", f"hydra.sweep.dir={tmp_path / 'sweep'}"],
        capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Creating initial MLflow database tables" not in done.stderr     # quiet console
    client = mlflow.MlflowClient(uri)
    every = client.search_runs([client.get_experiment_by_name("fedclust").experiment_id])
    (parent,) = [r for r in every if r.data.tags.get("fedclust.sweep") == "true"]
    runs = [r for r in every if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert len(every) == 3 and parent.info.status == "FINISHED"   # one parent per sweep
    assert parent.data.params["jobs"] == "2" and "app.seed=0,1" in parent.data.params["overrides"]
    assert sorted(r.info.run_name for r in runs) == ["app.seed=0", "app.seed=1"]  # the sweep
    assert sorted(r.data.params["seed"] for r in runs) == ["0", "1"]
    for run in runs:
        assert run.data.params["method"] == "fedfcm" and run.data.params["fedfcm.k-max"] == "3"
        folder = Path(run.data.tags["fedclust.run_dir"])
        history = read_history(folder / "history.jsonl")
        logged = client.get_metric_history(run.info.run_id, "shift/2")
        assert [m.step for m in logged] == [r["round"] for r in history]
        summary = json.loads((folder / "summary.json").read_text())
        assert run.data.metrics["best_k"] == summary["metrics"]["best_k"]


def test_a_failed_run_is_marked_failed_in_mlflow(store, tmp_path):
    cfg = validate({"tracker": "mlflow", "output-dir": str(tmp_path / "r")})
    rec = RunRecorder(tmp_path / "r", "exact-fcm", "blobs", 0, 3, cfg)
    rec.log_round({"round": 1, "shift": 0.5})
    rec.interrupted(RuntimeError("node 3 went away"))
    client, run = only_run(store)
    assert run.info.status == "FAILED"
    assert "node 3 went away" in run.data.tags["fedclust.error"]
    assert (tmp_path / "r" / "interrupted.json").is_file()


def test_tensorboard_scalars_are_the_history_and_the_folder_can_be_overwritten(tmp_path):
    pytest.importorskip("tensorboard", reason="pip install 'fedclust[tensorboard]'")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = tmp_path / "run"
    res = fedclust.simulate("fedfcm", blobs(), k_max=3, output_dir=out,
                            run_config={"tracker": "tensorboard", "plots": False})
    events = EventAccumulator(str(out / "tensorboard"))
    events.Reload()
    history = read_history(out / "history.jsonl")
    logged = [(s.step, s.value) for s in events.Scalars("shift/3")]
    assert logged == [(r["round"], pytest.approx(r["shift"]["3"])) for r in history]
    (best,) = events.Scalars("final/best_k")
    assert best.value == res.metrics["best_k"]
    # the event file is fedclust's: overwrite=true clears the folder and runs again
    fedclust.simulate("fedfcm", blobs(), k_max=3, output_dir=out,
                      run_config={"tracker": "tensorboard", "plots": False, "overwrite": True})
    assert len(list((out / "tensorboard").iterdir())) == 1


def test_a_tracker_without_its_package_is_refused_before_any_work(monkeypatch, tmp_path):
    from fedclust import trackers

    monkeypatch.setitem(trackers.PACKAGES, "mlflow", ("no_such_mlflow", "fedclust[mlflow]"))
    with pytest.raises(ConfigError, match=r"pip install 'fedclust\[mlflow\]'"):
        fedclust.simulate("exact-fcm", blobs(), n_clusters=3, output_dir=tmp_path / "r",
                          run_config={"tracker": "mlflow"})
    assert not (tmp_path / "r").exists()
    with pytest.raises(ConfigError, match="tracker"):
        validate({"tracker": "wandb"})


def test_an_unwritable_store_stops_the_run_in_one_line(monkeypatch, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{blocker / 'sub' / 'x.db'}")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match="tracker 'mlflow' could not be opened") as err:
        fedclust.simulate("exact-fcm", blobs(), n_clusters=3, output_dir=tmp_path / "r",
                          run_config={"tracker": "mlflow"})
    assert "\n" not in str(err.value)
    assert (tmp_path / "r" / "interrupted.json").is_file()


def test_the_tracker_uri_key_names_the_store_whatever_the_environment(store, tmp_path):
    """``tracker-uri`` wins over MLFLOW_TRACKING_URI (under ``flwr run`` the ServerApp sees the
    SuperLink's environment, not the shell's: the run config is what reaches it)."""
    mine = f"sqlite:///{tmp_path / 'mine.db'}"
    res = fedclust.simulate("exact-fcm", blobs(), n_clusters=3, output_dir=tmp_path / "run",
                            run_config={"tracker": "mlflow", "tracker-uri": mine,
                                        "tracker-experiment": "clinics",
                                        "tracker-run-name": "first try"})
    client = mlflow.MlflowClient(mine)
    (run,) = client.search_runs([client.get_experiment_by_name("clinics").experiment_id])
    assert run.info.run_name == "first try"
    assert res.summary["tracker"]["run_id"] == run.info.run_id
    assert mlflow.MlflowClient(store).get_experiment_by_name("fedclust") is None


def test_simulate_logs_clusters_centers_clients_and_what_it_clustered(store, tmp_path):
    xs, ys = blobs(labels=True)
    res = fedclust.simulate("exact-fcm", xs, labels=ys, n_clusters=3,
                            output_dir=tmp_path / "run", run_config={"tracker": "mlflow"})
    client, run = only_run(store)
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"clusters.png", "centers.npy", "centers_unscaled.npy", "history.jsonl",
            "summary.json", "clients"} <= artifacts
    clients = {a.path for a in client.list_artifacts(run.info.run_id, "clients")}
    assert clients == {"clients/0", "clients/1", "clients/2"}
    params = run.data.params
    assert params["data.dataset"] == "arrays" and params["data.rows"] == "[50, 50, 50]"
    assert run.data.tags["fedclust.dataset"] == "arrays"
    assert (res.run_dir / "clusters.png").is_file()


def test_tracker_start_up_is_not_the_runs_time(monkeypatch, tmp_path):
    """A store that takes 100 s (of a fake clock) to open: the run's wall_time_s leaves it out,
    tracker_setup_s holds it."""
    from fedclust import results, trackers

    now = [1000.0]
    monkeypatch.setattr(results.time, "perf_counter", lambda: now[0])

    class Slow(trackers.Tracker):
        def __init__(self, *args, **kwargs):
            now[0] += 100.0

        def log_round(self, record, index=0):
            now[0] += 1.0

        def final(self, summary):
            pass

        def finish(self, summary, folder):
            pass

    monkeypatch.setattr(results, "open_tracker", lambda *a, **k: Slow())
    rec = RunRecorder(tmp_path / "r", "exact-fcm", "blobs", 0, 3, {"tracker": "slow"})
    rec.log_round({"round": 1})
    rec.log_round({"round": 2})
    summary = rec.finish({"x": 1.0})
    assert summary["tracker_setup_s"] == 100.0
    assert summary["wall_time_s"] == 2.0


@pytest.mark.slow
@pytest.mark.exclusive("ray")
def test_tracker_uri_reaches_the_serverapp_under_flwr_run(tmp_path):
    """Under ``flwr run`` the ServerApp runs with the SuperLink's environment (here its
    MLFLOW_TRACKING_URI names another store): the run config's ``tracker-uri`` is what it
    logs to."""
    from server_app.engine import SimulationSuperLink

    mine, links = f"sqlite:///{tmp_path / 'mine.db'}", f"sqlite:///{tmp_path / 'link.db'}"
    link = SimulationSuperLink(tmp_path / "flwr")
    link.env["MLFLOW_TRACKING_URI"] = links
    with link:
        outcome = link.run({"tracker": "mlflow", "tracker-uri": mine, "plots": False,
                            "output-dir": str(tmp_path / "run")}, num_supernodes=2)
    assert outcome.ok, outcome.log[-4000:]
    client = mlflow.MlflowClient(mine)
    (run,) = client.search_runs([client.get_experiment_by_name("fedclust").experiment_id])
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["tracker"]["run_id"] == run.info.run_id
    assert not (tmp_path / "link.db").exists()


def test_the_tracker_params_name_the_partitioner_and_the_fingerprint(store, tmp_path):
    datasets = pytest.importorskip("datasets")
    fp = pytest.importorskip("flwr_datasets.partitioner")
    xs, ys = blobs(labels=True)
    ds = datasets.Dataset.from_dict({"a": np.concatenate(xs)[:, 0],
                                     "b": np.concatenate(xs)[:, 1],
                                     "label": np.concatenate(ys).tolist()})
    part = fp.DirichletPartitioner(num_partitions=3, partition_by="label", alpha=0.7,
                                   min_partition_size=5, seed=4)
    fedclust.simulate("exact-fcm", dataset=ds, partitioner=part, label_column="label",
                      n_clusters=3, output_dir=tmp_path / "run",
                      run_config={"tracker": "mlflow", "plots": False})
    _, run = only_run(store)
    params = run.data.params
    assert params["data.partitioner.class"] == "flwr_datasets.partitioner.DirichletPartitioner"
    assert params["data.partitioner.params.seed"] == "4"
    assert params["data.partitioner.params.partition_by"] == "label"
    assert params["data.hf.fingerprint"] == ds._fingerprint
    assert "partition.kind" not in params      # fedclust made no partition of its own
