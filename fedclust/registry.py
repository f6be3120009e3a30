"""Which methods exist and where their run-config keys live (data only).

Each entry names, as import paths inside :mod:`fedclust` (nothing heavy is imported until a
method is chosen), the run-config keys a method adds and its extra cross-key checks. The other
layers keep their own half of the table: the server loops and preflight checks in
:data:`strategies.methods.SERVER`, the ClientApp handler modules in
:data:`client_apps.app.HANDLERS`.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class MethodSpec:
    keys: tuple[str, ...]
    cross_checks: tuple[str, ...] = ()


METHODS: dict[str, MethodSpec] = {
    "exact-fcm": MethodSpec(keys=("fedclust.fcm.keys:FCM_KEYS",),
                            cross_checks=("fedclust.fcm.keys:check_fcm",)),
    "fedfcm": MethodSpec(keys=("fedclust.fedfcm.keys:FEDFCM_KEYS",),
                         cross_checks=("fedclust.fedfcm.keys:check_fedfcm",)),
    "fedcref": MethodSpec(keys=("fedclust.fedcref.keys:KEYS",),
                          cross_checks=("fedclust.fedcref.keys:check",)),
    "emdcfl": MethodSpec(keys=("fedclust.emdcfl.keys:KEYS",),
                         cross_checks=("fedclust.emdcfl.keys:check",)),
}
