"""The one ``fedclust`` command: its subcommands, the old entry points as aliases, and
``fedclust check``, which validates a run config offline as ``flwr run`` would run it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from fedclust.cli import COMMANDS, main, parse_run_config
from fedclust.config import ConfigError

try:
    import tomllib
except ImportError:     # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "FLWR_TELEMETRY_ENABLED": "0"}


def fedclust(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fedclust.cli", *args], capture_output=True,
                          text=True, timeout=120, cwd=ROOT, env=ENV)


def test_one_command_with_the_old_entry_points_as_aliases():
    assert set(COMMANDS) == {"sweep", "report", "deploy", "predict", "check", "examples",
                             "config"}
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["fedclust"] == "fedclust.cli:main"
    assert scripts["fedclust-sweep"] == "server_app.sweep:main"      # the old name stays
    assert main(["--help"]) == 0 and main([]) == 2


def test_an_unknown_command_is_named_with_the_close_one(capsys):
    assert main(["repot"]) == 2
    assert "unknown command 'repot' (did you mean 'report'?)" in capsys.readouterr().err


def test_run_config_text_is_read_as_flwr_run_reads_it(tmp_path):
    assert parse_run_config('method="fedfcm" fedfcm.k-max=4 fcm.m=1.5 plots=false') == {
        "method": "fedfcm", "fedfcm.k-max": 4, "fcm.m": 1.5, "plots": False}
    assert parse_run_config("output-dir='/a b/c'") == {"output-dir": "/a b/c"}
    toml = tmp_path / "run.toml"
    toml.write_text('method = "exact-fcm"\n[fcm]\nm = 1.5\n')
    assert parse_run_config(str(toml)) == {"method": "exact-fcm", "fcm.m": 1.5}
    with pytest.raises(ConfigError, match='dataset="files"'):
        parse_run_config("dataset=files")
    with pytest.raises(ConfigError, match="not a key=value pair"):
        parse_run_config("fcm.m=1.5 oops")


def test_check_names_a_mistyped_key_with_a_did_you_mean_in_one_line():
    done = fedclust("check", "--run-config", 'fcm.n-cluster=3 method="exact-fcm"')
    assert done.returncode == 2
    assert "'fcm.n-cluster'" in done.stderr and "fcm.n-clusters" in done.stderr
    assert "did you mean" in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_check_refuses_bad_values_and_missing_data_and_passes_a_good_config(tmp_path):
    bad = fedclust("check", "--run-config", "fcm.m=0.5")
    assert bad.returncode == 2 and "'fcm.m' = 0.5" in bad.stderr and "Allowed" in bad.stderr
    missing = fedclust("check", "--run-config", f'dataset="xclara" data-dir="{tmp_path}"')
    assert missing.returncode == 2 and "xclara.arff" in missing.stderr
    assert fedclust("check", "--no-data", "--run-config",
                    f'dataset="xclara" data-dir="{tmp_path}"').returncode == 0
    sites = tmp_path / "sites"
    sites.mkdir()
    for i in range(2):
        (sites / f"s{i}.csv").write_text("a,b\n" + "\n".join(f"{j},{j % 3}" for j in range(20)))
    ok = fedclust("check", "--run-config",
                  f'dataset="files" data-dir="{sites}" fcm.n-clusters=3')
    assert ok.returncode == 0, ok.stderr
    assert "run config OK" in ok.stdout and "fcm.n-clusters=3" in ok.stdout
    other = fedclust("check", "--run-config", 'method="exact-fcm" fedcref.tau=0.5')
    assert other.returncode == 2 and "method='fedcref'" in other.stderr


@pytest.mark.parametrize("text, message", [
    ("fcm.m=1.5 fcm.m=3.0", "'fcm.m' more than once"),
    ('partition.kind="column"', "'partition.column' = '' is invalid"),
    ('partition.kind="size"', "'partition.sizes' = '' is invalid"),
    ('partition.kind="size" partition.sizes="10" num-clients=3', "3 sizes .num-clients., 1 given"),
])
def test_check_refuses_what_a_run_would_silently_misread(text, message):
    """Probe: a key given twice kept its last value, and a partition kind without the key it
    needs passed `fedclust check` when num-clients was left to the engine."""
    from fedclust.cli import parse_run_config
    from fedclust.config import validate

    with pytest.raises(ConfigError, match=message):
        validate(parse_run_config(text))


def test_a_config_error_under_flwr_run_is_one_log_line_and_a_short_trace(fedclust_log):
    """What the ServerApp does with bad input under `flwr run` (Flower logs the exception it
    raises with its traceback): fedclust logs the message on one line, and the exception
    carries no chain of fedclust's internals."""
    import traceback

    from flwr.app import Context, RecordDict

    from client_apps.app import app as client_app
    from server_app.app import app
    from server_app.inprocess import InProcessGrid

    cfg = {"method": "exact-fcm", "fcm.m": 0.5}
    context = Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=cfg)
    with pytest.raises(ConfigError) as err:
        app(InProcessGrid(client_app, 2, cfg), context)
    log = [line for line in fedclust_log if "run refused" in line]
    assert len(log) == 1 and "\n" not in log[0]
    assert "'fcm.m' = 0.5" in log[0] and "Fix:" in log[0]
    trace = "".join(traceback.format_exception(err.value)).splitlines()
    assert len(trace) <= 8 and trace[-1].endswith(log[0].split("run refused: ")[1])
    assert err.value.__cause__ is None and err.value.__suppress_context__


def test_the_readme_is_short_and_its_links_resolve():
    """README in Flower Baselines shape stays at most 15 KB (the long results live in docs/);
    every relative link points at a file of the repository."""
    import re

    readme = ROOT / "README.md"
    assert readme.stat().st_size <= 15_000
    text = readme.read_text()
    for section in ("## Papers", "## Quick start", "## Expected time per job",
                    "## Where results go", "## fedclust in your own Flower app"):
        assert section in text
    links = re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", text)
    missing = [link for link in links if not (ROOT / link).exists()]
    assert links and not missing, missing
