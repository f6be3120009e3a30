"""Can the data hold the run's clusters? Checked before any work on the rows the run will
see (a dataset, the site files, the arrays given to ``simulate``, a deployed node's own
table): more clusters than rows, or than distinct rows, is degenerate (a center on every
point, an objective of about 0 reported as convergence).

Each method says what its data must hold with a :class:`Capacity` built from its own settings
(the ``capacity`` column of :data:`fedclust.registry.METHODS`: exact FCM ``fcm.n-clusters``
and FedFCM ``fedfcm.k-max`` on the pooled rows, FedCRef ``fedcref.k-min`` on every client).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from fedclust.schema import ConfigError, require


@dataclass(frozen=True)
class Capacity:
    """``clusters`` (the value of run-config ``key``) that method ``method`` fits: on the
    pooled rows of all clients, or on every client (``per_client``)."""

    method: str
    key: str
    clusters: int
    per_client: bool = False


def check_rows(cap: Capacity | None, rows: int, whose: str) -> None:
    """Refuse a run that fits more clusters than ``rows`` (``whose``: "dataset 'iris'", "the
    site files of data-dir", "this run's only node"): FCM would put a center on every row and
    report a zero objective as convergence. A per-client capacity is
    :func:`check_distinct`'s.

    Raises
    ------
    ConfigError
        Naming the key, the row count and the fix.
    """
    if cap is None or cap.per_client:
        return
    key, c = cap.key, cap.clusters
    require(c <= rows, key, c, f"at most {rows}, the number of rows ({whose}: {rows} row(s) "
            f"in all); more clusters than rows is degenerate (a center on every row, "
            f"objective 0)",
            f"pass {key}={max(2, min(rows, c) // 2)} or fewer, or give the run more rows")


def distinct_rows(arrays: Sequence[np.ndarray], enough: int) -> int:
    """How many distinct rows ``arrays`` hold together, counted up to ``enough`` (a count of
    at least ``enough`` may stop early)."""
    found: list[np.ndarray] = []
    for x in arrays:
        x = np.asarray(x, dtype=np.float64).reshape(len(x), -1) + 0.0   # -0.0 is 0.0
        found.append(np.unique(x, axis=0) if len(x) else x)
        if len(found[-1]) >= enough:
            return len(found[-1])
    rows = [f for f in found if len(f)]
    return len(np.unique(np.concatenate(rows), axis=0)) if rows else 0


def check_distinct(cap: Capacity | None, arrays: Sequence[np.ndarray], whose: str) -> None:
    """Refuse data that cannot hold the run's clusters — fewer distinct rows than clusters
    (all-constant data: one), pooled or on a client (``arrays``: one per client) — before the
    run, with what was found: FCM would put several centers on one point and report an
    objective of about 1e-153 as convergence.

    Raises
    ------
    ConfigError
        Naming the key, the rows and distinct rows found, and the fix.
    """
    if cap is None:
        return
    key, c = cap.key, cap.clusters
    if cap.per_client:
        for i, x in enumerate(arrays):
            found = distinct_rows([x], c)
            if found < c:
                raise ConfigError(
                    f"client {i} of {whose} holds {len(x)} row(s) of which {found} distinct: "
                    f"method {cap.method!r} fits at least {c} clusters on every client "
                    f"({key}), and {found} distinct point(s) cannot hold them"
                    f"{' (every feature constant)' if found == 1 else ''}. Allowed: at least "
                    f"{c} distinct rows per client. Fix: check that client's data, or leave "
                    f"it out")
        return
    rows = sum(len(x) for x in arrays)
    check_rows(cap, rows, whose)    # fewer rows than clusters first
    distinct = distinct_rows(arrays, c)
    if distinct >= c:
        return
    what = ("every row is the same point (every feature constant)" if distinct == 1 else
            f"only {distinct} distinct rows")
    raise ConfigError(
        f"run config '{key}' = {c}, but {whose} hold {rows} row(s) of which {what}: "
        f"{c} clusters cannot be told apart in them (several centers would sit on one point, "
        f"with an objective of about 0 reported as convergence). Allowed: at most "
        f"{distinct} cluster(s) here. Fix: check the data (a constant or duplicated "
        f"table, the wrong column), or lower {key}")
