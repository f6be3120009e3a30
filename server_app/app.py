"""The fedclust ServerApp: validate the run config, run the chosen method, write results."""

from __future__ import annotations

import importlib
import logging
import secrets
import sys
import time
from pathlib import Path
from typing import Any

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from fedclust.config import validate
from fedclust.results import RunRecorder
from server_app.registry import METHODS

LOG = logging.getLogger("fedclust")

app = ServerApp()


def _setup_logging() -> None:
    if not LOG.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s fedclust %(levelname)s %(message)s",
                                               "%H:%M:%S"))
        LOG.addHandler(handler)
        LOG.setLevel(logging.INFO)
        LOG.propagate = False


def _load(path: str) -> Any:
    module, _, attr = path.partition(":")
    return getattr(importlib.import_module(module), attr)


def output_dir(cfg: dict[str, Any]) -> Path:
    """``output-dir`` if set, else
    ``~/fedclust-runs/<method>/<dataset>-seed<seed>-<time>-<random>`` (unique per run: runs
    started in the same second get different folders)."""
    if cfg["output-dir"]:
        return Path(cfg["output-dir"]).expanduser()
    stamp = time.strftime("%Y%m%d-%H%M%S")
    name = f"{cfg['dataset']}-seed{cfg['seed']}-{stamp}-{secrets.token_hex(3)}"
    return Path.home() / "fedclust-runs" / cfg["method"] / name


def check_run_config(run_config: dict[str, Any]) -> dict[str, Any]:
    """Validate ``run_config`` and run the method's preflight (e.g. data files exist).

    Bad input stops here, before any engine starts or any message is sent; returns the typed
    config.
    """
    cfg = validate(run_config)
    if cfg["dataset"] == "files":   # the nodes read the site files with the node loader
        from fedclust.data.sites import check_sites

        check_sites(cfg, cfg["num-clients"] or None)
        return cfg
    spec = METHODS[cfg["method"]]
    if spec.preflight:
        _load(spec.preflight)(cfg)
    return cfg


def run_method(grid: Grid, run_config: dict[str, Any]) -> dict[str, Any]:
    """Validate, preflight, run the method's server loop and write ``summary.json``."""
    _setup_logging()
    from strategies.common import engine_clients

    # Bad values and missing files stop the run here, before it waits for any node.
    cfg = check_run_config(run_config)
    n = engine_clients(grid, cfg)
    if n != cfg["num-clients"]:   # num-clients = 0: now the engine's count is known
        cfg = check_run_config({**run_config, "num-clients": n})
    runner = _load(METHODS[cfg["method"]].runner)
    recorder = RunRecorder(output_dir(cfg), cfg["method"], cfg["dataset"], cfg["seed"],
                           cfg["num-clients"], cfg, overwrite=cfg["overwrite"])
    LOG.info("method=%s dataset=%s clients=%s -> %s", cfg["method"], cfg["dataset"],
             cfg["num-clients"] or "every connected node", recorder.dir)
    try:
        metrics = runner(grid, cfg, recorder)
    except BaseException as exc:   # Ctrl-C included: the folder says the run did not finish
        recorder.interrupted(exc)
        raise
    recorder.num_clients = recorder.config["num-clients"] = cfg["num-clients"]
    summary = recorder.finish(metrics)
    LOG.info("done in %.1fs: %s", summary["wall_time_s"],
             {k: v for k, v in summary["metrics"].items() if not isinstance(v, (dict, list))})
    return summary


@app.main()
def main(grid: Grid, context: Context) -> None:
    run_method(grid, dict(context.run_config))
