"""Record builders every message codec uses."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
from flwr.app import Array, ArrayRecord, MetricRecord, RecordDict

from fedclust import npy


def to_array(value: np.ndarray) -> Array:
    """``Array(value)`` (the same bytes, C order), without ``numpy.save``'s per-call cost
    (:mod:`fedclust.npy`)."""
    dtype, shape, stype, data = npy.array_fields(value)
    return Array(dtype=dtype, shape=shape, stype=stype, data=data)


def to_numpy(array: Array) -> np.ndarray:
    """``array.numpy()``, without ``numpy.load``'s per-call cost (:mod:`fedclust.npy`)."""
    return npy.from_array(array)


def array_record(**named: np.ndarray) -> ArrayRecord:
    """An ArrayRecord of the keyword arrays (names kept; filled key by key: Flower's
    constructor, which also takes lists and state dicts, costs several times more)."""
    rec = ArrayRecord()
    for k, v in named.items():
        rec[k] = to_array(v)
    return rec


def get_array_record(rd: RecordDict, name: str) -> ArrayRecord | None:
    """The ArrayRecord ``name`` of ``rd`` (None: none of that name and type); what
    ``rd.array_records.get(name)`` gives, without building that view on every call."""
    rec = rd.get(name)
    return rec if isinstance(rec, ArrayRecord) else None


def content(arrays: Mapping[str, Mapping[str, np.ndarray]] | None = None,
            metrics: Mapping[str, float | int | list] | None = None) -> RecordDict:
    """A node's reply: one ArrayRecord per entry of ``arrays`` (in order), then the
    MetricRecord ``"metrics"`` (empty when ``metrics`` is None)."""
    out = RecordDict()
    for name, named in (arrays or {}).items():
        out[name] = array_record(**named)
    out["metrics"] = MetricRecord(dict(metrics or {}))
    return out
