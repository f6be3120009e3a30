"""Experiment trackers: run-config key ``tracker`` = ``""`` | ``"mlflow"`` | ``"tensorboard"``.

The run's results folder stays the record of the run; a tracker copies it, as the run goes, to
where ML users look:

- ``mlflow``: one MLflow run per fedclust run in the experiment ``fedclust`` (or
  ``MLFLOW_EXPERIMENT_NAME``) of the store ``MLFLOW_TRACKING_URI`` names (unset: MLflow's
  default in the server's working directory: ``./mlflow.db`` with artifacts under
  ``./mlruns`` for MLflow ≥ 3.7, ``./mlruns`` before). Params: the run config (the run's
  method's keys and the common keys); metrics: every number of each ``history.jsonl`` record
  with ``step`` = its round (FedCRef: its iteration; a dict of numbers, e.g. FedFCM's shift per
  K, as ``shift/<K>``), then the summary's numeric metrics and ``wall_time_s`` at the last
  step; artifacts: ``summary.json``, ``history.jsonl`` and the PNG plots. A run that fails is
  marked FAILED.
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
_BATCH = 100     # MLflow takes at most 100 params (1000 metrics) per request


def check(cfg: Mapping[str, Any]) -> None:
    """Refuse a ``tracker`` whose package is not installed on the server, before any work.

    Raises
    ------
    ConfigError
        The package is missing (the message names the pip extra).
    """
    name = cfg.get("tracker", "")
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


class Tracker:
    """What :class:`fedclust.results.RunRecorder` calls: :meth:`log_round` per history record,
    :meth:`final` before ``summary.json`` is written (so that it stays the last file of the
    results folder), :meth:`finish` after it, or :meth:`fail`."""

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

        self.uri = os.environ.get("MLFLOW_TRACKING_URI") or None
        self.client = MlflowClient(tracking_uri=self.uri)
        name = os.environ.get("MLFLOW_EXPERIMENT_NAME") or EXPERIMENT
        experiment = self.client.get_experiment_by_name(name)
        exp_id = (experiment.experiment_id if experiment is not None
                  else self.client.create_experiment(name))
        tags = {"fedclust.method": str(config.get("method")),
                "fedclust.dataset": str(config.get("dataset")),
                "fedclust.seed": str(config.get("seed")), "fedclust.run_dir": str(folder)}
        self.run_id = self.client.create_run(exp_id, run_name=folder.name,
                                             tags=tags).info.run_id
        params = [Param(k, str(v)[:6000]) for k, v in own_config(config).items()]
        for i in range(0, len(params), _BATCH):
            self.client.log_batch(self.run_id, params=params[i:i + _BATCH])
        self.client.log_batch(self.run_id, tags=[RunTag("mlflow.source.name", "fedclust")])
        self.last_step = 0
        LOG.info("mlflow: run %s in experiment %r of %s", self.run_id, name,
                 self.client.tracking_uri)

    def _log(self, values: list[tuple[str, float]], step: int) -> None:
        import time

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
        for path in [*(folder / n for n in ARTIFACTS), *sorted(folder.glob("*.png"))]:
            if path.is_file():
                self.client.log_artifact(self.run_id, str(path))
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
        fix = ("point MLFLOW_TRACKING_URI at a store this process can write (a "
               "sqlite:///path.db or a tracking server), or pass tracker=\"\""
               if name == "mlflow" else "pass tracker=\"\"")
        where = (f" (MLFLOW_TRACKING_URI={os.environ.get('MLFLOW_TRACKING_URI', '')!r})"
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
