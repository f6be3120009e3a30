"""The client steps the FCM family shares, without Flower: what a node computes from its own
rows for the evaluation path. The ClientApp handlers (:mod:`client_apps.fcm_handlers`) and
the in-memory clients (:mod:`fedclust.fcm.inmemory`) both call these, so both paths compute
the same numbers."""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from fedclust.fcm import labels_from_centers
from fedclust.metrics import contingency


def eval_codes(y: NDArray) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """``(codes, rows)``: the distinct label codes (sorted) and each row's index in them."""
    codes, rows = np.unique(y, return_inverse=True)
    return codes.astype(np.int64), rows.reshape(-1).astype(np.int64)


def eval_table(y: NDArray, x: NDArray, centers: NDArray) -> NDArray[np.int64]:
    """Label × cluster counts ``(len(codes), C)``, one row per code of :func:`eval_codes`, of
    the rows ``x`` (scaled) labelled by their nearest center."""
    codes, rows = eval_codes(y)
    return contingency(rows, labels_from_centers(x, centers), len(codes), centers.shape[0])
