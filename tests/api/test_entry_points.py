"""Every entry point turns a bad value into a fedclust message with a non-zero exit.

Probe: ``fedclust deploy up --data a.csv b.csv fcm.m=abc`` (and with the override first) ended in
a raw ``TOMLDecodeError``; an unwritable ``output-dir`` in a ``FileNotFoundError`` traceback from
``simulate``, the sweep and ``flwr run .``; the quick start's ``python -m fedclust.examples
sites DIR`` in one too, and it replaced a ``site0.csv`` already in DIR. Each now says what was
wrong, what is allowed and the fix, on one line, and exits with status 2 — before any process
starts or any file is written.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import fedclust
from fedclust.cli import main as cli
from fedclust.examples import main as examples
from fedclust.results import OutputDirError
from server_app.inprocess import run_server

ROOT = Path(__file__).resolve().parents[2]
UNWRITABLE = "/proc/fedclust-cannot-be-here"     # no user may create a folder in /proc


def _one_clear_line(err: str, *words: str) -> None:
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert err.startswith(("fedclust ", "python -m fedclust")), err
    for word in words:
        assert word in err, (word, err)


@pytest.fixture
def two_sites(tmp_path, monkeypatch):
    """Two site files ``a.csv`` and ``b.csv`` in the working folder (a temporary one)."""
    for name in ("a.csv", "b.csv"):
        np.savetxt(tmp_path / name, np.random.default_rng(0).normal(size=(20, 2)),
                   delimiter=",")
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize("argv", [
    ["up", "fcm.m=abc", "--data", "a.csv", "b.csv"],
    ["up", "fcm.n-clusters=", "--data", "a.csv", "b.csv"],
    ["up", "fcm.max-rounds=2", "--data", "missing0.csv", "missing1.csv"],
])
def test_deploy_up_refuses_bad_values_before_starting_anything(two_sites, capsys, argv):
    assert cli(["deploy", *argv]) == 2
    err = capsys.readouterr().err
    _one_clear_line(err, "fedclust deploy up:", "Fix:")


def test_deploy_certs_into_a_folder_that_cannot_be_made(capsys):
    assert cli(["deploy", "certs", f"{UNWRITABLE}/certs"]) == 2
    _one_clear_line(capsys.readouterr().err, "fedclust deploy certs:", "Fix:")


def test_an_unwritable_output_dir_is_a_fedclust_error_everywhere(tmp_path):
    rows = [np.random.default_rng(i).normal(size=(20, 2)) for i in range(2)]
    with pytest.raises(OutputDirError, match="cannot be created or written"):
        fedclust.simulate("exact-fcm", rows, n_clusters=2, output_dir=UNWRITABLE)
    with pytest.raises(OutputDirError, match="Fix:"):      # the ServerApp's path
        run_server({"method": "exact-fcm", "plots": False, "output-dir": UNWRITABLE},
                   num_nodes=2)


def test_the_sweep_refuses_an_unwritable_output_dir():
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    out = subprocess.run([sys.executable, "-m", "fedclust.cli", "sweep",
                          f"app.output-dir={UNWRITABLE}", "app.plots=false"],
                         capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
    assert out.returncode == 2, out.stderr[-2000:]
    assert "Traceback" not in out.stderr and "cannot be created or written" in out.stderr


def test_the_example_sites_never_replace_a_file_and_say_why(tmp_path, capsys):
    mine = tmp_path / "site0.csv"
    mine.write_text("my,own\n1,2\n")
    assert examples(["sites", str(tmp_path)]) == 2
    assert mine.read_text() == "my,own\n1,2\n"
    _one_clear_line(capsys.readouterr().err, "site0.csv", "Fix:")
    assert examples(["sites", f"{UNWRITABLE}/sites"]) == 2
    _one_clear_line(capsys.readouterr().err, "cannot write", "Fix:")
    assert examples(["sites", str(tmp_path / "new"), "--sites", "0"]) == 2
    assert examples(["sites", str(tmp_path / "new")]) == 0
    assert examples(["sites", str(tmp_path / "new")]) == 0     # the same files again: fine


@pytest.mark.parametrize(("argv", "words"), [
    (["app.fcm.nclusters=3"], ["app.fcm.n-clusters=3"]),
    (["method=kmeans"], ["exact-fcm"]),
    (["dataset=files"], ["app.dataset=files"]),
    (["fcm.m=2"], ["app.fcm.m=2"]),
])
def test_the_sweep_judges_its_overrides_before_hydra(argv, words):
    """Hydra said "Key 'nclusters' is not in struct" and suggested appending it with '+'."""
    from fedclust.config import ConfigError
    from server_app.sweep import check_overrides

    with pytest.raises(ConfigError) as err:
        check_overrides(argv)
    assert all(w in str(err.value) for w in words) and "Fix:" in str(err.value)
    check_overrides(["method=fedfcm", "dataset=iris", "app.fcm.m=1.5", "engine=flower",
                     "-m", "app.seed=0,1", "hydra.run.dir=x"])


def test_sigterm_ends_a_sweep_like_ctrl_c(tmp_path):
    """Killed with SIGTERM, a sweep died with its folder still marked RUNNING."""
    import signal
    import time

    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    run = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "fedclust.cli", "sweep", "app.plots=false",
                             f"app.output-dir={run}", "app.fcm.max-rounds=100000",
                             "app.fcm.epsilon=0", "app.blobs.n-samples=3000"],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    deadline = time.monotonic() + 240
    while not (run / "history.jsonl").exists() and time.monotonic() < deadline \
            and proc.poll() is None:
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode != 0 and "Traceback" not in err, err[-1000:]
    assert (run / "interrupted.json").exists() and not (run / "RUNNING").exists()


def test_deploy_up_refuses_more_before_starting(two_sites, capsys):
    for argv, word in [(["up", "fcm.m=1.5", "fcm.m=2", "--data", "a.csv", "b.csv"],
                        "more than once"),
                       (["up", 'method="emdcfl"', "--data", "a.csv", "b.csv"], ".npz")]:
        assert cli(["deploy", *argv]) == 2
        err = capsys.readouterr().err
        _one_clear_line(err, word, "Fix")
    with pytest.raises(SystemExit):
        cli(["deploy", "certs", "c", "--nodes", "-1"])
    with pytest.raises(SystemExit):
        cli(["deploy", "fleet-gateway", "--listen", "127.0.0.1:99999", "--superlink",
             "127.0.0.1:1"])


@pytest.mark.parametrize("where", ["start", "finish"])
def test_an_interrupt_anywhere_after_the_claim_releases_the_folder(tmp_path, monkeypatch, where):
    """A signal between claiming the folder and the run's own try (its first log line), or
    while the summary was being written, left the folder marked RUNNING: the next run into it
    was refused as "in use"."""
    import fedclust.results as results
    import strategies.run as run

    if where == "start":
        info = run.LOG.info

        def stop_at_start(msg, *args, **kwargs):
            if str(msg).startswith("method="):
                raise KeyboardInterrupt("stopped")
            return info(msg, *args, **kwargs)
        monkeypatch.setattr(run.LOG, "info", stop_at_start)
    else:
        safe = results.trackers.safe

        def stop_at_finish(tracker, step, *args, **kwargs):
            if step == "final":
                raise KeyboardInterrupt("stopped")
            return safe(tracker, step, *args, **kwargs)
        monkeypatch.setattr(results.trackers, "safe", stop_at_finish)
    with pytest.raises(KeyboardInterrupt):
        run_server({"method": "exact-fcm", "plots": False, "output-dir": str(tmp_path / "r"),
                    "fcm.max-rounds": 2}, num_nodes=2)
    assert not (tmp_path / "r" / "RUNNING").exists()
    assert (tmp_path / "r" / "interrupted.json").exists()
