"""``fedclust-sweep``: compose a run config with Hydra and run it, in-process or on Flower's
Simulation Engine.

Examples::

    fedclust-sweep                                       # exact-fcm on blobs, in-process
    fedclust-sweep method=fedfcm dataset=motivational partition=recipe app.num-clients=3
    fedclust-sweep -m app.seed=0,1,2 app.fcm.fraction=0.25,1.0
    fedclust-sweep -m experiment=fcm_table1              # a paper table (see conf/experiment)
    fedclust-sweep engine=flower app.num-clients=3       # through Flower's Simulation Engine

``engine=inprocess`` (the default) runs the ServerApp main and ClientApp handlers that
``flwr run`` runs, through an in-process grid: no engine to start, a fraction of a second per
small job. ``engine=flower`` (or ``flwr``) submits each job with ``flwr run`` to a private
simulation SuperLink (Flower's Simulation Engine, the path of deployment: messages serialised,
one ClientApp per Ray actor), which costs tens of seconds per job. Both give the same numbers.
Each job writes summary.json/history.jsonl to its Hydra job directory.
"""

from __future__ import annotations

import atexit
import logging
import math
import sys
from pathlib import Path
from typing import Any

import hydra
from omegaconf import DictConfig, OmegaConf

LOG = logging.getLogger("fedclust.sweep")
_LINK = None


def flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested Hydra ``app`` config -> Flower's flat dotted run config."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten(value, f"{name}."))
        elif value is not None:
            out[name] = value
    return out


def job_run_config(app: Any, given: set[str] | None = None) -> dict[str, Any]:
    """The flat run config of a composed ``app`` node. Keys of other methods that the config
    groups bring along (a dataset file's ``fcm.n-clusters`` in a FedCRef job) are dropped;
    those the user gave (``given``, default: this job's ``app.*`` command-line overrides) stay,
    and the run config check refuses them, naming their method."""
    from fedclust.config import without_foreign_defaults

    flat = flatten(OmegaConf.to_container(app, resolve=True))
    return without_foreign_defaults(flat, override_keys() if given is None else given)


def override_keys() -> set[str]:
    """Run-config keys this job's command line sets (``app.<key>=…``, ``+app.<key>=…``)."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return set()
    keys = set()
    for override in HydraConfig.get().overrides.task:
        key = override.split("=", 1)[0].lstrip("+~")
        if key.startswith("app."):
            keys.add(key[len("app."):])
    return keys


def total_jobs(argv: list[str], sweeper_params: dict[str, Any] | None) -> int | None:
    """Number of jobs of this multirun (product of the sweep dimensions), if it can be told."""
    try:
        from hydra.core.override_parser.overrides_parser import OverridesParser

        # command-line values replace the experiment's sweeper params of the same key
        by_key = {str(k): f"{k}={v}" for k, v in (sweeper_params or {}).items()}
        for arg in argv:
            if "=" in arg and not arg.startswith("-"):
                by_key[arg.split("=", 1)[0].lstrip("+~")] = arg
        parsed = OverridesParser.create().parse_overrides(list(by_key.values()))
        sizes = [len(list(ov.sweep_string_iterator())) for ov in parsed
                 if ov.is_sweep_override()]
        return math.prod(sizes) if sizes else 1
    except Exception:  # the count is cosmetic; never fail a sweep over it
        return None


def bad_input_errors() -> tuple[type[Exception], ...]:
    """Exceptions whose message already names the bad input, what is allowed and the fix: the
    launchers print the message alone (no traceback) and exit with status 2."""
    from fedclust.config import ConfigError
    from fedclust.data.local import LocalDataError
    from fedclust.data.partition import PartitionError
    from fedclust.data.sites import SiteFilesError
    from fedclust.data.tabular import DatasetError
    from fedclust.results import OutputDirError

    return (ConfigError, SiteFilesError, OutputDirError, DatasetError, PartitionError,
            LocalDataError)


def _flower_link():
    global _LINK
    if _LINK is None:
        from server_app.engine import SimulationSuperLink

        _LINK = SimulationSuperLink().__enter__()
        atexit.register(_LINK.__exit__, None, None, None)
    return _LINK


def run_job(cfg: DictConfig) -> dict[str, Any]:
    """Run one composed job; return its summary."""
    run_config = job_run_config(cfg.app)
    from fedclust.config import ConfigError
    from fedclust.data.sites import simulated_nodes
    from strategies.run import check_run_config

    engine = engine_name(cfg.engine)
    raw = cfg.num_supernodes
    if raw is not None and (isinstance(raw, bool) or not isinstance(raw, int) or raw < 0):
        raise ConfigError(f"fedclust-sweep 'num_supernodes' = {raw!r} is invalid. Allowed: an "
                          f"int >= 1, or null (= app.num-clients, else one per file of "
                          f"data-dir for dataset=files, else 5). Fix: pass num_supernodes=3, "
                          f"or leave it out")
    n = int(raw or simulated_nodes(run_config, 5))

    # fail fast (keys, data files), before starting any engine
    check_run_config({**run_config, "num-clients": n})
    if engine == "inprocess":
        from server_app.inprocess import run_server

        summary, _ = run_server(run_config, num_nodes=n)
        return summary
    import json

    outcome = _flower_link().run(run_config, num_supernodes=n)
    if not outcome.ok:
        raise RuntimeError(f"flwr run {outcome.run_id} ended {outcome.status}:\n"
                           f"{outcome.log[-4000:]}")
    return json.loads((Path(run_config["output-dir"]) / "summary.json").read_text())


#: the engines a job runs on (the first is the default of ``conf/config.yaml``)
ENGINES = ("inprocess", "flower")
#: other names of an engine
ENGINE_ALIASES = {"flwr": "flower"}


def engine_name(value: Any) -> str:
    """The engine ``value`` (the sweep's ``engine``) names.

    Raises
    ------
    ConfigError
        Not an engine: what is allowed and how to fix it.
    """
    from fedclust.config import ConfigError

    name = ENGINE_ALIASES.get(str(value), str(value))
    if name not in ENGINES:
        raise ConfigError(f"fedclust-sweep 'engine' = {value!r} is invalid. Allowed: "
                          f"{', '.join(ENGINES)} (or {', '.join(ENGINE_ALIASES)}, the same as "
                          f"{', '.join(ENGINE_ALIASES.values())}). Fix: leave it out (in-process) "
                          f"or pass engine=flower (Flower's Simulation Engine)")
    return name
CONF_DIR = str(Path(__file__).resolve().parents[1] / "conf")


@hydra.main(version_base=None, config_path=CONF_DIR, config_name="config")
def _main(cfg: DictConfig) -> None:
    from hydra.core.hydra_config import HydraConfig

    hc = HydraConfig.get()
    num = hc.job.get("num", 0) if hc.mode.name == "MULTIRUN" else 0
    params = hc.sweeper.get("params") or {}
    if not isinstance(params, dict):
        params = OmegaConf.to_container(params)
    total = total_jobs(sys.argv[1:], params) if hc.mode.name == "MULTIRUN" else 1
    overrides = " ".join(hc.overrides.task)
    print(f"[fedclust-sweep] job {num + 1}/{total or '?'} ({cfg.engine}): {overrides}",
          flush=True)
    try:
        summary = run_job(cfg)
    except bad_input_errors() as exc:   # a clear message: no traceback (Hydra prints one)
        print(f"[fedclust-sweep] job {num + 1}/{total or '?'} refused: {exc}", file=sys.stderr,
              flush=True)
        raise SystemExit(2) from None
    scalars = {k: v for k, v in summary["metrics"].items() if not isinstance(v, (dict, list))}
    print(f"[fedclust-sweep] job {num + 1}/{total or '?'} done in {summary['wall_time_s']:.1f}s "
          f"-> {summary['config']['output-dir']} {scalars}", flush=True)


def main() -> None:
    _main()


if __name__ == "__main__":
    main()
