"""FedCRef's typed settings (``fedclust.fedcref.keys``): built once from the validated run
config, they carry every ``fedcref.*`` key, and no other module looks a key up by name."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

import pytest
from flwr.app import Context, RecordDict

from client_apps.base import RunConfig
from client_apps.common import run_settings
from fedclust.config import validate
from fedclust.fedcref.keys import KEYS, ClientSettings, Settings, SystemSettings

ROOT = Path(__file__).resolve().parents[2]
CFG = {"method": "fedcref", "dataset": "digits", "output-dir": "unused"}


class _Reads(dict):
    """A run config that records the keys read from it."""

    def __init__(self, values: dict[str, Any]) -> None:
        super().__init__(values)
        self.read: set[str] = set()

    def __getitem__(self, key: str) -> Any:
        self.read.add(key)
        return super().__getitem__(key)


def test_the_settings_carry_every_fedcref_key() -> None:
    cfg = _Reads(validate(CFG))
    Settings.from_config(cfg)
    ClientSettings.from_config(cfg)
    missing = sorted(k.name for k in KEYS if k.name not in cfg.read)
    assert not missing, f"fedcref keys no settings type reads: {missing}"


def test_the_settings_hold_the_configured_values() -> None:
    cfg = validate({**CFG, "fedcref.ae-hidden": "20,10", "fedcref.lambda": 0.5,
                    "fedcref.wire": "float16", "fedcref.max-iterations": 4, "seed": 3,
                    "num-clients": 7, "fedcref.samples-per-cluster": 0})
    s, loop = ClientSettings.from_config(cfg), Settings.from_config(cfg)
    assert s.hidden == [20, 10] and s.lam == 0.5 and s.wire == "float16" and s.seed == 3
    assert loop.max_iterations == 4 and loop.seed == 3
    assert s.system == SystemSettings.from_config(cfg) and s.system.num_clients == 7
    assert s.system.samples == 30     # automatic S of the small embedded 'digits'
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.lr = 1.0    # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        loop.tau = 0.5    # type: ignore[misc]


def test_a_node_builds_the_settings_once_per_run_config() -> None:
    def context(values: dict[str, Any], key: str | None) -> Context:
        cfg = RunConfig(values, key) if key is not None else values
        return Context(run_id=1, node_id=1, node_config={}, state=RecordDict(), run_config=cfg)

    a = {**CFG, "fedcref.lr": 0.01}
    b = {**CFG, "fedcref.lr": 0.02}
    first = run_settings(context(a, "digest-a"), ClientSettings.from_config)
    assert first.lr == 0.01
    assert run_settings(context(a, "digest-a"), ClientSettings.from_config) is first
    assert run_settings(context(b, "digest-b"), ClientSettings.from_config).lr == 0.02
    # a config without a digest (the node's own): found by its items
    plain = run_settings(context(dict(b), None), ClientSettings.from_config)
    assert plain.lr == 0.02
    assert run_settings(context(dict(b), None), ClientSettings.from_config) is plain


def test_no_module_looks_up_a_fedcref_key_by_name() -> None:
    lookup = re.compile(r"""\[\s*["']fedcref\.[a-z0-9-]+["']\s*\]""")
    keys = ROOT / "fedclust" / "fedcref" / "keys.py"
    found = [f"{path.relative_to(ROOT)}:{n}"
             for folder in ("fedclust", "strategies", "client_apps", "server_app")
             for path in sorted((ROOT / folder).rglob("*.py")) if path != keys
             for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
             if lookup.search(line)]
    assert not found, f"read the typed settings (fedclust.fedcref.keys) instead: {found}"
