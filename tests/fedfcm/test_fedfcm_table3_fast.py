"""bench/fedfcm_table3_fast.py computes exactly what the Flower FedFCM server loop computes."""

import importlib.util
import sys

import pytest

from fedclust.config import validate
from fedclust.data.tabular import load_dataset
from tests.conftest import ROOT
from tests.fake_grid import run_server


def _fast():
    name = "fedfcm_table3_fast"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROOT / "bench" / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


# Overlapping blobs: several rounds, and K that converge at different rounds.
SMALL = {"method": "fedfcm", "dataset": "blobs", "blobs.n-samples": 240, "blobs.centers": 3,
         "blobs.n-features": 3, "blobs.std": 2.0, "num-clients": 3, "scaling": "minmax",
         "fedfcm.k-min": 2, "fedfcm.k-max": 5, "fedfcm.local-index": False, "plots": False,
         "seed": 3}


@pytest.mark.parametrize("averaging", ["kmeans", "fedavg"])
def test_fast_path_equals_the_flower_run(tmp_path, averaging):
    run_config = {**SMALL, "fedfcm.averaging": averaging, "output-dir": str(tmp_path)}
    flower = run_server(run_config)[0]["metrics"]
    cfg = validate(run_config)
    fast = _fast().fedfcm_job(load_dataset(cfg), cfg)
    assert fast["best_k"] == flower["best_k"]
    assert fast["rounds"] == flower["rounds"]
    assert max(flower["rounds"].values()) > 1
    assert set(fast["fedfuzzdb"]) == set(flower["fedfuzzdb"]) == {"2", "3", "4", "5"}
    for k, v in flower["fedfuzzdb"].items():
        assert fast["fedfuzzdb"][k] == pytest.approx(v, rel=1e-9, abs=0)
    for k, v in flower["eval_ari"].items():
        assert fast["eval_ari"][k] == pytest.approx(v, rel=1e-9, abs=1e-12)


def test_stored_summary_layout_is_read_by_the_table(tmp_path):
    """The grid's summary.json files feed ``fedfcm-table3`` unchanged."""
    from fedclust.experiments.__main__ import fedfcm_table3

    fast = _fast()
    for avg, p in (("kmeans", 1), ("kmeans", 2), ("fedavg", 2)):
        run_config = {**SMALL, "num-clients": p, "fedfcm.averaging": avg}
        cfg = validate(run_config)
        metrics = fast.fedfcm_job(load_dataset(cfg), cfg)
        job = tmp_path / avg / f"P{p}"
        job.mkdir(parents=True)
        import json

        (job / "summary.json").write_text(json.dumps(fast.summary_of(cfg, metrics, 0.0)))
    table = fedfcm_table3([str(tmp_path)], threshold=1e9)
    assert "| kmeans | 2 |" in table and "| fedavg | 2 |" in table and "| — | central |" in table
