"""The fedclust ServerApp: build the method the run config names as a Strategy object
(:func:`strategies.methods.from_run_config`) and start it."""

from __future__ import annotations

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from strategies.methods import from_run_config
from strategies.run import check_run_config, output_dir, run_method

__all__ = ["app", "check_run_config", "main", "output_dir", "run_method"]

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    strategy, run_config = from_run_config(dict(context.run_config))
    strategy.start(grid, run_config=run_config)
