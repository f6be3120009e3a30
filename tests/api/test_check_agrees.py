"""One validation: ``fedclust check`` runs exactly the run's own checks (keys, data folder,
output folder), so that the same folders and keys get the same verdict from ``check`` and from
the run, both ways; and a ``fedclust sweep -m`` grid is checked in full before its first job,
naming each refused combination, with every job's progress lines in its own ``sweep.log``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fedclust.cli import check_main
from fedclust.errors import BadInputError
from fedclust.examples import write_sites
from server_app.inprocess import run_server

ROOT = Path(__file__).resolve().parents[2]


def _toml(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return json.dumps(value) if isinstance(value, str) else repr(value)


def check_verdict(cfg: dict, n: int) -> bool:
    text = " ".join(f"{k}={_toml(v)}" for k, v in cfg.items())
    return check_main(["--run-config", text, "--num-clients", str(n)]) == 0


def run_verdict(cfg: dict, n: int) -> bool:
    try:
        run_server(cfg, num_nodes=n)
    except BadInputError:
        return False
    return True


def sites(tmp_path: Path) -> dict:
    write_sites(tmp_path / "sites", n_sites=3, seed=0)
    return {"method": "exact-fcm", "dataset": "files", "data-dir": str(tmp_path / "sites"),
            "files.label-column": "diagnosis", "fcm.n-clusters": 3, "plots": False}


def earlier_run(folder: Path) -> None:
    run_server({"method": "exact-fcm", "fcm.max-rounds": 2, "plots": False,
                "output-dir": str(folder)}, num_nodes=2)


CASES = {
    # accepted by the run, refused by check before: a deployed node's results folder in data-dir
    "results folder in data-dir": (
        lambda t, c: (t / "sites" / "fedclust-results" / "site0.csv" / "7").mkdir(parents=True),
        {}, True),
    # passed by check before, refused by the run: a non-empty output-dir
    "foreign output-dir": (lambda t, c: (t / "out").mkdir() or (t / "out" / "notes.txt")
                           .write_text("mine"), {"output-dir": "{t}/out"}, False),
    "earlier run, no overwrite": (lambda t, c: earlier_run(t / "out"),
                                  {"output-dir": "{t}/out"}, False),
    "earlier run, overwrite": (lambda t, c: earlier_run(t / "out"),
                               {"output-dir": "{t}/out", "overwrite": True}, True),
    "earlier run plus a foreign file, overwrite": (
        lambda t, c: earlier_run(t / "out") or (t / "out" / "notes.txt").write_text("mine"),
        {"output-dir": "{t}/out", "overwrite": True}, False),
    "output-dir is a file": (lambda t, c: (t / "out").write_text("x"),
                             {"output-dir": "{t}/out"}, False),
    "output-dir in use": (lambda t, c: (t / "out").mkdir() or (t / "out" / "RUNNING")
                          .write_text("1"), {"output-dir": "{t}/out"}, False),
    "new output-dir": (lambda t, c: None, {"output-dir": "{t}/new/run"}, True),
    "unreadable site file": (lambda t, c: (t / "sites" / "site1.csv").write_text("a,b\n1,x\n"),
                             {}, False),
    "a bad value": (lambda t, c: None, {"fcm.m": 0.5}, False),
}


@pytest.mark.parametrize("case", list(CASES))
def test_check_and_the_run_give_one_verdict(tmp_path, case):
    prepare, extra, expected = CASES[case]
    cfg = sites(tmp_path)
    prepare(tmp_path, cfg)
    cfg.update({k: v.format(t=tmp_path) if isinstance(v, str) else v for k, v in extra.items()})
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    assert check_verdict(cfg, 3) is expected
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before  # wrote none
    assert run_verdict(cfg, 3) is expected


def test_the_readme_check_example_after_the_quick_start(tmp_path, capsys):
    """The quick start's deployment step leaves sites/fedclust-results/ next to the files; the
    check of the same folder still passes, as the run does."""
    cfg = sites(tmp_path)
    (tmp_path / "sites" / "fedclust-results" / "site0.csv" / "1").mkdir(parents=True)
    assert check_main(["--run-config", f'fcm.n-clusters=3 dataset="files" data-dir="'
                       f'{tmp_path / "sites"}" files.label-column="diagnosis"']) == 0
    out = capsys.readouterr().out
    assert "run config OK" in out
    assert '3 site files, one simulated client each: flwr run needs --federation-config ' \
           '"num-supernodes=3"' in out      # the count the run will check
    assert run_verdict(cfg, 3)


# ------------------------------------------------------------------ sweeps

def sweep(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "server_app.sweep", *args],
                          capture_output=True, text=True, timeout=300, cwd=ROOT,
                          env={**os.environ, **(env or {})})


def test_a_grid_with_a_bad_combination_is_refused_before_any_job(tmp_path):
    out = sweep("-m", "app.fcm.m=0.5,1.5", "app.fcm.n-clusters=3,0", "app.plots=false",
                f"hydra.sweep.dir={tmp_path / 'sw'}")
    assert out.returncode == 2, out.stderr[-2000:]
    assert "3 of 4 job(s) of this grid would be refused; no job was run" in out.stderr
    for combo in ("app.fcm.m=0.5 app.fcm.n-clusters=3", "app.fcm.m=0.5 app.fcm.n-clusters=0",
                  "app.fcm.m=1.5 app.fcm.n-clusters=0"):
        assert combo in out.stderr
    assert "app.fcm.m=1.5 app.fcm.n-clusters=3" not in out.stderr
    assert not (tmp_path / "sw").exists() or not list((tmp_path / "sw").rglob("summary.json"))


def test_one_output_dir_for_every_job_is_refused_up_front(tmp_path):
    out = sweep("-m", "app.seed=0,1", f"app.output-dir={tmp_path / 'one'}", "app.plots=false",
                f"hydra.sweep.dir={tmp_path / 'sw'}")
    assert out.returncode == 2 and "is the folder of 2 jobs" in out.stderr, out.stderr[-2000:]


def test_a_failing_job_does_not_stop_the_sweep_and_every_job_logs(tmp_path):
    """A job that fails at run time (here: made to raise) is reported, the next job still
    runs, the sweep exits 1 naming it; each job's sweep.log holds its progress lines."""
    script = ("import sys, server_app.sweep as s\n"
              "run = s.run_job\n"
              "def job(cfg):\n"
              "    if cfg.app.seed == 0:\n"
              "        raise RuntimeError('boom in job 1')\n"
              "    return run(cfg)\n"
              "s.run_job = job\n"
              "sys.argv = ['fedclust sweep', *sys.argv[1:]]\n"
              "s.main()\n")
    out = subprocess.run([sys.executable, "-c", script, "-m", "app.seed=0,1",
                          "app.num-clients=2", "app.plots=false",
                          f"hydra.sweep.dir={tmp_path}"], capture_output=True, text=True,
                         timeout=300, cwd=ROOT)
    assert out.returncode == 1, out.stderr[-2000:]
    assert "job 1/2 failed: RuntimeError: boom in job 1" in out.stderr
    assert f"(traceback in {tmp_path / '0' / 'sweep.log'})" in out.stderr   # where to look
    assert "1 job(s) did not finish" in out.stderr and "job 2/2 done" in out.stdout
    assert json.loads((tmp_path / "1" / "summary.json").read_text())["seed"] == 1
    log0 = (tmp_path / "0" / "sweep.log").read_text()
    log1 = (tmp_path / "1" / "sweep.log").read_text()
    assert "boom in job 1" in log0 and "Traceback" in log0
    assert "exact-fcm round 1/" in log1 and "job 2/2 done" in log1
    assert log1.count("exact-fcm round 1/") == 1          # each line once


def pixel_sites(tmp_path: Path, labels) -> dict:
    """FedCRef site files (pixels 0..255 and a ``digit`` column) and the run config that reads
    them with ``dataset="files"``, kept small (one iteration, tiny autoencoders)."""
    import numpy as np
    import pandas as pd

    (tmp_path / "sites").mkdir()
    rng = np.random.default_rng(0)
    for i in range(2):
        frame = pd.DataFrame(rng.integers(0, 256, (40, 16)),
                             columns=[f"p{j}" for j in range(16)])
        frame["digit"] = [labels[j % len(labels)] for j in range(40)]
        frame.to_csv(tmp_path / "sites" / f"site{i}.csv", index=False)
    return {"method": "fedcref", "dataset": "files", "data-dir": str(tmp_path / "sites"),
            "files.label-column": "digit", "plots": False, "fedcref.max-iterations": 1,
            "fedcref.fl-rounds": 1, "fedcref.ae-epochs": 1, "fedcref.k-estimate-max": 2,
            "output-dir": str(tmp_path / "run")}


@pytest.mark.parametrize(("labels", "expected"), [
    pytest.param([0, 1, 2], True, marks=pytest.mark.slow), (["a", "b"], False)],
    ids=["class numbers", "text labels"])
def test_check_and_a_fedcref_run_read_site_files_alike(tmp_path, labels, expected):
    """FedCRef's nodes read a site file through its pixel door (values in [0, 255], labels
    that are class numbers, the label column not a pixel): ``check`` gives the verdict the
    run gives."""
    pytest.importorskip("torch")
    cfg = pixel_sites(tmp_path, labels)
    assert check_verdict(cfg, 2) is expected
    assert run_verdict(cfg, 2) is expected
    if expected:        # the label column reached evaluation, not the pixels
        summary = json.loads((tmp_path / "run" / "summary.json").read_text())
        assert summary["metrics"]["eval_nodes"] == 2


@pytest.mark.slow
def test_check_and_an_emdcfl_run_take_its_site_files(tmp_path):
    """EMD-CFL's ``dataset="files"``: one labelled ``.npz`` per client (x_train, y_train, x_val,
    y_val, x_test, y_test of 28×28 grey images), read by ``check`` through the door its
    nodes use — a bad file is refused by both, a good folder runs."""
    pytest.importorskip("torch")
    import numpy as np

    rng = np.random.default_rng(0)
    (tmp_path / "sites").mkdir()
    for i in range(2):
        np.savez(tmp_path / "sites" / f"c{i}.npz", **{
            f"{kind}_{split}": (rng.integers(0, 256, (n, 28, 28)) if kind == "x" else
                                rng.integers(0, 10, n))
            for split, n in (("train", 12), ("val", 4), ("test", 4)) for kind in ("x", "y")})
    cfg = {"method": "emdcfl", "dataset": "files", "data-dir": str(tmp_path / "sites"),
           "emdcfl.rounds": 1, "emdcfl.local-epochs": 1, "emdcfl.conv1": 2, "emdcfl.conv2": 2,
           "emdcfl.embed-dim": 4, "emdcfl.workers": 1, "plots": False,
           "output-dir": str(tmp_path / "run")}
    assert check_verdict(cfg, 2) and run_verdict(cfg, 2)
    np.savez(tmp_path / "sites" / "c1.npz", x=np.zeros((3, 28, 28)))     # not a client split
    cfg["output-dir"] = str(tmp_path / "run2")
    assert not check_verdict(cfg, 2) and not run_verdict(cfg, 2)


@pytest.mark.slow
def test_a_sweep_into_a_folder_that_holds_its_job_folders_is_checked_up_front(tmp_path):
    """Run again into the same ``hydra.sweep.dir``, a grid's job folders are not new: the
    grid check gives each the verdict its run would give, before any job — refused when a
    folder holds what fedclust did not write, accepted with overwrite=true over an earlier
    run's results."""
    earlier_run(tmp_path / "sw" / "0")
    (tmp_path / "sw" / "1").mkdir()
    (tmp_path / "sw" / "1" / "notes.txt").write_text("mine")
    args = ("-m", "app.seed=0,1", "app.num-clients=2", "app.plots=false",
            f"hydra.sweep.dir={tmp_path / 'sw'}")
    out = sweep(*args)
    assert out.returncode == 2, out.stderr[-2000:]
    assert "2 of 2 job(s) of this grid would be refused; no job was run" in out.stderr
    assert f"'{tmp_path / 'sw' / '1'}' is not empty" in out.stderr
    (tmp_path / "sw" / "1" / "notes.txt").unlink()
    out = sweep(*args, "app.overwrite=true")
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads((tmp_path / "sw" / "1" / "summary.json").read_text())["seed"] == 1
