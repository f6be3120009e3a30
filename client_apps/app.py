"""The one ClientApp of fedclust (``clientapp = "client_apps.app:app"``): the app object of
:mod:`client_apps.base` with every method's handlers registered on it."""

from __future__ import annotations

import importlib
import importlib.util

from client_apps.base import CONFIG_RECORD, app, engine_mod, error_mod, node_info
from fedclust.registry import METHODS

__all__ = ["CONFIG_RECORD", "app", "engine_mod", "error_mod", "node_info"]


def _register_handlers() -> None:
    # each method's handler module (the method table's ``handlers`` column; a method whose
    # extra is not installed has none to import), and secagg_handlers: the default "train"
    # action wrapped by SecAgg+ (exact FCM's secure sums)
    modules = {spec.handlers for spec in METHODS.values()} | {"client_apps.secagg_handlers"}
    for module in sorted(modules):
        if importlib.util.find_spec(module) is not None:
            importlib.import_module(module)


_register_handlers()
