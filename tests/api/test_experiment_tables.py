"""The table builders of ``python -m fedclust.experiments`` on hand-made run folders."""

from __future__ import annotations

import json
from pathlib import Path

from fedclust.experiments.__main__ import fedcref_figure4


def _run(root: Path, seed: int, accs: list[float]) -> None:
    job = root / f"seed{seed}"
    job.mkdir(parents=True)
    history = [{"iteration": i + 1, "communities": 10 + i % 2, "isolated": 5 - i,
                "eval_acc": a, "eval_wrong_associations_pct": 0.0, "active_clients": 3 - i}
               for i, a in enumerate(accs)]
    (job / "history.jsonl").write_text("".join(json.dumps(r) + "\n" for r in history))
    metrics = {"iterations": len(accs), "communities": history[-1]["communities"],
               "isolated_start": 9, "isolated_end": history[-1]["isolated"],
               "eval_wrong_associations_pct": 0.0, "eval_acc_start": 0.5,
               "eval_acc_end": accs[-1], "eval_global_k": 10}
    (job / "summary.json").write_text(json.dumps({"seed": seed, "metrics": metrics}))


def test_fedcref_figure4_lists_every_run_and_draws_the_panels(tmp_path: Path) -> None:
    _run(tmp_path / "exp", 0, [0.7, 0.8, 0.9])
    _run(tmp_path / "exp", 1, [0.6, 0.85])          # stopped early: carried forward
    table = fedcref_figure4([str(tmp_path / "exp")], plot=str(tmp_path / "fig"))
    rows = table.splitlines()[2:]
    assert rows[0].startswith("| exp/seed0 | 0 | 3 | 10 | 9 → 3 | 0.0 | 0.500 → 0.900 |")
    assert rows[1].startswith("| exp/seed1 | 1 | 2 | 11 | 9 → 4 | 0.0 | 0.500 → 0.850 |")
    png = tmp_path / "fig.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


def _grid_run(root: Path, name: str, seed: int, acc: float, wrong: list[float],
              mb: float = 10.0) -> None:
    job = root / name / f"seed{seed}"
    job.mkdir(parents=True)
    history = [{"iteration": i + 1, "eval_wrong_associations_pct": w}
               for i, w in enumerate(wrong)]
    (job / "history.jsonl").write_text("".join(json.dumps(r) + "\n" for r in history))
    metrics = {"eval_acc_end": acc, "eval_wrong_associations_pct": wrong[-1],
               "bytes_per_client_iter": mb * 1e6}
    (job / "summary.json").write_text(json.dumps({"seed": seed, "metrics": metrics}))


def test_fedcref_grid_judges_the_final_links_and_keeps_the_worst_iteration(
        tmp_path: Path) -> None:
    from bench.fedcref_experiments import grid

    # seed 1 linked wrongly in its first iteration only; its final models use no such link
    _grid_run(tmp_path, "mnist-n10-s60-default", 0, 0.93, [0.0, 0.0], mb=8.0)
    _grid_run(tmp_path, "mnist-n10-s60-default", 1, 0.95, [12.5, 0.0], mb=6.0)
    for seed in (0, 1):
        _grid_run(tmp_path, "mnist-n10-s60-local", seed, 0.90, [0.0])
    row = grid(tmp_path).splitlines()[2]
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[0] == "mnist-n10-s60" and cells[1] == "0, 1"
    assert cells[5] == "0.0 (0.0 / 0.0)"            # wrong among the final links
    assert cells[6] == "12.5 (0.0 / 12.5)"          # worst iteration, for the history
    assert cells[7] == "7.0"                        # MB per client per iteration
