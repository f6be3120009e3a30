"""``fedclust check`` and the run agree on the site files: they run the same checks
(column names and order, fedclust's own results folder).

Probe: ``check`` passed a data folder whose site file had its columns in another order, and the
run then excluded that site; after the quick start's step 3 (a deployment that keeps each
site's results in ``fedclust-results/`` next to its file), step 2 was refused with a wrong fix
("point data-path at the image folder").
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from fedclust.cli import main as cli
from fedclust.data.sites import SiteFilesError
from server_app.app import check_run_config
from server_app.inprocess import run_server


def _sites(root: Path, reorder: int | None = None, headerless: int | None = None) -> Path:
    root.mkdir()
    rng = np.random.default_rng(0)
    for i in range(3):
        x = rng.normal(size=(30, 3)) + 4 * (np.arange(30) % 2)[:, None]
        names = "heart_rate,systolic_bp,glucose"
        if i == reorder:
            x, names = x[:, [1, 0, 2]], "systolic_bp,heart_rate,glucose"
        np.savetxt(root / f"site{i}.csv", x, delimiter=",",
                   header="" if i == headerless else names, comments="")
    return root


@pytest.mark.parametrize("fault", ["reorder", "headerless"])
def test_check_refuses_the_site_file_the_run_would_exclude(tmp_path, capsys, fault):
    sites = _sites(tmp_path / "sites", **{fault: 2})
    text = f'dataset="files" data-dir="{sites}" fcm.n-clusters=2'
    assert cli(["check", "--run-config", text]) == 2
    err = capsys.readouterr().err
    assert "site2.csv" in err and "Fix:" in err, err
    cfg = {"method": "exact-fcm", "dataset": "files", "data-dir": str(sites), "plots": False,
           "fcm.n-clusters": 2, "output-dir": str(tmp_path / "run")}
    with pytest.raises(SiteFilesError, match="site2.csv"):      # the run: the same refusal
        run_server(cfg)
    assert not (tmp_path / "run").exists()


def test_a_deployed_sites_results_folder_is_no_site(tmp_path, capsys):
    sites = _sites(tmp_path / "sites")
    kept = sites / "fedclust-results" / "site0.csv" / "4242"
    kept.mkdir(parents=True)
    (kept / "assignments.csv").write_text("row,label\n0,1\n")
    text = f'dataset="files" data-dir="{sites}" fcm.n-clusters=2'
    assert cli(["check", "--run-config", text]) == 0, capsys.readouterr().err
    cfg = check_run_config({"dataset": "files", "data-dir": str(sites), "fcm.n-clusters": 2})
    assert cfg["dataset"] == "files"
    summary, _ = run_server({**cfg, "plots": False, "output-dir": str(tmp_path / "run")})
    assert summary["metrics"]["n_clients"] == 3


def test_check_refuses_what_the_run_would_refuse_at_its_start(tmp_path, capsys):
    """An output-dir the run cannot create, and a SecAgg+ fraction that samples one client per
    round, were "run config OK" for check and refused by the run."""
    assert cli(["check", "--no-data", "--run-config", 'output-dir="/proc/fedclust-x"']) == 0
    assert cli(["check", "--run-config", 'output-dir="/proc/fedclust-x"']) == 2
    assert "cannot be created or written" in capsys.readouterr().err
    text = "fcm.secure-aggregation=true fcm.fraction=0.1 num-clients=3"
    assert cli(["check", "--run-config", text]) == 2
    assert "fcm.fraction" in capsys.readouterr().err
    assert cli(["check", "--run-config", 'dataset="files" data-dir="nowhere"']) == 2
    capsys.readouterr()
