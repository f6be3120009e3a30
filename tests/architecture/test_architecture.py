"""Layout rules of the project brief that a test can check.

``fedclust/`` holds the algorithms as plain numpy/torch code: no module under it may import
Flower (``flwr``), directly or inside a function. Flower lives in ``strategies/``,
``client_apps/`` and ``server_app/``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "fedclust"


def flwr_imports(source: str) -> list[int]:
    """Line numbers of every ``import flwr…`` / ``from flwr… import`` in ``source``."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            if any(a.name == "flwr" or a.name.startswith("flwr.") for a in node.names):
                lines.append(node.lineno)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and (
                node.module == "flwr" or node.module.startswith("flwr.")):
            lines.append(node.lineno)
    return lines


@pytest.mark.parametrize("source, expected", [
    ("import flwr\n", [1]),
    ("import numpy\nfrom flwr.app import RecordDict\n", [2]),
    ("def f():\n    import flwr.serverapp as s\n", [2]),
    ("import flwrx\nfrom .flwr import x\nimport numpy\n# import flwr\n", []),
])
def test_detector(source: str, expected: list[int]) -> None:
    assert flwr_imports(source) == expected


def test_fedclust_does_not_import_flower() -> None:
    files = sorted(PACKAGE.rglob("*.py"))
    assert len(files) > 10, f"found only {len(files)} modules under {PACKAGE}"
    offenders = {str(f.relative_to(PACKAGE.parent)): lines for f in files
                 if (lines := flwr_imports(f.read_text(encoding="utf-8")))}
    assert not offenders, f"fedclust/ must not import flwr; found at {offenders}"


def test_the_clientapp_imports_no_heavy_library() -> None:
    """Every deployment message starts a fresh ClientApp process: importing it must not pull
    torch, scikit-learn, scipy.stats or POT (each costs from 0.3 to 2 s per message); a
    handler imports what its method needs when it runs."""
    import subprocess
    import sys

    code = ("import sys, client_apps.app; heavy = ('torch', 'sklearn', 'scipy.stats', 'ot', "
            "'networkx', 'matplotlib', 'hydra'); print([m for m in heavy if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "[]", out.stdout
