"""The one ClientApp of fedclust.

Handlers of each method live in ``client_apps/<method>_handlers.py`` and register named actions
on :data:`app` (``@app.query("fcm_sums")`` handles message type ``"query.fcm_sums"``). Importing
this module imports every handler module listed in :mod:`server_app.registry`.
"""

from __future__ import annotations

import importlib
import importlib.util

from flwr.clientapp import ClientApp

app = ClientApp()


def _register_handlers() -> None:
    from server_app.registry import METHODS

    # secagg_handlers: the default "train" action wrapped by SecAgg+ (exact FCM secure sums).
    modules = {spec.handlers for spec in METHODS.values()} | {"client_apps.secagg_handlers"}
    for module in sorted(modules):
        if importlib.util.find_spec(module) is not None:
            importlib.import_module(module)


_register_handlers()
