"""Each run-config parameter is declared once: the Settings field (``param``) is the key, the
Strategy's signature and docstring, and the typed value the loops read."""

import dataclasses
import importlib.util
import inspect
from pathlib import Path

import pytest

from fedclust.config import ConfigError, all_keys, validate
from fedclust.emdcfl.keys import EMDCFLSettings
from fedclust.fcm.keys import FCM_KEYS, FCMSettings
from fedclust.fedfcm.keys import FedFCMSettings
from strategies.methods import EMDCFL, STRATEGIES, ExactFCM, FedFCM, from_run_config

ROOT = Path(__file__).resolve().parents[2]


def _count_script():
    spec = importlib.util.spec_from_file_location(
        "count_key_declarations", ROOT / "scripts" / "count_key_declarations.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_keys_are_generated_from_the_settings_fields():
    assert [k.name for k in FCM_KEYS] == [f"fcm.{f.name.replace('_', '-')}"
                                          for f in dataclasses.fields(FCMSettings)][:len(FCM_KEYS)]
    assert FCMSettings.key_of("n_clusters") == FCMSettings.clusters_key == "fcm.n-clusters"
    assert FedFCMSettings.clusters_key == "fedfcm.k-max"
    assert EMDCFLSettings.key_of("solver_name") == "emdcfl.solver"
    defaults = {k.name: k.default for k in all_keys()}
    assert FCMSettings().n_clusters == defaults["fcm.n-clusters"]
    assert EMDCFLSettings().epsilon == defaults["emdcfl.epsilon"] == "auto"


def test_a_settings_object_is_checked_and_typed_as_the_run_config_is():
    with pytest.raises(ConfigError, match=r"'fcm.n-clusters' = 1 .*Allowed: a int in \[2"):
        FCMSettings(n_clusters=1)
    with pytest.raises(ConfigError, match="'fedfcm.averaging'"):
        FedFCMSettings(averaging="median")
    s = FCMSettings(m=2, privacy_guard="false")
    assert s.m == 2.0 and isinstance(s.m, float) and s.privacy_guard is False
    assert EMDCFLSettings(epsilon="0.1").epsilon == 0.1
    # the flat run config the nodes get validates back to the same settings
    for settings in (FCMSettings(n_clusters=3, scaling="none"), FedFCMSettings(k_max=4),
                     EMDCFLSettings(epsilon=0.2, solver_name="sinkhorn", dataset="rotdigits")):
        method = {FCMSettings: "exact-fcm", FedFCMSettings: "fedfcm",
                  EMDCFLSettings: "emdcfl"}[type(settings)]
        cfg = validate({"method": method, **settings.to_config()})
        assert type(settings).from_config(cfg) == settings


def test_the_strategies_take_settings_and_their_signature_comes_from_the_fields():
    s = FCMSettings(n_clusters=3)
    strategy = ExactFCM(settings=s, m=1.5)
    assert strategy.settings == dataclasses.replace(s, m=1.5)
    assert ExactFCM(3).settings.n_clusters == 3            # positional, as before
    assert EMDCFL(solver="sinkhorn").settings.solver_name == "sinkhorn"
    with pytest.raises(ConfigError, match=r"ExactFCM\(settings=...\) got a FedFCMSettings"):
        ExactFCM(settings=FedFCMSettings())
    with pytest.raises(ConfigError, match=r"ExactFCM: run config 'fcm.m' = 0.5"):
        ExactFCM(settings=s, m=0.5)
    defaults = {k.name: k.default for k in all_keys()}
    for cls in STRATEGIES.values():
        params = inspect.signature(cls).parameters
        assert params["settings"].kind is inspect.Parameter.KEYWORD_ONLY
        for name, key in cls.param_keys().items():
            assert params[name].default == defaults[key], (cls.__name__, name)
            assert f"    {name} : " in cls.__doc__ and f"``{key}``" in cls.__doc__


def test_from_run_config_builds_the_settings_of_the_validated_run_config():
    strategy, rest = from_run_config({"method": "fedfcm", "fedfcm.k-max": "4", "seed": 2})
    assert isinstance(strategy, FedFCM) and rest == {"seed": 2}
    assert strategy.settings == FedFCMSettings(k_max=4, seed=2)
    assert strategy.params["k_max"] == 4 and strategy.run_config()["fedfcm.k-max"] == 4


def test_the_count_script_finds_every_kind_of_repeated_declaration(tmp_path):
    count = _count_script()
    layer = tmp_path / "fedclust"
    layer.mkdir()
    (layer / "a.py").write_text(
        'Key("fcm.m", float, 2.0, "fuzzifier")\n'
        'def f(cfg):\n    return cfg.get("fcm.m", 2.0), cfg.get("fcm.epsilon")\n'
        '@settings(prefix="fcm.")\nclass S:\n    n_clusters: int = param(4, "C")\n'
        '    seed: int = common("seed")\n')
    found = count.declarations(tmp_path, {"fcm.m", "fcm.epsilon", "fcm.n-clusters", "seed"})
    assert sorted(kind for _, _, kind in found["fcm.m"]) == [".get(key, default)", "Key(...)"]
    assert [kind for _, _, kind in found["fcm.n-clusters"]] == ["param field"]
    assert "fcm.epsilon" not in found and "seed" not in found     # a use, a reference


def test_each_run_config_key_is_declared_in_exactly_one_place():
    """``scripts/count_key_declarations.py``: no hand-written Key list, no Settings field filled
    by hand, no Strategy default and no lookup that writes a key's default again."""
    count = _count_script()
    keys = [k.name for k in all_keys()]
    found = count.declarations(ROOT, set(keys))
    wrong = {k: found.get(k, []) for k in keys if len(found.get(k, [])) != 1}
    assert not wrong, wrong
