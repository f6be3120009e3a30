"""Heatmap of the pairwise EMD matrix (as the paper's Figure 2 / Figure 11)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from fedclust.outputs import save_figure


def emd_heatmap(path: str | Path, emd: NDArray, clusters: NDArray | None = None,
                title: str = "EMD between embedding distributions") -> Path:
    """Save ``emd[c, o] = W(train_c, val_o)`` as a PNG (rows: source model/client c).

    Clients are ordered by found cluster (if given) so that blocks are visible. Entries not
    solved (NaN: the lazy AND or the lower bound decided them without a solve;
    ``emdcfl.full-matrix=true`` solves all) are grey.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    emd = np.asarray(emd, dtype=np.float64)
    order = np.argsort(clusters, kind="stable") if clusters is not None else np.arange(len(emd))
    fig, ax = plt.subplots(figsize=(6, 5))
    cmap = plt.get_cmap("Reds").copy()
    cmap.set_bad("lightgrey")
    im = ax.imshow(np.ma.masked_invalid(emd[np.ix_(order, order)]), cmap=cmap)
    fig.colorbar(im, ax=ax, label="W(train_c, val_o)")
    ax.set_xlabel("target client o (val set)")
    ax.set_ylabel("source client c (model, train set)")
    ticks = np.arange(len(order))
    if len(order) <= 40:
        ax.set_xticks(ticks, [str(i) for i in order], fontsize=5, rotation=90)
        ax.set_yticks(ticks, [str(i) for i in order], fontsize=5)
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    path = Path(path)
    save_figure(fig, path, dpi=130)
    plt.close(fig)
    return path
