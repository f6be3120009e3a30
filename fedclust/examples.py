"""Example site files for the quick start: ``fedclust examples sites DIR``.

Writes one CSV per site (``site0.csv`` …), as a group of clinics would hold them: a header,
three numeric features in their own units (``heart_rate`` in bpm, ``systolic_bp`` in mmHg,
``glucose`` in mg/dL) and a ``diagnosis`` text column (ground truth, for the evaluation path
only). Three patient groups; every site sees them in different proportions and sizes
(non-IID), so no site alone has the whole picture.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

GROUPS = {   # mean and spread of (heart_rate, systolic_bp, glucose)
    "healthy": ((68.0, 118.0, 90.0), (6.0, 8.0, 8.0)),
    "hypertensive": ((78.0, 158.0, 100.0), (7.0, 10.0, 10.0)),
    "diabetic": ((84.0, 132.0, 190.0), (7.0, 10.0, 25.0)),
}
COLUMNS = ("heart_rate", "systolic_bp", "glucose", "diagnosis")


def write_sites(folder: str | Path, n_sites: int = 4, seed: int = 0) -> list[Path]:
    """Write ``n_sites`` example site files into ``folder``; return their paths.

    A site file already there is never replaced: it may be someone's data (the same example
    written again, byte for byte, is fine).

    Raises
    ------
    ValueError
        ``n_sites`` below 1, or a file of another content at a site file's path.
    """
    if isinstance(n_sites, bool) or not isinstance(n_sites, int) or n_sites < 1:
        raise ValueError(f"--sites = {n_sites!r}: allowed a whole number of at least 1. Fix: "
                         f"--sites 4")
    rng = np.random.default_rng(seed)
    folder = Path(folder)
    texts = []
    for i in range(n_sites):
        share = rng.dirichlet(np.full(len(GROUPS), 2.0))
        counts = rng.multinomial(int(rng.integers(120, 400)), share)
        lines = [",".join(COLUMNS)]
        for (name, (mean, std)), n in zip(GROUPS.items(), counts):
            for row in rng.normal(mean, std, (n, 3)):
                lines.append(",".join(f"{v:.1f}" for v in row) + f",{name}")
        body = lines[1:]
        rng.shuffle(body)
        texts.append((folder / f"site{i}.csv", "\n".join([lines[0], *body]) + "\n"))
    taken = [p for p, text in texts if p.exists() and (not p.is_file()
                                                        or p.read_text(errors="replace") != text)]
    if taken:
        raise ValueError(f"{folder} already holds {', '.join(p.name for p in taken)}, which "
                         f"this example would replace (it may be someone's data). Allowed: a "
                         f"new or empty folder. Fix: pass another folder")
    folder.mkdir(parents=True, exist_ok=True)
    for path, text in texts:
        path.write_text(text)
    return [p for p, _ in texts]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="fedclust examples",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=["sites"])
    parser.add_argument("folder")
    parser.add_argument("--sites", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    try:
        paths = write_sites(args.folder, args.sites, args.seed)
    except ValueError as exc:
        print(f"python -m fedclust.examples: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"python -m fedclust.examples: cannot write {args.folder!r} "
              f"({type(exc).__name__}: {exc.strerror or exc}). Fix: pass a folder this user "
              f"may create and write", file=sys.stderr)
        return 2
    for path in paths:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
