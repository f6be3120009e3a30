"""Data that cannot hold the asked number of clusters is refused before the run.

Probe: all-constant data on every site "converged" with an objective of about 1e-153 and no
word. Where the rows are at hand before the run (``simulate``'s arrays, the site files of
``dataset="files"``, a built-in dataset) fewer distinct rows than clusters are refused with
what was found; on deployed nodes, whose rows the server never sees, the federated bounds
having no width (every row the same point) stops the run after the scaling phase.
"""

from __future__ import annotations

import numpy as np
import pytest

import fedclust
from client_apps.app import app as client_app
from fedclust.cli import main as cli
from fedclust.config import ConfigError
from server_app.app import check_run_config, run_method
from server_app.inprocess import InProcessGrid


def _constant(n: int = 3) -> list[np.ndarray]:
    return [np.full((20, 3), 5.0) for _ in range(n)]


@pytest.mark.parametrize("method", ["exact-fcm", "fedfcm"])
def test_simulate_refuses_all_constant_data(tmp_path, method):
    with pytest.raises(ConfigError, match="every row is the same point") as err:
        fedclust.simulate(method, _constant(), output_dir=tmp_path / "o",
                          run_config={"plots": False})
    assert "60 row(s)" in str(err.value) and "Fix:" in str(err.value)
    assert not (tmp_path / "o").exists()


def test_simulate_refuses_fewer_distinct_rows_than_clusters(tmp_path):
    two = [np.repeat([[0.0, 0.0], [1.0, 1.0]], 10, axis=0) for _ in range(3)]
    with pytest.raises(ConfigError, match="only 2 distinct rows"):
        fedclust.simulate("exact-fcm", two, n_clusters=3, output_dir=tmp_path / "o",
                          run_config={"plots": False})
    result = fedclust.simulate("exact-fcm", two, n_clusters=2, output_dir=tmp_path / "ok",
                               run_config={"plots": False})
    assert result.summary["metrics"]["objective"] < 1e-6     # two clusters, two points


def test_site_files_and_fedclust_check_refuse_constant_data(tmp_path, capsys):
    sites = tmp_path / "sites"
    sites.mkdir()
    for i, x in enumerate(_constant()):
        np.savetxt(sites / f"s{i}.csv", x, delimiter=",", header="a,b,c", comments="")
    cfg = {"dataset": "files", "data-dir": str(sites), "fcm.n-clusters": 3}
    with pytest.raises(ConfigError, match="every row is the same point"):
        check_run_config(cfg)
    assert cli(["check", "--run-config", f'dataset="files" data-dir="{sites}" '
                                         f'fcm.n-clusters=3']) == 2
    assert "every row is the same point" in capsys.readouterr().err


@pytest.mark.parametrize("method", ["exact-fcm", "fedfcm"])
def test_deployed_nodes_with_one_point_stop_after_the_scaling_phase(tmp_path, method):
    nodes = []
    for i, x in enumerate(_constant()):
        np.savez(tmp_path / f"c{i}.npz", x=x)
        nodes.append({"data-path": str(tmp_path / f"c{i}.npz")})
    cfg = {"method": method, "dataset": "local", "num-clients": 3, "plots": False,
           "output-dir": str(tmp_path / "run")}
    with pytest.raises(ConfigError, match="same point"):
        run_method(InProcessGrid(client_app, 3, cfg, node_configs=nodes), cfg)
    assert not (tmp_path / "run" / "summary.json").exists()


def test_fedcref_refuses_a_client_with_fewer_distinct_rows_than_it_fits(tmp_path):
    """Probe: constant rows on FedCRef's nodes ended in a bare scikit-learn ValueError on every
    node, reported as "no client answered the local phase"."""
    rng = np.random.default_rng(0)
    clients = [rng.normal(size=(40, 4)), np.full((40, 4), 2.0), rng.normal(size=(40, 4))]
    small = dict(max_iterations=1, fl_rounds=1, ae_epochs=1, samples_per_cluster=10)
    with pytest.raises(ConfigError, match="client 1 .* 1 distinct"):
        fedclust.simulate("fedcref", clients, output_dir=tmp_path / "o",
                          run_config={"plots": False}, **small)
    from fedclust.data.local import LocalDataError
    from fedclust.fedcref.initial import initial_clustering

    with pytest.raises(LocalDataError, match="1 distinct point"):     # a deployed node
        initial_clustering("kmeans", np.full((40, 4), 2.0), range(2, 5), random_state=0)
