"""The one table of fedclust's methods (data only).

Each entry names, as import paths (``"module:attribute"``; nothing is imported until a method
is chosen), every layer's part of a method:

- the core's: its run-config keys and cross-key checks (:mod:`fedclust.config`), the prefix of
  its keys, the predictor of ``fedclust predict`` (:mod:`fedclust.predict`), what
  ``fedclust report`` shows by default (:mod:`fedclust.report`), how many clusters its data
  must hold (:mod:`fedclust.data.capacity`) and how the preflight reads a site file
  (:mod:`fedclust.data.sites`);
- the server's: its server loop and its server-side preflight, which
  :mod:`strategies.run` loads;
- the nodes': the ClientApp handler module, which :mod:`client_apps.app` imports.

:func:`load` resolves an import path. The core never loads the server's or the nodes' column:
each layer loads its own (``tests/architecture/test_layers.py`` checks that every path resolves
and that the upper layers' paths sit in their columns only).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class MethodSpec:
    """One method.

    Attributes
    ----------
    keys : import paths of the lists of run-config keys the method adds
    cross_checks : import paths of its checks across keys (``cfg -> None``, raise on error)
    prefix : the prefix of its own keys (``fcm.``); another method's keys are refused
    predictor : import path of ``predict(run_dir, summary, x, options) -> Prediction``
    report_metrics : the metrics ``fedclust report`` shows by default
    needs : the modules the method imports beyond the core install (none: numpy, scipy,
        scikit-learn and Flower suffice), all from the pip extra ``extra``
    extra : the pip extra that installs ``needs`` (``pip install 'fedclust[<extra>]'``)
    capacity : import path of ``capacity(cfg) -> Capacity | None``, the clusters the run's
        data must hold (checked before the run: :mod:`fedclust.data.capacity`); "" for none
    site_reader : import path of ``reader(cfg, fmt, column) -> (path -> 2-D array)``, how
        the preflight of ``dataset="files"`` reads a site file as its node does
    server : import path of the server loop ``run(grid, cfg, recorder) -> metrics``
        (:mod:`strategies`)
    server_preflight : import path of the server's ``preflight(cfg)``, every check before the
        first message beyond the keys (data files exist …); "" for none
    handlers : the ClientApp module that registers the method's message handlers
        (:mod:`client_apps`)
    """

    keys: tuple[str, ...]
    cross_checks: tuple[str, ...]
    prefix: str
    predictor: str
    report_metrics: tuple[str, ...]
    needs: tuple[str, ...] = ()
    extra: str = ""
    capacity: str = ""
    site_reader: str = "fedclust.data.local:table_reader"
    server: str = ""
    server_preflight: str = ""
    handlers: str = ""

#: the columns that name the layers above the core (loaded by those layers only)
UPPER_COLUMNS = ("server", "server_preflight", "handlers")


#: the optional extras of the install and the packages (pip names) each adds; the import
#: name of POT is ``ot``
EXTRAS: dict[str, tuple[str, ...]] = {"nn": ("torch", "POT", "networkx")}


METHODS: dict[str, MethodSpec] = {
    "exact-fcm": MethodSpec(
        keys=("fedclust.fcm.keys:FCM_KEYS",), cross_checks=("fedclust.fcm.keys:check_fcm",),
        prefix="fcm.",
        predictor="fedclust.fcm.predict:predict_fcm",
        report_metrics=("eval_ari", "objective", "rounds", "converged"),
        capacity="fedclust.fcm.keys:capacity",
        server="strategies.fcm.exact:run", server_preflight="fedclust.fcm.keys:preflight",
        handlers="client_apps.fcm_handlers"),
    "fedfcm": MethodSpec(
        keys=("fedclust.fedfcm.keys:FEDFCM_KEYS",),
        cross_checks=("fedclust.fedfcm.keys:check_fedfcm",),
        prefix="fedfcm.",
        predictor="fedclust.fedfcm.predict:predict_fedfcm",
        report_metrics=("best_k", "elbow_k", "eval_ari_best_k", "objective_best_k"),
        capacity="fedclust.fedfcm.keys:capacity",
        server="strategies.fcm.fedfcm:run", server_preflight="fedclust.fedfcm.keys:preflight",
        handlers="client_apps.fcm_handlers"),
    "fedcref": MethodSpec(
        keys=("fedclust.fedcref.keys:KEYS",), cross_checks=("fedclust.fedcref.keys:check",),
        prefix="fedcref.",
        predictor="fedclust.fedcref.predict:predict_rows",
        report_metrics=("eval_acc_end", "communities", "iterations",
                        "eval_wrong_associations_pct"),
        needs=("torch", "networkx"), extra="nn",
        capacity="fedclust.fedcref.keys:capacity",
        site_reader="fedclust.data.local:pixel_reader",
        server="strategies.fedcref:run", server_preflight="strategies.fedcref:preflight",
        handlers="client_apps.fedcref_handlers"),
    "emdcfl": MethodSpec(
        keys=("fedclust.emdcfl.keys:KEYS",), cross_checks=("fedclust.emdcfl.keys:check",),
        prefix="emdcfl.",
        predictor="fedclust.emdcfl.predict:predict_rows",
        report_metrics=("eval_acc_mean", "eval_acc_worst", "eval_ari", "num_clusters"),
        needs=("torch", "ot"), extra="nn",
        site_reader="fedclust.emdcfl.keys:site_reader",
        server="strategies.emdcfl:run", server_preflight="strategies.emdcfl:preflight",
        handlers="client_apps.emdcfl_handlers"),
}


def load(path: str) -> Any:
    """The object an import path of the table names (``"package.module:attribute"``)."""
    module, _, attr = path.partition(":")
    return getattr(importlib.import_module(module), attr)
