"""PNG plots of the iteration story (matplotlib, Agg backend)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib
import numpy as np

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
    for name, values in _by_client_number(local or {}):
        ax.plot(ks, values, marker=".", lw=1, alpha=0.6, label=f"local client {name}")
    ax.set(xlabel="number of clusters K", ylabel="fuzzy DB index (lower is better)", title=title)
    ax.set_xticks(list(ks))
    return _save(fig, ax, path, 7)


def _by_client_number(series: Mapping[str, Sequence[float]]
                      ) -> list[tuple[str, Sequence[float]]]:
    """Series keyed by node id, renamed to client numbers 0, 1, … in node-id order: the
    numbering of ``fedclust.simulate``'s client list and of its ``clients/<i>/`` folders (the
    in-process engine gives client ``i`` the ``i``-th smallest node id). Other keys are kept."""
    if not series or not all(str(k).isdigit() for k in series):
        return list(series.items())
    order = sorted(series, key=int)
    return [(str(order.index(k)), series[k]) for k in order]


def _save(fig: plt.Figure, ax: plt.Axes, path: Path, legend_size: int) -> Path:
    ax.grid(alpha=0.3)
    ax.legend(fontsize=legend_size)
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)
    return Path(path)


def plot_clusters(path: Path, xs: Sequence[np.ndarray], labels: Sequence[np.ndarray],
                  memberships: Sequence[np.ndarray] | None = None,
                  centers: np.ndarray | None = None,
                  feature_names: Sequence[str] | None = None, max_points: int = 5000,
                  seed: int = 0) -> Path:
    """The clusters: every client's rows in 2-D (the two features, or the pooled rows' first two
    principal components), coloured by cluster, shaded by membership, one marker per client,
    the centers as black crosses.

    Parameters
    ----------
    path : Path
        The PNG to write (atomically).
    xs : sequence of ndarray, each (rows_i, features)
        Each client's rows (only where they are all at hand: :func:`fedclust.simulate`).
    labels : sequence of ndarray, each (rows_i,)
        Each row's cluster.
    memberships : sequence of ndarray, each (rows_i, clusters), optional
        Each row's memberships: the highest one sets the point's opacity.
    centers : ndarray (clusters, features), optional
    feature_names : sequence of str, optional
        Axis names when the data have two features.
    max_points : int
        Rows drawn at most (a random subset, the same share of every client).
    """
    x = np.concatenate([np.asarray(a, dtype=np.float64).reshape(len(a), -1) for a in xs])
    lab = np.concatenate([np.asarray(v).ravel() for v in labels]).astype(int)
    who = np.concatenate([np.full(len(a), i) for i, a in enumerate(xs)])
    shade = (np.concatenate([np.asarray(u).max(axis=1) for u in memberships])
             if memberships is not None else np.ones(len(x)))
    mean = x.mean(axis=0)
    if x.shape[1] <= 2:
        basis = np.eye(x.shape[1])[:, :2]
        names = list(feature_names or [f"feature {i}" for i in range(x.shape[1])])[:2]
        how = "features"
    else:
        _, sv, vt = np.linalg.svd(x - mean, full_matrices=False)
        basis = vt[:2].T
        share = sv[:2] ** 2 / max(float(np.sum(sv ** 2)), 1e-300)
        names = [f"PC{i + 1} ({100 * s:.0f}% of the variance)" for i, s in enumerate(share)]
        how = "first two principal components of the pooled rows"
    keep = np.random.default_rng(seed).permutation(len(x))[:max_points]
    p = (x[keep] - mean) @ basis
    if p.shape[1] == 1:
        p = np.column_stack([p[:, 0], np.zeros(len(p))])
        names.append("")
    fig, ax = plt.subplots(figsize=(5.8, 4.6), dpi=110)
    cmap = plt.get_cmap("tab10" if lab.max(initial=0) < 10 else "tab20")
    markers = "os^Dv<>ph*" if len(xs) <= 10 else "o"
    for i in range(len(xs)):
        mine = who[keep] == i
        colours = cmap(lab[keep][mine] % cmap.N)
        colours[:, 3] = np.clip(0.15 + 0.85 * shade[keep][mine], 0.0, 1.0)
        ax.scatter(p[mine, 0], p[mine, 1], c=colours, s=10, marker=markers[i % len(markers)],
                   linewidths=0)
        if len(xs) <= 10:       # legend entry in grey: colour is the cluster, not the client
            ax.scatter([], [], c="grey", s=10, marker=markers[i], label=f"client {i}")
    if centers is not None:
        c = (np.asarray(centers, dtype=np.float64) - mean) @ basis
        c = c if c.shape[1] == 2 else np.column_stack([c[:, 0], np.zeros(len(c))])
        ax.scatter(c[:, 0], c[:, 1], marker="X", s=90, c="black", label="centers")
    ax.set(xlabel=names[0], ylabel=names[1],
           title=f"clusters ({how}; shade = membership)" if memberships is not None
           else f"clusters ({how})")
    ax.title.set_fontsize(8)
    return _save(fig, ax, path, 7)
