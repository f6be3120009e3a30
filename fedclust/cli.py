"""``fedclust`` command line: ``fedclust predict RUN_DIR DATA --out FILE`` and
``fedclust deploy up|certs|fleet-gateway`` (:mod:`server_app.deploy`, reached through the
facade :func:`fedclust.api.deploy`)."""

from __future__ import annotations

import sys
from collections.abc import Sequence

COMMANDS = {"predict": "apply a finished run to new rows (fedclust predict --help)",
            "deploy": "a SuperLink and SuperNodes on this machine, certificates, the Fleet "
                      "gateway (fedclust deploy --help)"}


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] not in COMMANDS:
        lines = "\n".join(f"  {name:<10} {text}" for name, text in COMMANDS.items())
        print(f"usage: fedclust <command> ...\ncommands:\n{lines}", file=sys.stderr)
        return 0 if args[:1] in (["-h"], ["--help"]) else 2
    if args[0] == "deploy":
        from fedclust.api import deploy

        return deploy(args[1:])
    from fedclust.predict import main as predict_main

    return predict_main(args[1:])


if __name__ == "__main__":
    sys.exit(main())
