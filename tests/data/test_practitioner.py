"""The practitioner path: each site's own file in simulation (``dataset="files"``), results kept
by every data owner, and ``fedclust predict`` on a finished run (FCM methods)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from fedclust import fcm
from fedclust.data import scaling
from fedclust.data.local import load_local_table
from fedclust.data.sites import SiteFilesError
from fedclust.predict import PredictError, predict
from tests.fake_grid import run_server

SIZES = (60, 90, 45)


def write_sites(folder: Path, sizes=SIZES, width: int = 3, seed: int = 0) -> list[Path]:
    """One csv per site: a header, `width` features, a text diagnosis column (evaluation)."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for i, n in enumerate(sizes):
        half = n // 2
        x = np.vstack([rng.normal(0, 0.4, (half, width)), rng.normal(4, 0.4, (n - half, width))])
        x[:, 0] *= 100.0                     # units differ per feature: scaling matters
        y = ["healthy"] * half + ["sick"] * (n - half)
        path = folder / f"site{i}.csv"
        lines = [",".join([f"f{j}" for j in range(width)] + ["diagnosis"])]
        lines += [",".join([f"{v:.6f}" for v in row] + [lab]) for row, lab in zip(x, y)]
        path.write_text("\n".join(lines) + "\n")
        paths.append(path)
    return paths


FILES_CFG = {"dataset": "files", "files.label-column": "diagnosis", "fcm.n-clusters": 2,
             "plots": False, "seed": 3}


def expected_memberships(run_dir: Path, path: Path, m: float) -> np.ndarray:
    x, _ = load_local_table(str(path), "", "diagnosis")
    xs = scaling.apply(x, np.load(run_dir / "scaling_shift.npy"),
                       np.load(run_dir / "scaling_scale.npy"))
    return fcm.memberships(xs, np.load(run_dir / "centers.npy"), m)


def check_owner_folder(run_dir: Path, i: int, path: Path, m: float) -> np.ndarray:
    folder = run_dir / "clients" / str(i)
    table = np.loadtxt(folder / "assignments.csv", delimiter=",", skiprows=1)
    header = (folder / "assignments.csv").read_text().splitlines()[0].split(",")
    u = expected_memberships(run_dir, path, m)
    assert header == ["row", "cluster"] + [f"u{c}" for c in range(u.shape[1])]
    np.testing.assert_array_equal(table[:, 0], np.arange(len(u)))
    np.testing.assert_array_equal(table[:, 1], np.argmax(u, axis=1))
    np.testing.assert_allclose(table[:, 2:], u, atol=1e-12)
    result = json.loads((folder / "result.json").read_text())
    assert result["rows"] == len(u) and sum(result["rows_per_cluster"]) == len(u)
    return table


@pytest.mark.parametrize("method", ["exact-fcm", "fedfcm"])
def test_site_files_in_simulation_and_results_for_each_owner(tmp_path, method):
    paths = write_sites(tmp_path / "sites")
    out = tmp_path / "run"
    extra = {"fedfcm.k-max": 4} if method == "fedfcm" else {}
    own = {k: v for k, v in FILES_CFG.items() if method == "exact-fcm" or k != "fcm.n-clusters"}
    summary, grid = run_server({**own, **extra, "method": method,
                                "data-dir": str(tmp_path / "sites"), "output-dir": str(out)})
    assert summary["num_clients"] == len(SIZES) == len(grid.contexts)   # one client per file
    m = 2.0
    for i, path in enumerate(paths):
        table = check_owner_folder(out, i, path, m)
        # the site's own rows predict to the labels it received, from the server's folder and
        # from its own folder
        rows, _ = load_local_table(str(path), "", "diagnosis")
        for where in (out, out / "clients" / str(i)):
            pred = predict(where, path, label_column="diagnosis")
            np.testing.assert_array_equal(pred.labels, table[:, 1])
            np.testing.assert_allclose(pred.table, table, atol=1e-12)
        np.testing.assert_array_equal(predict(out, rows).labels, table[:, 1])
    centers = np.loadtxt(out / "clients" / "0" / "centers.csv", delimiter=",", skiprows=1)
    np.testing.assert_allclose(centers, np.load(out / "centers_unscaled.npy"), atol=1e-9)
    assert summary["metrics"]["eval_ari" if method == "exact-fcm" else "eval_ari_best_k"] == 1.0


def test_secure_aggregation_run_also_returns_results_to_each_owner(tmp_path):
    paths = write_sites(tmp_path / "sites")
    out = tmp_path / "run"
    run_server({**FILES_CFG, "data-dir": str(tmp_path / "sites"), "output-dir": str(out),
                "fcm.secure-aggregation": True, "fcm.max-rounds": 3})
    for i, path in enumerate(paths):
        check_owner_folder(out, i, path, 2.0)


def test_predict_refuses_rows_of_the_wrong_width_and_the_cli_writes_the_same_rows(tmp_path):
    paths = write_sites(tmp_path / "sites")
    out = tmp_path / "run"
    run_server({**FILES_CFG, "data-dir": str(tmp_path / "sites"), "output-dir": str(out)})
    with pytest.raises(PredictError, match="the rows have 2 features but the run's centers "
                                           "have 3"):
        predict(out, np.zeros((4, 2)))
    with pytest.raises(PredictError, match="neither summary.json nor predict.json"):
        predict(tmp_path / "sites", paths[0])
    target = tmp_path / "pred.csv"
    cli = [sys.executable, "-m", "fedclust.cli", "predict", str(out), str(paths[1]),
           "--label-column", "diagnosis", "--out", str(target)]
    done = subprocess.run(cli, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert target.read_text() == (out / "clients" / "1" / "assignments.csv").read_text()
    other = tmp_path / "pred2.csv"
    bad = subprocess.run(cli[:5] + [str(paths[1]), "--out", str(other)], capture_output=True,
                         text=True, timeout=120)
    assert bad.returncode == 2 and "label-column" in bad.stderr and not other.exists()


@pytest.mark.parametrize("case, match", [
    ("empty", "holds no site files"),
    ("missing", "is not a folder"),
    ("widths", r"different feature counts \(site0.csv: 3, site1.csv: 3, site2.csv: 4\)"),
    ("unreadable", r"unreadable files among the site files of data-dir: site1.npy"),
    ("count", r"holds 3 site files but the engine has 2 nodes.*num-supernodes=3"),
])
def test_bad_site_folders_stop_before_any_work(tmp_path, case, match):
    sites = tmp_path / "sites"
    sites.mkdir()
    nodes = None
    if case in ("widths", "count"):
        write_sites(sites)
    if case == "widths":
        write_sites(tmp_path / "wide", width=4)
        (tmp_path / "wide" / "site2.csv").replace(sites / "site2.csv")
    if case == "unreadable":
        write_sites(sites, sizes=(30,))
        (sites / "site1.npy").write_bytes(b"not a numpy file")
    if case == "count":
        nodes = 2
    data_dir = tmp_path / "nowhere" if case == "missing" else sites
    sent = []
    with pytest.raises(SiteFilesError, match=match):
        run_server({**FILES_CFG, "data-dir": str(data_dir), "output-dir": str(tmp_path / "o")},
                   num_nodes=nodes or 3, inspect=lambda msg, rep: sent.append(msg))
    types = [m.metadata.message_type for m in sent]
    assert set(types) <= {"query.fedclust_node"} and len(types) <= 3
    assert not (tmp_path / "o").exists()


def test_sweep_runs_site_files_with_one_node_per_file(tmp_path):
    write_sites(tmp_path / "sites")
    out = tmp_path / "sweep"
    done = subprocess.run(
        [sys.executable, "-m", "server_app.sweep", "engine=inprocess", "app.dataset=files",
         f"app.data-dir={tmp_path / 'sites'}", "app.files.label-column=diagnosis",
         "app.fcm.n-clusters=2", "app.plots=false", f"hydra.run.dir={out}"],
        capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["num_clients"] == 3 and summary["metrics"]["eval_ari"] == 1.0
    assert sorted(p.name for p in (out / "clients").iterdir()) == ["0", "1", "2"]


@pytest.mark.slow
@pytest.mark.exclusive("ray")
def test_site_files_on_flowers_simulation_engine(tmp_path):
    from server_app.engine import SimulationSuperLink

    paths = write_sites(tmp_path / "sites")
    out = tmp_path / "run"
    with SimulationSuperLink(workdir=tmp_path / "sim") as link:
        res = link.run({**FILES_CFG, "data-dir": str(tmp_path / "sites"),
                        "output-dir": str(out)}, num_supernodes=len(paths))
        assert res.ok, res.log[-3000:]
        bad = link.run({**FILES_CFG, "data-dir": str(tmp_path / "sites"),
                        "output-dir": str(tmp_path / "bad")}, num_supernodes=2)
    assert not bad.ok and "num-supernodes=3" in bad.log
    for i, path in enumerate(paths):
        check_owner_folder(out, i, path, 2.0)
    # the clients wrote from their own processes: every file is in the run folder's manifest
    from fedclust.outputs import read_manifest

    entries = read_manifest(out)
    for i in range(len(paths)):
        for name in ("assignments.csv", "centers.npy", "predict.json", "result.json"):
            assert entries.get(f"clients/{i}/{name}") == "file", sorted(entries)


def test_error_replies_carry_no_node_data():
    """A handler failing on a value of the node's data sends its error class and a fixed text;
    the value stays in the node's log. Errors whose text is data-free by construction (bad
    config, a data file that cannot be used) keep their message."""
    from flwr.app import Context, Message, RecordDict
    from flwr.supercore.task_identity import TaskIdentity

    from client_apps.app import error_mod
    from fedclust.data.local import LocalDataError

    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1
    ctx = Context(run_id=1, node_id=5, node_config={}, state=RecordDict(), run_config={})
    msg = Message(RecordDict(), dst_node_id=5, message_type="query.fcm_stats")
    msg.metadata.__dict__["_message_id"] = "m1"
    secret = "PATIENT_SMITH_1957"

    def numpy_failure(msg, context):
        raise ValueError(f"could not convert string {secret!r} to float")

    def file_failure(msg, context):
        raise LocalDataError("site0.csv: row 3, column 2 is not a number")

    rep = error_mod(msg, ctx, numpy_failure)
    assert rep.has_error() and secret not in rep.error.reason
    assert rep.error.reason == "ValueError in query.fcm_stats (details in this node's log)"
    rep = error_mod(msg, ctx, file_failure)
    assert rep.error.reason == "LocalDataError: site0.csv: row 3, column 2 is not a number"


@pytest.mark.parametrize("outlier", ["1234.0", "123456789.0"])
def test_one_site_dominating_a_feature_is_named(tmp_path, fedclust_log, outlier):
    """An outlier a few hundred spans out is named in a warning; one a million spans out (a
    typo, another unit) would squeeze every other site's values into a sliver of the box: that
    site is excluded from the run, named with the reason."""
    paths = write_sites(tmp_path / "sites")
    lines = paths[2].read_text().splitlines()
    cells = lines[5].split(",")
    cells[1] = outlier                             # one outlier in feature 1 at site 2
    lines[5] = ",".join(cells)
    paths[2].write_text("\n".join(lines) + "\n")
    summary, _ = run_server({**FILES_CFG, "data-dir": str(tmp_path / "sites"),
                             "output-dir": str(tmp_path / "run")})
    if outlier == "1234.0":
        warned = [m for m in fedclust_log if "alone spans" in m]
        assert len(warned) == 1 and "feature 1: node 1002" in warned[0]
        assert summary["excluded_nodes"] == []
    else:
        assert [(e["node"], e["phase"]) for e in summary["excluded_nodes"]] == [
            (1002, "scaling")]
        assert "of feature 1 reaches" in summary["excluded_nodes"][0]["reason"]
    assert not any(outlier.removesuffix(".0") in m for m in fedclust_log)
