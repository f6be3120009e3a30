"""Experiment trackers: run-config key ``tracker`` = ``""`` | ``"mlflow"`` | ``"tensorboard"``.

The run's results folder stays the record of the run; a tracker copies it, as the run goes, to
where ML users look:

- ``mlflow``: one MLflow run per fedclust run in the experiment ``tracker-experiment`` (empty:
  ``MLFLOW_EXPERIMENT_NAME``, else ``fedclust``) of the store run config ``tracker-uri`` names
  (empty: ``MLFLOW_TRACKING_URI`` of the ServerApp's environment, else MLflow's default in its
  working directory: ``./mlflow.db`` with artifacts under ``./mlruns`` for MLflow ≥ 3.7,
  ``./mlruns`` before). Under ``flwr run`` the ServerApp runs in the SuperLink's environment,
  not the shell's: name the store with ``tracker-uri``. The run is named ``tracker-run-name``
  (empty: the results folder's name) and, with ``tracker-parent``, nested under that run
  (``fedclust sweep -m`` opens one parent run per sweep, its jobs named by their overrides).
  Params: the run config (the run's method's keys and the common keys) and what it clustered
  (``data.*``: the dataset, the partitioner's class and parameters, the Hugging Face
  fingerprint); metrics: every number of each ``history.jsonl`` record with ``step`` = its
  round (FedCRef: its iteration; a dict of numbers, e.g. FedFCM's shift per K, as
  ``shift/<K>``), then the summary's numeric metrics and ``wall_time_s`` at the last step;
  artifacts: ``summary.json``, ``history.jsonl``, the PNG plots (``clusters.png`` from
  ``fedclust.simulate``), the arrays (``centers.npy`` …) and, in simulation, the clients'
  results (``clients/``). A run that fails is marked FAILED. Opening the store is not part of
  the run's ``wall_time_s`` (``summary.json``: ``tracker_setup_s``).
- ``tensorboard``: the same scalars through ``torch.utils.tensorboard`` into
  ``<results folder>/tensorboard/`` (``tensorboard --logdir ~/fedclust-runs`` shows every run),
  and the run config as text.

Install with ``pip install 'fedclust[mlflow]'`` or ``'fedclust[tensorboard]'``. A tracker runs on
the server only: the nodes need neither package.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import math
import os
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from fedclust.config import ConfigError

LOG = logging.getLogger("fedclust")

TRACKERS = ("", "mlflow", "tensorboard")
PACKAGES = {"mlflow": ("mlflow", "fedclust[mlflow]"),
            "tensorboard": ("tensorboard", "fedclust[tensorboard]")}
EXPERIMENT = "fedclust"
STEP_KEYS = ("round", "iteration")
ARTIFACTS = ("summary.json", "history.jsonl")
#: artifact patterns of the results folder, and its folders logged whole
ARTIFACT_GLOBS = ("*.png", "*.npy", "*.csv")
ARTIFACT_DIRS = ("clients",)
_BATCH = 100     # MLflow takes at most 100 params (1000 metrics) per request


def check(cfg: Mapping[str, Any]) -> None:
    """Refuse a ``tracker`` whose package is not installed on the server, before any work.

    Raises
    ------
    ConfigError
        The package is missing (the message names the pip extra).
    """
    from fedclust.common import setting

    name = setting(cfg, "tracker")
    if name in PACKAGES:
        module, extra = PACKAGES[name]
        if importlib.util.find_spec(module) is None:
            raise ConfigError(f"run config 'tracker' = {name!r} needs the {module} package, "
                              f"which is not installed where the ServerApp runs. Fix: pip "
                              f"install '{extra}', or pass tracker=\"\" (results are still "
                              f"written to the run's folder)")


def own_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """The run config without the keys of other methods than its own."""
    from fedclust.report import METHOD_PREFIX

    own = METHOD_PREFIX.get(str(config.get("method")))
    other = tuple(p for p in METHOD_PREFIX.values() if p != own)
    return {k: v for k, v in config.items() if not k.startswith(other)}


def scalars(record: Mapping[str, Any], skip: tuple[str, ...] = STEP_KEYS
            ) -> Iterator[tuple[str, float]]:
    """``(name, value)`` of every finite number of a record; a dict of numbers one level down
    as ``name/key``; booleans as 0/1."""
    for name, value in record.items():
        if name in skip:
            continue
        if isinstance(value, Mapping):
            for key, inner in value.items():
                number = _number(inner)
                if number is not None:
                    yield f"{name}/{key}", number
        else:
            number = _number(value)
            if number is not None:
                yield name, number


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)) and math.isfinite(value):
        return float(value)
    return None


def step_of(record: Mapping[str, Any], index: int) -> int:
    """A history record's step: its round (or iteration), else its position."""
    for key in STEP_KEYS:
        if isinstance(record.get(key), (int, float)) and not isinstance(record[key], bool):
            return int(record[key])
    return index


def flat_params(data: Mapping[str, Any], prefix: str = "data.") -> dict[str, str]:
    """A nested record as ``{"data.partitioner.params.alpha": "0.5", …}`` (lists as text)."""
    out: dict[str, str] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flat_params(value, f"{name}."))
        else:
            out[name] = json.dumps(value) if isinstance(value, (list, tuple)) else str(value)
    return out


def store_uri(config: Mapping[str, Any]) -> str | None:
    """The MLflow store of a run: run config ``tracker-uri``, else ``MLFLOW_TRACKING_URI``."""
    return str(config.get("tracker-uri") or "") or os.environ.get("MLFLOW_TRACKING_URI") or None


def experiment_id(client: Any, config: Mapping[str, Any]) -> str:
    """The id of the run's experiment (created when new)."""
    name = (str(config.get("tracker-experiment") or "")
            or os.environ.get("MLFLOW_EXPERIMENT_NAME") or EXPERIMENT)
    experiment = client.get_experiment_by_name(name)
    return (experiment.experiment_id if experiment is not None
            else client.create_experiment(name))


class Tracker:
    """What :class:`fedclust.results.RunRecorder` calls: :meth:`log_round` per history record,
    :meth:`final` before ``summary.json`` is written (so that it stays the last file of the
    results folder), :meth:`finish` after it, or :meth:`fail`; :meth:`describe` is what
    ``summary.json`` records of it."""

    def describe(self) -> dict[str, Any]:  # noqa: D102
        return {}

    def log_round(self, record: Mapping[str, Any], index: int = 0) -> None:  # noqa: D102
        raise NotImplementedError

    def final(self, summary: Mapping[str, Any]) -> None:  # noqa: D102
        raise NotImplementedError

    def finish(self, summary: Mapping[str, Any], folder: Path) -> None:  # noqa: D102
        raise NotImplementedError

    def fail(self, exc: BaseException) -> None:  # noqa: D102
        raise NotImplementedError


class MLflowTracker(Tracker):
    """One MLflow run (through :class:`mlflow.MlflowClient`: no global active run, so runs in
    one process never mix)."""

    def __init__(self, folder: Path, config: Mapping[str, Any],
                 data: Mapping[str, Any] | None = None) -> None:
        from mlflow import MlflowClient
        from mlflow.entities import Param, RunTag

        _quiet("mlflow", "alembic")     # store set-up chatter a user cannot act on

        self.uri = store_uri(config)
        self.client = MlflowClient(tracking_uri=self.uri)
        parent = str(config.get("tracker-parent") or "")
        exp_id = (self.client.get_run(parent).info.experiment_id if parent
                  else experiment_id(self.client, config))
        data = dict(data or {})
        tags = {"fedclust.method": str(config.get("method")),
                "fedclust.dataset": str(data.get("dataset") or config.get("dataset")),
                "fedclust.seed": str(config.get("seed")), "fedclust.run_dir": str(folder),
                **({"mlflow.parentRunId": parent} if parent else {})}
        name = str(config.get("tracker-run-name") or "") or folder.name
        self.run_id = self.client.create_run(exp_id, run_name=name, tags=tags).info.run_id
        params = [Param(k, str(v)[:6000]) for k, v in
                  {**own_config(config), **flat_params(data)}.items()]
        for i in range(0, len(params), _BATCH):
            self.client.log_batch(self.run_id, params=params[i:i + _BATCH])
        self.client.log_batch(self.run_id, tags=[RunTag("mlflow.source.name", "fedclust")])
        self.experiment_id = exp_id
        self.last_step = 0
        LOG.info("mlflow: run %s (%s) in experiment %s of %s", self.run_id, name, exp_id,
                 self.client.tracking_uri)

    def describe(self) -> dict[str, Any]:  # noqa: D102
        return {"kind": "mlflow", "uri": str(self.client.tracking_uri),
                "experiment_id": str(self.experiment_id), "run_id": self.run_id}

    def _log(self, values: list[tuple[str, float]], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(k, v, now, step) for k, v in values]
        for i in range(0, len(metrics), 1000):
            self.client.log_batch(self.run_id, metrics=metrics[i:i + 1000])

    def log_round(self, record: Mapping[str, Any], index: int = 0) -> None:  # noqa: D102
        self.last_step = step_of(record, index)
        self._log(list(scalars(record)), self.last_step)

    def final(self, summary: Mapping[str, Any]) -> None:  # noqa: D102
        final = [*scalars(summary.get("metrics") or {}, skip=()),
                 *scalars({"wall_time_s": summary.get("wall_time_s")})]
        self._log(final, self.last_step)

    def finish(self, summary: Mapping[str, Any], folder: Path) -> None:  # noqa: D102
        log_folder(self.client, self.run_id, folder)
        self.client.set_terminated(self.run_id, "FINISHED")

    def fail(self, exc: BaseException) -> None:  # noqa: D102
        self.client.set_tag(self.run_id, "fedclust.error", f"{type(exc).__name__}: "
                                                             f"{str(exc)[:4000]}")
        self.client.set_terminated(self.run_id, "KILLED" if isinstance(exc, KeyboardInterrupt)
                                   else "FAILED")


class TensorBoardTracker(Tracker):
    """Scalars in ``<folder>/tensorboard/`` through ``torch.utils.tensorboard``."""

    SUBDIR = "tensorboard"

    def __init__(self, folder: Path, config: Mapping[str, Any],
                 data: Mapping[str, Any] | None = None) -> None:
        from torch.utils.tensorboard import SummaryWriter

        from fedclust.outputs import make_dirs, record_tree

        self.dir = make_dirs(folder / self.SUBDIR)
        self.writer = SummaryWriter(log_dir=str(self.dir))
        rows = "\n".join(f"| {k} | {v} |" for k, v in own_config(config).items())
        self.writer.add_text("run config", f"| key | value |\n|---|---|\n{rows}", 0)
        self.writer.flush()
        record_tree(self.dir)      # the event file, in the folder's manifest
        self.last_step = 0

    def log_round(self, record: Mapping[str, Any], index: int = 0) -> None:  # noqa: D102
        self.last_step = step_of(record, index)
        for name, value in scalars(record):
            self.writer.add_scalar(name, value, self.last_step)

    def final(self, summary: Mapping[str, Any]) -> None:  # noqa: D102
        for name, value in scalars(summary.get("metrics") or {}, skip=()):
            self.writer.add_scalar(f"final/{name}", value, self.last_step)
        self.writer.add_scalar("final/wall_time_s", float(summary.get("wall_time_s", 0.0)),
                               self.last_step)
        self._close()

    def finish(self, summary: Mapping[str, Any], folder: Path) -> None:  # noqa: D102
        pass

    def fail(self, exc: BaseException) -> None:  # noqa: D102
        self.writer.add_text("error", f"{type(exc).__name__}: {str(exc)[:4000]}",
                             self.last_step)
        self._close()

    def _close(self) -> None:
        from fedclust.outputs import record_tree

        self.writer.close()
        record_tree(self.dir)


def log_folder(client: Any, run_id: str, folder: Path, names: tuple[str, ...] = ()) -> None:
    """The results folder's artifacts (or only the entries ``names``): ``summary.json``,
    ``history.jsonl``, the plots, arrays and tables, and the clients' folders."""
    paths = ([folder / n for n in names] if names else
             [*(folder / n for n in ARTIFACTS),
              *sorted(p for g in ARTIFACT_GLOBS for p in folder.glob(g)),
              *(folder / d for d in ARTIFACT_DIRS)])
    for path in paths:
        if path.is_file():
            client.log_artifact(run_id, str(path))
        elif path.is_dir():
            client.log_artifacts(run_id, str(path), artifact_path=path.name)


def log_after(summary: Mapping[str, Any], folder: Path, names: tuple[str, ...]) -> None:
    """Add the entries ``names`` of a finished run's folder to its tracker run (what
    ``fedclust.simulate`` writes after the run: ``clusters.png``, ``clients/``); a failure is
    logged, the run's results stand."""
    info = summary.get("tracker") or {}
    if info.get("kind") != "mlflow":
        return
    try:
        from mlflow import MlflowClient

        log_folder(MlflowClient(tracking_uri=info.get("uri")), str(info["run_id"]), folder,
                   names)
    except Exception as exc:
        LOG.warning("tracker: %s not logged to MLflow run %s (%s: %s)", ", ".join(names),
                    info.get("run_id"), type(exc).__name__, json.dumps(str(exc)[:300]))


def open_parent(config: Mapping[str, Any], name: str, params: Mapping[str, Any]) -> str:
    """An MLflow run that a sweep's jobs are logged under (``tracker-parent``); its id."""
    from mlflow import MlflowClient
    from mlflow.entities import Param

    _quiet("mlflow", "alembic")
    client = MlflowClient(tracking_uri=store_uri(config))
    run = client.create_run(experiment_id(client, config), run_name=name,
                            tags={"fedclust.sweep": "true", "mlflow.source.name": "fedclust"})
    client.log_batch(run.info.run_id, params=[Param(k, str(v)[:6000])
                                              for k, v in params.items()])
    return run.info.run_id


def close_parent(config: Mapping[str, Any], run_id: str, failed: int, jobs: int) -> None:
    """End a sweep's parent run: FINISHED, or FAILED when a job did not finish."""
    from mlflow import MlflowClient
    from mlflow.entities import Metric

    client = MlflowClient(tracking_uri=store_uri(config))
    now = int(time.time() * 1000)
    client.log_batch(run_id, metrics=[Metric("jobs", jobs, now, 0),
                                      Metric("jobs_failed", failed, now, 0)])
    client.set_terminated(run_id, "FAILED" if failed else "FINISHED")


def _quiet(*names: str) -> None:
    """Warnings and errors only from these loggers (MLflow sets its own to INFO on import),
    unless the user chose MLflow's level with ``MLFLOW_LOGGING_LEVEL``."""
    if os.environ.get("MLFLOW_LOGGING_LEVEL"):
        return
    for name in names:
        logging.getLogger(name).setLevel(logging.WARNING)


def open_tracker(name: str, folder: Path, config: Mapping[str, Any],
                 data: Mapping[str, Any] | None = None) -> Tracker | None:
    """The tracker ``name`` for a run writing to ``folder`` (None for ``""``); ``data``: what
    the run clusters (:func:`fedclust.results.data_record`), logged with the params.

    Raises
    ------
    ConfigError
        An unknown name, a missing package, or a store that cannot be opened (the message says
        which and how to fix it), before the run's work starts.
    """
    if not name:
        return None
    if name not in PACKAGES:
        raise ConfigError(f"run config 'tracker' = {name!r} is invalid. Allowed: "
                          f"{', '.join(repr(t) for t in TRACKERS)}")
    check({"tracker": name})
    cls = MLflowTracker if name == "mlflow" else TensorBoardTracker
    try:
        return cls(folder, config, data or {})
    except ConfigError:
        raise
    except Exception as exc:    # an unreachable or damaged store: one line, before any work
        detail = f"{type(exc).__name__}: {' '.join(str(exc).split())[:500]}"
        fix = ("point run config tracker-uri (or MLFLOW_TRACKING_URI) at a store this "
               "process can write (a sqlite:////abs/path.db or a tracking server), or pass "
               "tracker=\"\"" if name == "mlflow" else "pass tracker=\"\"")
        where = (f" (store {store_uri(config) or 'MLflow default'!r})"
                 if name == "mlflow" else "")
        raise ConfigError(f"tracker {name!r} could not be opened{where}: {detail}. "
                          f"Fix: {fix}") from None


def safe(tracker: Tracker | None, what: str, *args: Any) -> Tracker | None:
    """Call ``tracker.<what>(*args)``; a tracker that fails mid-run is logged and dropped (the
    run's own results are on disk) — returns the tracker, or None once it failed."""
    if tracker is None:
        return None
    try:
        getattr(tracker, what)(*args)
    except Exception as exc:
        LOG.warning("tracker %s failed in %s (%s: %s): the run goes on without it; its "
                    "results folder is complete", type(tracker).__name__, what,
                    type(exc).__name__, json.dumps(str(exc)[:300]))
        return None
    return tracker
