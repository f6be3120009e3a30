"""CI runs every test: ``make test`` takes the tests not marked slow, ``make test-slow`` those
marked slow, and ``.ci/run`` calls both (a failure in the first does not skip the second)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _recipe(target: str) -> str:
    """The recipe of ``target`` in the Makefile, with its variables expanded."""
    text = (ROOT / "Makefile").read_text()
    variables = dict(re.findall(r"^([A-Z_]+) = (.*)$", text, re.M))
    m = re.search(rf"^{re.escape(target)}:.*\n((?:\t.*\n)+)", text, re.M)
    assert m, f"no target {target!r} in the Makefile"
    recipe = m.group(1)
    for name, value in variables.items():
        recipe = recipe.replace(f"$({name})", value)
    return recipe


def _marker_expression(recipe: str) -> str:
    args = shlex.split(recipe.split("pytest", 1)[1])
    assert "tests" in args, recipe
    return args[args.index("-m") + 1] if "-m" in args else ""


def test_the_two_test_targets_split_the_suite_by_the_slow_marker():
    assert _marker_expression(_recipe("test")) == "not slow"
    assert _marker_expression(_recipe("test-slow")) == "slow"


def test_ci_runs_both_test_targets_whatever_the_first_gives():
    lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()
             if line.strip() and not line.lstrip().startswith("#")]
    calls = [line for line in lines if line.startswith("make ")]
    assert [c.split("||")[0].strip() for c in calls] == ["make test", "make test-slow"], calls
    # under `set -e` a bare failing `make test` would end the script before the slow tests
    assert all("||" in c for c in calls), calls
    assert lines[-1] == 'exit "$status"', lines[-1]


def test_the_slow_marker_is_declared():
    text = (ROOT / "pyproject.toml").read_text()
    assert re.search(r'markers = \[[^\]]*"slow:', text)
