"""``fedclust predict`` matches columns by name when the run knows the names, refuses a
mismatch, and says when rows lie far outside the data the run was fitted on.

Probe: rows whose columns came in another order were applied by position (31 of 50 labels
changed, exit 0), and rows of absurd magnitude were assigned without a word.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import fedclust
from client_apps.app import app as client_app
from fedclust.cli import main as cli
from fedclust.predict import predict
from fedclust.predict.base import PredictError
from server_app.app import run_method
from server_app.inprocess import InProcessGrid, run_server

NAMES = ["heart_rate", "systolic_bp", "glucose"]


def _table(rng, n: int = 50) -> np.ndarray:
    group = np.arange(n) % 3
    return np.column_stack([60 + 10 * group, 120 + 20 * (group == 1), 90 + 60 * (group == 2)]
                           ) + rng.normal(size=(n, 3))


def _csv(path: Path, x: np.ndarray, names=NAMES) -> Path:
    np.savetxt(path, x, delimiter=",", header=",".join(names), comments="", fmt="%.6f")
    return path


@pytest.fixture(scope="module")
def files_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("files")
    rng = np.random.default_rng(0)
    (root / "sites").mkdir()
    for i in range(3):
        _csv(root / "sites" / f"site{i}.csv", _table(rng))
    cfg = {"method": "exact-fcm", "dataset": "files", "data-dir": str(root / "sites"),
           "fcm.n-clusters": 3, "plots": False, "output-dir": str(root / "run")}
    run_server(cfg)
    new = _table(np.random.default_rng(7))
    return root, new


@pytest.mark.parametrize("folder", ["run", "run/clients/0"])
def test_reordered_columns_are_matched_by_name(files_run, tmp_path, folder):
    root, new = files_run
    same = predict(root / folder, _csv(tmp_path / "same.csv", new)).labels
    order = [2, 0, 1]
    moved = predict(root / folder, _csv(tmp_path / "moved.csv", new[:, order],
                                        [NAMES[i] for i in order])).labels
    np.testing.assert_array_equal(moved, same)
    assert len(set(same)) == 3


def test_other_names_are_refused(files_run, tmp_path, capsys):
    root, new = files_run
    path = _csv(tmp_path / "other.csv", new, ["heart_rate", "diastolic_bp", "glucose"])
    with pytest.raises(PredictError, match="missing: \\['systolic_bp'\\]"):
        predict(root / "run", path)
    assert cli(["predict", str(root / "run"), str(path), "--out", str(tmp_path / "o.csv")]) == 2
    assert "diastolic_bp" in capsys.readouterr().err
    assert not (tmp_path / "o.csv").exists()


def test_rows_far_outside_the_training_data_are_named(files_run, tmp_path, capsys):
    root, new = files_run
    wild = new.copy()
    wild[:5] *= 1e6
    path = _csv(tmp_path / "wild.csv", wild)
    assert predict(root / "run", path).meta["far_rows"] == 5
    assert predict(root / "run", _csv(tmp_path / "tame.csv", new)).meta["far_rows"] == 0
    assert cli(["predict", str(root / "run"), str(path), "--out", str(tmp_path / "o.csv")]) == 0
    assert "5 of 50 rows lie far outside" in capsys.readouterr().err


def test_a_deployed_run_knows_a_digest_and_refuses_another_order(tmp_path):
    rng = np.random.default_rng(1)
    nodes = [{"data-path": str(_csv(tmp_path / f"n{i}.csv", _table(rng)))} for i in range(3)]
    cfg = {"method": "exact-fcm", "dataset": "local", "num-clients": 3, "plots": False,
           "fcm.n-clusters": 3, "output-dir": str(tmp_path / "run")}
    run_method(InProcessGrid(client_app, 3, cfg, node_configs=nodes), cfg)
    new = _table(np.random.default_rng(2))
    assert len(predict(tmp_path / "run", _csv(tmp_path / "ok.csv", new)).labels) == 50
    with pytest.raises(PredictError, match="another order"):
        predict(tmp_path / "run", _csv(tmp_path / "bad.csv", new[:, [1, 0, 2]],
                                       [NAMES[1], NAMES[0], NAMES[2]]))


def test_simulate_with_dataframes_predicts_a_reordered_dataframe_by_name(tmp_path):
    pd = pytest.importorskip("pandas")
    rng = np.random.default_rng(3)
    frames = [pd.DataFrame(_table(rng), columns=NAMES) for _ in range(3)]
    result = fedclust.simulate("exact-fcm", frames, n_clusters=3, output_dir=tmp_path / "r",
                               run_config={"plots": False})
    new = pd.DataFrame(_table(np.random.default_rng(4)), columns=NAMES)
    same = predict(result.run_dir, new).labels
    moved = predict(result.run_dir, new[["glucose", "heart_rate", "systolic_bp"]]).labels
    np.testing.assert_array_equal(moved, same)
