"""Helpers shared by the ClientApp handlers: config access, replies, timing."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import lru_cache
from typing import Any, TypeVar

import numpy as np
from flwr.app import Context, Message

from fedclust.config import validate
from strategies.wire import records


def run_config(context: Context) -> dict[str, Any]:
    """The validated, typed run config (same keys and values as on the server).

    Validated once per distinct run config and process, not on every message: a config taken
    from the server's messages (:class:`client_apps.base.RunConfig`) is found by its key and
    returned as one read-only dict shared by its messages (copy it to change it); any other
    config is found by its items and returned as a new dict.
    """
    cfg = context.run_config
    key = getattr(cfg, "key", None)
    if isinstance(key, str):
        hit = _BY_KEY.get(key)
        if hit is None:
            from client_apps.base import RunConfig

            hit = _BY_KEY[key] = RunConfig(dict(_validated(tuple(sorted(cfg.items())))), key)
            while len(_BY_KEY) > 16:
                del _BY_KEY[next(iter(_BY_KEY))]
        return hit
    return dict(_validated(tuple(sorted(cfg.items()))))


_BY_KEY: dict[str, dict[str, Any]] = {}

T = TypeVar("T")


def run_settings(context: Context, build: Callable[[Mapping[str, Any]], T]) -> T:
    """A method's typed settings, ``build(run config)`` (a ``from_config`` classmethod), built
    once per distinct run config and process, as :func:`run_config` validates it once: a
    config taken from the server's messages is found by its key, any other by its items."""
    key = getattr(context.run_config, "key", None)
    if isinstance(key, str):
        hit = _SETTINGS.get((key, build))
        if hit is None:
            hit = _SETTINGS[(key, build)] = build(run_config(context))
            while len(_SETTINGS) > 16:
                del _SETTINGS[next(iter(_SETTINGS))]
        return hit
    return _settings(build, _validated(tuple(sorted(context.run_config.items()))))


_SETTINGS: dict[tuple[str, Callable[[Mapping[str, Any]], Any]], Any] = {}


@lru_cache(maxsize=8)
def _settings(build: Callable[[Mapping[str, Any]], T], items: tuple[tuple[str, Any], ...]
              ) -> T:
    return build(dict(items))


@lru_cache(maxsize=8)
def _validated(items: tuple[tuple[str, Any], ...]) -> tuple[tuple[str, Any], ...]:
    return tuple(validate(dict(items)).items())


def reply(msg: Message, arrays: Mapping[str, Mapping[str, np.ndarray]] | None = None,
          metrics: Mapping[str, float | int | list] | None = None) -> Message:
    """Build a reply with named ArrayRecords and one MetricRecord ``"metrics"``."""
    return Message(records.content(arrays, metrics), reply_to=msg)


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
