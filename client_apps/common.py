"""Helpers shared by the ClientApp handlers: config access, replies, timing."""

from __future__ import annotations

from collections.abc import Mapping
from functools import lru_cache
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, Context, Message, MetricRecord, RecordDict

from fedclust import npy
from fedclust.config import validate


def run_config(context: Context) -> dict[str, Any]:
    """The validated, typed run config (same keys and values as on the server).

    Validated once per distinct run config and process, not on every message: a config taken
    from the server's messages (:class:`client_apps.base.RunConfig`) is found by its key, any
    other by its items.
    """
    cfg = context.run_config
    key = getattr(cfg, "key", None)
    if isinstance(key, str):
        items = _BY_KEY.get(key)
        if items is None:
            items = _BY_KEY[key] = _validated(tuple(sorted(cfg.items())))
            while len(_BY_KEY) > 16:
                del _BY_KEY[next(iter(_BY_KEY))]
        return dict(items)
    return dict(_validated(tuple(sorted(cfg.items()))))


_BY_KEY: dict[str, tuple[tuple[str, Any], ...]] = {}


@lru_cache(maxsize=8)
def _validated(items: tuple[tuple[str, Any], ...]) -> tuple[tuple[str, Any], ...]:
    return tuple(validate(dict(items)).items())


def to_array(value: np.ndarray) -> Array:
    """``Array(value)`` (the same bytes, C order), without ``numpy.save``'s per-call cost
    (:mod:`fedclust.npy`)."""
    dtype, shape, stype, data = npy.array_fields(value)
    return Array(dtype=dtype, shape=shape, stype=stype, data=data)


def to_numpy(array: Array) -> np.ndarray:
    """``array.numpy()``, without ``numpy.load``'s per-call cost (:mod:`fedclust.npy`)."""
    return npy.from_array(array)


def reply(msg: Message, arrays: Mapping[str, Mapping[str, np.ndarray]] | None = None,
          metrics: Mapping[str, float | int | list] | None = None) -> Message:
    """Build a reply with named ArrayRecords and one MetricRecord ``"metrics"``."""
    content = RecordDict()
    for rec_name, named in (arrays or {}).items():
        content[rec_name] = array_record_of(named)
    content["metrics"] = MetricRecord(dict(metrics or {}))
    return Message(content, reply_to=msg)


def array_record_of(named: Mapping[str, np.ndarray]) -> ArrayRecord:
    """``ArrayRecord`` of named arrays (filled key by key: Flower's constructor, which also
    takes lists and state dicts, costs several times more)."""
    rec = ArrayRecord()
    for k, v in named.items():
        rec[k] = to_array(v)
    return rec


def array_record(content: RecordDict, name: str) -> ArrayRecord | None:
    """The ArrayRecord ``name`` of ``content`` (None: none of that name and type); what
    ``content.array_records.get(name)`` gives, without building that view on every call."""
    rec = content.get(name)
    return rec if isinstance(rec, ArrayRecord) else None


class LazyModule:
    """A module imported on first attribute access.

    In deployment every message starts a fresh ClientApp process that imports every handler
    module; importing torch or scikit-learn there would cost seconds per round trip for methods
    that do not need them.
    """

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> Any:
        import importlib

        module = importlib.import_module(self._name)
        self.__dict__.update(module.__dict__)
        return getattr(module, attr)
