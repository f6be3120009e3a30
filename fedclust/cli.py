"""``fedclust`` command line: ``fedclust predict RUN_DIR DATA --out FILE``."""

from __future__ import annotations

import sys
from collections.abc import Sequence

COMMANDS = {"predict": "apply a finished run to new rows (fedclust predict --help)"}


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] not in COMMANDS:
        lines = "\n".join(f"  {name:<10} {text}" for name, text in COMMANDS.items())
        print(f"usage: fedclust <command> ...\ncommands:\n{lines}", file=sys.stderr)
        return 0 if args[:1] in (["-h"], ["--help"]) else 2
    from fedclust.predict import main as predict_main

    return predict_main(args[1:])


if __name__ == "__main__":
    sys.exit(main())
