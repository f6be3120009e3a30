"""The one ClientApp of fedclust (``clientapp = "client_apps.app:app"``): the app object of
:mod:`client_apps.base` with every method's handlers registered on it."""

from __future__ import annotations

import importlib
import importlib.util

from client_apps.base import CONFIG_RECORD, app, engine_mod, error_mod, node_info

__all__ = ["CONFIG_RECORD", "HANDLERS", "app", "engine_mod", "error_mod",
           "node_info"]

# The ClientApp handler module of each method (:data:`fedclust.registry.METHODS`), and
# secagg_handlers: the default "train" action wrapped by SecAgg+ (exact FCM secure sums).
HANDLERS: dict[str, str] = {
    "exact-fcm": "client_apps.fcm_handlers",
    "fedfcm": "client_apps.fcm_handlers",
    "fedcref": "client_apps.fedcref_handlers",
    "emdcfl": "client_apps.emdcfl_handlers",
}


def _register_handlers() -> None:
    modules = set(HANDLERS.values()) | {"client_apps.secagg_handlers"}
    for module in sorted(modules):
        if importlib.util.find_spec(module) is not None:
            importlib.import_module(module)


_register_handlers()
