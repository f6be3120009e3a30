"""FedCRef Figure 4 across runs (one figure per setting, iteration 0 from the summary) and the
Hydra experiment files of the FedCRef tables (each composed job is a valid run config)."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pytest

from fedclust.experiments.__main__ import config_groups, fedcref_figure4, summaries
from fedclust.fedcref.plots import series, start_record


def _fake_run(root: Path, job: str, seed: int, dirtiness: float, acc: list[float]) -> None:
    out = root / job
    out.mkdir(parents=True)
    cfg = {"method": "fedcref", "seed": seed, "output-dir": str(out), "num-clients": 4,
           "fedcref.dirtiness": dirtiness}
    hist = [{"iteration": t + 1, "communities": 3, "isolated": 2, "active_clients": 4 - t,
             "eval_acc": a, "eval_wrong_associations_pct": 0.0, "eval_global_k": 5}
            for t, a in enumerate(acc)]
    (out / "history.jsonl").write_text("".join(json.dumps(h) + "\n" for h in hist))
    metrics = {"iterations": len(acc), "communities": 3, "isolated_start": 9,
               "isolated_end": 2, "eval_acc_start": 1.0 - dirtiness, "eval_acc_end": acc[-1],
               "eval_wrong_associations_pct": 0.0, "eval_global_k": 5}
    (out / "summary.json").write_text(json.dumps({"seed": seed, "config": cfg,
                                                  "metrics": metrics}))


def test_figure4_cli_draws_one_figure_per_setting(tmp_path: Path) -> None:
    # a Hydra multirun: job folders by number, two settings x two seeds mixed
    for job, (seed, d) in enumerate(itertools.product((0, 1), (0.3, 0.5))):
        _fake_run(tmp_path / "multirun", str(job), seed, d, [0.8 + 0.01 * seed, 0.9])
    groups = config_groups(summaries([str(tmp_path / "multirun")]))
    assert [(label, len(runs)) for label, runs in groups] == [
        ({"fedcref.dirtiness": 0.3}, 2), ({"fedcref.dirtiness": 0.5}, 2)]
    text = fedcref_figure4([str(tmp_path / "multirun")], plot=str(tmp_path / "fig"))
    assert text.count("**setting") == 2 and "fedcref.dirtiness=0.5 (2 runs)" in text
    assert (tmp_path / "fig_1.png").stat().st_size > 0
    assert (tmp_path / "fig_2.png").stat().st_size > 0
    assert not (tmp_path / "fig.png").exists()


def test_figure4_starts_at_iteration_zero(tmp_path: Path) -> None:
    _fake_run(tmp_path, "a", 0, 0.3, [0.8, 0.9])
    _fake_run(tmp_path, "b", 1, 0.3, [0.85])
    runs = summaries([str(tmp_path)])
    hists = [[json.loads(x) for x in (job / "history.jsonl").read_text().splitlines()]
             for job, _ in runs]
    starts = [start_record(s["metrics"], h) for (_, s), h in zip(runs, hists, strict=True)]
    assert starts[0] == {"iteration": 0, "communities": 0, "isolated": 9, "active_clients": 4,
                         "eval_acc": pytest.approx(0.7)}
    padded = [[s0, *h] for s0, h in zip(starts, hists, strict=True)]
    x, acc, _ = series(padded, "eval_acc", first=0)
    assert list(x) == [0, 1, 2] and acc[0] == pytest.approx(0.7)
    assert acc[2] == pytest.approx((0.9 + 0.85) / 2)          # run b carries its last value
    x, wrong, _ = series(padded, "eval_wrong_associations_pct", first=0)
    assert np.isnan(wrong[0]) and wrong[1] == 0.0             # nothing associated at it. 0
    fedcref_figure4([str(tmp_path)], plot=str(tmp_path / "one"))
    assert (tmp_path / "one.png").stat().st_size > 0


EXPERIMENTS = sorted(p.stem for p in (Path(__file__).resolve().parents[2] / "conf" /
                                      "experiment").glob("fedcref_*.yaml"))


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_experiment_files_compose_to_valid_run_configs(name: str, tmp_path: Path) -> None:
    from hydra import compose, initialize_config_dir
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import OmegaConf

    from fedclust.config import validate
    from fedclust.fedcref.client import build_system
    from server_app.sweep import CONF_DIR, job_run_config

    with initialize_config_dir(config_dir=CONF_DIR, version_base=None):
        cfg = compose(config_name="config",
                      overrides=[f"experiment={name}", f"app.output-dir={tmp_path}"],
                      return_hydra_config=True)
    params = OmegaConf.to_container(cfg.hydra.sweeper.params)
    sweeps = OverridesParser.create().parse_overrides([f"{k}={v}" for k, v in params.items()])
    dims = [[(ov.key_or_group, v) for v in ov.sweep_iterator()] for ov in sweeps]
    assert cfg.app.method == "fedcref" and dims
    del cfg.hydra
    jobs = feasible = 0
    for combo in itertools.product(*dims):            # every job of the multirun
        job = cfg.copy()
        for key, value in combo:
            OmegaConf.update(job, key, value, merge=False)
        run = validate(job_run_config(job.app, given=set()))
        assert run["method"] == "fedcref"
        for key, value in combo:
            assert run[key.removeprefix("app.")] == value
        if (Path(run["data-dir"]) / run["dataset"]).is_dir():
            build_system(run)      # the dataset can supply the job's system (else it raises)
            feasible += 1
        jobs += 1
    assert jobs == int(np.prod([len(d) for d in dims]))
    if not feasible:
        pytest.skip(f"data for {name} not found: system sizes not checked")
