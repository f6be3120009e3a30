"""The tests mirror the code: one folder per package (``tests/fcm/``, ``tests/fedcref/`` …),
shared helpers and fixtures at the top (``conftest.py``, ``fake_grid.py``, ``hostile.py``,
``flwr_smoke.py``), no test file left at the top."""

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


# What in a test's own source starts a Ray cluster: Flower's Simulation Engine, directly or
# through `flwr run` / a sweep on engine=flwr|flower.
_RAY = ("SimulationSuperLink(", '"engine=flwr"', '"engine=flower"', '"flwr run', "ray start")


def _ray_marked(node, module_marks: str) -> bool:
    decorators = " ".join(ast.unparse(d) for d in node.decorator_list)
    return "exclusive('ray')" in decorators or "exclusive('ray')" in module_marks


def test_every_test_that_starts_a_ray_cluster_takes_the_ray_lock():
    """A slow test whose source (or a helper of its module it calls) starts a Ray cluster holds
    the ``"ray"`` lock (``pytest.mark.exclusive("ray")``, conftest.py), and no other test holds
    it: Ray gives a raylet a fixed 30 s to start, which clusters started side by side by the
    xdist workers miss on 2 cores."""
    unmarked, needless = [], []
    for path in sorted(TESTS.rglob("test_*.py")):
        text = path.read_text()
        tree = ast.parse(text)
        module_marks = " ".join(ast.unparse(n.value) for n in tree.body
                                if isinstance(n, ast.Assign) and any(
                                    getattr(t, "id", "") == "pytestmark" for t in n.targets))
        helpers = {n.name: ast.get_source_segment(text, n) for n in tree.body
                   if isinstance(n, ast.FunctionDef) and not n.name.startswith("test_")}
        for node in tree.body:
            if not (isinstance(node, ast.FunctionDef) and node.name.startswith("test_")):
                continue
            decorators = " ".join(ast.unparse(d) for d in node.decorator_list)
            if "mark.slow" not in decorators + module_marks:
                continue         # only slow tests start engines (the marker's definition)
            body = ast.get_source_segment(text, node)
            called = [src for name, src in helpers.items() if f"{name}(" in body]
            starts = any(p in src for src in [body, *called] for p in _RAY)
            where = f"{path.relative_to(TESTS)}::{node.name}"
            if starts and not _ray_marked(node, module_marks):
                unmarked.append(where)
            if _ray_marked(node, module_marks) and not starts:
                needless.append(where)
    assert not unmarked, f'mark these @pytest.mark.exclusive("ray"): {unmarked}'
    assert not needless, f"these start no Ray cluster; drop their ray lock: {needless}"
