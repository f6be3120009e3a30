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
import itertools
import logging
import math
import sys
from pathlib import Path
from typing import Any

import hydra
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from fedclust.errors import BadInputError

LOG = logging.getLogger("fedclust.sweep")
_LINK = None
#: ``(job number, overrides, error)`` of every job of this process that failed; the sweep goes
#: on with its other jobs and exits non-zero at the end (:func:`main`)
FAILED: list[tuple[int, str, BaseException]] = []
#: the MLflow run a multirun's jobs are logged under (``app.tracker=mlflow``), while it runs
SWEEP_PARENT: dict[str, Any] = {}


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


def override_keys(overrides: list[str] | None = None) -> set[str]:
    """Run-config keys a job's overrides set (``app.<key>=…``, ``+app.<key>=…``; default: this
    job's command line)."""
    from hydra.core.hydra_config import HydraConfig

    if overrides is None:
        if not HydraConfig.initialized():
            return set()
        overrides = list(HydraConfig.get().overrides.task)
    keys = set()
    for override in overrides:
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


def _flower_link():
    global _LINK
    if _LINK is None:
        from server_app.engine import SimulationSuperLink

        _LINK = SimulationSuperLink().__enter__()
        atexit.register(_LINK.__exit__, None, None, None)
    return _LINK


def checked_job(cfg: DictConfig, given: set[str] | None = None
                ) -> tuple[str, dict[str, Any], int]:
    """A composed job's engine, flat run config and node count, after the run's own checks
    (:func:`strategies.run.check_run_config`: keys, data files, output folder, method extras):
    what :func:`run_job` runs, and what :class:`GridCheck` checks for every job of a grid."""
    from fedclust.config import ConfigError
    from fedclust.data.sites import simulated_nodes
    from strategies.run import check_run_config

    run_config = job_run_config(cfg.app, given)
    engine = engine_name(cfg.engine)
    raw = cfg.num_supernodes
    if raw is not None and (isinstance(raw, bool) or not isinstance(raw, int) or raw < 0):
        raise ConfigError(f"fedclust-sweep 'num_supernodes' = {raw!r} is invalid. Allowed: an "
                          f"int >= 1, or null (= app.num-clients, else one per file of "
                          f"data-dir for dataset=files, else 5). Fix: pass num_supernodes=3, "
                          f"or leave it out")
    n = int(raw or simulated_nodes(run_config, 5))
    check_run_config({**run_config, "num-clients": n})
    return engine, run_config, n


def run_job(cfg: DictConfig) -> dict[str, Any]:
    """Run one composed job; return its summary."""
    # fail fast (keys, data files), before starting any engine
    engine, run_config, n = checked_job(cfg)
    if SWEEP_PARENT and run_config.get("tracker") == "mlflow":
        from hydra.core.hydra_config import HydraConfig

        if not run_config.get("tracker-parent"):
            run_config["tracker-parent"] = SWEEP_PARENT["run_id"]
        if not run_config.get("tracker-run-name"):    # named by what varies in the grid
            task = list(HydraConfig.get().overrides.task)
            swept = [o for o in task if o.split("=", 1)[0] in SWEEP_PARENT["swept"]]
            run_config["tracker-run-name"] = " ".join(swept or task)
    if engine == "inprocess":
        from server_app.inprocess import run_server

        summary, _ = run_server(run_config, num_nodes=n)
        return summary
    import json

    outcome = _flower_link().run(run_config, num_supernodes=n)
    _to_job_log(outcome.log)        # the ServerApp's lines ran in another process
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


# ------------------------------------------------------------------ the grid, checked first

def grid_jobs(config: DictConfig) -> list[list[str]]:
    """The override list of every job of a multirun, as Hydra's basic sweeper makes them: the
    experiment's ``hydra.sweeper.params``, then the command line (a key given on both: the
    command line's), every sweep expanded, their product in order."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    params = config.hydra.sweeper.get("params") or {}
    args = [f"{k}={v}" for k, v in params.items()]
    args += list(config.hydra.overrides.task)
    columns: dict[str, list[str]] = {}
    for override in OverridesParser.create().parse_overrides(args):
        key = override.get_key_element()
        columns[key] = ([f"{key}={v}" for v in override.sweep_string_iterator()]
                        if override.is_sweep_override()
                        else [f"{key}={override.get_value_element_as_str()}"])
    return [list(job) for job in itertools.product(*columns.values())]


def grid_problems(config: DictConfig, config_name: str | None = None
                  ) -> tuple[int, list[tuple[int, str, str]]]:
    """Every job of the multirun ``config`` through the run's own checks
    (:func:`checked_job`), before any runs: ``(jobs, [(job number, overrides, why)])``."""
    from hydra import compose

    from fedclust.results import OutputDirError, check_folder

    jobs = grid_jobs(config)
    problems: list[tuple[int, str, str]] = []
    outputs: dict[str, list[int]] = {}
    sweep_dir = Path(str(config.hydra.sweep.dir))    # as the launcher resolves it
    for num, overrides in enumerate(jobs):
        given = override_keys(overrides)
        # without app.output-dir a job writes to its Hydra folder, hydra.sweep.dir/<subdir>:
        # checked below as the run will check it (a sweep run again into the same folder)
        extra = [] if "output-dir" in given else ["app.output-dir="]
        try:
            cfg = compose(config_name=config_name or "config", return_hydra_config=True,
                          overrides=[*overrides, *extra, f"hydra.job.num={num}"])
            _, run_config, _ = checked_job(cfg, given)
            if "output-dir" not in given:
                folder = sweep_dir / str(cfg.hydra.sweep.subdir)
                try:
                    check_folder(folder, bool(run_config.get("overwrite")))
                except OutputDirError as exc:
                    raise OutputDirError(f"{exc} (this job's folder under hydra.sweep.dir: "
                                         f"pass another hydra.sweep.dir, or app.overwrite="
                                         f"true to replace an earlier sweep's results)") from None
        except BadInputError as exc:
            problems.append((num, " ".join(overrides), " ".join(str(exc).split())))
            continue
        except Exception as exc:      # noqa: BLE001 - a composition error names the override
            problems.append((num, " ".join(overrides), f"{type(exc).__name__}: "
                                                       f"{' '.join(str(exc).split())}"))
            continue
        if run_config.get("output-dir"):
            outputs.setdefault(str(run_config["output-dir"]), []).append(num)
    for folder, nums in outputs.items():
        if len(nums) > 1:
            problems += [(num, " ".join(jobs[num]), f"app.output-dir={folder!r} is the folder of "
                          f"{len(nums)} jobs of this sweep: each would refuse the folder the "
                          f"one before it wrote. Fix: leave app.output-dir out (one folder per "
                          f"job under hydra.sweep.dir)") for num in nums]
    return len(jobs), sorted(problems)


class GridCheck(Callback):
    """Hydra callback (``conf/config.yaml``): a multirun checks every job of its grid with the
    run's own checks before the first job starts, and refuses the whole grid — naming each
    refused combination — rather than stopping half-way."""

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:  # noqa: D102
        total, problems = grid_problems(config, kwargs.get("config_name"))
        if not problems:
            print(f"[fedclust-sweep] {total} job(s) checked: keys, data and output folders",
                  flush=True)
            self._open_parent(config, total)
            return
        lines = [f"  job {num + 1} ({overrides}): {why}" for num, overrides, why in problems]
        print(f"[fedclust-sweep] {len(problems)} of {total} job(s) of this grid would be "
              f"refused; no job was run:\n" + "\n".join(lines), file=sys.stderr, flush=True)
        raise SystemExit(2)

    @staticmethod
    def _open_parent(config: DictConfig, total: int) -> None:
        """``app.tracker=mlflow``: one MLflow parent run for the sweep, its jobs under it."""
        SWEEP_PARENT.clear()
        flat = {k: config.app.get(k) or "" for k in ("tracker", "tracker-uri",
                                                      "tracker-experiment")}
        if flat["tracker"] != "mlflow":
            return
        from fedclust.trackers import open_parent

        overrides = " ".join(config.hydra.overrides.task)
        params = {"overrides": overrides, "jobs": total,
                  **{f"sweeper.{k}": v for k, v in
                     (config.hydra.sweeper.get("params") or {}).items()}}
        name = f"sweep {Path(str(config.hydra.sweep.dir)).name}: {overrides}"[:250]
        jobs = grid_jobs(config)
        values: dict[str, set[str]] = {}
        for job in jobs:
            for override in job:
                key, _, value = override.partition("=")
                values.setdefault(key, set()).add(value)
        swept = {k for k, v in values.items() if len(v) > 1}
        SWEEP_PARENT.update(run_id=open_parent(flat, name, params), config=flat, jobs=total,
                            swept=swept)
        print(f"[fedclust-sweep] MLflow parent run {SWEEP_PARENT['run_id']} ({name})",
              flush=True)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:  # noqa: D102
        if SWEEP_PARENT:
            from fedclust.trackers import close_parent

            close_parent(SWEEP_PARENT["config"], SWEEP_PARENT["run_id"], len(FAILED),
                         SWEEP_PARENT["jobs"])
            SWEEP_PARENT.clear()


# ------------------------------------------------------------------ one job

def _job_log_handlers() -> list[logging.Handler]:
    """The file handler(s) Hydra opened for this job's ``<job name>.log``."""
    return [h for h in logging.getLogger().handlers if isinstance(h, logging.FileHandler)]


def _to_job_log(text: str, level: int = logging.INFO) -> None:
    """``text`` into this job's log file(s) only (the console has it already)."""
    for handler in _job_log_handlers():
        for line in text.splitlines():
            handler.handle(logging.makeLogRecord({
                "name": "fedclust.sweep", "levelno": level,
                "levelname": logging.getLevelName(level), "msg": line}))


def _say(text: str, error: bool = False) -> None:
    print(text, file=sys.stderr if error else sys.stdout, flush=True)
    _to_job_log(text, logging.ERROR if error else logging.INFO)


@hydra.main(version_base=None, config_path=CONF_DIR, config_name="config")
def _main(cfg: DictConfig) -> None:
    from hydra.core.hydra_config import HydraConfig

    hc = HydraConfig.get()
    multirun = hc.mode.name == "MULTIRUN"
    num = hc.job.get("num", 0) if multirun else 0
    params = hc.sweeper.get("params") or {}
    if not isinstance(params, dict):
        params = OmegaConf.to_container(params)
    total = total_jobs(sys.argv[1:], params) if multirun else 1
    overrides = " ".join(hc.overrides.task)
    job = f"[fedclust-sweep] job {num + 1}/{total or '?'}"
    # fedclust's progress lines (its logger does not propagate) go to the job's log too
    from strategies.run import setup_logging

    setup_logging()
    fedclust_log = logging.getLogger("fedclust")
    handlers = [h for h in _job_log_handlers() if h not in fedclust_log.handlers]
    for handler in handlers:
        fedclust_log.addHandler(handler)
    try:
        _say(f"{job} ({cfg.engine}): {overrides}")
        try:
            summary = run_job(cfg)
        except BadInputError as exc:   # a clear message: no traceback (Hydra prints one)
            _say(f"{job} refused: {exc}", error=True)
            FAILED.append((num, overrides, exc))
            return
        except Exception as exc:            # the sweep goes on; main() reports it at the end
            import traceback

            logs = [h.baseFilename for h in _job_log_handlers()]
            where = f" (traceback in {logs[0]})" if logs else ""
            _say(f"{job} failed: {type(exc).__name__}: {exc}{where}", error=True)
            _to_job_log(traceback.format_exc(), logging.ERROR)
            if not logs:        # no job log to hold it: the console gets the traceback
                traceback.print_exc()
            FAILED.append((num, overrides, exc))
            return
        scalars = {k: v for k, v in summary["metrics"].items()
                   if not isinstance(v, (dict, list))}
        _say(f"{job} done in {summary['wall_time_s']:.1f}s -> {summary['config']['output-dir']} "
             f"{scalars}")
    finally:
        for handler in handlers:
            fedclust_log.removeHandler(handler)


GROUPS = ("method", "dataset", "partition", "experiment")
TOP_KEYS = ("engine", "num_supernodes")


def check_overrides(argv: list[str]) -> None:
    """The command line's overrides judged before Hydra composes anything: a config group
    option (``method=``, ``dataset=``, ``partition=``, ``experiment=``) that has no file in
    ``conf/``, a run-config key under ``app.`` that does not exist, or a plain key that is
    neither, is refused with the choices and the close matches (Hydra would say "key not in
    struct" and suggest appending it with ``+``).

    Raises
    ------
    ConfigError
    """
    import difflib

    from fedclust.config import ConfigError, all_keys

    keys = [k.name for k in all_keys()]
    for arg in argv:
        if arg.startswith("-") or "=" not in arg:
            continue
        key, _, value = arg.partition("=")
        key = key.lstrip("+~")
        if key in GROUPS:
            options = sorted(p.stem for p in (Path(CONF_DIR) / key).glob("*.yaml"))
            if any(ch in value for ch in "()[]{}$") or value in ("null", ""):
                continue            # Hydra's sweep syntax and interpolations: Hydra judges
            run_values = {"files", *(next((k.choices for k in all_keys() if k.name == key),
                                          None) or ())}
            for v in value.split(","):
                if v not in options:
                    close = difflib.get_close_matches(v, options, n=1)
                    fix = (f"app.{key}={v} (a run-config value with no config group: set the "
                           f"key itself{', with app.data-dir=<folder>' if v == 'files' else ''})"
                           if v in run_values else f"{key}={close[0]}" if close else
                           f"one of the {key}s above")
                    raise ConfigError(
                        f"fedclust-sweep: {key}={v!r} is not a {key} of conf/{key}/. Allowed: "
                        f"{', '.join(options)}. Fix: {fix}")
        elif key.startswith("app."):
            name = key[len("app."):]
            if name not in keys:
                close = difflib.get_close_matches(name, keys, n=2)
                raise ConfigError(
                    f"fedclust-sweep: app.{name} is not a run-config key. Allowed: the keys of "
                    f"docs/run-config.md (under app.). Fix: "
                    + (" or ".join(f"app.{c}={value}" for c in close) if close
                       else "check the key's name"))
        elif key not in TOP_KEYS and not key.startswith("hydra"):
            hint = (f"app.{key}={value}" if key in keys else
                    f"one of {', '.join(GROUPS + TOP_KEYS)}, or app.<run-config key>")
            raise ConfigError(f"fedclust-sweep: {key!r} is neither a config group, a sweep "
                              f"setting nor app.<run-config key>. Allowed: "
                              f"{', '.join(GROUPS + TOP_KEYS)}, app.<key>. Fix: {hint}")


def main() -> None:
    """``fedclust sweep``: the jobs (one, or a multirun's grid); exit status 2 when a job's
    input was refused, 1 when a job failed otherwise (the other jobs still ran), else 0."""
    FAILED.clear()
    from fedclust.config import ConfigError
    from fedclust.results import terminate_as_interrupt

    terminate_as_interrupt()
    try:
        check_overrides(sys.argv[1:])
    except ConfigError as exc:
        print(f"[fedclust-sweep] refused: {exc}", file=sys.stderr, flush=True)
        raise SystemExit(2) from None
    _main()
    if FAILED:
        if len(FAILED) > 1 or _multirun():
            lines = "\n".join(f"  job {num + 1} ({overrides}): {type(exc).__name__}: "
                              f"{' '.join(str(exc).split())[:300]}"
                              for num, overrides, exc in FAILED)
            print(f"[fedclust-sweep] {len(FAILED)} job(s) did not finish:\n{lines}",
                  file=sys.stderr, flush=True)
        bad = all(isinstance(exc, BadInputError) for _, _, exc in FAILED)
        raise SystemExit(2 if bad else 1)


def _multirun() -> bool:
    return any(a in ("-m", "--multirun") for a in sys.argv[1:])


if __name__ == "__main__":
    main()
