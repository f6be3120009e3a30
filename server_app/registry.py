"""Which methods exist and where their pieces live.

Each entry names, as import paths (so nothing heavy is imported until a method is chosen):
the server loop (``runner``), the run-config keys it adds, extra cross-key checks, and the
ClientApp handler module that registers its actions.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class MethodSpec:
    runner: str
    keys: tuple[str, ...]
    handlers: str
    cross_checks: tuple[str, ...] = ()
    preflight: str = ""   # server-side check before any work (e.g. data files exist)


METHODS: dict[str, MethodSpec] = {
    "exact-fcm": MethodSpec(
        runner="strategies.exact_fcm:run",
        keys=("fedclust.fcm_keys:FCM_KEYS",),
        handlers="client_apps.fcm_handlers",
        cross_checks=("fedclust.fcm_keys:check_fcm",),
        preflight="fedclust.fcm_keys:preflight",
    ),
    "fedfcm": MethodSpec(
        runner="strategies.fedfcm:run",
        keys=("fedclust.fcm_keys:FEDFCM_KEYS",),
        handlers="client_apps.fcm_handlers",
        cross_checks=("fedclust.fcm_keys:check_fedfcm",),
        preflight="fedclust.fcm_keys:preflight",
    ),
    "fedcref": MethodSpec(
        runner="strategies.fedcref:run",
        keys=("fedclust.fedcref.keys:KEYS",),
        handlers="client_apps.fedcref_handlers",
        cross_checks=("fedclust.fedcref.keys:check",),
        preflight="strategies.fedcref:preflight",
    ),
    "emdcfl": MethodSpec(
        runner="strategies.emdcfl:run",
        keys=("fedclust.emdcfl.keys:KEYS",),
        handlers="client_apps.emdcfl_handlers",
        cross_checks=("fedclust.emdcfl.keys:check",),
        preflight="strategies.emdcfl:preflight",
    ),
}
