"""No lost or mixed results: a folder per run, refused reuse, atomic summary, marked
interruptions."""

from __future__ import annotations

import builtins
import io
import json
import os
import shutil
import threading
from pathlib import Path

import numpy as np
import pytest

from fedclust import outputs
from fedclust.outputs import MANIFEST, read_manifest
from fedclust.results import OutputDirError, RunRecorder, claim_folder
from server_app.app import output_dir
from tests.fake_grid import run_server

CFG = {"plots": False, "fcm.max-rounds": 3}


def test_default_folders_are_unique_within_one_second():
    cfg = {"output-dir": "", "dataset": "blobs", "seed": 0, "method": "exact-fcm"}
    assert len({output_dir(cfg) for _ in range(50)}) == 50


def test_a_finished_runs_folder_is_refused_then_cleared_with_overwrite(tmp_path):
    out = tmp_path / "run"
    run_server({**CFG, "output-dir": str(out), "fcm.n-clusters": 5, "plots": True})
    assert (out / "shift.png").is_file()                 # a file only the earlier run wrote
    with pytest.raises(OutputDirError, match="is not empty.*or pass overwrite=true"):
        run_server({**CFG, "output-dir": str(out)})
    assert json.loads((out / "summary.json").read_text())["config"]["fcm.n-clusters"] == 5
    summary, _ = run_server({**CFG, "output-dir": str(out), "overwrite": True})
    assert summary["config"]["fcm.n-clusters"] == 4
    assert not (out / "shift.png").exists() and not (out / "RUNNING").exists()


def test_overwrite_never_clears_a_folder_that_is_not_a_fedclust_run(tmp_path):
    (tmp_path / "thesis.tex").write_text("precious")
    with pytest.raises(OutputDirError, match=f"holds no {MANIFEST}.*nothing was removed"):
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


# ------------------------------------------------------------ overwrite: only what fedclust wrote

def tree(folder: Path) -> dict[str, str]:
    """Every entry below ``folder`` (relative name -> content, '<dir>' or '-> target'),
    without following a symbolic link."""
    found = {}
    for top, dirs, files in os.walk(folder):
        for name in dirs + files:
            path = Path(top) / name
            rel = str(path.relative_to(folder))
            found[rel] = (f"-> {os.readlink(path)}" if path.is_symlink()
                          else "<dir>" if path.is_dir() else path.read_bytes().hex()[:64])
    return found


def test_the_probes_thesis_folder_loses_nothing_with_overwrite(tmp_path):
    """The probe's repro: an empty history.jsonl made the folder count as fedclust's, and
    overwrite=true then removed the thesis and the site file."""
    out = tmp_path / "mine"
    (out / "thesis").mkdir(parents=True)
    (out / "thesis" / "ch1.tex").write_text("chapter one")
    (out / "site0.csv").write_text("a,b\n1,2\n")
    (out / "history.jsonl").write_text("")
    before = tree(out)
    with pytest.raises(OutputDirError, match=f"holds no {MANIFEST}.*nothing was removed"):
        run_server({**CFG, "output-dir": str(out), "overwrite": True})
    assert tree(out) == before


def _earlier_run(out: Path, **extra) -> None:
    run_server({**CFG, "output-dir": str(out), "plots": True, **extra}, num_nodes=3)
    assert (out / "clients" / "0" / "assignments.csv").is_file()


@pytest.mark.parametrize("rel, named", [
    ("thesis/ch1.tex", "thesis"),                          # a folder of the user's
    ("site0.csv", "site0.csv"),                            # a file beside the results
    ("clients/0/notes.txt", "clients/0/notes.txt"),        # inside a folder fedclust made
])
def test_overwrite_refuses_an_entry_fedclust_did_not_write_and_names_it(tmp_path, rel, named):
    out = tmp_path / "run"
    _earlier_run(out)
    (out / rel).parent.mkdir(parents=True, exist_ok=True)
    (out / rel).write_text("the user's")
    before = tree(out)
    with pytest.raises(OutputDirError) as info:
        run_server({**CFG, "output-dir": str(out), "overwrite": True}, num_nodes=3)
    text = str(info.value)
    assert f"holds {named!r}" in text and "did not write" in text and "nothing was removed" in text
    assert "Allowed" in text and f"Fix: move {named!r} out of the folder" in text
    assert str(out / named) not in text          # the entry by its relative name
    assert tree(out) == before                   # nothing removed, nothing written


@pytest.mark.parametrize("entry", ["centers.npy", "clients"])
def test_overwrite_never_follows_a_symbolic_link_out_of_the_folder(tmp_path, entry):
    out, elsewhere = tmp_path / "run", tmp_path / "elsewhere"
    _earlier_run(out)
    shutil.move(str(out / entry), str(elsewhere))     # the user's own copy, outside
    (out / entry).symlink_to(elsewhere, target_is_directory=elsewhere.is_dir())
    outside, before = tree(tmp_path / "elsewhere") if elsewhere.is_dir() else None, tree(out)
    content = None if elsewhere.is_dir() else elsewhere.read_bytes()
    with pytest.raises(OutputDirError, match=f"holds '{entry}', now a symbolic link"):
        run_server({**CFG, "output-dir": str(out), "overwrite": True}, num_nodes=3)
    assert tree(out) == before
    if content is None:
        assert tree(elsewhere) == outside and (elsewhere / "0" / "assignments.csv").is_file()
    else:
        assert elsewhere.read_bytes() == content


def test_overwrite_removes_exactly_what_the_earlier_run_wrote(tmp_path):
    out = tmp_path / "run"
    _earlier_run(out, **{"fcm.n-clusters": 5})
    (out / ".git").mkdir()
    (out / ".git" / "config").write_text("hidden, the user's")
    (out / "job.log").write_text("a Hydra job log")
    (out / "clients" / ".DS_Store").write_text("hidden, inside a results folder")
    (out / ".summary.json.0123456789ab.part").write_text("a write that never finished")
    summary, _ = run_server({**CFG, "output-dir": str(out), "overwrite": True}, num_nodes=2)
    assert summary["config"]["fcm.n-clusters"] == 4
    assert (out / ".git" / "config").read_text() == "hidden, the user's"
    assert (out / "job.log").read_text() == "a Hydra job log"
    assert (out / "clients" / ".DS_Store").exists()
    assert not (out / "shift.png").exists()              # plots only in the earlier run
    assert not (out / "clients" / "2").exists()          # 3 clients then, 2 now
    assert not (out / ".summary.json.0123456789ab.part").exists()
    # and again: the folder is still a clean fedclust folder (clients/ kept its hidden entry)
    run_server({**CFG, "output-dir": str(out), "overwrite": True}, num_nodes=2)


@pytest.mark.parametrize("method, extra", [
    ("exact-fcm", {}),
    ("exact-fcm", {"fcm.secure-aggregation": True}),
    ("fedfcm", {"fedfcm.k-max": 3}),
    ("fedcref", {"fedcref.max-iterations": 1, "fedcref.fl-rounds": 1, "fedcref.ae-epochs": 1,
                 "fedcref.ae-hidden": "16,8", "fedcref.samples-per-cluster": 10}),
    ("emdcfl", {"emdcfl.samples": 20, "emdcfl.test-samples": 10, "emdcfl.rounds": 1,
                "emdcfl.conv1": 4, "emdcfl.conv2": 4, "emdcfl.embed-dim": 8,
                "emdcfl.max-samples": 16, "emdcfl.workers": 1}),
])
def test_every_entry_a_run_writes_is_in_its_manifest(tmp_path, method, extra):
    out = tmp_path / "run"
    cfg = {"method": method, "plots": True, "output-dir": str(out), **extra}
    run_server(cfg, num_nodes=3)
    entries = read_manifest(out)
    written = {rel: ("dir" if v == "<dir>" else "file") for rel, v in tree(out).items()
               if not Path(rel).name.startswith(".")}
    assert written and {rel: entries.get(rel) for rel in written} == written
    assert any(rel.startswith("clients/") for rel in written)        # the owners' folders
    run_server({**cfg, "overwrite": True}, num_nodes=3)              # so overwrite can clear it


def test_a_damaged_manifest_refuses_overwrite(tmp_path):
    out = tmp_path / "run"
    _earlier_run(out)
    (out / MANIFEST).write_text('{"entries": {"../outside": "file"}}')
    before = tree(out)
    with pytest.raises(OutputDirError, match="is damaged"):
        run_server({**CFG, "output-dir": str(out), "overwrite": True}, num_nodes=3)
    assert tree(out) == before


def test_simulate_records_the_owners_folders_it_moves_in(tmp_path):
    from fedclust.api import simulate

    rng = np.random.default_rng(0)
    clients = [rng.normal(size=(30, 2)) + 5 * (i % 2) for i in range(3)]
    out = tmp_path / "run"
    first = simulate("exact-fcm", clients, output_dir=out, run_config={"plots": False})
    assert (first.run_dir / "clients" / "2" / "assignments.csv").is_file()
    simulate("exact-fcm", clients[:2], seed=1, output_dir=out,
             run_config={"plots": False, "overwrite": True})
    assert not (out / "clients" / "2").exists() and (out / "clients" / "1").is_dir()


# ------------------------------------------------------------------ summary.json: never half

class _HalfThenFail:
    """A file object whose first write stores half the bytes, then fails (a full disk or a
    crash in the middle of writing)."""

    def __init__(self, fh):
        self.fh = fh

    def write(self, data):
        self.fh.write(data[: max(1, len(data) // 2)])
        self.fh.flush()
        raise OSError(28, "No space left on device (injected)")

    def __getattr__(self, name):
        return getattr(self.fh, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.fh.close()


def _fail_writes_of(monkeypatch, fragment: str) -> None:
    """Every file opened for writing whose name holds ``fragment`` fails half-way."""
    real = io.open

    def opener(file, mode="r", *args, **kwargs):
        fh = real(file, mode, *args, **kwargs)
        if fragment in str(file) and any(c in mode for c in "wxa+"):
            return _HalfThenFail(fh)
        return fh

    monkeypatch.setattr(io, "open", opener)
    monkeypatch.setattr(builtins, "open", opener)


def test_summary_json_is_never_half_written(tmp_path, monkeypatch):
    rec = RunRecorder(tmp_path / "run", "exact-fcm", "blobs", 0, 2, {"k": "v" * 5000})
    with monkeypatch.context() as patch:
        _fail_writes_of(patch, "summary.json")
        with pytest.raises(OSError, match="injected"):
            rec.finish({"objective": 1.0})
    assert not (tmp_path / "run" / "summary.json").exists()
    assert not [p for p in (tmp_path / "run").iterdir() if "summary.json" in p.name]
    rec.finish({"objective": 1.0})
    complete = (tmp_path / "run" / "summary.json").read_text()
    with monkeypatch.context() as patch:     # a later rewrite that fails keeps the old file
        _fail_writes_of(patch, "summary.json")
        with pytest.raises(OSError, match="injected"):
            outputs.write_json(tmp_path / "run" / "summary.json", {"x": "y" * 10000})
    assert (tmp_path / "run" / "summary.json").read_text() == complete
    assert json.loads(complete)["metrics"] == {"objective": 1.0}


def test_an_unserialisable_summary_leaves_no_file(tmp_path):
    rec = RunRecorder(tmp_path / "run", "exact-fcm", "blobs", 0, 2, {})
    with pytest.raises(TypeError):
        rec.finish({"bad": object()})
    assert not [p for p in (tmp_path / "run").iterdir() if "summary.json" in p.name]


def test_a_linked_file_replaces_an_earlier_one_whole(tmp_path):
    """outputs.link_file: a new name, or an existing file replaced through a temporary link and
    a rename (no ``.part`` left); a folder of that name is refused."""
    src = tmp_path / "src.csv"
    src.write_text("a\n")
    new, old = tmp_path / "new.csv", tmp_path / "old.csv"
    old.write_text("earlier\n")
    for path in (new, old):
        outputs.link_file(src, path)
        assert path.read_text() == "a\n" and path.stat().st_ino == src.stat().st_ino
    assert not list(tmp_path.glob(".*.part"))
    (tmp_path / "dir.csv").mkdir()
    with pytest.raises(OutputDirError, match="is a folder"):
        outputs.link_file(src, tmp_path / "dir.csv")
