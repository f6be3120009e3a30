"""Run-config keys of FedFCM with FedFuzzDB and the choice of K (``fedfcm.*``, paper 003),
and the typed settings built from them (:class:`FedFCMSettings`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from fedclust.common import common
from fedclust.data.capacity import Capacity
from fedclust.fcm import M_MAX, MAX_UNDERFLOW_DIGITS
from fedclust.fcm import keys as fcm_keys
from fedclust.fcm.keys import FamilySettings, check_m
from fedclust.schema import Key, KeyName, param, require, settings


def _local_k_max_problem(value: int) -> str | None:
    return ("1 is not a cluster count: the local index needs K >= 2 (0 means fedfcm.k-max)"
            if value == 1 else None)


@settings(prefix="fedfcm.")
class FedFCMSettings(FamilySettings):
    """FedFCM with FedFuzzDB and the choice of K (paper 003), typed: each field declares its
    run-config key ``fedfcm.<field>`` (``-`` for ``_``), or holds a common key. The K tried
    are ``k_min..k_max`` (:attr:`ks`); ``averaging="kmeans"`` is eq. 14, the paper's."""

    method: ClassVar[str] = "fedfcm"
    clusters_key: ClassVar[str] = KeyName("k_max")   # type: ignore[assignment]
    clusters_symbol: ClassVar[str] = "K"

    k_min: int = param(2, "smallest number of clusters K tried", low=2)
    k_max: int = param(6, "largest number of clusters K tried", low=2)
    m: float = param(2.0, f"fuzzifier m; at most {M_MAX:g} and m*log10(K) <= "
                     f"{MAX_UNDERFLOW_DIGITS:g} (larger m: u^m underflows)", low=1.0,
                     high=M_MAX, low_open=True)
    averaging: str = param("kmeans", "global update: k-means averaging (paper 003) or "
                           "support-weighted federated averaging", choices=("kmeans", "fedavg"))
    tol: float = param(0.01, "stop when sum_k ||c_k(t) - c_k(t+1)|| <= tol", low=0.0)
    max_rounds: int = param(10, "maximum federated rounds per K", low=1)
    local_tol: float = param(1e-3, "local FCM stops when ||U(t+1) - U(t)||_F <= local-tol",
                             low=0.0)
    local_max_iter: int = param(50, "maximum local FCM iterations per round", low=1)
    local_index: bool = param(True, "clients also report their local (non-federated) fuzzy DB "
                              "index per K")
    local_k_max: int = param(0, "largest K of the local index (0 = fedfcm.k-max; else at least "
                             "2 and at least fedfcm.k-min); paper 003 Table 1 uses 5", low=0,
                             check=_local_k_max_problem)
    p: float = param(2.0, "Minkowski p of the center distances M_ij", low=1.0)
    q: float = param(1.0, "power q of the spread S_i", low=1.0)
    privacy_guard: bool = param(True, "a client with N <= K(F+1)/F points (K = fedfcm.k-max) "
                                "sends no statistic in any phase (paper 004 §4.2's rule applied "
                                "to FedFCM: a tiny client's local centers are its rows)")
    scaling: str = common("scaling")
    seed: int = common("seed", "draws the initial centers; seeds k-means averaging and the "
                       "local index")
    evaluate: bool = common("evaluate", "collect the label × cluster tables for the eval_* "
                            "metrics")

    @property
    def clusters(self) -> int:
        return self.k_max

    @property
    def ks(self) -> list[int]:
        """Every K tried, ascending."""
        return list(range(self.k_min, self.k_max + 1))

    @property
    def local_k(self) -> int:
        """The largest K of the local index."""
        return self.local_k_max or self.k_max


FEDFCM_KEYS: list[Key] = FedFCMSettings.keys()


def check_fedfcm(cfg: dict[str, Any]) -> None:
    require(cfg["fedfcm.k-min"] <= cfg["fedfcm.k-max"], "fedfcm.k-min", cfg["fedfcm.k-min"],
            f"an int <= fedfcm.k-max ({cfg['fedfcm.k-max']})",
            "swap the two values or raise fedfcm.k-max")
    require(cfg["fedfcm.k-max"] - cfg["fedfcm.k-min"] <= 50, "fedfcm.k-max", cfg["fedfcm.k-max"],
            "at most 51 values of K in one run", "narrow [fedfcm.k-min, fedfcm.k-max]")
    local = cfg["fedfcm.local-k-max"]
    require(not cfg["fedfcm.local-index"] or local == 0 or local >= cfg["fedfcm.k-min"],
            "fedfcm.local-k-max", local, f"0 (= fedfcm.k-max) or an int >= fedfcm.k-min "
            f"({cfg['fedfcm.k-min']}): below it no K of the run gets a local index",
            "pass fedfcm.local-k-max=0, or fedfcm.local-index=false")
    largest = max(cfg["fedfcm.k-max"], local)
    check_m(cfg, "fedfcm.m", largest, "the largest K (fedfcm.k-max, fedfcm.local-k-max)")


def capacity(cfg: Mapping[str, Any]) -> Capacity | None:
    """What the run's rows must hold: ``fedfcm.k-max`` clusters on the pooled rows."""
    return fcm_keys.capacity(cfg, FedFCMSettings)


def preflight(cfg: dict[str, Any]) -> None:
    """The FCM family's server-side preflight (:func:`fedclust.fcm.keys.preflight`) with
    FedFCM's capacity."""
    fcm_keys.preflight(cfg, FedFCMSettings)
