"""Owner folders on deployed nodes: keyed by node, claimed exclusively, written atomically.

Nodes that share a node ``output-dir`` (a network folder, or several SuperNodes on one machine)
each get ``<output-dir>/<run-id>/<node key>/``; a name already taken is never written into.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from flwr.app import Context, RecordDict

from client_apps.results import node_key
from tests.data.test_practitioner import write_sites
from tests.fake_grid import run_server

CFG = {"dataset": "local", "fcm.n-clusters": 2, "plots": False, "seed": 3}


def nodes(paths: list[Path], shared: Path) -> list[dict]:
    return [{"data-path": str(p), "label-column": "diagnosis", "allow-evaluation": True,
             "output-dir": str(shared)} for p in paths]


def rows_of(path: Path) -> int:
    return len(path.read_text().splitlines()) - 1


def test_three_nodes_sharing_an_output_dir_keep_three_results(tmp_path):
    """The probe's repro: the folder was <output-dir>/<run-id>/ for every node, so three nodes
    left one assignments.csv."""
    paths = write_sites(tmp_path / "sites")
    shared = tmp_path / "node-results"
    run_server({**CFG, "output-dir": str(tmp_path / "run")}, num_nodes=3,
               node_configs=nodes(paths, shared))
    (run,) = shared.iterdir()                     # <run-id>
    assert sorted(p.name for p in run.iterdir()) == ["site0", "site1", "site2"]
    for path in paths:
        folder = run / path.stem
        table = np.loadtxt(folder / "assignments.csv", delimiter=",", skiprows=1)
        assert len(table) == rows_of(path)       # each node's own rows, not another's
        assert (folder / "result.json").is_file() and (folder / "centers.npy").is_file()
        assert not [p for p in folder.iterdir() if p.name.endswith(".part")]


def test_nodes_with_the_same_file_name_get_suffixed_folders_and_a_warning(tmp_path,
                                                                          fedclust_log):
    paths = []
    for i, n in enumerate((40, 50, 60)):
        (p,) = write_sites(tmp_path / f"site{i}", sizes=(n,), seed=i)
        paths.append(p.rename(p.with_name("data.csv")))
    shared = tmp_path / "node-results"
    run_server({**CFG, "output-dir": str(tmp_path / "run")}, num_nodes=3,
               node_configs=nodes(paths, shared))
    (run,) = shared.iterdir()
    assert sorted(p.name for p in run.iterdir()) == ["data", "data-2", "data-3"]
    sizes = sorted(rows_of(run / name / "assignments.csv") for name in ("data", "data-2",
                                                                         "data-3"))
    assert sizes == [40, 50, 60]
    assert sum("already exists" in m for m in fedclust_log) == 2, fedclust_log


def test_a_folder_already_there_is_never_written_into(tmp_path):
    paths = write_sites(tmp_path / "sites")
    shared = tmp_path / "node-results"
    # run id 1 (the in-process grid's): someone's folder with site0's name
    (shared / "1" / "site0").mkdir(parents=True)
    (shared / "1" / "site0" / "assignments.csv").write_text("not fedclust's")
    run_server({**CFG, "output-dir": str(tmp_path / "run")}, num_nodes=3,
               node_configs=nodes(paths, shared))
    assert (shared / "1" / "site0" / "assignments.csv").read_text() == "not fedclust's"
    assert sorted(p.name for p in (shared / "1").iterdir()) == ["site0", "site0-2", "site1",
                                                                "site2"]
    assert rows_of(shared / "1" / "site0-2" / "assignments.csv") == rows_of(paths[0])


@pytest.mark.parametrize("data_path, key", [
    ("/data/site0.csv", "site0"),
    ("/data/Clinic A (2024).tsv", "Clinic_A_2024"),
    ("/data/images/", "images"),
    ("/data/..csv", "node-77"),
    ("", "node-77"),
])
def test_node_key_is_a_safe_name_from_the_data_file_or_the_node_id(data_path, key):
    node = {"data-path": data_path} if data_path else {}
    context = Context(run_id=5, node_id=77, node_config=node, state=RecordDict(), run_config={})
    assert node_key(context) == key
