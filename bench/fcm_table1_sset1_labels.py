"""s-set1 ARI of stored paper-004 Table 1 runs against both label files of S1.

Paper 004 took s-set1 from deric/clustering-benchmark (ARFF); its labels differ from the SIPU
reference labels (``s1.labels0``, what fedclust loads) on 27 of 5,000 points. Usage::

    FEDCLUST_DATA_DIR=/path/to/data python bench/fcm_table1_sset1_labels.py runs/fcm_table1
"""

from __future__ import annotations

import json
import os
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np
from sklearn.metrics import adjusted_rand_score

from fedclust.data.tabular import read_arff
from fedclust.metrics import format_ci


def main(run_dir: str) -> None:
    root = Path(os.environ.get("FEDCLUST_DATA_DIR", "data")) / "clustering"
    x, y_arff = read_arff(root / "s-set1.arff")
    y_ref = np.loadtxt(root / "s1.labels0.gz", dtype=int)
    lo, hi = x.min(0), x.max(0)
    xs = (x - lo) / (hi - lo)            # the federated MinMax scaling equals the pooled one
    ari: dict[float, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for path in sorted(Path(run_dir).rglob("summary.json")):
        summary = json.loads(path.read_text())
        if summary["dataset"] != "s-set1":
            continue
        centers = np.load(path.parent / "centers.npy")
        labels = ((xs[:, None] - centers[None]) ** 2).sum(-1).argmin(1)
        row = ari[summary["config"]["fcm.fraction"]]
        row["sipu"].append(adjusted_rand_score(y_ref, labels))
        row["arff"].append(adjusted_rand_score(y_arff, labels))
    print("| γ | ARI, SIPU labels (s1.labels0) | ARI, ARFF labels (paper's source) | seeds |")
    print("|---|---|---|---|")
    for gamma in sorted(ari):
        row = ari[gamma]
        print(f"| {gamma} | {format_ci(row['sipu'], 5)} | {format_ci(row['arff'], 5)} | "
              f"{len(row['sipu'])} |")


if __name__ == "__main__":
    main(sys.argv[1])
