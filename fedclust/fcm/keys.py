"""Run-config keys of exact federated FCM (``fcm.*``), the typed settings built from them
(:class:`FCMSettings`), and the checks the FCM family shares: the fuzzifier against underflow,
clusters against rows, the server's preflight.

FedFCM's keys and settings are :mod:`fedclust.fedfcm.keys`.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from typing import Any, ClassVar

from fedclust.common import common, setting
from fedclust.data.capacity import Capacity, check_distinct
from fedclust.fcm import M_MAX, MAX_UNDERFLOW_DIGITS, SECURE_UNDERFLOW_DIGITS, fuzzifier_problem
from fedclust.schema import Key, KeyedSettings, KeyName, param, require, settings


class FamilySettings(KeyedSettings):
    """What the two FCM-family settings share: the privacy guard of paper 004 §4.2 and the
    names of the keys that messages about it quote."""

    method: ClassVar[str]         #: run config ``method``
    clusters_key: ClassVar[str]   #: the key of :attr:`clusters`
    guard_key: ClassVar[str] = KeyName("privacy_guard")   # type: ignore[assignment]
    clusters_symbol: ClassVar[str]   #: the symbol of :attr:`clusters` in messages
    m_key: ClassVar[str] = KeyName("m")   # type: ignore[assignment]
    privacy_guard: bool
    m: float

    @property
    def clusters(self) -> int:
        """The most clusters the run fits (exact FCM: ``C``; FedFCM: ``K`` max)."""
        raise NotImplementedError

    @property
    def hides_rows(self) -> bool:
        """Whether the nodes keep their row counts to themselves (exact FCM with SecAgg+)."""
        return False

    def guard_bound(self, n_features: int) -> float | None:
        """``C(F+1)/F`` when the privacy guard is on (None when off): a client with at most
        that many rows sends no statistic in any phase."""
        if not self.privacy_guard:
            return None
        return self.clusters * (n_features + 1) / n_features

    def withholds(self, n_rows: int, n_features: int) -> bool:
        """Whether the privacy guard keeps a client of ``n_rows × n_features`` silent."""
        bound = self.guard_bound(n_features)
        return bound is not None and n_rows <= bound


@settings(prefix="fcm.")
class FCMSettings(FamilySettings):
    """Exact federated FCM (paper 004), typed: each field declares its run-config key
    ``fcm.<field>`` (``-`` for ``_``), or holds a common key. ``C`` is :attr:`n_clusters`,
    ``λ`` is :attr:`m`, ``γ`` is :attr:`fraction` (``⌈γM⌉`` of the ``M`` clients per round)."""

    method: ClassVar[str] = "exact-fcm"
    clusters_key: ClassVar[str] = KeyName("n_clusters")   # type: ignore[assignment]
    clusters_symbol: ClassVar[str] = "C"

    n_clusters: int = param(4, "number of clusters C", low=2)
    m: float = param(2.0, "fuzzifier m (lambda in paper 004); m -> 1 is hard k-means; "
                     f"at most {M_MAX:g} and m*log10(C) <= {MAX_UNDERFLOW_DIGITS:g} (secure "
                     f"aggregation: {SECURE_UNDERFLOW_DIGITS:g}; larger m: u^m underflows)",
                     low=1.0, high=M_MAX, low_open=True)
    epsilon: float = param(0.005, "stop when ||V(t+1) - V(t)||_F < epsilon", low=0.0)
    max_rounds: int = param(30, "maximum federated rounds", low=1)
    fraction: float = param(1.0, "participation fraction gamma, resampled every round",
                            low=0.0, high=1.0, low_open=True)
    privacy_guard: bool = param(True, "a client with N <= C(F+1)/F points sends no statistic "
                                "in any phase: no bounds, sums, objective or evaluation table "
                                "(paper 004 §4.2)")
    secure_aggregation: bool = param(False, "sum U and WS with SecAgg+ so the server sees only "
                                     "the totals (deployment issue)")
    incremental: bool = param(False, "keep every client's latest U and WS on the server and "
                              "update from all of them (incremental EM): with fcm.fraction < 1 "
                              "the fixed point is centralized FCM's; not with "
                              "fcm.secure-aggregation")
    scaling: str = common("scaling")
    seed: int = common("seed", "draws the initial centers and each round's clients")
    evaluate: bool = common("evaluate", "collect the label × cluster tables for the eval_* "
                            "metrics")

    @property
    def clusters(self) -> int:
        return self.n_clusters

    @property
    def hides_rows(self) -> bool:
        return self.secure_aggregation


FCM_KEYS: list[Key] = FCMSettings.keys()


def check_fcm(cfg: dict[str, Any]) -> None:
    require(cfg["fcm.n-clusters"] >= 2, "fcm.n-clusters", cfg["fcm.n-clusters"],
            "an int >= 2", "set fcm.n-clusters to the number of clusters you expect")
    check_m(cfg, "fcm.m", cfg["fcm.n-clusters"], "fcm.n-clusters",
             secure=cfg["fcm.secure-aggregation"])
    require(not (cfg["fcm.incremental"] and cfg["fcm.secure-aggregation"]), "fcm.incremental",
            cfg["fcm.incremental"], "false when fcm.secure-aggregation=true: the incremental "
            "rule keeps each client's latest U and WS on the server and replaces only the "
            "answering clients' part, but SecAgg+ reveals only the round's sum over the "
            "sampled clients, so no client's part can be replaced",
            "set fcm.incremental=false to keep SecAgg+ (paper 004's rule), or "
            "fcm.secure-aggregation=false to use the incremental rule on plain sums, or "
            "fcm.fraction=1 (every client in every round: SecAgg+ alone is then exact)")
    n = int(setting(cfg, "num-clients") or 0)
    if cfg["fcm.secure-aggregation"] and n:      # the rule the first secure round applies
        per_round = max(1, math.ceil(cfg["fcm.fraction"] * n))
        require(per_round >= 2, "fcm.fraction", cfg["fcm.fraction"],
                f"at least 2 of the {n} clients per round with fcm.secure-aggregation=true "
                f"(SecAgg+ needs at least 2: a lone client's masked sum is its own); this "
                f"samples {per_round}",
                f"raise fcm.fraction to {min(1.0, 2 / n):.3g} or more, or use more clients")


def check_m(cfg: dict[str, Any], key: str, clusters: int, clusters_key: str,
             secure: bool = False) -> None:
    """The fuzzifier against underflow of u^m for the largest cluster count (float64, or the
    fixed-point sums of secure aggregation)."""
    problem = fuzzifier_problem(cfg[key], clusters, secure)
    if problem is not None:
        limit = SECURE_UNDERFLOW_DIGITS if secure else MAX_UNDERFLOW_DIGITS
        m_max = min(M_MAX, limit / math.log10(max(clusters, 2)))
        with_secure = " and fcm.secure-aggregation=true" if secure else ""
        require(False, key, cfg[key], f"a float in (1, {m_max:.3g}] with {clusters_key} = "
                f"{clusters}{with_secure} ({problem})", f"pass {key}=2.0 (the usual "
                f"fuzzifier), or fewer clusters")


def capacity(cfg: Mapping[str, Any], settings: type[FamilySettings] | None = None
             ) -> Capacity | None:
    """What the run's rows must hold: ``C`` clusters (``fcm.n-clusters``; FedFCM passes its
    settings: ``K`` max) on the pooled rows. None when the key is not set."""
    settings = settings or FCMSettings
    key = settings.clusters_key
    return Capacity(settings.method, key, int(cfg[key])) if key in cfg else None


def preflight(cfg: dict[str, Any], settings: type[FamilySettings] | None = None) -> None:
    """Server-side check before any work: the dataset exists, holds the run's clusters
    (:func:`capacity` of ``settings``, exact FCM's by default) and can be partitioned as
    asked.

    ``dataset="local"`` means every node reads its own ``data-path`` (deployment); nothing to
    check on the server then.
    """
    if cfg["dataset"] == "local":
        return
    if cfg["dataset"] == "bank" and cfg["scaling"] != "standard":
        logging.getLogger("fedclust").warning(
            "dataset=bank with scaling=%s: paper 003 standardizes the bank features "
            "(pass scaling=standard, as conf/dataset/bank.yaml does)", cfg["scaling"])
    from fedclust.data.partition import make_partition
    from fedclust.data.tabular import load_dataset

    ds = load_dataset(cfg)
    check_distinct(capacity(cfg, settings), [ds.x], f"dataset {cfg['dataset']!r}")
    if cfg["num-clients"]:   # 0: the engine's node count, checked when the run starts
        make_partition(cfg["partition.kind"], ds, cfg["num-clients"], cfg["seed"],
                       cfg["partition.alpha"], cfg["partition.column"], options=cfg)
