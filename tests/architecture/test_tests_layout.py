"""The tests mirror the code: one folder per package (``tests/fcm/``, ``tests/fedcref/`` …),
shared helpers and fixtures at the top (``conftest.py``, ``fake_grid.py``, ``hostile.py``,
``flwr_smoke.py``), no test file left at the top."""

from __future__ import annotations

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
