"""The Python API: the methods as Flower Strategy objects (``strategies.methods``) and
``fedclust.simulate`` on arrays, through the real ServerApp loop and ClientApp handlers."""

from __future__ import annotations

import json

import numpy as np
import pytest
from flwr.serverapp.strategy import Result, Strategy
from sklearn.datasets import make_blobs
from sklearn.metrics import adjusted_rand_score

import fedclust
from client_apps.app import app as client_app
from fedclust import fcm
from fedclust.config import ConfigError
from server_app.inprocess import InProcessGrid
from strategies.methods import EMDCFL, STRATEGIES, ExactFCM, FedCRef, FedFCM
from tests.fake_grid import run_server


def blobs(seed: int = 0, n: int = 600, k: int = 3, clients: int = 3):
    x, y = make_blobs(n, centers=k, cluster_std=1.0, center_box=(-15, 15), random_state=seed)
    parts = np.array_split(np.random.default_rng(seed).permutation(n), clients)
    return [x[p] for p in parts], [y[p] for p in parts]


def owner_labels(result, n_clients: int) -> np.ndarray:
    return np.concatenate([
        np.loadtxt(result.run_dir / "clients" / str(i) / "assignments.csv", delimiter=",",
                   skiprows=1, ndmin=2)[:, 1] for i in range(n_clients)])


def test_simulate_exact_fcm_equals_centralized_fcm_on_the_pooled_rows(tmp_path):
    xs, ys = blobs()
    res = fedclust.simulate("exact-fcm", xs, labels=ys, n_clusters=3, epsilon=1e-6,
                            max_rounds=200, output_dir=tmp_path / "run",
                            run_config={"plots": False})
    assert isinstance(res, Result)
    pooled = np.vstack(xs)
    shift, scale = res.arrays["scaling_shift"].numpy(), res.arrays["scaling_scale"].numpy()
    central = fcm.fcm_from_centers((pooled - shift) / scale, res.arrays["initial_centers"].numpy(),
                                   2.0, 1e-6, 200)
    np.testing.assert_allclose(res.arrays["centers"].numpy(), central.centers, atol=1e-9)
    np.testing.assert_allclose(res.centers, central.centers * scale + shift, atol=1e-8)
    # the evaluation path: the federated ARI is the ARI of the rows each owner received
    ari = adjusted_rand_score(np.concatenate(ys), owner_labels(res, 3))
    assert res.summary["metrics"]["eval_ari"] == pytest.approx(ari, abs=1e-12) and ari > 0.9
    assert len(res.history) == res.summary["metrics"]["rounds"]
    assert json.loads((res.run_dir / "summary.json").read_text()) == res.summary


def test_simulate_without_labels_sends_no_label_statistic(tmp_path):
    xs, _ = blobs(1)
    res = fedclust.simulate(ExactFCM(n_clusters=3), xs, output_dir=tmp_path / "run",
                            run_config={"plots": False})
    assert res.summary["config"]["evaluate"] is False
    assert "eval_ari" not in res.summary["metrics"]
    assert res.centers.shape == (3, 2)


def test_fedfcm_chooses_k_then_exact_fcm_runs_with_it_on_one_grid(tmp_path):
    """Chaining two methods in one ServerApp: FedFCM's chosen K feeds exact FCM."""
    xs, ys = blobs(2, k=4, clients=4)
    nodes = []
    for i, (x, y) in enumerate(zip(xs, ys)):
        np.savez(tmp_path / f"c{i}.npz", x=x, y=y)
        nodes.append({"data-path": str(tmp_path / f"c{i}.npz"), "allow-evaluation": True})
    grid = InProcessGrid(client_app, 4, {"method": "fedfcm", "dataset": "local"},
                         node_configs=nodes)
    first = FedFCM(k_min=2, k_max=6).start(grid=grid, dataset="local",
                                           output_dir=tmp_path / "k", run_config={"plots": False})
    k = first.summary["metrics"]["best_k"]
    assert 2 <= k <= 6 and first.centers.shape == (k, 2)
    second = ExactFCM(n_clusters=k).start(grid=grid, dataset="local", output_dir=tmp_path / "c",
                                          run_config={"plots": False})
    assert second.centers.shape == (k, 2)
    assert second.summary["metrics"]["eval_ari"] > 0.8


def test_a_strategy_object_runs_exactly_what_the_run_config_runs(tmp_path):
    keys = {"fedfcm.k-max": 4, "fedfcm.max-rounds": 5, "scaling": "standard"}
    common = {"dataset": "blobs", "num-clients": 3, "seed": 4, "plots": False}
    ref, _ = run_server({"method": "fedfcm", **keys, **common,
                         "output-dir": str(tmp_path / "ref")})
    grid = InProcessGrid(client_app, 3, {"method": "fedfcm", **keys, **common})
    res = FedFCM(k_max=4, max_rounds=5, scaling="standard").start(
        grid=grid, seed=4, dataset="blobs", output_dir=tmp_path / "obj",
        run_config={"num-clients": 3, "plots": False})
    same = [k for k in ref["metrics"] if not k.endswith("_s") and "time" not in k]
    assert {k: res.summary["metrics"][k] for k in same} == {k: ref["metrics"][k] for k in same}


def test_simulate_fedcref_and_emdcfl(tmp_path):
    from fedclust.data.images import load_image_dataset

    x, y = load_image_dataset("digits", "", split="all")
    rng = np.random.default_rng(0)
    idx = rng.permutation(len(y))[:540]
    # FedCRef: three clients of 8x8 digits, label-free start (k-means), labels for evaluation
    fc_clients = [x[p].reshape(len(p), -1) for p in np.array_split(idx, 3)]
    fc_labels = [y[p] for p in np.array_split(idx, 3)]
    res = fedclust.simulate(
        "fedcref", fc_clients, labels=fc_labels, output_dir=tmp_path / "fedcref",
        max_iterations=1, fl_rounds=1, ae_epochs=2, ae_patience=0, batch_size=16,
        fl_local_epochs=1, k_estimate_max=3, run_config={"plots": False})
    m = res.summary["metrics"]
    assert m["iterations"] == 1 and m["active_clients"] == 3 and m["eval_nodes"] == 3
    assert 0.0 <= m["eval_acc_end"] <= 1.0
    assert all((res.run_dir / "clients" / str(i) / "assignments.csv").exists() for i in range(3))
    assert [len(lab) for lab in res.labels] == [len(c) for c in fc_clients]
    assert res.memberships is None          # FedCRef's results are hard labels
    np.testing.assert_array_equal(np.concatenate(res.labels), owner_labels(res, 3))
    # EMD-CFL: four clients, two of them colour-inverted; labels are the training targets
    em_idx = np.array_split(rng.permutation(len(y))[:800], 4)
    em_clients = [(255 - x[p] if i >= 2 else x[p]) for i, p in enumerate(em_idx)]
    res = fedclust.simulate(
        EMDCFL(rounds=2, local_epochs=2, conv1=4, conv2=8, embed_dim=16, workers=1),
        em_clients, labels=[y[p] for p in em_idx], dataset="rotdigits",
        output_dir=tmp_path / "emdcfl", run_config={"plots": False})
    m = res.summary["metrics"]
    assert 1 <= m["num_clusters"] <= 4
    assert all((res.run_dir / "clients" / str(i) / "model.pt").exists() for i in range(4))
    assert res.labels is None and res.memberships is None    # per client, not per row


def test_every_method_is_a_flower_strategy_with_its_keys_as_parameters():
    from fedclust.config import all_keys

    assert set(STRATEGIES) == {"exact-fcm", "fedfcm", "fedcref", "emdcfl"}
    defaults = {k.name: k.default for k in all_keys()}
    for cls in STRATEGIES.values():
        assert issubclass(cls, Strategy)
        strategy = cls()
        assert strategy.run_config()["method"] == cls.method
        # every named parameter is a key of the method, with the key's default
        import inspect

        for name, p in inspect.signature(cls.__init__).parameters.items():
            if name in ("self", "options", "settings"):
                continue
            key = cls.param_keys()[name]
            assert p.default == defaults[key], (cls.__name__, name)
    assert FedCRef(ae_epochs=3).run_config()["fedcref.ae-epochs"] == 3


def test_bad_parameters_are_refused_before_any_run():
    with pytest.raises(TypeError, match="n_cluster"):
        ExactFCM(n_cluster=3)
    with pytest.raises(ConfigError, match=r"FedFCM: run config 'fedfcm.k-max' = 1 .*Allowed"):
        FedFCM(k_max=1)
    with pytest.raises(ConfigError, match=r"unknown keyword argument\(s\) 'ae_epoch' \(did you "
                                          r"mean 'ae_epochs'\?\)"):
        FedCRef(ae_epoch=3)
    with pytest.raises(ConfigError, match="unknown method 'kmeans'"):
        fedclust.simulate("kmeans", [np.zeros((3, 2))])
    with pytest.raises(ConfigError, match="2 label arrays for 1 clients"):
        fedclust.simulate("exact-fcm", [np.zeros((3, 2))], labels=[[0], [1]])
    with pytest.raises(ConfigError, match="dtype complex"):
        fedclust.simulate("exact-fcm", [np.zeros((3, 2), dtype=complex)])
    with pytest.raises(ConfigError, match="EMD-CFL trains a classifier"):
        fedclust.simulate("emdcfl", [np.zeros((5, 8, 8))])
    with pytest.raises(NotImplementedError, match="inside start"):
        ExactFCM().configure_train(1, None, None, None)


def test_the_run_config_layer_builds_the_strategy_the_serverapp_starts():
    from strategies.methods import from_run_config

    strategy, rest = from_run_config({"method": "fedfcm", "fedfcm.k-max": 4, "scaling": "none",
                                      "seed": 3, "dataset": "blobs"})
    assert isinstance(strategy, FedFCM)
    assert strategy.params["k_max"] == 4 and strategy.params["scaling"] == "none"
    assert strategy.params["k_min"] == 2                        # the key's default
    assert rest == {"seed": 3, "dataset": "blobs"}
    strategy, rest = from_run_config({"method": "fedcref", "fedcref.ae-epochs": 3})
    assert isinstance(strategy, FedCRef) and strategy.params["ae_epochs"] == 3 and rest == {}
    with pytest.raises(ConfigError, match="run config 'method' = 'kmeans' is invalid"):
        from_run_config({"method": "kmeans"})
    with pytest.raises(ConfigError, match="fedfcm.k-min"):      # cross-key rules: whole config
        from_run_config({"method": "fedfcm", "fedfcm.k-min": 5, "fedfcm.k-max": 3})


# ------------------------------------------------------------------ notebook results

def test_each_clients_results_are_on_the_result_object_and_drawn(tmp_path):
    from fedclust.outputs import read_manifest

    xs, ys = blobs(2)
    res = fedclust.simulate("exact-fcm", xs, labels=ys, n_clusters=3, output_dir=tmp_path / "r")
    assert len(res.labels) == len(res.memberships) == 3
    for i, x in enumerate(xs):
        u = fcm.memberships((x - res.arrays["scaling_shift"].numpy())
                            / res.arrays["scaling_scale"].numpy(), res.arrays["centers"].numpy())
        np.testing.assert_allclose(res.memberships[i], u, atol=1e-12)
        np.testing.assert_array_equal(res.labels[i], u.argmax(axis=1))
    np.testing.assert_array_equal(np.concatenate(res.labels), owner_labels(res, 3))
    # the default plots show the clusters of the rows, and overwrite=true may clear them
    assert (res.run_dir / "clusters.png").stat().st_size > 5000
    assert read_manifest(res.run_dir)["clusters.png"] == "file"
    again = fedclust.simulate("exact-fcm", xs, n_clusters=3, output_dir=tmp_path / "r",
                              run_config={"overwrite": True, "plots": False})
    assert not (again.run_dir / "clusters.png").exists()
    # a finished run's folder gives the same per-client results
    from strategies.methods import RunResult

    read = RunResult.from_dir(res.run_dir)
    assert all(np.array_equal(a, b) for a, b in zip(read.memberships, res.memberships))


def test_simulate_takes_dataframes_with_a_label_column_by_name(tmp_path):
    pd = pytest.importorskip("pandas")
    xs, ys = blobs(3)
    frames = [pd.DataFrame(x, columns=["heart_rate", "glucose"],
                           index=[f"site{i}-{j}" for j in range(len(x))]).assign(diagnosis=y)
              for i, (x, y) in enumerate(zip(xs, ys))]
    res = fedclust.simulate("exact-fcm", frames, label_column="diagnosis", n_clusters=3,
                            output_dir=tmp_path / "df", run_config={"plots": False})
    arrays = fedclust.simulate("exact-fcm", xs, labels=ys, n_clusters=3,
                               output_dir=tmp_path / "np", run_config={"plots": False})
    assert res.feature_names == ["heart_rate", "glucose"]
    np.testing.assert_array_equal(res.centers, arrays.centers)
    assert res.metrics["eval_ari"] == arrays.metrics["eval_ari"] > 0.9
    assert list(res.labels[1].index) == list(frames[1].index)
    assert list(res.memberships[2].columns) == ["u0", "u1", "u2"]
    np.testing.assert_array_equal(res.labels[0].to_numpy(), arrays.labels[0])


@pytest.mark.parametrize("change, message", [
    (lambda f: f.assign(site="north"), r"client 0's column\(s\) \['site'\] are not numeric"),
    (lambda f: f.rename(columns={"glucose": "sugar"}), "differ from client 0's"),
])
def test_dataframes_with_a_text_column_or_other_columns_are_refused_by_name(
        tmp_path, change, message):
    pd = pytest.importorskip("pandas")
    xs, _ = blobs(4)
    frames = [pd.DataFrame(x, columns=["heart_rate", "glucose"]) for x in xs]
    frames = [change(frames[0]) if "site" in message else frames[0], frames[1],
              change(frames[2])]
    with pytest.raises(ConfigError, match=message):
        fedclust.simulate("exact-fcm", frames, n_clusters=3, output_dir=tmp_path / "x")
    assert not (tmp_path / "x").exists()
    with pytest.raises(ConfigError, match="no column 'label'"):
        fedclust.simulate("exact-fcm", frames[1:2], label_column="label", n_clusters=3)


def test_plots_number_clients_as_the_client_list_and_folders_do():
    from fedclust.plots import _by_client_number

    local = {"1002": [3.0], "1000": [1.0], "1001": [2.0]}
    assert _by_client_number(local) == [("0", [1.0]), ("1", [2.0]), ("2", [3.0])]
    assert _by_client_number({"a": [1.0]}) == [("a", [1.0])]


def test_every_launcher_writes_under_one_results_folder(tmp_path):
    """fedclust sweep, like flwr run and simulate, writes under ~/fedclust-runs."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "HOME": str(tmp_path), "PYTHONPATH": str(root),
           "FLWR_TELEMETRY_ENABLED": "0"}
    for args in (["app.fcm.max-rounds=2"], ["-m", "app.seed=0,1", "app.fcm.max-rounds=2"]):
        done = subprocess.run([sys.executable, "-m", "server_app.sweep", *args,
                               "engine=inprocess", "app.plots=false"], capture_output=True,
                              text=True, cwd=tmp_path, env=env, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
    runs = sorted(p.relative_to(tmp_path).parts[:3] for p in tmp_path.rglob("summary.json"))
    assert [r[:2] for r in runs] == [("fedclust-runs", "exact-fcm"), ("fedclust-runs", "sweeps"),
                                     ("fedclust-runs", "sweeps")]
    assert not (tmp_path / "outputs").exists() and not (tmp_path / "multirun").exists()


def _two_clients() -> list[np.ndarray]:
    x, _ = make_blobs(60, n_features=3, centers=3, random_state=0)
    return [x[:30].copy(), x[30:].copy()]


def test_simulate_refuses_what_it_would_misread_before_any_work(tmp_path):
    """Probe: a mistyped parameter raised a bare TypeError; a NaN in a client's array and a
    DataFrame with two columns of one name were run without a word."""
    import pandas as pd

    out = tmp_path / "never"
    with pytest.raises(ConfigError,
                       match="unknown keyword argument.s. 'n_cluster' .did you mean 'n_clusters'"):
        fedclust.simulate("exact-fcm", _two_clients(), n_cluster=3, output_dir=out)
    bad = _two_clients()
    bad[1][4, 2] = np.nan
    with pytest.raises(ConfigError, match=r"client 1's array holds 1 NaN .* index \(4, 2\)"):
        fedclust.simulate("exact-fcm", bad, n_clusters=3, output_dir=out)
    frames = [pd.DataFrame(x, columns=["a", "b", "a"]) for x in _two_clients()]
    with pytest.raises(ConfigError, match=r"duplicate column names \['a'\]"):
        fedclust.simulate("exact-fcm", frames, n_clusters=3, output_dir=out)
    assert not out.exists()
