"""The tests mirror the code: one folder per package (``tests/fcm/``, ``tests/fedcref/`` …),
shared helpers and fixtures at the top (``conftest.py``, ``fake_grid.py``, ``hostile.py``,
``exclusive.py``), no test file left at the top."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def test_no_test_file_sits_at_the_top_of_tests():
    flat = sorted(p.name for p in TESTS.glob("test_*.py"))
    assert not flat, f"move these into the folder of the package they test: {flat}"


def test_every_test_folder_is_a_package():
    # tests import each other as tests.<folder>.<module>; without __init__.py two folders
    # holding the same file name would clash
    folders = {p.parent for p in TESTS.rglob("test_*.py")}
    missing = sorted(str(f.relative_to(TESTS)) for f in folders if not (f / "__init__.py").exists())
    assert not missing, f"add an __init__.py to: {missing}"


# What in a test's source starts a Ray cluster: Flower's Simulation Engine, directly or through
# `flwr run` / a sweep on engine=flwr|flower.
_RAY = ("SimulationSuperLink(", '"engine=flwr"', '"engine=flower"', '"flwr run', "ray start")
_LOCK = "exclusive('ray')"


def _unguarded_ray(name: str, sources: dict[str, str], seen: set[str]) -> bool:
    """Whether function ``name`` of a module, or a helper of that module it calls, starts a Ray
    cluster outside a ``with exclusive("ray")`` block."""
    seen.add(name)
    src = sources[name]
    if any(p in src for p in _RAY) and _LOCK not in src.replace('"', "'"):
        return True
    return any(f"{other}(" in src and _unguarded_ray(other, sources, seen)
               for other in sources if other not in seen and not other.startswith("test_"))


def test_every_test_that_starts_a_ray_cluster_takes_the_ray_lock():
    """A slow test that starts a Ray cluster (in its source or a helper of its module it calls)
    holds the ``"ray"`` lock: it is marked ``pytest.mark.exclusive("ray")``, or the helper
    starts it inside ``with exclusive("ray")`` (tests/exclusive.py). Ray gives a raylet a fixed
    30 s to start, which clusters started side by side by the xdist workers miss on 2 cores. A
    marked test must start one (the lock makes others wait)."""
    unmarked, needless = [], []
    for path in sorted(TESTS.rglob("test_*.py")):
        text = path.read_text()
        tree = ast.parse(text)
        module_marks = " ".join(ast.unparse(n.value) for n in tree.body
                                if isinstance(n, ast.Assign) and any(
                                    getattr(t, "id", "") == "pytestmark" for t in n.targets))
        sources = {n.name: ast.get_source_segment(text, n) for n in tree.body
                   if isinstance(n, ast.FunctionDef)}
        for node in tree.body:
            if not (isinstance(node, ast.FunctionDef) and node.name.startswith("test_")):
                continue
            marks = " ".join(ast.unparse(d) for d in node.decorator_list) + module_marks
            if "mark.slow" not in marks:
                continue         # only slow tests start engines (the marker's definition)
            starts = _unguarded_ray(node.name, sources, set())
            where = f"{path.relative_to(TESTS)}::{node.name}"
            if starts and _LOCK not in marks:
                unmarked.append(where)
            if _LOCK in marks and not starts:
                needless.append(where)
    assert not unmarked, f'mark these @pytest.mark.exclusive("ray"): {unmarked}'
    assert not needless, f"these start no Ray cluster; drop their ray lock: {needless}"
