"""Run-configuration schema, validation and the pyproject sync tool.

Flower run configs are flat dicts with dotted keys (``fcm.m``). Every key the project accepts is
declared once here (common keys) or in a method's ``KEYS`` list, with its type, default and
allowed range. :func:`validate` turns a raw run config into a typed dict and stops bad input
before any work starts, with a message that names the key, the value, what is allowed and how
to fix it.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

# Common keys (all methods): fedclust/common.py. Method keys live next to each method and are
# listed in fedclust/registry.py.
from fedclust.common import (  # noqa: E402,F401 - re-exported
    COMMON_KEYS,
    SEED_MAX,
    CommonSettings,
    common,
)
from fedclust.registry import load
from fedclust.schema import (  # noqa: F401 - re-exported: the keys' public home
    ConfigError,
    Key,
    MissingExtraError,
    Scalar,
    _cast,
    _hydra_override,
    _message,
    _toml,
    require,
)

# ----------------------------------------------------------------------------------------------

def _available(path: str) -> bool:
    """A registered method's module exists (methods are added one issue at a time)."""
    import importlib.util

    module = path.partition(":")[0]
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


def missing_modules(modules: Iterable[str]) -> list[str]:
    """Those of ``modules`` (import names) that cannot be imported here; a module an import
    hook refuses counts as missing."""
    import importlib.util

    out = []
    for name in modules:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            out.append(name)
    return out


def check_installed(method: str) -> None:
    """Refuse a method whose optional packages are not installed here, with the ``pip
    install`` line (``fedcref``, ``emdcfl``: ``fedclust[nn]`` — torch, POT, networkx).

    Raises
    ------
    MissingExtraError
        A :class:`ConfigError` (and an ``ImportError``) naming the missing packages.
    """
    from fedclust.registry import EXTRAS, METHODS

    spec = METHODS.get(method)
    missing = missing_modules(spec.needs) if spec is not None else []
    if missing:
        raise MissingExtraError(extra_message(f"method={method!r}", missing, spec.extra,
                                              EXTRAS[spec.extra]))


def extra_message(what: str, missing: Iterable[str], extra: str, packages: Iterable[str]
                  ) -> str:
    """``<what> needs …, not installed here. Fix: pip install 'fedclust[<extra>]' …``."""
    names = ", ".join("POT (import ot)" if m == "ot" else m for m in missing)
    return (f"{what} needs {names}, which {'is' if ',' not in names else 'are'} not installed "
            f"where it runs. Fix: pip install 'fedclust[{extra}]' (adds "
            f"{', '.join(packages)}; for torch with CUDA, install torch from "
            f"download.pytorch.org first: fedclust's docs/install.md), or run a method of the "
            f"core install: method=\"exact-fcm\" or \"fedfcm\"")


def _load_keys(path: str) -> list[Key]:
    return list(load(path))


def all_keys() -> list[Key]:
    """Common keys followed by every registered method's keys."""
    from fedclust.registry import METHODS  # local import: registry imports nothing heavy

    keys = list(COMMON_KEYS)
    for spec in METHODS.values():
        for path in spec.keys:
            if _available(path):
                keys.extend(_load_keys(path))
    names = [k.name for k in keys]
    dup = {n for n in names if names.count(n) > 1}
    if dup:
        raise RuntimeError(f"run-config keys declared twice: {sorted(dup)}")
    return keys


def setting(cfg: Mapping[str, Any], name: str) -> Any:
    """``cfg[name]``, or the key ``name``'s default when ``cfg`` lacks it (a raw run config,
    the config an older run saved): a lookup that does not write the default again."""
    if name in cfg:
        return cfg[name]
    return next(k for k in [*COMMON_KEYS, *all_keys()] if k.name == name).default


def defaults() -> dict[str, Scalar]:
    """Default value of every key."""
    return {k.name: k.default for k in all_keys()}


def validate(run_config: Mapping[str, Any], keys: Iterable[Key] | None = None) -> dict[str, Any]:
    """Return a typed copy of ``run_config`` with defaults filled in.

    Raises
    ------
    ConfigError
        On an unknown key, a value of the wrong type or outside its range, a key of another
        method that the user set (:func:`foreign_keys`), or an inconsistent combination (e.g.
        ``fedfcm.k-min > fedfcm.k-max``).
    """
    default_keys = keys is None
    keys = list(all_keys() if keys is None else keys)
    by_name = {k.name: k for k in keys}
    unknown = sorted(set(run_config) - set(by_name))
    if unknown:
        import difflib

        close = {u: [n for n in by_name if n.split(".")[-1] == str(u).split(".")[-1]]
                 or difflib.get_close_matches(str(u), list(by_name), n=3, cutoff=0.8)
                 for u in unknown}
        hint = "; ".join(f"'{u}' (did you mean {close[u]}?)" if close[u] else f"'{u}'"
                         for u in unknown)
        raise ConfigError(f"unknown run-config key(s): {hint}. "
                          f"Known keys are listed in pyproject.toml [tool.flwr.app.config] "
                          f"and by `fedclust config list`. Fix: correct the spelling "
                          f"or remove the key.")
    cfg = {k.name: k.parse(run_config.get(k.name, k.default)) for k in keys}
    from fedclust.registry import METHODS

    spec = METHODS[cfg["method"]]
    if not all(_available(p) for p in spec.keys):
        installed = [m for m, s in METHODS.items()
                     if all(_available(p) for p in s.keys)]
        raise ConfigError(f"run config 'method' = {cfg['method']!r} is not installed in this "
                          f"build. Allowed: {', '.join(installed)}.")
    if default_keys:
        _refuse_foreign_keys(run_config, cfg)
    require(cfg["num-clients"] == 0 or cfg["min-clients"] <= cfg["num-clients"], "min-clients",
            cfg["min-clients"], f"at most num-clients ({cfg['num-clients']}), or 0",
            f"pass min-clients={cfg['num-clients']} or raise num-clients")
    require(cfg.get("partition.kind") != "column" or cfg.get("partition.column") != "",
            "partition.column", "", "a grouping column of the dataset with "
            "partition.kind='column'", "pass partition.column (e.g. 'job' for dataset=bank) or "
            "another partition.kind")
    require(cfg.get("partition.kind") != "size" or str(cfg.get("partition.sizes")).strip() != "",
            "partition.sizes", "", "one size per client, comma-separated, with "
            "partition.kind='size'", "pass partition.sizes=\"100,200,…\"")
    if cfg.get("partition.kind") == "size" and cfg.get("num-clients"):
        sizes = [v for v in str(cfg["partition.sizes"]).split(",") if v.strip()]
        require(len(sizes) == cfg["num-clients"], "partition.sizes", cfg["partition.sizes"],
                f"one size per client: {cfg['num-clients']} sizes (num-clients), "
                f"{len(sizes)} given", "give one size per client, or change num-clients")
    for check in spec.cross_checks:
        load(check)(cfg)
    return cfg


def method_keys() -> dict[str, list[Key]]:
    """The keys of every installed method, by method (common keys not included)."""
    from fedclust.registry import METHODS

    return {m: [k for path in spec.keys for k in _load_keys(path)]
            for m, spec in METHODS.items() if all(_available(p) for p in spec.keys)}


def foreign_keys(run_config: Mapping[str, Any], cfg: Mapping[str, Any]) -> dict[str, list[str]]:
    """Keys of ``run_config`` that belong to another method than ``cfg["method"]`` and that
    the user set, by the method they belong to.

    Flower's run config carries every key of ``[tool.flwr.app.config]`` (pyproject.toml lists
    all keys of all methods with their defaults), so what the user set cannot be told from
    what is present: a method's keys all present count as that table, and only those with a
    value other than the default count as set (a foreign key set to its default value is
    harmless and cannot be told apart). Where only some of a method's keys are present (the
    Python API's ``run_config``, a Hydra override ``+app.<key>=…``), every one present was
    given by the user and counts as set, whatever its value.
    """
    out: dict[str, list[str]] = {}
    for method, keys in method_keys().items():
        if method == cfg["method"]:
            continue
        present = [k for k in keys if k.name in run_config]
        complete = len(present) == len(keys)
        given = [k.name for k in present if not complete or cfg[k.name] != k.default]
        if given:
            out[method] = given
    return out


def without_foreign_defaults(run_config: Mapping[str, Any], given: Iterable[str] = ()
                             ) -> dict[str, Any]:
    """``run_config`` without the keys of other methods than its ``method`` that the user did
    not give: what a composition brings along for other methods (a Hydra dataset file sets
    ``fcm.n-clusters`` for every method). Keys in ``given`` stay, for :func:`validate` to
    refuse them."""
    method = run_config.get("method", next(k for k in COMMON_KEYS if k.name == "method").default)
    given = set(given)
    drop = {k.name for m, keys in method_keys().items() if m != method for k in keys
            if k.name not in given}
    return {k: v for k, v in run_config.items() if k not in drop}


def _refuse_foreign_keys(run_config: Mapping[str, Any], cfg: Mapping[str, Any]) -> None:
    foreign = foreign_keys(run_config, cfg)
    if not foreign:
        return
    listing = "; ".join(f"{', '.join(repr(k) for k in names)} belong(s) to method={method!r}"
                        for method, names in foreign.items())
    names = [k for ks in foreign.values() for k in ks]
    other = next(iter(foreign))
    raise ConfigError(
        f"run config key(s) of another method in a run of method={cfg['method']!r}: "
        f"{listing}; this run would ignore them. Allowed: the common keys and the "
        f"{cfg['method']!r} keys (`fedclust config list`). Fix: remove "
        f"{', '.join(repr(k) for k in names)} from the run config (--run-config, the API's "
        f"run_config, or the Hydra overrides), or run method={other!r} if that is the method "
        f"you meant.")


def own_data(cfg: Mapping[str, Any]) -> bool:
    """Whether every client reads its own file (``dataset`` ``local``: a deployed node's
    ``data-path``; ``files``: one file of ``data-dir`` per simulated client) instead of a
    partition of one shared dataset."""
    return cfg["dataset"] in ("local", "files")


# ----------------------------------------------------------------------------------------------
# pyproject sync: [tool.flwr.app.config] must list every key (flwr rejects unknown keys).

_BEGIN = "# --- run-config keys: generated by `fedclust config sync` ---"
_END = "# --- end of generated run-config keys ---"


def render_config_table(keys: Iterable[Key]) -> str:
    """TOML lines of ``[tool.flwr.app.config]`` for ``keys`` (dotted keys quoted)."""
    lines = [_BEGIN]
    for key in keys:
        name = key.name if re.fullmatch(r"[A-Za-z0-9_-]+", key.name) else f'"{key.name}"'
        lines.append(f"{name} = {_toml(key.default)}")
    lines.append(_END)
    return "\n".join(lines)


def sync_pyproject(path: Path, check: bool = False) -> bool:
    """Rewrite the generated block of ``pyproject.toml``; return True if it changed."""
    text = path.read_text()
    start, end = text.index(_BEGIN), text.index(_END) + len(_END)
    new = text[:start] + render_config_table(all_keys()) + text[end:]
    changed = new != text
    if changed and not check:
        path.write_text(new)
    return changed


_YAML_HEADER = ("# @package app\n# Generated by `fedclust config sync` from the key "
                "schema (fedclust/config.py,\n# fedclust/*keys*.py); edit the schema, not this "
                "file. Override any key with app.<prefix>.<key>=value.\n")


def _nested_yaml(keys: Iterable[Key], top: dict[str, Any] | None = None) -> str:
    import yaml

    nested: dict[str, Any] = dict(top or {})
    for key in keys:
        node = nested
        *parents, leaf = key.name.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = key.default
    return _YAML_HEADER + yaml.safe_dump(nested, sort_keys=False)


_README_BEGIN = "<!-- run-config keys: generated by `fedclust config sync` -->"
_README_END = "<!-- end of generated run-config keys -->"


def render_readme_keys() -> str:
    """Markdown tables of every key (common, then per method), one line per key: key, type
    (the allowed values), default and the help cut to a line (`fedclust config list` prints
    the whole help)."""
    from fedclust.registry import METHODS

    def number(v: Any) -> str:
        return f"{v:g}" if isinstance(v, float) else str(v)

    def kind(k: Key) -> str:
        if k.allowed_text is not None:
            return k.allowed_text
        if k.choices is not None:
            return " \\| ".join(f"`{c}`" if c != "" else '`""`' for c in k.choices)
        name, lo, hi = k.type.__name__, k.low, k.high
        if lo is None and hi is None:
            return name
        if hi is None:
            return f"{name} {'>' if k.low_open else '≥'} {number(lo)}"
        if lo is None:
            return f"{name} {'<' if k.high_open else '≤'} {number(hi)}"
        return (f"{name} {'(' if k.low_open else '['}{number(lo)}, {number(hi)}"
                f"{')' if k.high_open else ']'}")

    def short(text: str, limit: int = 72) -> str:
        if len(text) > limit:                 # at most `limit` characters, brackets whole
            out = text[:limit].rsplit(" ", 1)[0]
            depth, opened = 0, 0
            for i, ch in enumerate(out):
                if ch == "(":
                    depth += 1
                    opened = i if depth == 1 else opened
                elif ch == ")":
                    depth -= 1
            text = (out[:opened] if depth > 0 else out).rstrip(",;: ") + " …"
        return text.replace("|", "\\|")

    def table(keys: Iterable[Key]) -> list[str]:
        rows = ["| key | type | default | meaning |", "|---|---|---|---|"]
        rows += [f"| `{k.name}` | {kind(k)} | `{_toml(k.default)}` | {short(k.help)} |"
                 for k in keys]
        return rows

    lines = [_README_BEGIN, "", "**Common keys**", "", *table(COMMON_KEYS)]
    for method, spec in METHODS.items():
        if all(_available(p) for p in spec.keys):
            keys = [k for path in spec.keys for k in _load_keys(path)]
            lines += ["", f"**`method={method}`**", "", *table(keys)]
    return "\n".join([*lines, "", _README_END])


def sync_readme(path: Path, check: bool = False) -> bool:
    if not path.exists():
        return False
    text = path.read_text()
    if _README_BEGIN not in text:
        return False
    start, end = text.index(_README_BEGIN), text.index(_README_END) + len(_README_END)
    new = text[:start] + render_readme_keys() + text[end:]
    if new != text and not check:
        path.write_text(new)
    return new != text


def render_method_yaml(method: str) -> str:
    """``conf/method/<method>.yaml``: the method's keys (nested) with their defaults."""
    from fedclust.registry import METHODS

    keys = [k for path in METHODS[method].keys for k in _load_keys(path)]
    return _nested_yaml(keys, {"method": method})


def sync_method_yamls(conf_dir: Path, check: bool = False) -> bool:
    """Write ``conf/method/<m>.yaml`` for every installed method; return True if any changed."""
    from fedclust.registry import METHODS

    changed = False
    base = conf_dir / "base.yaml"
    text = _nested_yaml([k for k in COMMON_KEYS if k.name != "method"])
    if not base.exists() or base.read_text() != text:
        changed = True
        if not check:
            base.write_text(text)
    for method, spec in METHODS.items():
        if not all(_available(p) for p in spec.keys):
            continue
        path = conf_dir / "method" / f"{method}.yaml"
        text = render_method_yaml(method)
        if not path.exists() or path.read_text() != text:
            changed = True
            if not check:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(text)
    return changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="fedclust config", description=__doc__)
    parser.add_argument("command", choices=["sync", "check", "list"])
    parser.add_argument("--pyproject", default=str(Path(__file__).parents[1] / "pyproject.toml"))
    args = parser.parse_args(argv)
    if args.command == "list":
        for key in all_keys():
            print(f"{key.name:32s} {_toml(key.default):20s} {key.allowed()} — {key.help}")
        return 0
    check = args.command == "check"
    changed = sync_pyproject(Path(args.pyproject), check=check)
    changed |= sync_method_yamls(Path(args.pyproject).parent / "conf", check=check)
    for page in ("README.md", "docs/run-config.md"):    # wherever the markers are
        changed |= sync_readme(Path(args.pyproject).parent / page, check=check)
    if check and changed:
        print("run-config keys in pyproject.toml or conf/method/ are out of date: "
              "run `fedclust config sync`")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
