"""Imports point one way: ``fedclust`` ← ``strategies.wire`` ← ``client_apps``, ``strategies``
← ``server_app``.

``strategies.wire`` (the message codecs, both ends of every message) is a layer of its own
below both the server side and the nodes: both import it, and it imports neither.

Every module's imports are read from its source (top-level and inside functions), together
with import paths written as strings (``"strategies.fcm.exact:run"`` in a table that is
imported later with ``importlib``). A wrong-way arrow or an import cycle fails the test; the
one allowed exception is the user-facing facade :mod:`fedclust.api`.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LAYERS = ("fedclust", "client_apps", "strategies", "server_app")
WIRE = "strategies.wire"
ALLOWED = {   # layer -> layers it may import
    "fedclust": {"fedclust"},
    "wire": {"fedclust", "wire"},
    "client_apps": {"fedclust", "wire", "client_apps"},
    "strategies": {"fedclust", "wire", "strategies"},
    "server_app": {*LAYERS, "wire"},
}
FACADES = {"fedclust.api"}
TARGET = re.compile(r"^((?:fedclust|client_apps|strategies|server_app)(?:\.\w+)*)(?::\w+)?$")


def modules() -> dict[str, Path]:
    out = {}
    for layer in LAYERS:
        for path in sorted((ROOT / layer).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            out[name] = path
    return out


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """Project modules ``name`` imports (statements anywhere, and string import paths)."""
    found: set[str] = set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            targets = [f"{base}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            m = TARGET.match(node.value)
            if m:
                targets = [m.group(1)]
        for t in targets:
            # the longest known module the target names (``pkg.mod.attr`` -> ``pkg.mod``)
            parts = t.split(".")
            for i in range(len(parts), 0, -1):
                if ".".join(parts[:i]) in known:
                    found.add(".".join(parts[:i]))
                    break
    found.discard(name)
    return found


def graph() -> dict[str, set[str]]:
    """Every module's arrows. The method table's paths into the layers above the core are
    none: the table holds them for those layers, which load their own column (checked by
    :func:`test_the_method_table_names_upper_layers_in_their_columns_only`)."""
    mods = modules()
    edges = {name: imports_of(name, path, set(mods)) for name, path in mods.items()}
    edges[TABLE] = {d for d in edges[TABLE] if layer(d) == "fedclust"}
    return edges


def layer(module: str) -> str:
    """The layer of ``module``: ``"wire"`` for :data:`WIRE` and below it, else its top
    package."""
    return "wire" if module == WIRE or module.startswith(WIRE + ".") else module.split(".")[0]


def wrong_way(edges: dict[str, set[str]]) -> list[str]:
    bad = []
    for src, dsts in sorted(edges.items()):
        if src in FACADES:
            continue
        for dst in sorted(dsts):
            if layer(dst) not in ALLOWED[layer(src)]:
                bad.append(f"{src} -> {dst}")
    return bad


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def package_imports(edges: dict[str, set[str]]) -> dict[str, set[str]]:
    """Drop the arrows from a package ``__init__`` to its own modules (re-exports) and from a
    module to its parent packages: they are how Python loads a package, not a dependency."""
    return {src: {d for d in dsts if not d.startswith(src + ".") and not src.startswith(d + ".")}
            for src, dsts in edges.items()}


def test_no_wrong_way_import() -> None:
    assert wrong_way(graph()) == []


def test_no_import_cycle() -> None:
    assert cycles(package_imports(graph())) == []


@pytest.mark.parametrize(("edges", "bad"), [
    ({"fedclust.a": {"strategies.b"}, "strategies.b": set()}, ["fedclust.a -> strategies.b"]),
    ({"client_apps.a": {"strategies.b"}, "strategies.b": set()},
     ["client_apps.a -> strategies.b"]),
    ({"strategies.a": {"client_apps.b"}, "client_apps.b": set()},
     ["strategies.a -> client_apps.b"]),
    ({"server_app.a": {"strategies.b", "client_apps.c", "fedclust.d"}}, []),
    ({"fedclust.api": {"server_app.x"}}, []),
    ({"client_apps.a": {"strategies.wire.b"}, "strategies.c": {"strategies.wire.b"},
      "strategies.wire.b": {"fedclust.d", "strategies.wire.e"}}, []),
    ({"strategies.wire.b": {"strategies.common"}}, ["strategies.wire.b -> strategies.common"]),
    ({"strategies.wire.b": {"client_apps.a"}}, ["strategies.wire.b -> client_apps.a"]),
    ({"client_apps.a": {"strategies.wirex"}}, ["client_apps.a -> strategies.wirex"]),
])
def test_the_checker_sees_wrong_arrows(edges, bad) -> None:
    assert wrong_way(edges) == bad


def test_the_checker_sees_cycles_and_string_targets(tmp_path) -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    src = tmp_path / "m.py"
    src.write_text('TABLE = {"x": "strategies.fcm.exact:run"}\n'
                   'def f():\n    from server_app import app\n')
    known = {"strategies.fcm.exact", "server_app", "server_app.app"}
    assert imports_of("fedclust.m", src, known) == {"strategies.fcm.exact", "server_app.app"}


def test_every_path_of_the_method_table_resolves() -> None:
    """Every import path of every column of the one method table
    (:data:`fedclust.registry.METHODS`, the core's columns and the server's and nodes') names
    a module and attribute that exist; every method has a server loop and a handler module."""
    import dataclasses
    import importlib

    from fedclust.registry import METHODS

    for name, spec in METHODS.items():
        assert spec.server and spec.handlers, name
        for f in dataclasses.fields(spec):
            value = getattr(spec, f.name)
            for path in (value if isinstance(value, tuple) else (value,)):
                if f.name in ("report_metrics", "needs", "prefix", "extra") or not path:
                    continue
                module, _, attr = path.partition(":")
                obj = importlib.import_module(module)
                assert not attr or hasattr(obj, attr), (name, f.name, path)


def test_the_method_table_names_upper_layers_in_their_columns_only() -> None:
    """The core's table may name the server's and the nodes' parts (as strings, for them to
    load); anywhere but their columns such a path would be the core reaching up."""
    import dataclasses

    from fedclust.registry import METHODS, UPPER_COLUMNS

    for name, spec in METHODS.items():
        for f in dataclasses.fields(spec):
            value = getattr(spec, f.name)
            for path in (value if isinstance(value, tuple) else (value,)):
                upper = isinstance(path, str) and path.split(".")[0] in LAYERS[1:]
                assert not upper or f.name in UPPER_COLUMNS, (name, f.name, path)
    used = [n for n in graph() if n.startswith("fedclust.") and n != TABLE
            and re.search(r"\.(server|server_preflight|handlers)\b",
                          modules()[n].read_text())]
    assert used == [], f"core modules reading the upper layers' columns: {used}"


#: the method packages of the core: none imports another, except FedFCM building on FCM
METHOD_PACKAGES = ("fedclust.fcm", "fedclust.fedfcm", "fedclust.emdcfl", "fedclust.fedcref")
METHOD_MAY = {"fedclust.fedfcm": {"fedclust.fcm"}}
#: the method table names every method by import path (late-bound, its purpose); it imports
#: no fedclust module itself (test below), so its strings are its only arrows
TABLE = "fedclust.registry"


def core_packages(edges: dict[str, set[str]]) -> dict[str, set[str]]:
    """The arrows between the core's packages and top-level modules (``fedclust.fcm``,
    ``fedclust.data``, ``fedclust.config`` …), the method table's strings left out."""
    def top(module: str) -> str | None:
        parts = module.split(".")
        return ".".join(parts[:2]) if parts[0] == "fedclust" and len(parts) > 1 else None

    out: dict[str, set[str]] = {}
    for src, dsts in edges.items():
        s = top(src)
        if s is None or src == TABLE:
            continue
        out.setdefault(s, set()).update(d for d in map(top, dsts) if d and d != s)
    return out


def crossing_methods(edges: dict[str, set[str]]) -> list[str]:
    """Arrows from a method package or ``fedclust.data`` into another method package."""
    return [f"{src} -> {dst}" for src, dsts in sorted(core_packages(edges).items())
            if src in (*METHOD_PACKAGES, "fedclust.data")
            for dst in sorted(dsts)
            if dst in METHOD_PACKAGES and dst not in METHOD_MAY.get(src, set())]


def test_no_circle_between_the_core_packages() -> None:
    assert cycles(core_packages(package_imports(graph()))) == []


def test_the_data_layer_and_the_methods_do_not_import_other_methods() -> None:
    assert crossing_methods(package_imports(graph())) == []


def test_the_method_table_imports_no_fedclust_module() -> None:
    tree = ast.parse((ROOT / "fedclust" / "registry.py").read_text())
    named = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    named += [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    assert [m for m in named if m.split(".")[0] in LAYERS] == []


def test_the_package_checks_see_a_circle_and_a_method_crossing() -> None:
    planted = {"fedclust.fcm.estimator": {"fedclust.fedfcm.validity"},
               "fedclust.fedfcm.validity": {"fedclust.fcm"},
               "fedclust.data.sites": {"fedclust.emdcfl.keys"},
               "fedclust.emdcfl.keys": {"fedclust.data.local"},
               TABLE: {"fedclust.fedcref.keys"}, "fedclust.fedcref.keys": {"fedclust.config"},
               "fedclust.config": {TABLE}}
    assert cycles(core_packages(planted)) == [["fedclust.data", "fedclust.emdcfl"],
                                              ["fedclust.fcm", "fedclust.fedfcm"]]
    assert crossing_methods(planted) == ["fedclust.data -> fedclust.emdcfl",
                                         "fedclust.fcm -> fedclust.fedfcm"]


def builtin_only_errors(paths: dict[str, Path]) -> list[str]:
    """Classes that derive from a built-in exception and from no class of the project: every
    error fedclust raises on purpose is a :class:`fedclust.errors.FedclustError`."""
    import builtins

    trees = {name: ast.parse(path.read_text()) for name, path in paths.items()}
    ours = {n.name for tree in trees.values() for n in ast.walk(tree)
            if isinstance(n, ast.ClassDef)}
    bad = []
    for name, tree in trees.items():
        for node in ast.walk(tree):
            if not isinstance(node, ast.ClassDef):
                continue
            bases = [b.id if isinstance(b, ast.Name) else b.attr if isinstance(b, ast.Attribute)
                     else "" for b in node.bases]
            builtin = [b for b in bases if isinstance(getattr(builtins, b, None), type)
                       and issubclass(getattr(builtins, b), BaseException)]
            if builtin and not any(b in ours for b in bases) and node.name != "FedclustError":
                bad.append(f"{name}.{node.name}")
    return bad


def test_every_error_class_is_a_fedclust_error() -> None:
    assert builtin_only_errors(modules()) == []


def test_the_error_check_sees_a_class_outside_the_base(tmp_path) -> None:
    src = tmp_path / "m.py"
    src.write_text("class FedclustError(Exception):\n    pass\n\nclass A(ValueError):\n"
                   "    pass\n\nclass B(A, TypeError):\n    pass\n\n"
                   "class C(FedclustError, RuntimeError):\n    pass\n")
    assert builtin_only_errors({"fedclust.m": src}) == ["fedclust.m.A"]
