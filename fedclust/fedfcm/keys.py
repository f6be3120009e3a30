"""Run-config keys of FedFCM with FedFuzzDB and the choice of K (``fedfcm.*``, paper 003),
and the typed settings built from them (:class:`FedFCMSettings`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from fedclust.data.capacity import Capacity
from fedclust.fcm import M_MAX, MAX_UNDERFLOW_DIGITS
from fedclust.fcm import keys as fcm_keys
from fedclust.fcm.keys import FamilySettings, check_m
from fedclust.schema import Key, require

FEDFCM_KEYS: list[Key] = [
    Key("fedfcm.k-min", int, 2, "smallest number of clusters K tried", low=2),
    Key("fedfcm.k-max", int, 6, "largest number of clusters K tried", low=2),
    Key("fedfcm.m", float, 2.0, f"fuzzifier m; at most {M_MAX:g} and m*log10(K) <= "
        f"{MAX_UNDERFLOW_DIGITS:g} (larger m: u^m underflows)", low=1.0, high=M_MAX,
        low_open=True),
    Key("fedfcm.averaging", str, "kmeans", "global update: k-means averaging (paper 003) or "
        "support-weighted federated averaging", choices=("kmeans", "fedavg")),
    Key("fedfcm.tol", float, 0.01, "stop when sum_k ||c_k(t) - c_k(t+1)|| <= tol", low=0.0),
    Key("fedfcm.max-rounds", int, 10, "maximum federated rounds per K", low=1),
    Key("fedfcm.local-tol", float, 1e-3, "local FCM stops when ||U(t+1) - U(t)||_F <= local-tol",
        low=0.0),
    Key("fedfcm.local-max-iter", int, 50, "maximum local FCM iterations per round", low=1),
    Key("fedfcm.local-index", bool, True,
        "clients also report their local (non-federated) fuzzy DB index per K"),
    Key("fedfcm.local-k-max", int, 0, "largest K of the local index (0 = fedfcm.k-max; else "
        "at least 2 and at least fedfcm.k-min); paper 003 Table 1 uses 5", low=0,
        check=lambda v: ("1 is not a cluster count: the local index needs K >= 2 (0 means "
                         "fedfcm.k-max)") if v == 1 else None),
    Key("fedfcm.p", float, 2.0, "Minkowski p of the center distances M_ij", low=1.0),
    Key("fedfcm.q", float, 1.0, "power q of the spread S_i", low=1.0),
    Key("fedfcm.privacy-guard", bool, True,
        "a client with N <= K(F+1)/F points (K = fedfcm.k-max) sends no statistic in any phase "
        "(paper 004 §4.2's rule applied to FedFCM: a tiny client's local centers are its rows)"),
]


@dataclass(frozen=True)
class FedFCMSettings(FamilySettings):
    """FedFCM with FedFuzzDB and the choice of K (paper 003), typed, from a validated run
    config (:func:`fedclust.config.validate`; nothing here checks again).

    Attributes
    ----------
    k_min, k_max : int
        The K tried: ``k_min..k_max`` (``fedfcm.k-min``, ``fedfcm.k-max``).
    m : float
        Fuzzifier ``m`` (``fedfcm.m``).
    averaging : str
        ``"kmeans"`` (eq. 14, the paper) or ``"fedavg"`` (support-weighted) (``fedfcm.averaging``).
    tol : float
        A K stops when ``Σ_k ‖c_k(t) − c_k(t+1)‖ ≤ tol`` (``fedfcm.tol``).
    max_rounds : int
        Most federated rounds (``fedfcm.max-rounds``).
    local_tol : float
        Local FCM stops when ``‖U(t+1) − U(t)‖_F ≤ local_tol`` (``fedfcm.local-tol``).
    local_max_iter : int
        Most local FCM iterations per round (``fedfcm.local-max-iter``).
    local_index : bool
        Clients also report their own fuzzy DB index per K (``fedfcm.local-index``).
    local_k_max : int
        Largest K of the local index, 0 for ``k_max`` (``fedfcm.local-k-max``).
    p, q : float
        Minkowski ``p`` of the center distances, power ``q`` of the spread (``fedfcm.p``,
        ``fedfcm.q``).
    privacy_guard : bool
        A client with ``N ≤ K(F+1)/F`` rows, ``K = k_max``, sends no statistic
        (``fedfcm.privacy-guard``).
    scaling : str
        Federated feature scaling: ``"minmax"``, ``"standard"`` or ``"none"`` (``scaling``).
    seed : int
        Draws the initial centers; seeds k-means averaging and the local index (``seed``).
    evaluate : bool
        Collect the label × cluster tables for the ``eval_*`` metrics (``evaluate``).
    """

    method: ClassVar[str] = "fedfcm"
    clusters_key: ClassVar[str] = "fedfcm.k-max"
    guard_key: ClassVar[str] = "fedfcm.privacy-guard"
    clusters_symbol: ClassVar[str] = "K"
    m_key: ClassVar[str] = "fedfcm.m"

    k_min: int
    k_max: int
    m: float
    averaging: str
    tol: float
    max_rounds: int
    local_tol: float
    local_max_iter: int
    local_index: bool
    local_k_max: int
    p: float
    q: float
    privacy_guard: bool
    scaling: str
    seed: int
    evaluate: bool

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

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any]) -> FedFCMSettings:
        """The settings of a validated run config."""
        return cls(k_min=int(cfg["fedfcm.k-min"]), k_max=int(cfg["fedfcm.k-max"]),
                   m=float(cfg["fedfcm.m"]), averaging=str(cfg["fedfcm.averaging"]),
                   tol=float(cfg["fedfcm.tol"]), max_rounds=int(cfg["fedfcm.max-rounds"]),
                   local_tol=float(cfg["fedfcm.local-tol"]),
                   local_max_iter=int(cfg["fedfcm.local-max-iter"]),
                   local_index=bool(cfg["fedfcm.local-index"]),
                   local_k_max=int(cfg["fedfcm.local-k-max"]), p=float(cfg["fedfcm.p"]),
                   q=float(cfg["fedfcm.q"]), privacy_guard=bool(cfg["fedfcm.privacy-guard"]),
                   scaling=str(cfg["scaling"]), seed=int(cfg["seed"]),
                   evaluate=bool(cfg["evaluate"]))


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
