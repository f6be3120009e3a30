"""Bad-input matrix ("safe to deploy"): every bad input gets a clear refusal.

Across the four methods and the launchers (in-process grid, ``fedclust-sweep``,
``scripts/run_default.sh``), each case asserts either a clear message — naming the key or thing,
what is allowed and how to fix it, raised by one of the project's own error classes, never a
raw exception from deep inside numpy/scikit-learn/torch — or the correct result. Runs that meet
bad input must stop after at most one message (the engine question) and never wait for
``timeout``. Node data *files* are covered by tests/data/test_local_data_door.py; here the folders.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from fedclust.config import ConfigError, validate
from fedclust.data.sites import SiteFilesError, simulated_nodes
from fedclust.errors import BadInputError
from fedclust.results import OutputDirError
from server_app.app import check_run_config
from server_app.inprocess import run_server

ROOT = Path(__file__).resolve().parents[2]
METHODS = ("exact-fcm", "fedfcm", "fedcref", "emdcfl")
# the smallest runs of each method (a second or two each)
SMALL = {
    "exact-fcm": {},
    "fedfcm": {"fedfcm.k-max": 3},
    "fedcref": {"fedcref.max-iterations": 1, "fedcref.fl-rounds": 1, "fedcref.ae-epochs": 1,
                "fedcref.ae-hidden": "16,8", "fedcref.samples-per-cluster": 10},
    "emdcfl": {"emdcfl.samples": 20, "emdcfl.test-samples": 10, "emdcfl.rounds": 1,
               "emdcfl.conv1": 4, "emdcfl.conv2": 4, "emdcfl.embed-dim": 8,
               "emdcfl.max-samples": 16, "emdcfl.workers": 1},
}
BAD = BadInputError
SEED_MAX = 2**32 - 1


def assert_clear(text: str, *names: str, allowed: bool = True) -> None:
    """A clear message: names the key/thing, says what is allowed and how to fix it."""
    low = text.lower()
    for name in names:
        assert name in text, f"{name!r} not named in: {text}"
    if allowed:
        assert "allowed" in low, text
    assert "fix" in low, text
    assert "Traceback" not in text and "site-packages" not in text, text


def refused(call, *names: str, kind=BAD, allowed: bool = True) -> str:
    with pytest.raises(kind) as info:
        call()
    assert isinstance(info.value, BAD), type(info.value)   # ours, not numpy's or sklearn's
    assert_clear(str(info.value), *names, allowed=allowed)
    return str(info.value)


def cfg_of(method: str, **extra) -> dict:
    return {"method": method, "plots": False, **SMALL[method], **extra}


def serve(cfg: dict, nodes: int):
    """run_server that records every instruction sent; returns (sent, seconds, outcome)."""
    sent: list[str] = []
    t0 = time.monotonic()
    try:
        out = run_server(cfg, num_nodes=nodes,
                         inspect=lambda msg, rep: sent.append(msg.metadata.message_type))
    except Exception as exc:   # noqa: BLE001 - returned to the test
        out = exc
    return sent, time.monotonic() - t0, out


# ------------------------------------------------------------------ common keys, every method

COMMON_BAD = [
    ({"num-clients": "three"}, "num-clients"),
    ({"num-clients": [3]}, "num-clients"),
    ({"num-clients": 2.5}, "num-clients"),
    ({"num-clients": 10_001}, "num-clients"),
    ({"num-clients": float("inf")}, "num-clients"),
    ({"seed": "zero"}, "seed"),
    ({"seed": 2**32}, "seed"),
    ({"seed": str(2**32)}, "seed"),
    ({"seed": 2**64}, "seed"),
    ({"seed": -1}, "seed"),
    ({"timeout": 0}, "timeout"),
    ({"timeout": float("nan")}, "timeout"),
    ({"timeout": "inf"}, "timeout"),
    ({"evaluate": "maybe"}, "evaluate"),
    ({"dataset": ["blobs"]}, "dataset"),
    ({"output-dir": None}, "output-dir"),
    ({"scaling": "zscore"}, "scaling"),
    ({"partition.alpha": 0.0}, "partition.alpha"),
    ({"files.format": "xlsx"}, "files.format"),
]


@pytest.mark.parametrize("override, key", COMMON_BAD,
                         ids=[f"{k}={list(o.values())[0]!r}"[:40] for o, k in COMMON_BAD])
@pytest.mark.parametrize("method", METHODS)
def test_common_key_with_a_bad_value_is_refused(method, override, key):
    text = refused(lambda: validate({"method": method, **override}), f"'{key}'",
                   kind=ConfigError)
    if key == "seed" and "allowed range" in text:
        assert str(SEED_MAX) in text    # the upper bound is spelled out


# ------------------------------------------------------------------ each method's own keys

METHOD_BAD = {
    "exact-fcm": [({"fcm.m": "two"}, "fcm.m"), ({"fcm.m": [2.0]}, "fcm.m"),
                  ({"fcm.m": float("nan")}, "fcm.m"), ({"fcm.m": 1.0}, "fcm.m"),
                  ({"fcm.n-clusters": 1}, "fcm.n-clusters"),
                  ({"fcm.fraction": float("inf")}, "fcm.fraction"),
                  ({"fcm.max-rounds": "30x"}, "fcm.max-rounds"),
                  ({"fcm.privacy-guard": "perhaps"}, "fcm.privacy-guard"),
                  ({"fcm.epsilon": -1}, "fcm.epsilon")],
    "fedfcm": [({"fedfcm.m": "two"}, "fedfcm.m"), ({"fedfcm.m": float("inf")}, "fedfcm.m"),
               ({"fedfcm.k-max": "six"}, "fedfcm.k-max"), ({"fedfcm.k-min": 1}, "fedfcm.k-min"),
               ({"fedfcm.averaging": "median"}, "fedfcm.averaging"),
               ({"fedfcm.p": 0.5}, "fedfcm.p"), ({"fedfcm.tol": float("nan")}, "fedfcm.tol"),
               ({"fedfcm.local-max-iter": 0}, "fedfcm.local-max-iter")],
    "fedcref": [({"fedcref.lr": "fast"}, "fedcref.lr"), ({"fedcref.lr": 0}, "fedcref.lr"),
                ({"fedcref.alpha": float("nan")}, "fedcref.alpha"),
                ({"fedcref.ae-hidden": "100,-1"}, "fedcref.ae-hidden"),
                ({"fedcref.ae-hidden": [100, 64]}, "fedcref.ae-hidden"),
                ({"fedcref.init": "spectral"}, "fedcref.init"),
                ({"fedcref.overlap": 1.0}, "fedcref.overlap"),
                ({"fedcref.max-iterations": 0}, "fedcref.max-iterations")],
    "emdcfl": [({"emdcfl.rounds": [3]}, "emdcfl.rounds"),
               ({"emdcfl.lr": float("inf")}, "emdcfl.lr"),
               ({"emdcfl.algorithm": "fedprox"}, "emdcfl.algorithm"),
               ({"emdcfl.device": "tpu"}, "emdcfl.device"),
               ({"emdcfl.val-fraction": 0.95}, "emdcfl.val-fraction"),
               ({"emdcfl.solver": "lp"}, "emdcfl.solver"),
               ({"emdcfl.num-itermax": 10}, "emdcfl.num-itermax"),
               ({"emdcfl.samples": "many"}, "emdcfl.samples")],
}
METHOD_CASES = [(m, o, k) for m, cases in METHOD_BAD.items() for o, k in cases]


@pytest.mark.parametrize("method, override, key", METHOD_CASES,
                         ids=[f"{m}-{k}={list(o.values())[0]!r}"[:50]
                              for m, o, k in METHOD_CASES])
def test_method_key_with_a_bad_value_is_refused(method, override, key):
    refused(lambda: validate({"method": method, **override}), f"'{key}'", kind=ConfigError)


UNKNOWN = [("exact-fcm", "fcm.n_clusters", "fcm.n-clusters"), ("exact-fcm", "m", "fcm.m"),
           ("fedfcm", "fedfcm.kmax", "fedfcm.k-max"), ("fedfcm", "k-max", "fedfcm.k-max"),
           ("fedcref", "fedcref.learning-rate", None), ("fedcref", "theta", "fedcref.theta"),
           ("emdcfl", "emdcfl.round", None), ("emdcfl", "rounds", "emdcfl.rounds")]


@pytest.mark.parametrize("method, key, suggestion", UNKNOWN)
def test_unknown_key_is_named_with_a_suggestion(method, key, suggestion):
    text = refused(lambda: validate({"method": method, key: 1}), f"'{key}'", kind=ConfigError,
                   allowed=False)
    assert "unknown run-config key" in text and "Known keys" in text
    if suggestion:
        assert "did you mean" in text and suggestion in text


@pytest.mark.parametrize("value", ["kmeans", "EXACT-FCM", "", ["fedfcm"]])
def test_unknown_method_is_refused(value):
    refused(lambda: validate({"method": value}), "'method'", "exact-fcm", kind=ConfigError)


# ------------------------------------------------------------------ cross-key conflicts

CROSS = [
    ("exact-fcm", {"num-clients": 3, "min-clients": 4}, "min-clients"),
    ("fedfcm", {"num-clients": 3, "min-clients": 4}, "min-clients"),
    ("fedcref", {"num-clients": 3, "min-clients": 4}, "min-clients"),
    ("emdcfl", {"num-clients": 8, "min-clients": 9}, "min-clients"),
    ("exact-fcm", {"fcm.m": 99.0, "fcm.n-clusters": 200}, "fcm.m"),
    ("exact-fcm", {"fcm.m": 30.0, "fcm.secure-aggregation": True}, "fcm.m"),
    ("fedfcm", {"fedfcm.k-min": 5, "fedfcm.k-max": 3}, "fedfcm.k-min"),
    ("fedfcm", {"fedfcm.k-min": 2, "fedfcm.k-max": 60}, "fedfcm.k-max"),
    ("fedfcm", {"fedfcm.m": 90.0, "fedfcm.k-min": 160, "fedfcm.k-max": 200}, "fedfcm.m"),
    ("fedfcm", {"fedfcm.m": 90.0, "fedfcm.local-k-max": 300}, "fedfcm.m"),
    ("fedcref", {"fedcref.k-min": 4, "fedcref.k-max": 3}, "fedcref.k-max"),
    ("fedcref", {"fedcref.association": "perfect", "evaluate": False}, "fedcref.association"),
    ("fedcref", {"dataset": "mnist", "data-dir": ""}, "data-dir"),
    ("fedcref", {"dataset": "iris"}, "dataset"),
    ("emdcfl", {"num-clients": 1}, "num-clients"),
    ("emdcfl", {"num-clients": 6, "emdcfl.clients-per-group": 2}, "emdcfl.clients-per-group"),
    ("emdcfl", {"num-clients": 4, "emdcfl.clients-per-round": 5}, "emdcfl.clients-per-round"),
    ("emdcfl", {"num-clients": 4, "emdcfl.algorithm": "oracle", "evaluate": False},
     "emdcfl.algorithm"),
    ("emdcfl", {"num-clients": 4, "emdcfl.algorithm": "ifca", "evaluate": False},
     "emdcfl.num-clusters"),
    ("emdcfl", {"num-clients": 4, "emdcfl.algorithm": "fedavg",
                "emdcfl.clients-per-round": 2}, "emdcfl.clients-per-round"),
    ("emdcfl", {"dataset": "iris"}, "dataset"),
]


@pytest.mark.parametrize("method, override, key", CROSS,
                         ids=[f"{m}-{k}" for m, _, k in CROSS])
def test_conflicting_keys_are_refused_before_any_message(method, override, key, tmp_path):
    out = tmp_path / "run"
    refused(lambda: check_run_config({"method": method, **override, "output-dir": str(out)}),
            f"'{key}'", kind=ConfigError)
    assert not out.exists()


# ------------------------------------------------------------------ seeds

@pytest.mark.parametrize("method", METHODS)
def test_the_largest_seed_runs(method, tmp_path):
    """seed = 2**32 - 1 is allowed and must run (scikit-learn takes seeds below 2**32; FedFCM's
    k-means averaging derives seed*1000 + K from it)."""
    summary, _ = run_server(cfg_of(method, seed=SEED_MAX, **{"output-dir": str(tmp_path / "r")}),
                            num_nodes=4)
    assert summary["seed"] == SEED_MAX and (tmp_path / "r" / "summary.json").exists()


def test_fedfcm_seed_whose_derived_kmeans_seed_passes_2_to_the_32_runs(tmp_path):
    summary, _ = run_server(cfg_of("fedfcm", seed=5_000_000,
                                   **{"output-dir": str(tmp_path / "r")}), num_nodes=3)
    assert summary["metrics"]["best_k"] in (2, 3)


@pytest.mark.parametrize("method", METHODS)
def test_a_seed_above_the_bound_stops_before_any_message(method, tmp_path):
    sent, seconds, out = serve(cfg_of(method, seed=2**32, **{"output-dir": str(tmp_path / "r")}),
                               nodes=3)
    assert isinstance(out, ConfigError) and sent == []
    assert_clear(str(out), "'seed'", str(SEED_MAX))


# ------------------------------------------------------------------ num-clients vs the engine

@pytest.mark.parametrize("num_clients, nodes", [(3, 4), (6, 4)])
@pytest.mark.parametrize("method", METHODS)
def test_num_clients_other_than_the_engine_stops_after_one_message(method, num_clients, nodes,
                                                                  tmp_path):
    sent, seconds, out = serve(cfg_of(method, **{"num-clients": num_clients, "timeout": 600,
                                                  "output-dir": str(tmp_path / "r")}), nodes)
    assert isinstance(out, ConfigError), out
    assert_clear(str(out), f"'num-clients' = {num_clients}", f"has {nodes} nodes",
                 f"num-supernodes={num_clients}")
    assert set(sent) == {"query.fedclust_node"} and len(sent) <= 3 and seconds < 60
    assert not (tmp_path / "r").exists()


# ------------------------------------------------------------------ dataset=files folders

def _csvs(folder: Path, widths, rows: int = 30, method: str = "exact-fcm") -> Path:
    """One site file per width, as the method's nodes read them: a table of values in [0, 1)
    (features, and FedCRef's pixels), or EMD-CFL's labelled image splits (width 2: 28×28
    images, the run's model; any other width: 27×27)."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for i, w in enumerate(widths):
        if method == "emdcfl":
            side = 28 if w == 2 else 27
            np.savez(folder / f"site{i}.npz", **{
                f"{kind}_{split}": (rng.integers(0, 256, (n, side, side)) if kind == "x" else
                                    rng.integers(0, 10, n))
                for split, n in (("train", rows), ("val", 4), ("test", 4)) for kind in "xy"})
        else:
            np.savetxt(folder / f"site{i}.csv", rng.random(size=(rows, w)), delimiter=",")
    return folder


def _folder(case: str, tmp: Path, method: str = "exact-fcm") -> str:
    if case == "empty":
        (tmp / "empty").mkdir()
        return str(tmp / "empty")
    if case == "missing":
        return str(tmp / "nowhere")
    if case == "a-file":
        return str(next(_csvs(tmp / "one", [2], method=method).iterdir()))
    if case == "mixed-widths":
        return str(_csvs(tmp / "mixed", [2, 2, 3], method=method))
    if case == "no-usable-files":
        (tmp / "odd").mkdir()
        (tmp / "odd" / "sites.xlsx").write_text("x")
        (tmp / "odd" / ".hidden.csv").write_text("1,2\n")
        return str(tmp / "odd")
    if case == "unset":
        return ""
    return str(_csvs(tmp / "three", [2, 2, 2], method=method))   # "wrong-count": 3 files, 2 clients


FOLDERS = [("empty", "holds no site files"), ("missing", "is not a folder"),
           ("a-file", "is not a folder"), ("mixed-widths", "site2.csv: 3"),
           ("no-usable-files", "sites.xlsx"), ("unset", "needs run config 'data-dir'"),
           ("wrong-count", "holds 3 site files")]


@pytest.mark.parametrize("case, fragment", FOLDERS)
@pytest.mark.parametrize("method", METHODS)
def test_files_folder_problems_are_refused_before_any_work(method, case, fragment, tmp_path):
    cfg = cfg_of(method, dataset="files", **{"data-dir": _folder(case, tmp_path, method),
                                             "output-dir": str(tmp_path / "r")})
    if case == "wrong-count":
        cfg["num-clients"] = 2
    if method == "emdcfl" and case == "mixed-widths":   # its model's image shape, named
        fragment = "site2.npz: data-path (a .npz file): 'x_train' has shape (30, 27, 27)"
    text = refused(lambda: check_run_config(cfg), fragment, kind=SiteFilesError,
                   allowed=case not in ("wrong-count", "unset", "empty", "no-usable-files"))
    assert "data-dir" in text
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("method", METHODS)
def test_files_folder_with_another_count_than_the_engine_stops_after_one_message(method,
                                                                               tmp_path):
    sites = _csvs(tmp_path / "sites", [2, 2, 2], method=method)
    sent, seconds, out = serve(cfg_of(method, dataset="files", timeout=600, **{
        "data-dir": str(sites), "output-dir": str(tmp_path / "r")}), nodes=2)
    assert isinstance(out, SiteFilesError), out
    assert_clear(str(out), "holds 3 site files", "2 nodes", "num-supernodes=3", allowed=False)
    assert set(sent) <= {"query.fedclust_node"} and len(sent) <= 3 and seconds < 60
    assert not (tmp_path / "r").exists()


def test_simulated_nodes_refuses_an_empty_files_folder(tmp_path):
    (tmp_path / "e").mkdir()
    refused(lambda: simulated_nodes({"dataset": "files", "data-dir": str(tmp_path / "e")}),
            "holds no site files", kind=SiteFilesError, allowed=False)


# ------------------------------------------------------------------ output-dir

def _output(case: str, tmp: Path) -> Path:
    if case == "a-file":
        (tmp / "results").write_text("not a folder")
        return tmp / "results"
    if case == "below-a-file":
        (tmp / "results").write_text("not a folder")
        return tmp / "results" / "run"
    folder = tmp / "results"
    folder.mkdir()
    if case in ("foreign", "foreign-overwrite"):
        (folder / "notes.txt").write_text("someone's notes")
    elif case == "earlier-run":
        (folder / "summary.json").write_text("{}")
    elif case == "in-use":
        (folder / "RUNNING").write_text("123")
    return folder


OUTPUTS = [("a-file", "existing file, not a folder"), ("below-a-file", "existing file"),
           ("foreign", "is not empty"), ("foreign-overwrite", "overwrite=true clears only"),
           ("earlier-run", "overwrite=true"), ("in-use", "in use by another run")]


@pytest.mark.parametrize("case, fragment", OUTPUTS)
@pytest.mark.parametrize("method", METHODS)
def test_output_dir_problems_are_refused_and_nothing_is_touched(method, case, fragment,
                                                              tmp_path):
    out = _output(case, tmp_path)
    before = sorted(p.name for p in out.iterdir()) if out.is_dir() else None
    sent, seconds, res = serve(cfg_of(method, overwrite=case == "foreign-overwrite",
                                      **{"output-dir": str(out)}), nodes=3)
    assert isinstance(res, (ConfigError, OutputDirError)), res
    assert_clear(str(res), "output-dir", fragment)
    assert set(sent) <= {"query.fedclust_node"} and len(sent) <= 3
    if case.startswith("a-file") or case == "below-a-file":
        assert sent == [] and (tmp_path / "results").read_text() == "not a folder"
    else:
        assert sorted(p.name for p in out.iterdir()) == before


@pytest.mark.parametrize("method", ["exact-fcm", "fedfcm"])
def test_overwrite_clears_an_earlier_run_folder_and_runs(method, tmp_path):
    out = tmp_path / "results"
    run_server(cfg_of(method, **{"output-dir": str(out)}), num_nodes=3)
    (out / "stale.txt").write_text("from before")      # not fedclust's: overwrite refuses it
    with pytest.raises(OutputDirError, match="holds 'stale.txt'"):
        run_server(cfg_of(method, overwrite=True, seed=1, **{"output-dir": str(out)}),
                   num_nodes=3)
    assert (out / "stale.txt").read_text() == "from before"
    (out / "stale.txt").unlink()
    summary, _ = run_server(cfg_of(method, overwrite=True, seed=1, **{"output-dir": str(out)}),
                            num_nodes=3)
    assert json.loads((out / "summary.json").read_text())["seed"] == 1 == summary["seed"]


# ------------------------------------------------------------------ the fuzzifier

@pytest.mark.parametrize("method, key, value", [
    ("exact-fcm", "fcm.m", 1000.0), ("exact-fcm", "fcm.m", 1e6), ("exact-fcm", "fcm.m", 100.5),
    ("fedfcm", "fedfcm.m", 1000.0), ("fedfcm", "fedfcm.m", 1e300)])
def test_huge_fuzzifier_gets_its_own_message_not_the_privacy_guards(method, key, value,
                                                                    tmp_path):
    sent, _, out = serve(cfg_of(method, **{key: value, "output-dir": str(tmp_path / "r")}), 3)
    assert isinstance(out, ConfigError) and sent == []
    text = str(out)
    assert_clear(text, f"'{key}'", "100")
    assert "underflow" in text and "privacy" not in text


@pytest.mark.parametrize("config, bound", [
    ({"fcm.m": 99.0, "fcm.n-clusters": 200}, "86.9"),
    ({"fcm.m": 30.0, "fcm.secure-aggregation": True}, "16.6"),
    ({"method": "fedfcm", "fedfcm.m": 90.0, "fedfcm.k-min": 160, "fedfcm.k-max": 200}, "86.9")])
def test_fuzzifier_too_large_for_the_cluster_count_names_the_largest_usable_m(config, bound):
    key = "fedfcm.m" if "fedfcm.m" in config else "fcm.m"
    text = refused(lambda: validate(config), f"'{key}'", "underflows", f"use m <= {bound}",
                   kind=ConfigError)
    assert "privacy" not in text


@pytest.mark.parametrize("method, key", [("exact-fcm", "fcm.m"), ("fedfcm", "fedfcm.m")])
@pytest.mark.parametrize("m", [1.0000001, 100.0])
def test_fuzzifier_at_the_edges_gives_a_correct_result(method, key, m, tmp_path):
    """m -> 1 is hard k-means (crisp memberships, no NaN); m = 100 (the bound) still moves the
    centers: both recover the two well-separated site groups."""
    sites = _two_groups(tmp_path / "sites")
    out = tmp_path / "r"
    extra = {"fcm.n-clusters": 2} if method == "exact-fcm" else {"fedfcm.k-max": 2}
    summary, _ = run_server(cfg_of(method, dataset="files", **extra, **{
        key: m, "data-dir": str(sites), "output-dir": str(out), "files.label-column": "2"}))
    ari = summary["metrics"]["eval_ari" if method == "exact-fcm" else "eval_ari_best_k"]
    assert ari == 1.0
    centers = np.load(out / "centers_unscaled.npy")
    assert np.all(np.isfinite(centers))
    assert sorted(np.round(centers[:, 0]).tolist()) == [0.0, 10.0]


def _two_groups(folder: Path) -> Path:
    rng = np.random.default_rng(1)
    folder.mkdir(parents=True)
    for i in range(3):
        x = np.vstack([rng.normal(0, 0.3, (20, 2)), rng.normal(10, 0.3, (20, 2))])
        y = np.repeat([0, 1], 20)
        np.savetxt(folder / f"site{i}.csv", np.column_stack([x, y]), delimiter=",")
    return folder


def test_fcm_core_m_close_to_one_is_crisp_and_huge_m_is_refused():
    from fedclust import fcm

    rng = np.random.default_rng(0)
    x = np.vstack([rng.normal(0, 0.3, (30, 2)), rng.normal(3, 0.3, (30, 2))])
    u = fcm.memberships(x, np.array([[0.0, 0.0], [3.0, 3.0]]), 1.0000001)
    assert np.all(np.isfinite(u)) and set(np.unique(u)) <= {0.0, 1.0}
    labels = fcm.FuzzyCMeans(2, m=1.0000001, random_state=0).fit_predict(x)
    assert len(set(labels[:30])) == 1 and len(set(labels[30:])) == 1
    with pytest.raises(ValueError, match=r"FuzzyCMeans: m = 1e\+06 is above 100: .*underflow"):
        fcm.FuzzyCMeans(2, m=1e6).fit(x)
    with pytest.raises(ValueError, match="with 150 clusters.*use m <= 91.9"):
        fcm.FuzzyCMeans(150, m=99.0).fit(np.tile(x, (3, 1)))


# ------------------------------------------------------------------ launchers

ENV = {**os.environ, "FLWR_TELEMETRY_ENABLED": "0",
       "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1"}


def test_run_server_with_num_clients_three_gives_the_config_message(tmp_path):
    refused(lambda: run_server({"num-clients": "three", "output-dir": str(tmp_path / "r")}),
            "'num-clients' = 'three'", "not a int", kind=ConfigError)
    sent, _, out = serve({"num-clients": "three", "output-dir": str(tmp_path / "r")}, 3)
    assert isinstance(out, ConfigError) and sent == []


def test_simulated_nodes_with_num_clients_three_gives_the_config_message():
    refused(lambda: simulated_nodes({"num-clients": "three"}), "'num-clients'",
            kind=ConfigError)


def _sweep(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "server_app.sweep", "engine=inprocess", *args,
                           f"hydra.run.dir={tmp_path / 'job'}"], capture_output=True, text=True,
                          timeout=120, env=ENV, cwd=tmp_path)


@pytest.mark.parametrize("args, names", [
    (["app.num-clients=three"], ["'num-clients' = 'three'"]),
    ([f"app.seed={2**32}"], ["'seed'", str(SEED_MAX)]),
    (["app.fcm.m=1000"], ["'fcm.m'", "underflow"]),
    (["num_supernodes=three"], ["'num_supernodes'"]),
    (["engine=ray"], ["'engine'", "inprocess"]),
    (["app.dataset=files", "app.data-dir=/nonexistent/sites"], ["'data-dir'", "not a folder"]),
])
def test_sweep_refuses_with_the_message_and_no_traceback(tmp_path, args, names):
    done = _sweep(tmp_path, *args)
    assert done.returncode == 2, done.stderr[-2000:]
    assert_clear(done.stderr, *names)
    assert "refused:" in done.stderr
    assert not list(tmp_path.rglob("summary.json"))


@pytest.mark.parametrize("args, names", [
    (["num-clients=three"], ["'num-clients' = 'three'"]),
    ([f"seed={2**32}"], ["'seed'", str(SEED_MAX)]),
    (["fcm.m=1000"], ["'fcm.m'"]),
])
def test_run_default_refuses_before_starting_a_superlink(tmp_path, args, names):
    t0 = time.monotonic()
    done = subprocess.run(["bash", str(ROOT / "scripts" / "run_default.sh"), *args],
                          capture_output=True, text=True, timeout=120,
                          env={**ENV, "OUT": str(tmp_path / "out")})
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
    assert_clear(done.stderr, *names)
    assert "run_default.sh: run config" in done.stderr
    assert time.monotonic() - t0 < 60 and not (tmp_path / "out").exists()
