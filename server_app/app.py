"""The fedclust ServerApp: run the method the run config names (:func:`run_method`)."""

from __future__ import annotations

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from strategies.run import check_run_config, output_dir, run_method

__all__ = ["app", "check_run_config", "main", "output_dir", "run_method"]

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    run_method(grid, dict(context.run_config))
