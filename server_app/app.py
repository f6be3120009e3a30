"""The fedclust ServerApp: build the method the run config names as a Strategy object
(:func:`strategies.methods.from_run_config`) and start it."""

from __future__ import annotations

import logging

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from fedclust.errors import BadInputError
from strategies.methods import from_run_config
from strategies.run import check_run_config, output_dir, run_method, setup_logging

__all__ = ["app", "check_run_config", "main", "output_dir", "run_method"]

app = ServerApp()
LOG = logging.getLogger("fedclust")


@app.main()
def main(grid: Grid, context: Context) -> None:
    try:
        strategy, run_config = from_run_config(dict(context.run_config))
        strategy.start(grid, run_config=run_config)
    except BadInputError as exc:
        # Bad input (a key, a value, a data file): its message says what and how to fix it.
        # One log line, and the error raised afresh from here, so that Flower's own report of
        # the failed run is a short trace ending in the same line, not fedclust's internals.
        setup_logging()
        message = " ".join(str(exc).split())
        LOG.error("run refused: %s", message)
        try:
            fresh = type(exc)(message)
        except TypeError:       # an error class with other arguments
            fresh = ValueError(message)
        raise fresh from None
