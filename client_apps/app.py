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

    for module in sorted({spec.handlers for spec in METHODS.values()}):
        if importlib.util.find_spec(module) is not None:
            importlib.import_module(module)


_register_handlers()
