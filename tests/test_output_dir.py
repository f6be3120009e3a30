"""No lost or mixed results: a folder per run, refused reuse, atomic summary, marked
interruptions."""

from __future__ import annotations

import json
import threading

import pytest

from fedclust.results import OutputDirError, RunRecorder, claim_folder
from server_app.app import output_dir
from tests.fake_grid import run_server

CFG = {"plots": False, "fcm.max-rounds": 3}


def test_default_folders_are_unique_within_one_second():
    cfg = {"output-dir": "", "dataset": "blobs", "seed": 0, "method": "exact-fcm"}
    assert len({output_dir(cfg) for _ in range(50)}) == 50


def test_a_finished_runs_folder_is_refused_then_cleared_with_overwrite(tmp_path):
    out = tmp_path / "run"
    run_server({**CFG, "output-dir": str(out), "fcm.n-clusters": 5})
    (out / "centers_k5.npy").write_bytes(b"stale")       # a file an earlier run left
    with pytest.raises(OutputDirError, match="is not empty.*or pass overwrite=true"):
        run_server({**CFG, "output-dir": str(out)})
    assert json.loads((out / "summary.json").read_text())["config"]["fcm.n-clusters"] == 5
    summary, _ = run_server({**CFG, "output-dir": str(out), "overwrite": True})
    assert summary["config"]["fcm.n-clusters"] == 4
    assert not (out / "centers_k5.npy").exists() and not (out / "RUNNING").exists()


def test_overwrite_never_clears_a_folder_that_is_not_a_fedclust_run(tmp_path):
    (tmp_path / "thesis.tex").write_text("precious")
    with pytest.raises(OutputDirError, match="holds no summary.json"):
        run_server({**CFG, "output-dir": str(tmp_path), "overwrite": True})
    assert (tmp_path / "thesis.tex").read_text() == "precious"


def test_hydra_job_folders_count_as_empty(tmp_path):
    (tmp_path / ".hydra").mkdir()
    (tmp_path / "sweep.log").write_text("")
    claim_folder(tmp_path)
    assert (tmp_path / "RUNNING").exists()


def test_two_runs_into_one_folder_at_once_one_is_refused(tmp_path):
    barrier, errors = threading.Barrier(2), []

    def claim():
        barrier.wait()
        try:
            RunRecorder(tmp_path / "same", "exact-fcm", "blobs", 0, 2, {})
        except OutputDirError as exc:
            errors.append(str(exc))

    threads = [threading.Thread(target=claim) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(errors) == 1 and ("in use by another run" in errors[0]
                                 or "is not empty" in errors[0])


def test_a_failed_run_marks_its_folder_and_writes_no_summary(tmp_path):
    out = tmp_path / "run"
    with pytest.raises(RuntimeError):
        run_server({**CFG, "output-dir": str(out)}, num_nodes=3,
                   drop=lambda nid, msg: msg.metadata.message_type == "query.fcm_stats")
    marker = json.loads((out / "interrupted.json").read_text())
    assert marker["error"] == "RuntimeError" and "scaling" in marker["message"]
    assert not (out / "summary.json").exists() and not (out / "RUNNING").exists()
    assert not list(out.glob("*.part"))
