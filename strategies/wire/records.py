"""Record builders every message codec uses.

A simulated round builds one reply per node, thousands a phase, and Flower's constructors check
each argument for every form they accept (an ``Array`` from fields, an ndarray or a tensor; an
``ArrayRecord`` from a dict, a list or a state dict): most of a small reply's cost. Here the
records are filled with values already known to be what the checks require (``str`` keys,
``Array`` values, the ``.npy`` bytes of :mod:`fedclust.npy`), and each object holds exactly the
state Flower's own constructor leaves (``tests/engine/test_simulation_cost.py`` compares them,
object ids and serialised messages included).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
from flwr.app import Array, ArrayRecord, MetricRecord, RecordDict

from fedclust import npy


def to_array(value: np.ndarray) -> Array:
    """``Array(value)`` (the same bytes, C order), without ``numpy.save``'s per-call cost
    (:mod:`fedclust.npy`)."""
    dtype, shape, stype, data = npy.array_fields(value)
    out = object.__new__(Array)
    out.__dict__.update(_is_dirty=True, dtype=dtype, shape=shape, stype=stype, data=data)
    return out


_CHECKS = {k: v for k, v in ArrayRecord().__dict__.items() if k.startswith("_check")}


def to_numpy(array: Array) -> np.ndarray:
    """``array.numpy()``, without ``numpy.load``'s per-call cost (:mod:`fedclust.npy`)."""
    return npy.from_array(array)


def array_record(**named: np.ndarray) -> ArrayRecord:
    """An ArrayRecord of the keyword arrays, names and order kept (built as the module
    docstring says: Flower's constructor, which also takes lists and state dicts, costs
    several times more)."""
    rec = object.__new__(ArrayRecord)
    rec.__dict__.update(_CHECKS, _data={str(k): to_array(v) for k, v in named.items()},
                        _is_dirty=True)
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
    data = out.__dict__["_data"]        # the records are built here: Flower's check is moot
    for name, named in (arrays or {}).items():
        data[str(name)] = array_record(**named)
    data["metrics"] = metric_record(metrics or {})
    return out


_METRIC_CHECKS = {k: v for k, v in MetricRecord().__dict__.items() if k.startswith("_check")}


def metric_record(metrics: Mapping[str, float | int | list]) -> MetricRecord:
    """``MetricRecord(dict(metrics))``; plain ``int`` and ``float`` values (the usual reply)
    are taken as they are, anything else goes through Flower's checks."""
    if all(type(k) is str and type(v) in (int, float) for k, v in metrics.items()):
        rec = object.__new__(MetricRecord)
        rec.__dict__.update(_METRIC_CHECKS, _data=dict(metrics))
        return rec
    return MetricRecord(dict(metrics))
