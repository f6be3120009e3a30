"""One run of a method: validate the run config, check the engine's clients, run the method's
server loop and write its results. The ServerApp, the Strategy objects
(:mod:`strategies.methods`) and every launcher go through :func:`run_method`."""

from __future__ import annotations

import logging
import secrets
import sys
import time
from pathlib import Path
from typing import Any

from flwr.serverapp import Grid

from fedclust.config import validate
from fedclust.registry import METHODS, load
from fedclust.results import RunRecorder

LOG = logging.getLogger("fedclust")

def setup_logging() -> None:
    """fedclust's progress lines on stderr (once per process)."""
    if not LOG.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s fedclust %(levelname)s %(message)s",
                                               "%H:%M:%S"))
        LOG.addHandler(handler)
        LOG.setLevel(logging.INFO)
        LOG.propagate = False


def output_dir(cfg: dict[str, Any], dataset: str | None = None) -> Path:
    """``output-dir`` if set, else
    ``~/fedclust-runs/<method>/<dataset>-seed<seed>-<time>-<random>`` (unique per run: runs
    started in the same second get different folders; ``dataset``: the name the run records,
    default run config ``dataset``)."""
    if cfg["output-dir"]:
        return Path(cfg["output-dir"]).expanduser()
    from fedclust.outputs import safe_name

    stamp = time.strftime("%Y%m%d-%H%M%S")
    name = (f"{safe_name(dataset or cfg['dataset'], 40)}-seed{cfg['seed']}-{stamp}-"
            f"{secrets.token_hex(3)}")
    return Path.home() / "fedclust-runs" / cfg["method"] / name


def check_run_config(run_config: dict[str, Any], validated: dict[str, Any] | None = None
                     ) -> dict[str, Any]:
    """Validate ``run_config`` and run the method's preflight (e.g. data files exist).

    Bad input stops here, before any engine starts or any message is sent; returns the typed
    config. This is every check a run makes before its first message — the keys and values,
    the tracker's package, the output folder (:func:`fedclust.results.check_folder`), the site
    files of ``dataset="files"``, the method's preflight — and ``fedclust check`` runs exactly
    this, so that the two give one verdict. ``validated``: ``run_config`` already validated (by
    :func:`strategies.methods.from_run_config`), so that it is validated once.
    """
    cfg = validate(run_config) if validated is None else dict(validated)
    from fedclust.config import check_installed
    from fedclust.results import check_folder

    check_installed(cfg["method"])   # fedcref, emdcfl: torch & co. (pip extra nn) on the server
    from fedclust.trackers import check as check_tracker

    check_tracker(cfg)      # its package is installed here (the server), not on the nodes
    if cfg["output-dir"]:   # the verdict the run's RunRecorder gives, before any work
        check_folder(cfg["output-dir"], cfg["overwrite"])
    if cfg["dataset"] == "files":   # the nodes read the site files with the node loader
        from fedclust.data.sites import check_sites

        check_sites(cfg, cfg["num-clients"] or None)
        return cfg
    preflight = METHODS[cfg["method"]].server_preflight
    if preflight:
        load(preflight)(cfg)
    return cfg


def run_method(grid: Grid, run_config: dict[str, Any]) -> dict[str, Any]:
    """Validate, preflight, run the method's server loop and write ``summary.json``; return
    the summary (:func:`execute` also returns the run's recorder)."""
    return execute(grid, run_config)[0]


def execute(grid: Grid, run_config: dict[str, Any], validated: dict[str, Any] | None = None,
            data: dict[str, Any] | None = None) -> tuple[dict[str, Any], RunRecorder]:
    """:func:`run_method`, returning ``(summary, recorder)``: the recorder holds the run in
    memory as it wrote it (``history``, ``arrays``, ``dir``). ``validated``: ``run_config``
    already validated (:func:`check_run_config`); ``data``: what the run clusters, when the
    run config cannot tell (:func:`fedclust.results.data_record`)."""
    setup_logging()
    from fedclust import outputs

    # A simulation writes its clients' results too, thousands of files on this machine: they
    # are made durable once, at the end of the run, not file by file (fedclust.outputs).
    if getattr(grid, "simulated", False):     # the in-process engine: clients in this process
        with outputs.durable_at_exit():
            return _execute(grid, run_config, validated, data)
    summary, recorder = _execute(grid, run_config, validated, data)
    if (recorder.dir / "clients").is_dir():   # simulated nodes of another engine wrote there
        outputs.sync()
    return summary, recorder


def _execute(grid: Grid, run_config: dict[str, Any], validated: dict[str, Any] | None,
             data: dict[str, Any] | None) -> tuple[dict[str, Any], RunRecorder]:
    from fedclust.results import RUNNING, data_record, recorded_config
    from strategies.common import engine_clients, exclusions_recorded, messages_carry

    # Bad values and missing files stop the run here, before it waits for any node.
    cfg = check_run_config(run_config, validated)
    with exclusions_recorded() as excluded:     # from the first question to a node on
        n = engine_clients(grid, cfg)
        if n != cfg["num-clients"]:   # num-clients = 0: now the engine's count is known
            cfg = check_run_config({**run_config, "num-clients": n})
        runner = load(METHODS[cfg["method"]].server)
        record = data_record(cfg, data)
        name = str(record.get("dataset") or cfg["dataset"])
        recorder = RunRecorder(output_dir(cfg, name), cfg["method"], name, cfg["seed"],
                               cfg["num-clients"], recorded_config(cfg),
                               overwrite=cfg["overwrite"], data=record)
        try:
            LOG.info("method=%s dataset=%s clients=%s -> %s", cfg["method"], name,
                     cfg["num-clients"] or "every connected node", recorder.dir)
            with messages_carry(cfg):
                recorder.round_notes = excluded.since_last
                metrics = runner(grid, cfg, recorder)
            recorder.num_clients = recorder.config["num-clients"] = cfg["num-clients"]
            # every node whose reply failed a server check, with the phase and the reason
            summary = recorder.finish(metrics, {"excluded_nodes": excluded.records})
        except BaseException as exc:   # Ctrl-C included: the folder says the run did not finish
            if (recorder.dir / "summary.json").exists():    # stopped while releasing it
                (recorder.dir / RUNNING).unlink(missing_ok=True)
            else:
                recorder.interrupted(exc)
            raise
    if excluded.records:
        LOG.warning("%d repl(y/ies) failed the server's checks and were excluded, from node(s) "
                    "%s: summary.json excluded_nodes lists each with its phase and reason",
                    len(excluded.records), sorted({r["node"] for r in excluded.records}))
    LOG.info("done in %.1fs: %s", summary["wall_time_s"],
             {k: v for k, v in summary["metrics"].items() if not isinstance(v, (dict, list))})
    return summary, recorder
