"""The ``fedclust`` command line: one entry point for the tools around a run.

``fedclust sweep``    Hydra sweeps (``fedclust-sweep``, :mod:`server_app.sweep`)
``fedclust report``   mean ± sd (n) per setting of a folder of runs (:mod:`fedclust.report`);
                      ``--table NAME``: a paper's table from its sweep folders
``fedclust deploy``   a local SuperLink and SuperNodes, certificates, the Fleet gateway
``fedclust predict``  apply a finished run to new rows (:mod:`fedclust.predict`)
``fedclust check``    validate a run config offline, as ``flwr run`` would run it
``fedclust examples`` write example data (the quick start's site files)
``fedclust config``   list the run-config keys; keep pyproject.toml and conf/ in sync with them

The commands that need the Flower layers (``sweep``, ``deploy``, ``check``'s data checks) reach
them through the facade :mod:`fedclust.api`.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence
from typing import Any

from fedclust.errors import BadInputError

COMMANDS = {
    "sweep": "run a Hydra sweep of jobs (fedclust sweep --help; same as fedclust-sweep)",
    "report": "mean ± sd (n) table per setting of a run, sweep or folder of runs "
              "(fedclust report --help)",
    "deploy": "a SuperLink and SuperNodes on this machine, certificates, the Fleet gateway "
              "(fedclust deploy --help)",
    "predict": "apply a finished run to new rows (fedclust predict --help)",
    "check": "validate a run config offline: fedclust check --run-config 'fcm.m=1.5 ...'",
    "examples": "write example data: fedclust examples sites DIR (the quick start's files)",
    "config": "the run-config keys: fedclust config list (sync, check: keep pyproject.toml "
              "and conf/ in step with the schema)",
}


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] not in COMMANDS:
        lines = "\n".join(f"  {name:<8} {text}" for name, text in COMMANDS.items())
        known = "" if not args or args[0] in ("-h", "--help") else (
            f"fedclust: unknown command {args[0]!r}{_close(args[0], list(COMMANDS))}\n")
        print(f"{known}usage: fedclust <command> ...\ncommands:\n{lines}", file=sys.stderr)
        return 0 if args[:1] in (["-h"], ["--help"]) else 2
    command, rest = args[0], args[1:]
    from fedclust.results import terminate_as_interrupt

    terminate_as_interrupt()
    try:
        return _dispatch(command, rest)
    except KeyboardInterrupt:
        print(f"fedclust {command}: interrupted", file=sys.stderr)
        return 130
    except BadInputError as exc:   # bad input that got past a command's own checks
        print(f"fedclust {command}: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    except OSError as exc:         # a file or folder this user cannot read or write
        where = f" {exc.filename!r}" if getattr(exc, "filename", None) else ""
        print(f"fedclust {command}: cannot read or write{where}: "
              f"{exc.strerror or exc} ({type(exc).__name__}). Fix: check the path and its "
              f"permissions", file=sys.stderr)
        return 2


def _dispatch(command: str, rest: list[str]) -> int:
    if command == "report":
        if any(a == "--table" or a.startswith("--table=") for a in rest):
            return table_main(rest)
        from fedclust.report import main as report_main

        return report_main(rest)
    if command == "examples":
        from fedclust.examples import main as examples_main

        return examples_main(rest)
    if command == "config":
        from fedclust.config import main as config_main

        return config_main(rest)
    if command == "predict":
        from fedclust.predict import main as predict_main

        return predict_main(rest)
    if command == "check":
        return check_main(rest)
    from fedclust import api

    return api.deploy(rest) if command == "deploy" else api.sweep(rest)


def _close(word: str, choices: list[str]) -> str:
    import difflib

    close = difflib.get_close_matches(word, choices, n=1, cutoff=0.5)
    return f" (did you mean {close[0]!r}?)" if close else ""


# ----------------------------------------------------------------------------- paper tables

def table_main(argv: Sequence[str]) -> int:
    """``fedclust report --table NAME FOLDER …``: a paper's table from the folders of its
    sweep (``fedclust sweep -m experiment=…``), with the paper's numbers beside ours."""
    from fedclust.experiments.__main__ import TABLES

    names = sorted([*TABLES, "emdcfl", "emdcfl-eps"])
    parser = argparse.ArgumentParser(
        prog="fedclust report --table",
        description="A paper's table from the run folders of its sweep (any folder holding "
                    "them, or a file tool's results.jsonl for emdcfl). emdcfl-eps: the "
                    "clustering of one finished EMD-CFL run at other epsilon values (from its "
                    "emd_excess.npy, no retraining).")
    parser.add_argument("--table", required=True, choices=names)
    parser.add_argument("folders", nargs="+", metavar="FOLDER")
    parser.add_argument("--plot", default="", help="PNG path prefix for tables that draw one")
    parser.add_argument("--eps", nargs="+", type=float, default=None,
                        help="emdcfl-eps: the epsilon values (default 0 … 0.3)")
    args = parser.parse_args(list(argv))
    try:
        if args.table in TABLES:
            fn = TABLES[args.table]
            print(fn(args.folders, plot=args.plot) if args.plot else fn(args.folders))
        else:
            from fedclust import api

            print(api.emdcfl_table(args.folders, args.table == "emdcfl-eps", args.eps))
    except SystemExit as exc:       # the table tools' "no run here" messages
        if isinstance(exc.code, str):
            print(f"fedclust report --table: {exc.code}", file=sys.stderr)
            return 2
        raise
    except (OSError, ValueError, KeyError) as exc:
        print(f"fedclust report --table {args.table}: {type(exc).__name__}: {exc}",
              file=sys.stderr)
        return 2
    return 0


# ----------------------------------------------------------------------------- check

_PAIR = re.compile(r"(\S+?)=('[^']*'|\"[^\"]*\"|\S+)")


def parse_run_config(text: str) -> dict[str, Any]:
    """``--run-config`` text as ``flwr run`` reads it: ``key=value`` pairs separated by blanks,
    each value a TOML value (strings in quotes: ``dataset="files"``), or the path of a
    ``.toml`` file.

    Raises
    ------
    ConfigError
        A pair that is not ``key=value`` or a value TOML cannot read.
    """
    from pathlib import Path

    try:
        import tomllib
    except ImportError:     # pragma: no cover - Python 3.10
        import tomli as tomllib

    from fedclust.config import ConfigError

    text = text.strip()
    if text.endswith(".toml") and "=" not in text:
        try:
            return _flatten(tomllib.loads(Path(text).expanduser().read_text()))
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(f"--run-config file {text!r} cannot be read as TOML: "
                              f"{str(exc).splitlines()[0]}. Allowed: a readable .toml file "
                              f"of run-config keys. Fix: check the path and its TOML syntax "
                              f"(or pass the keys as 'key=value ...')") from None
    pairs = _PAIR.findall(text)
    leftover = _PAIR.sub("", text).strip()
    if leftover:
        raise ConfigError(f"--run-config: {leftover.split()[0]!r} is not a key=value pair. "
                          f"Allowed: key=value pairs separated by blanks, strings in double "
                          f"quotes (dataset=\"files\" fcm.m=1.5)")
    twice = sorted({k for k, _ in pairs if [p for p, _ in pairs].count(k) > 1})
    if twice:
        raise ConfigError(f"--run-config gives {', '.join(map(repr, twice))} more than once "
                          f"(flwr run would keep the last value silently). Allowed: each key "
                          f"once. Fix: remove the duplicate")
    out: dict[str, Any] = {}
    for key, value in pairs:
        try:
            out.update(_flatten(tomllib.loads(f"{key} = {value}")))
        except tomllib.TOMLDecodeError:
            raise ConfigError(f"--run-config: the value of {key!r}, {value}, is not a TOML "
                              f"value. Allowed: a number, true/false, or a string in double "
                              f"quotes. Fix: {key}=\"{value.strip(chr(39))}\"") from None
    return out


def _flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def check_main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="fedclust check",
        description="Validate a run config offline, before `flwr run`: every key and value "
                    "(a mistyped key is named with the close matches), the cross-key rules, "
                    "and the data the run would read (data-dir files, site files).")
    parser.add_argument("--run-config", default="", metavar="TEXT",
                        help="as flwr run's --run-config: 'key=value ...' or a .toml file")
    parser.add_argument("--num-clients", type=int, default=None,
                        help="the federation's node count (flwr run: num-supernodes)")
    parser.add_argument("--no-data", action="store_true",
                        help="check the keys only, not the data files")
    args = parser.parse_args(list(argv))
    from fedclust.config import ConfigError

    try:
        run_config = parse_run_config(args.run_config)
        if args.num_clients is not None:
            run_config.setdefault("num-clients", args.num_clients)
        if args.no_data:
            from fedclust.config import validate

            cfg = validate(run_config)
        else:
            from fedclust import api

            cfg = api.check(run_config)
    except (ConfigError, ValueError, OSError) as exc:
        print(f"fedclust check: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    given = ", ".join(f"{k}={cfg[k]!r}" for k in run_config if k in cfg) or "all defaults"
    print(f"run config OK: method={cfg['method']!r} dataset={cfg['dataset']!r} ({given})")
    if cfg["dataset"] == "files" and not cfg["num-clients"] and not args.no_data:
        from fedclust.data.sites import site_files

        n = len(site_files(cfg["data-dir"]))     # the node count the run will ask for
        print(f"dataset='files': {n} site files, one simulated client each: flwr run needs "
              f"--federation-config \"num-supernodes={n}\" (its default federation has 2 "
              f"nodes); fedclust sweep makes {n}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
