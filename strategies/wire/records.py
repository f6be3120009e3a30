"""Record builders every message codec uses."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
from flwr.app import Array, ArrayRecord, MetricRecord, RecordDict


def array_record(**named: np.ndarray) -> ArrayRecord:
    """An ArrayRecord of the keyword arrays (names kept, C-contiguous copies where needed)."""
    return ArrayRecord({k: Array(np.ascontiguousarray(v)) for k, v in named.items()})


def content(arrays: Mapping[str, Mapping[str, np.ndarray]] | None = None,
            metrics: Mapping[str, float | int | list] | None = None) -> RecordDict:
    """A node's reply: one ArrayRecord per entry of ``arrays`` (in order), then the
    MetricRecord ``"metrics"`` (empty when ``metrics`` is None)."""
    out = RecordDict()
    for name, named in (arrays or {}).items():
        out[name] = array_record(**named)
    out["metrics"] = MetricRecord(dict(metrics or {}))
    return out
