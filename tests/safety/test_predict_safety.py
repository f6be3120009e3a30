"""``fedclust predict`` on damaged run folders and dangerous ``--out`` paths: one clear line and
exit status 2, never a traceback; its inputs are never written; nothing is left behind."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from fedclust.predict import main, predict
from tests.data.test_practitioner import FILES_CFG, write_sites
from tests.fake_grid import run_server


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished exact-FCM run over three site files (and the sites)."""
    root = tmp_path_factory.mktemp("predict")
    paths = write_sites(root / "sites")
    run_server({**FILES_CFG, "data-dir": str(root / "sites"), "output-dir": str(root / "run")})
    return root / "run", paths


@pytest.fixture
def run(finished, tmp_path):
    """A private copy of the run folder (to damage) and a copy of site 1's file."""
    src, paths = finished
    copy = tmp_path / "run"
    shutil.copytree(src, copy, ignore=shutil.ignore_patterns("clients"))
    data = tmp_path / "site1.csv"
    shutil.copy(paths[1], data)
    return copy, data


def refused(capsys, argv: list[str], *fragments: str) -> str:
    """``main(argv)`` exits 2 with one line naming ``fragments``, what is allowed and the fix."""
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("fedclust predict: "), err
    assert "Traceback" not in err
    for fragment in fragments:
        assert fragment in err, f"{fragment!r} not in {err}"
    assert "Allowed" in err and "Fix" in err, err
    return err


def listing(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


# ------------------------------------------------------------------ --out

def test_out_that_is_the_data_file_is_refused_and_the_file_kept(run, capsys):
    """The probe's repro: ``predict RUN X --out X`` overwrote X and exited 0."""
    run_dir, data = run
    before = data.read_bytes()
    for extra in ([], ["--overwrite"]):
        refused(capsys, [str(run_dir), str(data), "--label-column", "diagnosis",
                         "--out", str(data), *extra], "one of predict's inputs")
    link = data.parent / "link.csv"
    link.symlink_to(data)
    refused(capsys, [str(run_dir), str(data), "--label-column", "diagnosis", "--out",
                     str(link), "--overwrite"], "one of predict's inputs")
    hard = data.parent / "hard.csv"
    os.link(data, hard)
    refused(capsys, [str(run_dir), str(data), "--label-column", "diagnosis", "--out",
                     str(hard), "--overwrite"], "under another name")
    assert data.read_bytes() == before


@pytest.mark.parametrize("name", ["summary.json", "centers.npy", "predicted.csv"])
def test_out_inside_the_run_folder_is_refused(run, capsys, name):
    run_dir, data = run
    before = {p: p.read_bytes() for p in run_dir.iterdir() if p.is_file()}
    refused(capsys, [str(run_dir), str(data), "--label-column", "diagnosis", "--out",
                     str(run_dir / name), "--overwrite"], "inside the run folder")
    assert {p: p.read_bytes() for p in run_dir.iterdir() if p.is_file()} == before


def test_an_existing_out_needs_overwrite(run, capsys):
    run_dir, data = run
    out = data.parent / "pred.csv"
    out.write_text("the user's")
    refused(capsys, [str(run_dir), str(data), "--label-column", "diagnosis", "--out",
                     str(out)], "already exists", "--overwrite")
    assert out.read_text() == "the user's"
    assert main([str(run_dir), str(data), "--label-column", "diagnosis", "--out", str(out),
                 "--overwrite"]) == 0
    expected = predict(run_dir, data, label_column="diagnosis")
    assert np.array_equal(np.loadtxt(out, delimiter=",", skiprows=1), expected.table)


def test_out_a_folder_is_refused_and_leaves_no_part_file(run, capsys):
    """The probe's repro: IsADirectoryError and a stray .part file."""
    run_dir, data = run
    folder = data.parent / "outputs"
    folder.mkdir()
    refused(capsys, [str(run_dir), str(data), "--label-column", "diagnosis", "--out",
                     str(folder), "--overwrite"], "is a folder")
    assert listing(folder) == [] and not list(data.parent.glob("*.part"))
    below = data.parent / "note.txt"
    below.write_text("x")
    refused(capsys, [str(run_dir), str(data), "--label-column", "diagnosis", "--out",
                     str(below / "pred.csv")], "which is a file")


def test_a_failed_write_leaves_nothing_behind(run, monkeypatch):
    run_dir, data = run

    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device (injected)")

    from fedclust import outputs

    monkeypatch.setattr(outputs, "_flush", full_disk)   # the table's bytes cannot be stored
    out = data.parent / "new" / "deeper" / "pred.csv"
    before = listing(data.parent)
    assert main([str(run_dir), str(data), "--label-column", "diagnosis", "--out",
                 str(out)]) == 2
    assert listing(data.parent) == before


# ------------------------------------------------------------------ damaged run folders

def _summary(run_dir: Path, change) -> None:
    path = run_dir / "summary.json"
    summary = json.loads(path.read_text())
    change(summary)
    path.write_text(json.dumps(summary))


def _m(value):
    return lambda s: s["config"].__setitem__("fcm.m", value)


DAMAGE = {
    # summary.json
    "no config": (lambda d: _summary(d, lambda s: s.pop("config")), "has no 'config'"),
    "config a list": (lambda d: _summary(d, lambda s: s.__setitem__("config", [])),
                      "has no 'config'"),
    "not JSON": (lambda d: (d / "summary.json").write_text('{"method": "exact-fcm", '),
                 "cannot be read as JSON"),
    "a JSON list": (lambda d: (d / "summary.json").write_text("[1, 2]"), "JSON list"),
    "unknown method": (lambda d: _summary(d, lambda s: s.__setitem__("method", "kmeans")),
                       "names method 'kmeans'"),
    # the fuzzifier
    "m = 1.0": (lambda d: _summary(d, _m(1.0)), "m must be > 1"),
    "m = 1e308": (lambda d: _summary(d, _m(1e308)), "above 100"),
    "m = NaN": (lambda d: _summary(d, _m(float("nan"))), "finite"),
    "m text": (lambda d: _summary(d, _m("two")), "is not a number"),
    "m true": (lambda d: _summary(d, _m(True)), "is not a number"),
    "m missing": (lambda d: _summary(d, lambda s: s["config"].pop("fcm.m")), "has no 'fcm.m'"),
    # the arrays
    "1-D centers": (lambda d: np.save(d / "centers.npy", np.zeros(3)), "has shape (3,)"),
    "NaN centers": (lambda d: np.save(d / "centers.npy", np.full((2, 3), np.nan)),
                    "centers.npy holds NaN"),
    "centers not npy": (lambda d: (d / "centers.npy").write_bytes(b"not numpy"),
                        "is not a numpy array file"),
    "centers pickled": (lambda d: np.save(d / "centers.npy", np.array([{"a": 1}], dtype=object),
                                          allow_pickle=True), "is not a numpy array file"),
    "centers text": (lambda d: np.save(d / "centers.npy", np.array([["a", "b"]])),
                     "Allowed: real numbers"),
    "scaling width": (lambda d: np.save(d / "scaling_shift.npy", np.zeros(2)),
                      "has shape (2,) but the centers have 3 features"),
    "scale inf": (lambda d: np.save(d / "scaling_scale.npy", np.array([1.0, np.inf, 1.0])),
                  "scaling_scale.npy holds NaN or infinite"),
    "scale zero": (lambda d: np.save(d / "scaling_scale.npy", np.array([1.0, 0.0, 1.0])),
                   "value(s) <= 0"),
    "shift NaN": (lambda d: np.save(d / "scaling_shift.npy", np.array([np.nan, 0.0, 0.0])),
                  "scaling_shift.npy holds NaN"),
    "scale missing": (lambda d: (d / "scaling_scale.npy").unlink(), "lacks scaling_scale.npy"),
}


@pytest.mark.parametrize("case", list(DAMAGE))
def test_a_damaged_run_folder_is_one_clear_line(run, capsys, case):
    run_dir, data = run
    damage, fragment = DAMAGE[case]
    damage(run_dir)
    out = data.parent / "new" / "pred.csv"
    before = listing(data.parent)
    refused(capsys, [str(run_dir), str(data), "--label-column", "diagnosis", "--out",
                     str(out)], fragment)
    assert listing(data.parent) == before         # no output, no folder, no .part


def test_the_cli_process_prints_no_traceback(run):
    run_dir, data = run
    _summary(run_dir, _m(1.0))
    done = subprocess.run([sys.executable, "-m", "fedclust.cli", "predict", str(run_dir),
                           str(data), "--label-column", "diagnosis", "--out",
                           str(data.parent / "p.csv")], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert "m must be > 1" in done.stderr and not (data.parent / "p.csv").exists()


def test_a_missing_run_folder_is_one_clear_line(tmp_path, capsys):
    (tmp_path / "x.csv").write_text("1,2\n")
    refused(capsys, [str(tmp_path / "nowhere"), str(tmp_path / "x.csv"), "--out",
                     str(tmp_path / "p.csv")], "is not a folder")


# ------------------------------------------------------------------ FedCRef / EMD-CFL folders

def _folder(tmp_path: Path, name: str, content: dict) -> Path:
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / name).write_text(json.dumps(content))
    return folder


def _rows(tmp_path: Path, width: int) -> Path:
    np.save(tmp_path / "rows.npy", np.random.default_rng(0).random((4, width)))
    return tmp_path / "rows.npy"


def _fedcref(tmp_path: Path, arrays: dict | None, raw: bytes = b"") -> Path:
    folder = _folder(tmp_path, "summary.json", {"method": "fedcref", "config": {}})
    if arrays is None:
        (folder / "community_models.npz").write_bytes(raw)
    else:
        np.savez(folder / "community_models.npz", **arrays)
    return folder


W = {"W0": np.zeros((2, 6, 3), np.float32), "b0": np.zeros((2, 1, 3), np.float32),
     "W1": np.zeros((2, 3, 6), np.float32), "b1": np.zeros((2, 1, 6), np.float32)}

FEDCREF = {
    "not npz": (None, b"garbage", "is not a readable .npz file"),
    "no labels": (W, b"", "holds the arrays"),
    "1-D weights": ({**W, "W0": np.zeros(6, np.float32), "labels": np.arange(2)}, b"",
                    "inconsistent shapes"),
    "NaN weights": ({**W, "W1": np.full((2, 3, 6), np.nan, np.float32),
                     "labels": np.arange(2)}, b"", "not finite"),
    "labels length": ({**W, "labels": np.arange(3)}, b"", "labels of shape (3,)"),
}


@pytest.mark.parametrize("case", list(FEDCREF))
def test_damaged_fedcref_models_are_one_clear_line(tmp_path, capsys, case):
    arrays, raw, fragment = FEDCREF[case]
    folder = _fedcref(tmp_path, arrays, raw)
    refused(capsys, [str(folder), str(_rows(tmp_path, 6)), "--out", str(tmp_path / "p.csv")],
            fragment)
    assert not (tmp_path / "p.csv").exists()


def test_intact_synthetic_fedcref_models_predict(tmp_path):
    folder = _fedcref(tmp_path, {**W, "labels": np.array([4, 7])})
    assert set(predict(folder, _rows(tmp_path, 6)).labels) <= {4, 7}


SPEC = {"in_channels": 1, "size": 8, "c1": 4, "c2": 4, "embed_dim": 8, "num_classes": 10}
EMDCFL = {
    "owner without cluster": ("predict.json", {"method": "emdcfl", "scope": "client",
                                               "config": {}, "spec": SPEC}, None,
                              "names cluster None"),
    "owner model outside": ("predict.json", {"method": "emdcfl", "scope": "client",
                                             "config": {}, "spec": SPEC, "cluster": 0,
                                             "model": "../../etc/passwd"}, None,
                            "a file name inside the folder"),
    "owner bad spec": ("predict.json", {"method": "emdcfl", "scope": "client", "config": {},
                                        "spec": {"size": "big"}, "cluster": 0}, None,
                       "damaged model shape"),
    "owner model garbage": ("predict.json", {"method": "emdcfl", "scope": "client",
                                             "config": {}, "spec": SPEC, "cluster": 0},
                            ("model.pt", b"garbage"), "is not an EMD-CFL model"),
    "index not JSON": ("summary.json", {"method": "emdcfl", "config": {}},
                       ("models/clusters.json", b"{"), "is damaged"),
    "index file outside": ("summary.json", {"method": "emdcfl", "config": {}},
                           ("models/clusters.json", json.dumps(
                               {"spec": SPEC, "clusters": {"0": {"file": "../x.pt",
                                                                 "clients": [1]}}}).encode()),
                           "a file name inside the folder"),
}


@pytest.mark.parametrize("case", list(EMDCFL))
def test_damaged_emdcfl_folders_are_one_clear_line(tmp_path, capsys, case):
    name, content, extra, fragment = EMDCFL[case]
    folder = _folder(tmp_path, name, content)
    if extra:
        (folder / extra[0]).parent.mkdir(parents=True, exist_ok=True)
        (folder / extra[0]).write_bytes(extra[1])
    refused(capsys, [str(folder), str(_rows(tmp_path, 64)), "--out", str(tmp_path / "p.csv")],
            fragment)
    assert not (tmp_path / "p.csv").exists()
