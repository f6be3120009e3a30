"""PNG plots of the iteration story (matplotlib, Agg backend)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from fedclust.outputs import save_figure  # noqa: E402


def plot_series(path: Path, series: Mapping[str, Sequence[float]], xlabel: str, ylabel: str,
                log: bool = False, hline: float | None = None, title: str = "") -> Path:
    fig, ax = plt.subplots(figsize=(5.5, 3.5), dpi=110)
    for label, values in series.items():
        ax.plot(range(1, len(values) + 1), values, marker="o", ms=3, label=label)
    if hline is not None:
        ax.axhline(hline, color="grey", ls="--", lw=1, label=f"tolerance {hline:g}")
    if log:
        ax.set_yscale("log")
    ax.set(xlabel=xlabel, ylabel=ylabel, title=title)
    return _save(fig, ax, path, 8)


def plot_index_vs_k(path: Path, ks: Sequence[int], federated: Sequence[float],
                    central: Sequence[float] | None = None,
                    local: Mapping[str, Sequence[float]] | None = None,
                    title: str = "fuzzy Davies-Bouldin index") -> Path:
    fig, ax = plt.subplots(figsize=(5.5, 3.8), dpi=110)
    ax.plot(ks, federated, marker="o", lw=2, label="federated (FedFuzzDB)")
    if central is not None:
        ax.plot(ks, central, marker="s", lw=2, ls="--", label="central (pooled data)")
    for name, values in (local or {}).items():
        ax.plot(ks, values, marker=".", lw=1, alpha=0.6, label=f"local client {name}")
    ax.set(xlabel="number of clusters K", ylabel="fuzzy DB index (lower is better)", title=title)
    ax.set_xticks(list(ks))
    return _save(fig, ax, path, 7)


def _save(fig: plt.Figure, ax: plt.Axes, path: Path, legend_size: int) -> Path:
    ax.grid(alpha=0.3)
    ax.legend(fontsize=legend_size)
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)
    return Path(path)
