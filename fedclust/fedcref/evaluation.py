"""Evaluation-path metrics of paper 000 §5.3 (ground truth; the algorithm never sees them).

All of them are computed on the server from per-client, per-cluster true-class histograms that
clients send only when ``evaluate`` is true.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import numpy as np
from numpy.typing import NDArray

from fedclust.fedcref.refine import table_accuracy


def wrong_associations(groups: Sequence[Sequence[Hashable]],
                       histograms: dict[Hashable, NDArray]) -> tuple[int, int, float]:
    """Clusters associated with the wrong community.

    A clustered node (client, cluster) in community G is *wrong* when its true majority class
    differs from the majority class of G (argmax of the summed member histograms).

    Returns
    -------
    wrong, associated, percent : ``100 · wrong / associated`` (0 when nothing is associated)
    """
    wrong = total = 0
    for g in groups:
        hs = [np.asarray(histograms[n]) for n in g if n in histograms]
        if not hs:
            continue
        size = max(h.size for h in hs)
        hs = [np.pad(h, (0, size - h.size)) for h in hs]
        major = int(np.argmax(np.sum(hs, axis=0)))
        wrong += sum(int(np.argmax(h)) != major for h in hs)
        total += len(hs)
    return wrong, total, (100.0 * wrong / total if total else 0.0)


def majority_classes(histograms: dict[Hashable, NDArray]) -> dict[Hashable, int]:
    """True majority class of every non-empty cluster."""
    return {n: int(np.argmax(h)) for n, h in histograms.items() if np.sum(h) > 0}


def mean_accuracy(tables: Sequence[NDArray]) -> float:
    """Mean over clients of the Hungarian ACC of each client's (true class × cluster) table."""
    accs = [table_accuracy(t) for t in tables if np.sum(t) > 0]
    return float(np.mean(accs)) if accs else float("nan")
