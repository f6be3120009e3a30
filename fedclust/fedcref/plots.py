"""Paper 000 Figure 4: communities, ACC, wrong associations, isolated clusters and active
clients per iteration (mean ± 95% CI across runs when several histories are given)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fedclust.metrics import mean_ci

PANELS = (("communities", "(a) Communities found"), ("eval_acc", "(b) Accuracy (ACC)"),
          ("eval_wrong_associations_pct", "(c) Wrong associations (%)"),
          ("isolated", "(d) Isolated clusters"), ("active_clients", "(e) Active clients"))


def series(histories: Sequence[Sequence[dict[str, Any]]], key: str
           ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Iterations, mean and CI half-width of ``key``; a run that stopped early carries its last
    value forward (its state no longer changes)."""
    length = max((len(h) for h in histories), default=0)
    cols = []
    for h in histories:
        vals = [r.get(key) for r in h]
        vals = [np.nan if v is None else float(v) for v in vals]
        if vals:
            vals += [vals[-1]] * (length - len(vals))
            cols.append(vals)
    if not cols:
        return np.arange(1, length + 1), np.full(length, np.nan), np.zeros(length)
    arr = np.asarray(cols)
    stats = [mean_ci(arr[:, i]) for i in range(length)]
    return (np.arange(1, length + 1), np.array([s[0] for s in stats]),
            np.array([s[1] for s in stats]))


def figure4(path: str | Path, histories: Sequence[Sequence[dict[str, Any]]],
            global_k: int | None = None, title: str = "") -> Path:
    """Write the five panels of Figure 4 to ``path`` (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, axes = plt.subplots(1, 5, figsize=(20, 3.6))
    for ax, (key, label) in zip(axes, PANELS, strict=False):
        x, m, ci = series(histories, key)
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
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
