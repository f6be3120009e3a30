"""Count, for every run-config key, the places in the source that declare it.

A key is *declared* where its name, type or default is written down by hand:

- ``Key("fcm.m", float, 2.0, ...)``: a hand-written schema entry;
- a Settings field ``m: float = param(2.0, ...)``: the field that declares the key
  (:func:`fedclust.schema.param`; the key's name is the class's prefix and the field's name);
- a Settings field filled from the run config by hand (``m=float(cfg["fcm.m"])`` in a
  ``from_config``, or a field of a class with a ``from_config`` named as a key): the field
  repeats the key's type;
- a Strategy constructor parameter with a default (``def __init__(self, m: float = 2.0)``), or a
  ``name : type, default value`` line in a Strategy's docstring: a repeated default;
- a lookup with a default (``cfg.get("fcm.m", 2.0)``): a repeated default.

A field that holds a key declared elsewhere (``ref(...)``, ``common("seed")``) refers to it and
is no declaration; so is any use of a key's name in a message or a subscript. Generated files
(``pyproject.toml``, ``conf/``, ``docs/``) are not read.

Usage: ``python scripts/count_key_declarations.py [ROOT]`` (default: this checkout). The keys
are those of ``fedclust.config.all_keys()`` of ROOT's package; the exit status is 1 when a
key is declared other than once.
"""

from __future__ import annotations

import ast
import sys
from collections import defaultdict
from pathlib import Path

LAYERS = ("fedclust", "strategies", "client_apps", "server_app")
#: the prefix of each method package's keys (a field of a class in ``fedclust/<package>/``)
PACKAGE_PREFIX = {"fcm": "fcm.", "fedfcm": "fedfcm.", "emdcfl": "emdcfl.", "fedcref": "fedcref."}
STRATEGY_PREFIX = {"ExactFCM": "fcm.", "FedFCM": "fedfcm.", "FedCRef": "fedcref.",
                   "EMDCFL": "emdcfl."}


def _name(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return ""


def _const(node: ast.AST | None) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _settings_prefix(cls: ast.ClassDef) -> str | None:
    """``prefix`` of a ``@settings(prefix=...)`` decorator (None: not such a class)."""
    for dec in cls.decorator_list:
        if isinstance(dec, ast.Call) and _name(dec.func) == "settings":
            prefix = next((k.value for k in dec.keywords if k.arg == "prefix"), None)
            if prefix is None and dec.args:
                prefix = dec.args[0]
            return _const(prefix) or ""
    return None


def _from_config_map(cls: ast.ClassDef) -> dict[str, str]:
    """Field → key of a hand-written ``from_config`` (``n=int(cfg["fcm.n"])``)."""
    out: dict[str, str] = {}
    for fn in cls.body:
        if isinstance(fn, ast.FunctionDef) and fn.name == "from_config":
            for call in ast.walk(fn):
                if isinstance(call, ast.Call):
                    for kw in call.keywords:
                        subs = [_const(s.slice) for s in ast.walk(kw.value)
                                if isinstance(s, ast.Subscript)]
                        subs = [s for s in subs if s]
                        if kw.arg and len(subs) == 1:
                            out[kw.arg] = subs[0]
    return out


def declarations(root: Path, keys: set[str]) -> dict[str, list[tuple[str, int, str]]]:
    """Key → ``(file, line, kind)`` of every declaration under ``root``'s layers."""
    found: dict[str, list[tuple[str, int, str]]] = defaultdict(list)

    def add(key: str | None, path: Path, line: int, kind: str) -> None:
        if key in keys:
            found[key].append((str(path.relative_to(root)), line, kind))

    for layer in LAYERS:
        for path in sorted((root / layer).rglob("*.py")):
            tree = ast.parse(path.read_text(), str(path))
            package = path.relative_to(root).parts[1] if layer == "fedclust" else ""
            for node in ast.walk(tree):
                if isinstance(node, ast.Call) and _name(node.func) == "Key" and node.args:
                    add(_const(node.args[0]), path, node.lineno, "Key(...)")
                elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                      and node.func.attr == "get" and len(node.args) == 2
                      and isinstance(node.args[1], ast.Constant)   # a written-down default
                      and "node" not in _name(node.func.value)):   # node config, not run config
                    add(_const(node.args[0]), path, node.lineno, ".get(key, default)")
                elif isinstance(node, ast.ClassDef):
                    _class(node, path, package, keys, add)
    return found


def _class(cls: ast.ClassDef, path: Path, package: str, keys: set[str], add) -> None:
    prefix = _settings_prefix(cls)
    by_from_config = _from_config_map(cls)
    hand_settings = any(isinstance(f, ast.FunctionDef) and f.name == "from_config"
                        for f in cls.body)
    for item in cls.body:
        if not (isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)):
            continue
        field = item.target.id
        if "ClassVar" in ast.unparse(item.annotation):
            continue
        value = item.value
        called = _name(value.func) if isinstance(value, ast.Call) else ""
        if called == "param":
            name = next((_const(k.value) for k in value.keywords if k.arg == "name"), None)
            add((prefix or "") + (name or field.replace("_", "-")), path, item.lineno,
                "param field")
        elif called in ("ref", "common") or called.endswith("_ref"):
            continue                    # holds a key declared elsewhere
        elif field in by_from_config:
            add(by_from_config[field], path, item.lineno, "Settings field (from_config)")
        elif hand_settings:
            for key in (PACKAGE_PREFIX.get(package, "") + field.replace("_", "-"),
                        field.replace("_", "-")):
                if key in keys:
                    add(key, path, item.lineno, "Settings field (from_config)")
                    break
    strategy_prefix = STRATEGY_PREFIX.get(cls.name)
    if strategy_prefix is None or not path.parts[-2:] == ("strategies", "methods.py"):
        return
    for fn in cls.body:
        if isinstance(fn, ast.FunctionDef) and fn.name == "__init__":
            args = fn.args.args[len(fn.args.args) - len(fn.args.defaults):]
            args += [a for a, d in zip(fn.args.kwonlyargs, fn.args.kw_defaults, strict=True)
                     if d is not None]
            for arg in args:
                for key in (strategy_prefix + arg.arg.replace("_", "-"), arg.arg):
                    if key in keys:
                        add(key, path, fn.lineno, "Strategy default")
                        break
    doc = ast.get_docstring(cls, clean=False) or ""
    for offset, line in enumerate(doc.splitlines()):
        head, sep, tail = line.strip().partition(" : ")
        if sep and "default" in tail:
            for arg in head.split(", "):
                for key in (strategy_prefix + arg.replace("_", "-"), arg):
                    if key in keys:
                        add(key, path, cls.lineno + offset, "Strategy docstring default")
                        break


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    root = Path(argv[0] if argv else Path(__file__).parents[1]).resolve()
    sys.path.insert(0, str(root))
    from fedclust.config import all_keys

    keys = [k.name for k in all_keys()]
    found = declarations(root, set(keys))
    counts = {k: len(found.get(k, [])) for k in keys}
    repeated = [k for k in keys if counts[k] > 1]
    missing = [k for k in keys if counts[k] == 0]
    kinds: dict[str, int] = defaultdict(int)
    for k in keys:
        for _, _, kind in found.get(k, []):
            kinds[kind] += 1
    print(f"{len(keys)} run-config keys; {sum(counts.values())} declarations "
          f"({', '.join(f'{n} {kind}' for kind, n in sorted(kinds.items()))})")
    print(f"declared exactly once: {sum(1 for k in keys if counts[k] == 1)}; more than once: "
          f"{len(repeated)}; nowhere: {len(missing)}")
    for key in repeated + missing:
        where = "; ".join(f"{f}:{line} {kind}" for f, line, kind in found.get(key, []))
        print(f"  {key}: {counts[key]} ({where or 'no declaration found'})")
    return 1 if repeated or missing else 0


if __name__ == "__main__":
    raise SystemExit(main())
