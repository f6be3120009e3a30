"""Bad input stops the run before any work, naming the key, the value, what is allowed, a fix."""

from pathlib import Path

import pytest

from fedclust.config import ConfigError, validate
from tests.fake_grid import run_server


@pytest.mark.parametrize("override, key", [
    ({"fcm.m": 1.0}, "fcm.m"),
    ({"fcm.m": 0.5}, "fcm.m"),
    ({"fcm.fraction": 0.0}, "fcm.fraction"),
    ({"fcm.fraction": 1.5}, "fcm.fraction"),
    ({"fcm.max-rounds": 0}, "fcm.max-rounds"),
    ({"method": "kmeans"}, "method"),
    ({"fcm.n-clusters": "three"}, "fcm.n-clusters"),
    ({"method": "fedfcm", "fedfcm.k-min": 5, "fedfcm.k-max": 3}, "fedfcm.k-min"),
    ({"partition.kind": "random"}, "partition.kind"),
    ({"num-clients": -1}, "num-clients"),
    ({"num-clients": 3, "min-clients": 4}, "min-clients"),
])
def test_out_of_range_values_are_rejected_with_key_value_allowed_and_fix(override, key):
    with pytest.raises(ConfigError) as err:
        validate(override)
    text = str(err.value)
    assert f"'{key}'" in text and "Allowed" in text and "Fix" in text
    assert repr(list(override.values())[-1]) in text or str(list(override.values())[-1]) in text


def test_unknown_key_is_rejected_with_a_suggestion():
    with pytest.raises(ConfigError, match=r"'m'.*did you mean.*fcm\.m"):
        validate({"m": 2})


def test_types_are_cast():
    cfg = validate({"fcm.m": 2, "evaluate": "false", "num-clients": 7.0})
    assert cfg["fcm.m"] == 2.0 and isinstance(cfg["fcm.m"], float)
    assert cfg["evaluate"] is False and cfg["num-clients"] == 7


@pytest.mark.parametrize("override, match", [
    ({"fcm.m": 1.0}, "fcm.m"),
    ({"dataset": "pendigits", "data-dir": "/nonexistent"}, "does not contain"),
    ({"dataset": "motivational", "partition.kind": "recipe", "num-clients": 4}, "num-clients=3"),
])
def test_server_stops_before_any_message_is_sent(tmp_path, override, match):
    out = tmp_path / "run"
    sent = []
    with pytest.raises(ValueError, match=match):
        run_server({"output-dir": str(out), **override}, num_nodes=3,
                   inspect=lambda msg, rep: sent.append(msg))
    assert sent == [] and not out.exists()


def test_pyproject_lists_every_run_config_key():
    from fedclust.config import sync_method_yamls, sync_pyproject

    root = Path(__file__).parents[2]
    assert not sync_pyproject(root / "pyproject.toml", check=True), (
        "run `fedclust config sync`")
    assert not sync_method_yamls(root / "conf", check=True), "run `fedclust config sync`"
    from fedclust.config import sync_readme

    keys_page = root / "docs" / "run-config.md"
    assert "<!-- run-config keys" in keys_page.read_text()
    assert not sync_readme(keys_page, check=True), "run `fedclust config sync`"


@pytest.mark.parametrize("num_clients, nodes", [(3, 5), (5, 2)])
def test_num_clients_other_than_the_engine_stops_after_one_question_round(tmp_path, num_clients,
                                                                   nodes):
    """More or fewer simulated nodes than num-clients: the run asks up to 3 nodes what the
    engine gave them, then stops at once with both numbers and the fix (never waits for
    `timeout`)."""
    sent = []
    with pytest.raises(ValueError, match=f"num-clients' = {num_clients} but the simulation "
                                         f"engine has {nodes} nodes.*num-supernodes="
                                         f"{num_clients}.*num-clients=0"):
        run_server({"output-dir": str(tmp_path / "run"), "num-clients": num_clients,
                    "timeout": 600}, num_nodes=nodes,
                   inspect=lambda msg, rep: sent.append(msg))
    assert {m.metadata.message_type for m in sent} == {"query.fedclust_node"}
    assert len(sent) == min(nodes, 3)
    assert not (tmp_path / "run").exists()


def test_num_clients_zero_follows_the_engine(tmp_path):
    summary, _ = run_server({"output-dir": str(tmp_path / "run"), "plots": False}, num_nodes=2)
    assert summary["num_clients"] == 2 and summary["config"]["num-clients"] == 2


def test_client_refuses_a_partition_count_other_than_num_clients():
    from flwr.app import Context, RecordDict

    from client_apps.data import load_client_data
    from fedclust.config import validate

    cfg = validate({"num-clients": 3})
    ctx = Context(run_id=1, node_id=1, node_config={"partition-id": 0, "num-partitions": 5},
                  state=RecordDict(), run_config={})
    with pytest.raises(ValueError, match="num-supernodes=3"):
        load_client_data(ctx, cfg)


@pytest.mark.parametrize("override", [{"fcm.m": 0.5}, {"partition.kind": "random"},
                                      {"method": "kmeans"}, {"evaluate": "maybe"},
                                      {"fcm.fraction": 1.5}])
def test_the_suggested_hydra_override_composes(override):
    """The error's 'Hydra override' must work on `fedclust-sweep` as printed."""
    import re

    from hydra import compose, initialize_config_dir

    from server_app.sweep import CONF_DIR, flatten

    with pytest.raises(ConfigError) as err:
        validate(override)
    fix = re.search(r"Hydra override (\S+?)\.?$", str(err.value)).group(1)
    with initialize_config_dir(config_dir=CONF_DIR, version_base=None):
        cfg = compose("config", overrides=[fix])
    from omegaconf import OmegaConf

    validate(flatten(OmegaConf.to_container(cfg.app, resolve=False)) | {"output-dir": "x"})


def test_an_in_process_run_without_nodes_is_refused_at_once(tmp_path):
    """Probe: run_server(num_nodes=0) waited the whole 'timeout' for a node that never comes."""
    with pytest.raises(ValueError, match=r"num_nodes=0.*at least one node"):
        run_server({"output-dir": str(tmp_path / "run")}, num_nodes=0)
    assert not (tmp_path / "run").exists()
