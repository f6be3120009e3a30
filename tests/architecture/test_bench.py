"""The benchmarks share one scaffold (``bench/_common.py``): its options, timers and output,
and every ``bench/bench_*.py`` built on it rather than on a copy of its own."""

from __future__ import annotations

import ast
import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"
#: kept with their own command-line code: their options are quoted as they are elsewhere
OWN_SCAFFOLD = {"bench_simulation_1000.py"}


def _common():
    spec = importlib.util.spec_from_file_location("bench_common", BENCH / "_common.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("path", sorted(p.name for p in BENCH.glob("bench_*.py")))
def test_each_benchmark_is_built_on_the_scaffold(path):
    if path in OWN_SCAFFOLD:
        pytest.skip("keeps its own command line")
    tree = ast.parse((BENCH / path).read_text())
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert "_common" in imported, f"bench/{path} does not use bench/_common.py"
    own = [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Call)
           and isinstance(n.func, ast.Attribute) and n.func.attr == "ArgumentParser"]
    assert not own, f"bench/{path} builds its own ArgumentParser (line {own}): use parser()"
    paths = [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Attribute)
             and n.attr == "insert" and isinstance(n.value, ast.Attribute)
             and n.value.attr == "path"]
    assert not paths, f"bench/{path} edits sys.path itself (line {paths}): _common does"


def test_the_parser_adds_the_shared_options_under_their_names():
    c = _common()
    ap = c.parser("Title.\n\nMore.", first_line=True, data_dir="required", dataset="mnist",
                  clients=10, samples_per_cluster=150, seed=100, repeats=5,
                  repeats_flag="--reps", overrides=True, out="runs/x")
    assert ap.description == "Title."
    a = ap.parse_args(["--data-dir", "d", "--set", "a=1", "b=c=2"])
    assert (a.data_dir, a.dataset, a.clients, a.samples_per_cluster, a.seed, a.reps, a.out) == (
        "d", "mnist", 10, 150, 100, 5, "runs/x")
    assert c.pairs(a.set) == {"a": "1", "b": "c=2"}
    with pytest.raises(SystemExit):
        ap.parse_args([])                                  # --data-dir is required
    bare = c.parser().parse_args([])
    assert vars(bare) == {}                                # nothing unless asked


def test_median_seconds_takes_the_median_and_the_warmup_is_not_timed(monkeypatch):
    c = _common()
    ticks = iter([0.0, 1.0, 1.0, 4.0, 4.0, 6.0, 6.0, 16.0])   # calls of 1, 3, 2 and 10 s
    monkeypatch.setattr(c.time, "perf_counter", lambda: next(ticks))
    calls = []
    assert c.median_seconds(lambda: calls.append(1), 4) == 2.5
    assert len(calls) == 4
    ticks = iter([0.0, 1.0, 1.0, 4.0, 4.0, 6.0])
    calls.clear()
    assert c.median_ms(lambda: calls.append(1), 3, warmup=True) == 2000.0
    assert len(calls) == 4                                 # one more, off the clock


def test_ratio_and_json_output(tmp_path, capsys):
    c = _common()
    assert c.ratio(3.0, 2.0) == "1.50" and c.ratio(1.0, 3.0, 3) == "0.333"
    assert c.ratio(1.0, 0.0) == "inf"
    c.print_json({"a": 1}, tmp_path / "sub" / "out.json")
    assert json.loads(capsys.readouterr().out) == {"a": 1}
    assert json.loads((tmp_path / "sub" / "out.json").read_text()) == {"a": 1}
