"""``fedclust report``: real small runs (a Hydra sweep through ``fedclust sweep``, runs of
``fedclust.simulate``, an EMD-CFL sweep) turned into one mean ± sd (n) table per setting, with
no user code; and the EMD-CFL table tool on a Hydra folder."""

from __future__ import annotations

import csv
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from fedclust.report import ReportError, format_stat, mean_sd, summarize, write

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "FLWR_TELEMETRY_ENABLED": "0"}


def fedclust(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fedclust.cli", *args], capture_output=True,
                          text=True, timeout=timeout, cwd=ROOT, env=ENV)


def summaries(folder: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(folder.glob("*/summary.json"))]


@pytest.fixture(scope="module")
def fcm_sweep(tmp_path_factory) -> Path:
    """A 2-seed × 2-setting exact-FCM sweep through `fedclust sweep` (in-process engine)."""
    folder = tmp_path_factory.mktemp("sweep")
    done = fedclust("sweep", "-m", "engine=inprocess", "app.seed=0,1", "app.fcm.m=1.5,2.0",
                    "app.fcm.max-rounds=4", "app.num-clients=3", "app.plots=false",
                    f"hydra.sweep.dir={folder}")
    assert done.returncode == 0, done.stderr[-3000:]
    assert len(summaries(folder)) == 4
    return folder


def test_a_two_seed_sweep_gives_a_mean_sd_table_with_no_user_code(fcm_sweep):
    done = fedclust("report", str(fcm_sweep))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("| fcm.m | runs | eval_ari | objective |")
    runs = summaries(fcm_sweep)
    for m in (1.5, 2.0):
        ari = [s["metrics"]["eval_ari"] for s in runs if s["config"]["fcm.m"] == m]
        row = next(line for line in lines if line.startswith(f"| {m} | 2 |"))
        assert format_stat(*mean_sd(ari)) in row and "± " in row and "(2)" in row
    # report.csv: one row per setting with mean, sd and n of every metric
    with open(fcm_sweep / "report.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert [float(r["fcm.m"]) for r in rows] == [1.5, 2.0]
    for r in rows:
        objective = [s["metrics"]["objective"] for s in runs
                     if s["config"]["fcm.m"] == float(r["fcm.m"])]
        assert float(r["objective_mean"]) == pytest.approx(np.mean(objective))
        assert float(r["objective_sd"]) == pytest.approx(np.std(objective, ddof=1))
        assert r["objective_n"] == "2" and r["runs"] == "2"
    assert (fcm_sweep / "report.png").stat().st_size > 1000


def test_report_groups_by_the_keys_asked_and_reads_dict_metrics(fcm_sweep, tmp_path):
    report = summarize(fcm_sweep, by=["seed"], metrics=["rounds", "eval_coverage.nodes"])
    assert [g.label for g in report.groups] == [{"seed": 0}, {"seed": 1}]
    assert all(g.stats["eval_coverage.nodes"] == (3.0, 0.0, 2) for g in report.groups)
    everything = summarize(fcm_sweep, metrics=["all"])
    assert {"objective", "bytes_sent", "wall_time_s"} <= set(everything.metrics)


def test_report_of_runs_made_by_simulate_in_any_folder(tmp_path):
    """A folder of runs at any depth (here: fedclust.simulate runs of FedFCM and exact FCM);
    one run folder alone is a report of one run."""
    import fedclust

    rng = np.random.default_rng(0)
    centers = np.array([[0.0, 0.0], [5.0, 5.0], [0.0, 6.0]])
    clients = [centers[rng.integers(0, 3, 60)] + rng.normal(0, 0.4, (60, 2)) for _ in range(3)]
    for seed in (0, 1):
        fedclust.simulate("fedfcm", clients, seed=seed, k_max=4, output_dir=tmp_path / "runs"
                          / "fedfcm" / f"s{seed}", run_config={"plots": False})
    fedclust.simulate("exact-fcm", clients, n_clusters=3, output_dir=tmp_path / "runs" / "fcm",
                      run_config={"plots": False})
    report = summarize(tmp_path / "runs")
    assert report.by == ["method"]
    by_method = {g.label["method"]: g for g in report.groups}
    assert len(by_method["fedfcm"].runs) == 2 and len(by_method["exact-fcm"].runs) == 1
    assert by_method["fedfcm"].stats["best_k"] == (3.0, 0.0, 2)
    assert "best_k" in report.metrics and "objective" in report.metrics
    assert "| exact-fcm | 1 |" in report.markdown()
    one = summarize(tmp_path / "runs" / "fcm")
    assert one.by == [] and len(one.groups) == 1 and one.groups[0].stats["rounds"][2] == 1


@pytest.mark.slow
def test_emdcfl_sweep_reports_and_the_emdcfl_table_reads_the_hydra_folder(tmp_path):
    done = fedclust("sweep", "-m", "engine=inprocess", "method=emdcfl", "dataset=rotdigits",
                    "app.seed=0,1", "app.num-clients=4", "app.emdcfl.rounds=2",
                    "app.emdcfl.samples=60", "app.emdcfl.test-samples=20",
                    "app.emdcfl.conv1=4", "app.emdcfl.conv2=4", "app.emdcfl.embed-dim=8",
                    "app.emdcfl.workers=1", "app.plots=false", f"hydra.sweep.dir={tmp_path}",
                    timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    report = fedclust("report", str(tmp_path), "--no-plot")
    assert report.returncode == 0, report.stderr
    acc = [s["metrics"]["eval_acc_mean"] for s in summaries(tmp_path)]
    assert f"| 2 | {format_stat(*mean_sd(acc))} |" in report.stdout
    # the EMD-CFL paper-table tool reads the same Hydra folder (it needed results.jsonl)
    table = subprocess.run([sys.executable, "-m", "server_app.emdcfl_experiments", "table",
                            "--out", str(tmp_path)], capture_output=True, text=True,
                           cwd=ROOT, env=ENV, timeout=120)
    assert table.returncode == 0, table.stderr[-2000:]
    row = next(line for line in table.stdout.splitlines() if "| emdcfl |" in line)
    assert "| rotdigits | max | 4 |" in row and "| 0,1 |" in row
    assert f"{100 * np.mean(acc):.2f} ±" in row


def test_report_refusals_are_one_line(fcm_sweep, tmp_path):
    typo = fedclust("report", str(fcm_sweep), "--by", "fcm.mm")
    assert typo.returncode == 2 and "did you mean 'fcm.m'" in typo.stderr
    assert len(typo.stderr.strip().splitlines()) == 1
    metric = fedclust("report", str(fcm_sweep), "--metric", "eval_arii")
    assert metric.returncode == 2 and "did you mean 'eval_ari'" in metric.stderr
    empty = fedclust("report", str(tmp_path))
    assert empty.returncode == 2 and "no finished run" in empty.stderr


def test_report_never_replaces_a_file_it_did_not_write(fcm_sweep, tmp_path):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "report.csv").write_text("my own table\n")
    report = summarize(fcm_sweep)
    with pytest.raises(ReportError, match="not the one fedclust report wrote"):
        write(report, out)
    assert (out / "report.csv").read_text() == "my own table\n"
    assert not (out / "report.png").exists()
    write(report, out, overwrite=True)
    assert (out / "report.csv").read_text().startswith("fcm.m,runs,")
    write(report, out, plot=False)            # its own file: replaced without --overwrite
    (out / "report.csv").write_text("edited\n")
    with pytest.raises(ReportError):
        write(report, out, plot=False)


def test_format_stat():
    assert format_stat(0.81234, 0.2412, 2) == "0.81 ± 0.24 (2)"
    assert format_stat(0.98765, 0.01543, 3) == "0.988 ± 0.015 (3)"
    assert format_stat(3.0, 0.0, 2) == "3 (2)"
    assert format_stat(math.nan, math.nan, 0) == "–"
    assert mean_sd([1.0, None, 3.0]) == (2.0, math.sqrt(2.0), 2)
