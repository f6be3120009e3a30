"""Paper 000 Figure 4: communities, ACC, wrong associations, isolated clusters and active
clients per iteration (mean ± 95% CI across runs when several histories are given).

Iteration 0 is the state before any association (as in the paper's figure): the initial ACC,
no community, every cluster isolated, every client active. It is not in ``history.jsonl``;
:func:`start_record` builds it from a run's summary.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fedclust.metrics import mean_ci
from fedclust.outputs import save_figure

PANELS = (("communities", "(a) Communities found"), ("eval_acc", "(b) Accuracy (ACC)"),
          ("eval_wrong_associations_pct", "(c) Wrong associations (%)"),
          ("isolated", "(d) Isolated clusters"), ("active_clients", "(e) Active clients"))


def start_record(metrics: dict[str, Any], history: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Iteration 0 of a run from its summary ``metrics`` and ``history``: initial ACC, 0
    communities, ``isolated_start`` isolated clusters, the clients active in iteration 1; no
    wrong-association share (nothing is associated yet)."""
    acc = metrics.get("eval_acc_start")
    return {"iteration": 0, "communities": 0, "isolated": metrics.get("isolated_start"),
            "active_clients": history[0].get("active_clients") if history else None,
            "eval_acc": None if acc is None or not np.isfinite(acc) else float(acc)}


def series(histories: Sequence[Sequence[dict[str, Any]]], key: str, first: int = 1
           ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Iterations (numbered from ``first``), mean and CI half-width of ``key``; a run that
    stopped early carries its last value forward (its state no longer changes)."""
    length = max((len(h) for h in histories), default=0)
    cols = []
    for h in histories:
        vals = [r.get(key) for r in h]
        vals = [np.nan if v is None else float(v) for v in vals]
        if vals:
            vals += [vals[-1]] * (length - len(vals))
            cols.append(vals)
    if not cols:
        return np.arange(first, first + length), np.full(length, np.nan), np.zeros(length)
    arr = np.asarray(cols)
    stats = [mean_ci(arr[:, i]) for i in range(length)]
    return (np.arange(first, first + length), np.array([s[0] for s in stats]),
            np.array([s[1] for s in stats]))


def figure4(path: str | Path, histories: Sequence[Sequence[dict[str, Any]]],
            global_k: int | None = None, title: str = "",
            starts: Sequence[dict[str, Any]] | None = None) -> Path:
    """Write the five panels of Figure 4 to ``path`` (PNG).

    ``starts``: one iteration-0 record per history (:func:`start_record`), drawn at x = 0.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    if starts is not None:
        if len(starts) != len(histories):
            raise ValueError(f"starts has {len(starts)} records for {len(histories)} histories")
        histories = [[dict(s0), *h] for s0, h in zip(starts, histories, strict=True)]
    first = 0 if starts is not None else 1
    fig, axes = plt.subplots(1, 5, figsize=(20, 3.6))
    for ax, (key, label) in zip(axes, PANELS, strict=False):
        x, m, ci = series(histories, key, first)
        ax.plot(x, m, marker="o", ms=3)
        ax.fill_between(x, m - ci, m + ci, alpha=0.25)
        if key == "communities" and global_k:
            ax.axhline(global_k, ls="--", c="gray", lw=1, label=f"global K = {global_k}")
            ax.legend(fontsize=8)
        ax.set_title(label, fontsize=10)
        ax.set_xlabel("iteration")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    path = Path(path)
    save_figure(fig, path, dpi=110)
    plt.close(fig)
    return path
