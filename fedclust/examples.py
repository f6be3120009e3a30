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
    """Write ``n_sites`` example site files into ``folder``; return their paths."""
    rng = np.random.default_rng(seed)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(n_sites):
        share = rng.dirichlet(np.full(len(GROUPS), 2.0))
        counts = rng.multinomial(int(rng.integers(120, 400)), share)
        lines = [",".join(COLUMNS)]
        for (name, (mean, std)), n in zip(GROUPS.items(), counts):
            for row in rng.normal(mean, std, (n, 3)):
                lines.append(",".join(f"{v:.1f}" for v in row) + f",{name}")
        body = lines[1:]
        rng.shuffle(body)
        path = folder / f"site{i}.csv"
        path.write_text("\n".join([lines[0], *body]) + "\n")
        paths.append(path)
    return paths


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="fedclust examples",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=["sites"])
    parser.add_argument("folder")
    parser.add_argument("--sites", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    for path in write_sites(args.folder, args.sites, args.seed):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
